"""Handoffs over JSON-RPC (``POST /a2a``): send, reply, read and list threads, and the work lifecycle's transitions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from datetime import datetime
from typing import Any

from relay.agent.client.errors import InvalidTransition, RelayError, StateChanged, lease_refused
from relay.agent.client.models import Handoff, Page, SendResult, TaskSummary, TransitionResult, _next_cursor, _when
from relay.agent.client.transport import Transport


def _text_message(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "text", "text": text}]}


class Handoffs(Transport):
    """:class:`RelayClient`'s JSON-RPC calls, and the lease tokens its accepts and renews got (``leases``)."""

    leases: MutableMapping[str, str]

    def send(
        self,
        recipient: str,
        text: str,
        *,
        intent: str = "inform",
        artifacts: Sequence[dict] | None = None,
        proposed_action: dict | None = None,
        metadata: Mapping[str, Any] | None = None,
        context_id: str | None = None,
        idempotency_key: str | None = None,
        priority: str | None = None,
        expires_in_seconds: int | None = None,
    ) -> SendResult:
        """Open a handoff to ``recipient`` (``message/send`` with no ``task_id``).

        ``intent`` is ``inform``, ``ask_question`` or ``propose_action`` (then
        ``proposed_action={"description", "target_files", "rationale", "suggested_diff"?}``
        is required). ``artifacts`` are dicts such as
        ``{"type": "file_diff", "path": ..., "diff": ...}``. ``context_id`` joins a context
        in which the caller already has a thread. ``idempotency_key`` (else
        ``metadata["client_idempotency_key"]``, else a new uuid4) makes the call safe to
        repeat: the same key with the same params returns the first result.
        ``priority`` is ``low``, ``normal`` (the relay's default), ``high`` or ``urgent``;
        ``expires_in_seconds`` (10-2,592,000) makes a handoff still pending after that
        long ``expired``. Left out (None), neither is sent.

        Returns :class:`SendResult` (``state`` ``pending``, ``sequence_no`` 1).
        Raises :class:`RecipientNotFound`, :class:`TeammateBlocked`,
        :class:`InvalidIntentPayload`, :class:`InvalidParams` (e.g. sending to yourself,
        an unknown ``context_id``), :class:`DuplicateIdempotencyKey`, or a transport error.
        """
        params: dict[str, Any] = {
            "recipient": recipient,
            "intent": intent,
            "message": _text_message(text),
            "artifacts": list(artifacts or []),
            "proposed_action": proposed_action,
        }
        if context_id is not None:
            params["context_id"] = context_id
        if priority is not None:
            params["priority"] = priority
        if expires_in_seconds is not None:
            params["expires_in_seconds"] = expires_in_seconds
        return self._send_message(params, metadata, idempotency_key)

    def reply(
        self,
        task_id: str,
        text: str,
        *,
        artifacts: Sequence[dict] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> SendResult:
        """Append a message to thread ``task_id`` (``message/send`` with ``task_id``).

        Either participant may reply while the thread is pending or accepted.
        Idempotency as in :meth:`send`. Returns :class:`SendResult` (its ``sequence_no``
        is the message's place in the thread). Raises :class:`ThreadNotFound`,
        :class:`NotAParticipant`, :class:`ThreadTerminal`, :class:`InvalidParams`,
        :class:`DuplicateIdempotencyKey`, or a transport error.
        """
        params = {"task_id": task_id, "message": _text_message(text), "artifacts": list(artifacts or [])}
        return self._send_message(params, metadata, idempotency_key)

    def get(self, task_id: str, *, messages_limit: int | None = None, messages_after: int | None = None) -> Handoff:
        """Read a thread (``tasks/get``); this marks what it returns read for the caller.

        Without paging, every message. ``messages_limit`` (1-1000) and/or
        ``messages_after`` (a ``sequence_no``, 0 for the start) read one page, oldest
        first; its ``raw`` then has ``messages_next`` (the next page's ``messages_after``,
        None at the end) and ``messages_total``. Raises :class:`ThreadNotFound`,
        :class:`NotAParticipant`, :class:`InvalidParams` (a malformed id or page).
        """
        params: dict[str, Any] = {"task_id": task_id}
        if messages_limit is not None:
            params["messages_limit"] = messages_limit
        if messages_after is not None:
            params["messages_after"] = messages_after
        return Handoff.from_json(self._rpc("tasks/get", params))

    def get_newest(self, task_id: str, messages_limit: int) -> Handoff:
        """Read a thread with only its newest ``messages_limit`` messages (1-1000), oldest first.

        One ``tasks/get`` page when the thread is that short, else a second from its last
        page (``messages_total - messages_limit``). Raises as :meth:`get`.
        """
        handoff = self.get(task_id, messages_limit=messages_limit)
        total = handoff.raw.get("messages_total") or 0
        if total > messages_limit:
            handoff = self.get(task_id, messages_limit=messages_limit, messages_after=total - messages_limit)
        return handoff

    def inbox(
        self,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        priority: str | Sequence[str] | None = None,
    ) -> Page[TaskSummary]:
        """One page of threads addressed to the caller (``tasks/list``, ``filter.role=recipient``).

        ``status``: one state or several (``pending``, ``accepted``, ``completed``,
        ``cancelled``, ``declined``, ``failed``, ``expired``); ``priority``: one or several
        (``low``, ``normal``, ``high``, ``urgent``); ``since``: inclusive, on the thread's
        last activity (an aware datetime or ISO 8601 string); ``limit`` 1-200. Newest
        activity first (priority filters, it does not reorder); pass the page's
        ``next_cursor`` as ``cursor`` for the next one. Raises :class:`InvalidParams`.
        """
        return self._list("recipient", status, since, limit, cursor, priority)

    def sent(
        self,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        priority: str | Sequence[str] | None = None,
    ) -> Page[TaskSummary]:
        """One page of threads the caller opened (``tasks/list``, ``filter.role=sender``); as :meth:`inbox`."""
        return self._list("sender", status, since, limit, cursor, priority)

    def iter_inbox(
        self,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        limit: int = 50,
        priority: str | Sequence[str] | None = None,
    ) -> Iterator[TaskSummary]:
        """Every inbox thread across all pages, newest activity first (follows ``next_cursor``)."""
        return self._iter_list("recipient", status, since, limit, priority)

    def iter_sent(
        self,
        status: str | Sequence[str] | None = None,
        since: datetime | str | None = None,
        limit: int = 50,
        priority: str | Sequence[str] | None = None,
    ) -> Iterator[TaskSummary]:
        """Every thread the caller opened, across all pages, newest activity first."""
        return self._iter_list("sender", status, since, limit, priority)

    def accept(
        self, task_id: str, session_id: str | None = None, *, lease_seconds: int | None = None
    ) -> TransitionResult:
        """Accept a pending handoff (``tasks/update`` ``accept``; recipient only).

        ``session_id`` is recorded in the audit trail. ``lease_seconds`` (10-86,400) leases
        the work: the answer's ``lease_token`` fences complete/fail/release/renew until
        ``lease_expires_at`` (then the handoff is pending again); the client remembers the
        token for this task (:attr:`leases`) and sends it on those calls. Raises
        :class:`NotAuthorizedTransition` (the sender called), :class:`InvalidTransition`
        (not pending), :class:`StateChanged` (lost a race), :class:`ThreadNotFound`,
        :class:`NotAParticipant`, :class:`InvalidParams` (``lease_seconds`` out of range).
        Not idempotent: see the class docstring on retries.
        """
        params: dict[str, Any] = {"task_id": task_id, "transition": "accept"}
        if session_id is not None:
            params["session_id"] = session_id
        if lease_seconds is not None:
            params["lease_seconds"] = lease_seconds
        result = self._transition(task_id, "accepted", "tasks/update", params)
        self._remember(task_id, result)
        return result

    def complete(self, task_id: str, result_summary: str, *, lease_token: str | None = None) -> TransitionResult:
        """Complete an accepted handoff (``tasks/update`` ``complete``; recipient only).

        ``result_summary`` (at most 8192 characters) says what was done. ``lease_token``:
        the accept's, for a leased handoff (default: the one this client remembers, see
        :attr:`leases`). Errors as :meth:`accept`; :class:`StateChanged` also when the
        handoff is leased and the token is missing or not the current one (the lease lapsed
        or another accept took it: read it, and accept again if it is pending).
        """
        params = {"task_id": task_id, "transition": "complete", "result_summary": result_summary}
        return self._fenced(task_id, "completed", params, lease_token)

    def decline(self, task_id: str, reason: str) -> TransitionResult:
        """Decline a pending handoff (``tasks/update`` ``decline``; recipient only): pending -> declined.

        ``reason`` (1-2000 characters, required) tells the sender why; declined is final.
        Raises :class:`InvalidParams` (no or too long a reason), :class:`InvalidTransition`
        (not pending), :class:`NotAuthorizedTransition` (the sender called), :class:`StateChanged`.
        """
        return self._transition(
            task_id, "declined", "tasks/update", {"task_id": task_id, "transition": "decline", "reason": reason}
        )

    def fail(self, task_id: str, reason: str, lease_token: str | None = None) -> TransitionResult:
        """Give up on an accepted handoff (``tasks/update`` ``fail``; recipient only): accepted -> failed.

        ``reason`` (1-2000 characters, required) says why; failed is final. ``lease_token``
        as in :meth:`complete`. Errors as :meth:`complete`.
        """
        params = {"task_id": task_id, "transition": "fail", "reason": reason}
        return self._fenced(task_id, "failed", params, lease_token)

    def release(self, task_id: str, reason: str | None = None, lease_token: str | None = None) -> TransitionResult:
        """Give an accepted handoff back (``tasks/update`` ``release``; recipient only): accepted -> pending.

        ``reason`` (optional, 1-2000 characters) goes on the audit row; the lease ends.
        ``lease_token`` as in :meth:`complete`. Errors as :meth:`complete`.
        """
        params: dict[str, Any] = {"task_id": task_id, "transition": "release"}
        if reason is not None:
            params["reason"] = reason
        return self._fenced(task_id, "pending", params, lease_token)

    def renew(self, task_id: str, lease_seconds: int | None = None, lease_token: str | None = None) -> TransitionResult:
        """Extend the lease of an accepted handoff (``tasks/update`` ``renew``; recipient only).

        The lease runs ``lease_seconds`` (10-86,400; default the accept's) from now and
        keeps its token. An unleased accepted handoff needs ``lease_seconds``: renew then
        starts a lease (its token is remembered as an accept's). ``lease_token`` as in
        :meth:`complete`. Errors as :meth:`complete`.
        """
        params: dict[str, Any] = {"task_id": task_id, "transition": "renew"}
        if lease_seconds is not None:
            params["lease_seconds"] = lease_seconds
        result = self._fenced(task_id, "accepted", params, lease_token)
        self._remember(task_id, result)
        return result

    def request_input(self, task_id: str, question: str, *, lease_token: str | None = None) -> TransitionResult:
        """Ask the sender a question before going on (``tasks/update`` ``request_input``;
        recipient only): accepted -> input_required.

        ``question`` (1-2000 characters, required) is shown to the sender (and to A2A
        clients as the status message of TASK_STATE_INPUT_REQUIRED). The sender's next
        message answers it: the handoff is accepted again. A lease stays yours and its
        clock stops until the answer, then runs its full length again. ``lease_token`` as in
        :meth:`complete`. Errors as :meth:`complete`; :class:`InvalidParams` for a missing
        or too long question.
        """
        params = {"task_id": task_id, "transition": "request_input", "question": question}
        return self._fenced(task_id, "input_required", params, lease_token)

    def cancel(self, task_id: str) -> TransitionResult:
        """Cancel a pending handoff (``tasks/cancel``; sender only). Errors as :meth:`accept`."""
        return self._transition(task_id, "cancelled", "tasks/cancel", {"task_id": task_id})

    def _remember(self, task_id: str, result: TransitionResult) -> None:
        """Keep the lease token an accept or renew answered (or forget the task's when it has none)."""
        if result.lease_token:
            self.leases[task_id] = result.lease_token
        else:
            self.leases.pop(task_id, None)

    def _fenced(self, task_id: str, target: str, params: dict[str, Any], lease_token: str | None) -> TransitionResult:
        """A transition a lease fences: with ``lease_token``, else the remembered one, else none.

        The remembered token is forgotten once it cannot serve again: the transition ended
        the lease (complete, fail, release), or the relay refused the token as stale or the
        handoff is no longer accepted (then only a new accept brings a new one).
        """
        remembered = self.leases.get(task_id)
        token = lease_token if lease_token is not None else remembered
        if token is not None:
            params["lease_token"] = token
        try:
            result = self._transition(task_id, target, "tasks/update", params)
        except (StateChanged, InvalidTransition) as exc:
            stale = isinstance(exc, InvalidTransition) or lease_refused(exc)
            if stale and remembered is not None and token == remembered:
                self.leases.pop(task_id, None)
            raise
        if target not in ("accepted", "input_required"):  # the lease goes on while input is required
            self.leases.pop(task_id, None)
        return result

    def _transition(self, task_id: str, target: str, method: str, params: dict[str, Any]) -> TransitionResult:
        # A transition is not idempotent at the relay: when an attempt whose answer was lost
        # (timeout, 5xx) did go through, the retry is refused as invalid_transition or
        # state_changed. Only then, read the thread: already in the target state means done.
        try:
            return TransitionResult.from_json(self._rpc(method, params))
        except (InvalidTransition, StateChanged) as exc:
            if exc.attempts <= 1:
                raise
            handoff = self.get(task_id)
            if handoff.state != target:
                raise
            return TransitionResult.from_json(handoff.raw)

    def _send_message(
        self, params: dict[str, Any], metadata: Mapping[str, Any] | None, idempotency_key: str | None
    ) -> SendResult:
        meta = dict(metadata or {})
        given = meta.get("client_idempotency_key")
        if idempotency_key is not None and given is not None and given != idempotency_key:
            raise ValueError("idempotency_key and metadata['client_idempotency_key'] differ")
        # Fixed before the first attempt so every retry of this call carries the same key.
        key = idempotency_key or given or str(uuid.uuid4())
        meta["client_idempotency_key"] = key
        params["metadata"] = meta
        try:
            return SendResult.from_json(self._rpc("message/send", params), key)
        except RelayError as exc:
            # After a connection error or a 5xx the send may have happened: repeating the
            # call with this key is safe, a new key is not.
            exc.idempotency_key = key
            raise

    def _list(
        self,
        role: str,
        status: str | Sequence[str] | None,
        since: datetime | str | None,
        limit: int,
        cursor: str | None,
        priority: str | Sequence[str] | None = None,
    ) -> Page[TaskSummary]:
        flt: dict[str, Any] = {"role": role}
        if status is not None:
            flt["status"] = [status] if isinstance(status, str) else list(status)
        if priority is not None:
            flt["priority"] = [priority] if isinstance(priority, str) else list(priority)
        if since is not None:
            flt["since"] = _when(since, "since")
        result = self._rpc("tasks/list", {"filter": flt, "page": {"limit": limit, "cursor": cursor}})
        return Page(
            items=tuple(TaskSummary.from_json(t) for t in result.get("items", [])),
            next_cursor=result.get("next_cursor"),
            raw=result,
        )

    def _iter_list(self, role: str, status: Any, since: Any, limit: int, priority: Any = None) -> Iterator[TaskSummary]:
        cursor, used = None, set()
        while True:
            page = self._list(role, status, since, limit, cursor, priority)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = _next_cursor(page.next_cursor, used)
