"""The client's results: frozen dataclasses read from the relay's JSON, pages, and times and cursors on the wire."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from relay.agent.client.errors import BadResponse

T = TypeVar("T")


def _ts(value: Any) -> datetime | None:
    # The relay writes ISO 8601 with a 'Z' and microseconds; fromisoformat (3.11+) reads it.
    if value is None:
        return None
    return datetime.fromisoformat(value)


def _when(value: datetime | str | None, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            # The relay refuses naive times, and guessing a zone here would silently shift a catch-up.
            raise ValueError(f"{name} must be timezone-aware, got {value!r}")
        return value.isoformat()
    raise TypeError(f"{name} must be a datetime or an ISO 8601 string, got {type(value).__name__}")


def _state(obj: Mapping[str, Any]) -> str:
    status = obj.get("status")
    return status.get("state") if isinstance(status, dict) else obj.get("task_state")


def _lifecycle(d: Mapping[str, Any]) -> dict[str, Any]:
    """The work lifecycle's answer fields (tasks/get and every transition's answer), typed."""
    return {
        "priority": d.get("priority"),
        "expires_at": _ts(d.get("expires_at")),
        "lease_expires_at": _ts(d.get("lease_expires_at")),
        "lease_token": d.get("lease_token"),
        "declined_at": _ts(d.get("declined_at")),
        "failed_at": _ts(d.get("failed_at")),
        "expired_at": _ts(d.get("expired_at")),
        "reason": d.get("reason"),
        "question": d.get("question"),
        "input_requested_at": _ts(d.get("input_requested_at")),
    }


@dataclass(frozen=True)
class AgentRef:
    """An agent as threads and feed rows name it: ``handle`` (``local@org``), ``name``, ``role``."""

    handle: str
    name: str | None = None
    role: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> AgentRef | None:
        if not d:
            return None
        return cls(handle=d["handle"], name=d.get("name"), role=d.get("role"))


@dataclass(frozen=True)
class Identity:
    """The caller, from ``GET /api/v1/identities/me``."""

    handle: str
    name: str | None
    role: str | None
    org: str | None
    created_at: datetime | None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Identity:
        return cls(
            handle=d["handle"],
            name=d.get("name"),
            role=d.get("role"),
            org=d.get("org"),
            created_at=_ts(d.get("created_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Message:
    """One message of a thread as ``tasks/get`` lists it (its ``messages[]``).

    ``author`` is the writer's handle (the wire's ``from``); ``role`` is ``caller`` when
    the thread's sender wrote it, ``agent`` when the recipient did; ``body`` is the text
    parts joined; ``payload`` is the metadata it was sent with, minus
    ``client_idempotency_key``.
    """

    id: str
    sequence_no: int
    author: str
    role: str | None
    body: str
    parts: list
    artifacts: list
    payload: dict
    created_at: datetime
    read_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Message:
        return cls(
            id=d["id"],
            sequence_no=d["sequence_no"],
            author=d.get("from"),
            role=d.get("role"),
            body=d.get("body", ""),
            parts=list(d.get("parts") or []),
            artifacts=list(d.get("artifacts") or []),
            payload=dict(d.get("payload") or {}),
            created_at=_ts(d["created_at"]),
            read_at=_ts(d.get("read_at")),
            raw=dict(d),
        )


@dataclass(frozen=True, kw_only=True)
class _LifecycleFields:
    """The work lifecycle's fields of a thread, in ``tasks/get`` and every transition's answer.

    The rules: docs/decisions.md, "The work lifecycle".
    """

    priority: str | None = None
    expires_at: datetime | None = None
    lease_expires_at: datetime | None = None
    lease_token: str | None = None
    declined_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    reason: str | None = None
    question: str | None = None
    input_requested_at: datetime | None = None


@dataclass(frozen=True)
class Handoff(_LifecycleFields):
    """A whole thread, from ``tasks/get``: its state, participants and messages.

    ``task_id`` and ``thread_id`` are the same 26-character ULID; ``state`` is
    ``pending``, ``accepted``, ``input_required``, ``completed``, ``cancelled``,
    ``declined``, ``failed`` or ``expired`` (as of now: a lapsed lease reads ``pending``);
    ``artifacts`` collects every
    message's artifacts; ``messages`` are in ``sequence_no`` order. The lifecycle's fields
    (docs/decisions.md, "The work lifecycle"): ``priority``; ``expires_at`` (a pending handoff's end, None for none);
    ``lease_expires_at`` and ``lease_token`` while leased (the token is shown to the
    recipient only); ``declined_at``/``failed_at``/``expired_at``; ``reason`` (why it was
    declined or failed); ``question`` and ``input_requested_at`` (the recipient's open
    question while ``input_required``, else None).
    """

    task_id: str
    thread_id: str
    context_id: str | None
    state: str
    sender: AgentRef | None
    recipient: AgentRef | None
    summary: str | None
    intent: str | None
    artifacts: list
    proposed_action: dict | None
    messages: tuple[Message, ...]
    result_summary: str | None
    version: int | None
    accepted_at: datetime | None
    completed_at: datetime | None
    cancelled_at: datetime | None
    created_at: datetime | None
    updated_at: datetime | None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Handoff:
        return cls(
            task_id=d["task_id"],
            thread_id=d.get("thread_id", d["task_id"]),
            context_id=d.get("context_id"),
            state=_state(d),
            sender=AgentRef.from_json(d.get("sender")),
            recipient=AgentRef.from_json(d.get("recipient")),
            summary=d.get("summary"),
            intent=d.get("intent"),
            artifacts=list(d.get("artifacts") or []),
            proposed_action=d.get("proposed_action"),
            messages=tuple(Message.from_json(m) for m in d.get("messages") or []),
            result_summary=d.get("result_summary"),
            version=d.get("version"),
            accepted_at=_ts(d.get("accepted_at")),
            completed_at=_ts(d.get("completed_at")),
            cancelled_at=_ts(d.get("cancelled_at")),
            created_at=_ts(d.get("created_at")),
            updated_at=_ts(d.get("updated_at")),
            **_lifecycle(d),
            raw=dict(d),
        )


@dataclass(frozen=True)
class TaskSummary:
    """One ``tasks/list`` item: a thread without its messages.

    ``unread_messages`` counts the other side's messages after the caller's read
    position (a new handoff shows 1 in the recipient's inbox until ``get`` reads it);
    ``priority`` is ``low``, ``normal``, ``high`` or ``urgent``.
    """

    task_id: str
    thread_id: str
    context_id: str | None
    state: str
    sender: AgentRef | None
    recipient: AgentRef | None
    summary_preview: str | None
    intent: str | None
    unread_messages: int
    created_at: datetime | None
    updated_at: datetime | None
    priority: str | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TaskSummary:
        return cls(
            task_id=d["task_id"],
            thread_id=d.get("thread_id", d["task_id"]),
            context_id=d.get("context_id"),
            state=_state(d),
            sender=AgentRef.from_json(d.get("sender")),
            recipient=AgentRef.from_json(d.get("recipient")),
            summary_preview=d.get("summary_preview"),
            intent=d.get("intent"),
            unread_messages=int(d.get("unread_messages") or 0),
            created_at=_ts(d.get("created_at")),
            updated_at=_ts(d.get("updated_at")),
            priority=d.get("priority"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class SendResult:
    """What ``message/send`` answered, for a new handoff or an append.

    ``idempotency_key`` is the ``client_idempotency_key`` the call carried (generated by
    the client unless given): sending again with it returns this same result.
    A create's answer also has ``priority`` and ``expires_at`` (None without
    ``expires_in_seconds``); an append's has neither.
    """

    task_id: str
    thread_id: str
    context_id: str | None
    state: str | None
    message_id: str | None
    sequence_no: int | None
    created_at: datetime | None
    idempotency_key: str
    priority: str | None = None
    expires_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], idempotency_key: str) -> SendResult:
        return cls(
            task_id=d["task_id"],
            thread_id=d.get("thread_id", d["task_id"]),
            context_id=d.get("context_id"),
            state=_state(d),
            message_id=d.get("message_id"),
            sequence_no=d.get("sequence_no"),
            created_at=_ts(d.get("created_at")),
            idempotency_key=idempotency_key,
            priority=d.get("priority"),
            expires_at=_ts(d.get("expires_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class TransitionResult(_LifecycleFields):
    """What ``tasks/update`` / ``tasks/cancel`` answered: the thread's new state and times.

    The lifecycle's fields are :class:`Handoff`'s: after an accept with a lease (or a
    renew) ``lease_token`` fences complete, fail, release and renew, and
    ``lease_expires_at`` says when the lease ends; ``reason`` after a decline or fail.
    """

    task_id: str
    thread_id: str
    context_id: str | None
    state: str
    version: int | None
    result_summary: str | None
    accepted_at: datetime | None
    completed_at: datetime | None
    cancelled_at: datetime | None
    updated_at: datetime | None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TransitionResult:
        return cls(
            task_id=d["task_id"],
            thread_id=d.get("thread_id", d["task_id"]),
            context_id=d.get("context_id"),
            state=_state(d),
            version=d.get("version"),
            result_summary=d.get("result_summary"),
            accepted_at=_ts(d.get("accepted_at")),
            completed_at=_ts(d.get("completed_at")),
            cancelled_at=_ts(d.get("cancelled_at")),
            updated_at=_ts(d.get("updated_at")),
            **_lifecycle(d),
            raw=dict(d),
        )


@dataclass(frozen=True)
class FeedRow:
    """One row of the messages feed (docs/api.md): a message plus the task around it.

    ``author`` is the writer's handle (the wire's ``from``); ``role`` is ``caller`` or
    ``agent`` (who wrote it); ``task_state`` is the task's state *now*, not when the
    message was written; ``caller``/``target`` are the task's requester and worker;
    ``metadata`` is what the message was sent with, minus ``client_idempotency_key``;
    ``priority`` is the task's and ``read_at`` the message's read receipt.
    """

    id: str
    task_id: str
    context_id: str | None
    task_state: str | None
    sequence_no: int
    role: str | None
    author: str | None
    body: str
    parts: list
    artifacts: list
    metadata: dict
    created_at: datetime
    caller: AgentRef | None
    target: AgentRef | None
    priority: str | None = None
    read_at: datetime | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FeedRow:
        return cls(
            id=d["id"],
            task_id=d["task_id"],
            context_id=d.get("context_id"),
            task_state=d.get("task_state"),
            sequence_no=d["sequence_no"],
            role=d.get("role"),
            author=d.get("from"),
            body=d.get("body", ""),
            parts=list(d.get("parts") or []),
            artifacts=list(d.get("artifacts") or []),
            metadata=dict(d.get("metadata") or {}),
            created_at=_ts(d["created_at"]),
            caller=AgentRef.from_json(d.get("caller")),
            target=AgentRef.from_json(d.get("target")),
            priority=d.get("priority"),
            read_at=_ts(d.get("read_at")),
            raw=dict(d),
        )


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: ``items`` and the opaque ``next_cursor`` (None on the last page)."""

    items: tuple[T, ...]
    next_cursor: str | None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _next_cursor(cursor: str, used: set[str]) -> str:
    if cursor in used:
        raise BadResponse(f"the relay returned page cursor {cursor[:40]!r} twice; stopping instead of looping")
    used.add(cursor)
    return cursor
