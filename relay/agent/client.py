"""A Python client for the handoff relay, speaking only its public HTTP API.

The client needs nothing but the standard library, ``requests`` and
``standardwebhooks``; it never imports the server's services, models or schemas, so it
can be copied into an agent's own code base. (Importing it as ``relay.agent.client`` runs
``relay/__init__.py``, which imports Flask; the client itself does not use it.)

The relay's JSON-RPC 2.0 dialect (``POST /a2a``, docs/api.md)::

    with RelayClient("http://127.0.0.1:8000", "ah_live_...") as bob:
        sent = bob.send("frank@acme", "Refactored /users; new shape {items, next_cursor}")
        ...
    with RelayClient("http://127.0.0.1:8000", "ah_live_...") as frank:
        for task in frank.inbox(status=["pending"]).items:
            handoff = frank.get(task.task_id)          # marks it read
            frank.accept(task.task_id, session_id="s-1")
            frank.reply(task.task_id, "on it")
            frank.complete(task.task_id, "client updated")

The messages feed (``GET /api/v1/identities/{handle}/a2a/messages``, docs/api.md):
:meth:`RelayClient.messages`, :meth:`RelayClient.search` and
:meth:`RelayClient.catch_up` (the feed's recovery loop after downtime).

Waking an agent that has no public URL (no webhook receiver): :meth:`RelayClient.wait`
long-polls the feed until a message arrives after a position, and
:meth:`RelayClient.stream` reads the feed's Server-Sent Events stream
(``.../a2a/messages/stream``), reconnecting with ``Last-Event-ID`` after a drop::

    with RelayClient(url, key) as bob:
        rows = bob.wait(after=last_id, timeout=300)        # [] when nothing came in 300 s
        for row in bob.stream(after=last_id):              # runs until an error is raised
            last_id = row.id

Errors: every failure the relay answers raises a subclass of :class:`RelayError`, one
per error symbol (``ThreadNotFound`` for ``thread_not_found``, ...), for both
transports. Transient failures (dropped connections, timeouts, HTTP 5xx, HTTP 429) are
retried with exponential backoff; a refused connection (nothing listens at the URL) and
domain errors are not. See :class:`RelayClient`.

Webhooks: :func:`verify_webhook` checks a delivery's Standard Webhooks signature.
"""

from __future__ import annotations

import codecs
import http.client
import itertools
import json
import math
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

import requests
import urllib3.exceptions  # requests' own transport

from relay.agent.retry_after import parse_retry_after

__all__ = [
    "RelayClient",
    "RetryNotice",
    "verify_webhook",
    # results
    "AgentRef",
    "Identity",
    "Message",
    "Handoff",
    "TaskSummary",
    "SendResult",
    "TransitionResult",
    "FeedRow",
    "Page",
    "next_position",
    "SSEParser",
    # errors
    "RelayError",
    "RelayConnectionError",
    "BadResponse",
    "StreamUnavailable",
    "WebhookVerificationError",
    "ERROR_SYMBOLS",
    "error_class",
    "ParseError",
    "InvalidRequest",
    "PayloadTooLarge",
    "MethodNotFound",
    "InvalidParams",
    "InternalError",
    "Unauthenticated",
    "Forbidden",
    "RateLimited",
    "RecipientNotFound",
    "RecipientDisabled",
    "NotAParticipant",
    "ThreadNotFound",
    "ThreadTerminal",
    "InvalidTransition",
    "NotAuthorizedTransition",
    "StateChanged",
    "lease_refused",
    "DuplicateIdempotencyKey",
    "InvalidIntentPayload",
    "TeammateBlocked",
    "IdentityNotFound",
    "AgentExists",
    "KeyNotFound",
    "NotFound",
    "ServiceUnavailable",
    "UnsupportedOperation",
    "VersionNotSupported",
    "MethodNotAllowed",
    "RequestTimeout",
    "RequestLineTooLong",
    "HeadersTooLarge",
    "ContentTypeNotSupported",
]

T = TypeVar("T")


# =========================================================================== errors


class RelayError(Exception):
    """An error answered by the relay (or, for subclasses noted below, met on the way to it).

    Attributes:
        symbol: the relay's error symbol (``thread_not_found``, ...): JSON-RPC's
            ``error.data.symbol`` or REST's ``error.code``; None when the answer carried none.
        code: the JSON-RPC error code (``-32006``, ...); for a REST answer the code the
            relay documents for the symbol; None when unknown.
        message: the relay's human-readable message.
        data: JSON-RPC ``error.data`` or REST ``error.details`` (field errors for
            ``invalid_params``, the current state for ``invalid_transition``, ...).
        request_id: the ``X-Request-Id`` response header: quote it when reporting a problem.
        http_status: the HTTP status of the answer (200 for most JSON-RPC errors).
        attempts: how many HTTP requests this call made (more than 1 after retries).
    """

    default_symbol: str | None = None

    def __init__(
        self,
        message: str,
        *,
        symbol: str | None = None,
        code: int | None = None,
        data: Any = None,
        request_id: str | None = None,
        http_status: int | None = None,
        attempts: int = 1,
    ):
        super().__init__(message)
        self.message = message
        self.symbol = symbol if symbol is not None else self.default_symbol
        self.code = code if code is not None else ERROR_SYMBOLS.get(self.symbol or "", (None, None))[0]
        self.data = data
        self.request_id = request_id
        self.http_status = http_status
        self.attempts = attempts
        self.idempotency_key: str | None = None  # set on a failed send/reply: retry with it, never a new one

    def __str__(self) -> str:
        where = f" (request {self.request_id})" if self.request_id else ""
        return f"{self.symbol or 'error'}: {self.message}{where}"

    def field_errors(self) -> list[str]:
        """The refused fields as ``"field.sub: reason"`` lines (``invalid_params``); [] when none.

        Reads JSON-RPC ``error.data.errors`` or REST ``error.details``, both
        ``{"field": ["reason", ...]}`` (nested dicts are joined with dots).
        """
        if self.symbol != "invalid_params" or not isinstance(self.data, dict):
            return []
        errors = self.data.get("errors", self.data)
        if isinstance(errors, dict):
            errors = {k: v for k, v in errors.items() if k != "symbol"}
        return _flatten_fields(errors)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(symbol={self.symbol!r}, code={self.code!r}, message={self.message!r}, "
            f"http_status={self.http_status!r}, request_id={self.request_id!r})"
        )


class ConfigurationError(ValueError):
    """The relay URL or API key given to RelayClient cannot be used; the message names which."""


def check_settings(base_url: str, api_key: str) -> None:
    """Refuse a base URL that is not an http(s) root URL, or a key no header can carry.

    Raises ConfigurationError naming ``RELAY_URL`` or ``RELAY_API_KEY`` (the variables the
    CLI and the MCP server read them from).
    """
    try:
        parts = urlsplit(base_url or "")
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ConfigurationError(f"RELAY_URL is not a valid URL ({exc}): {base_url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(ord(c) <= 0x20 for c in base_url):
        raise ConfigurationError(
            f"RELAY_URL must be the relay's http:// or https:// root URL, such as "
            f"http://127.0.0.1:8000, got {base_url!r}"
        )
    if not api_key or any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in api_key):
        raise ConfigurationError("RELAY_API_KEY must be the ah_live_... key as printed, with no spaces or line breaks")


def _flatten_fields(errors: Any, prefix: str = "") -> list[str]:
    if isinstance(errors, dict):
        return [line for k, v in errors.items() for line in _flatten_fields(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(errors, (list, tuple)) and all(isinstance(e, str) for e in errors):
        return [f"{prefix}: {' '.join(errors)}" if prefix else " ".join(errors)]
    if isinstance(errors, (list, tuple)):
        return [
            line for i, e in enumerate(errors) for line in _flatten_fields(e, f"{prefix}.{i}" if prefix else str(i))
        ]
    return [] if errors is None else [f"{prefix}: {errors}" if prefix else str(errors)]


class BadResponse(RelayError):
    """The relay (or something in front of it) answered in a way that breaks the API's contract,
    such as a page cursor it already returned (following it would loop forever)."""

    default_symbol = "bad_response"


class StreamUnavailable(RelayError):
    """The relay has no message stream: ``.../a2a/messages/stream`` answered HTTP 404, 405 or 501
    (a relay older than the stream), or a 200 that is not ``text/event-stream`` (a proxy in
    the way). Poll the feed instead (:meth:`RelayClient.catch_up`); ``http_status`` says what
    came back."""

    default_symbol = "stream_unavailable"


def _next_cursor(cursor: str, used: set[str]) -> str:
    if cursor in used:
        raise BadResponse(f"the relay returned page cursor {cursor[:40]!r} twice; stopping instead of looping")
    used.add(cursor)
    return cursor


def next_position(rows: Sequence[FeedRow], since: datetime | str, seen: Iterable[str] = ()) -> tuple[str, list[str]]:
    """Where a catch-up loop resumes after ``rows`` (oldest first, as :meth:`RelayClient.catch_up` returns).

    Returns ``(since, seen_ids)`` for the next ``catch_up(since, seen=seen_ids)``: the
    newest ``created_at`` of ``rows`` and the ids at exactly that time (the feed's
    ``since`` is inclusive, so they would come back). When no row is newer than ``since``,
    the earlier ``seen`` ids are kept too.
    """
    previous = since if isinstance(since, str) else since.isoformat()
    if not rows:
        return previous, list(seen)
    newest = max(rows, key=lambda r: r.created_at)
    at_newest = [r.id for r in rows if r.created_at == newest.created_at]
    if _ts(previous) == newest.created_at:
        at_newest = list(dict.fromkeys([*seen, *at_newest]))
    return newest.raw.get("created_at") or newest.created_at.isoformat(), at_newest


class RelayConnectionError(RelayError):
    """The relay could not be reached: the connection was refused (raised at once), or it dropped
    or timed out on every attempt.

    ``symbol`` is ``connection_error``; ``reason`` says what happened in a few words
    (``"connection refused"``, ``"timed out"``, ...); the underlying ``requests`` exception
    is ``__cause__``.
    """

    default_symbol = "connection_error"

    def __init__(self, message: str, *, reason: str = "no answer", **kw: Any):
        super().__init__(message, **kw)
        self.reason = reason


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: ``__cause__``/``__context__``, urllib3's ``reason``, exception args."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        todo += [w for w in wrapped if isinstance(w, BaseException)]


def transport_reason(exc: BaseException) -> str:
    """A failed connection's cause in a few words: ``"connection refused"``, ``"timed out"``, ..."""
    causes = list(_causes(exc))
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "connection refused"
    if any(isinstance(c, (requests.Timeout, TimeoutError)) or "Timeout" in type(c).__name__ for c in causes):
        return "timed out"
    if any(type(c).__name__ in ("RemoteDisconnected", "ChunkedEncodingError", "IncompleteRead") for c in causes):
        return "connection dropped before the answer"
    if any(isinstance(c, ConnectionResetError) for c in causes):
        return "connection reset"
    if any(type(c).__name__ in ("NameResolutionError", "gaierror") for c in causes):
        return "host name not found"
    text = " ".join(str(exc).split())
    return "connection refused" if "refused" in text.lower() else (text[:160] or "no answer")


@dataclass(frozen=True)
class RetryNotice:
    """What :class:`RelayClient` tells its ``on_retry`` callback before it sleeps and tries again.

    ``retry`` is this retry's number (1 for the second attempt) out of ``retries``
    (``max_retries``); ``delay`` the seconds it will sleep first; ``reason`` why the last
    attempt failed (``"timed out"``, ``"HTTP 503"``, ``"rate limited (HTTP 429)"``, ...);
    ``connection`` whether the attempt got no answer at all.
    """

    verb: str
    url: str
    retry: int
    retries: int
    delay: float
    reason: str
    connection: bool


class WebhookVerificationError(RelayError):
    """A webhook delivery's signature, timestamp or headers did not verify (:func:`verify_webhook`)."""

    default_symbol = "webhook_verification_failed"


# symbol -> (JSON-RPC code, HTTP status): the relay's error table as it documents it
# (docs/api.md, "Errors"). Kept here rather than imported so the client
# never depends on server code; tests/test_client.py asserts it matches relay.errors.
ERROR_SYMBOLS: dict[str, tuple[int, int]] = {
    "parse_error": (-32700, 400),
    "invalid_request": (-32600, 400),
    "payload_too_large": (-32600, 413),
    "method_not_found": (-32601, 404),
    "invalid_params": (-32602, 422),
    "internal_error": (-32603, 500),
    "unauthenticated": (-32001, 401),
    "forbidden": (-32002, 403),
    "rate_limited": (-32003, 429),
    "recipient_not_found": (-32004, 404),
    "not_a_participant": (-32005, 403),
    "thread_not_found": (-32006, 404),
    "thread_terminal": (-32007, 409),
    "invalid_transition": (-32008, 409),
    "not_authorized_transition": (-32009, 403),
    "state_changed": (-32010, 409),
    "duplicate_idempotency_key": (-32011, 409),
    "invalid_intent_payload": (-32012, 422),
    "teammate_blocked": (-32013, 403),
    "identity_not_found": (-32014, 404),
    "agent_exists": (-32015, 409),
    "key_not_found": (-32016, 404),
    "not_found": (-32017, 404),
    "service_unavailable": (-32603, 503),
    "recipient_disabled": (-32020, 409),
    # Refusals of the HTTP request itself, before any method.
    "method_not_allowed": (-32600, 405),
    "request_timeout": (-32600, 408),
    "request_line_too_long": (-32600, 414),
    "headers_too_large": (-32600, 431),
    # The relay's A2A v1.0 binding only; ``POST /a2a``, which this client calls, never answers them.
    "unsupported_operation": (-32018, 400),
    "version_not_supported": (-32019, 400),
    "content_type_not_supported": (-32021, 415),
}

_CLASSES: dict[str, type[RelayError]] = {}


def _error(name: str, symbol: str, doc: str) -> type[RelayError]:
    cls = type(name, (RelayError,), {"__doc__": doc, "default_symbol": symbol, "__module__": __name__})
    _CLASSES[symbol] = cls
    return cls


ParseError = _error("ParseError", "parse_error", "-32700: the request body was not JSON.")
InvalidRequest = _error("InvalidRequest", "invalid_request", "-32600: not a valid JSON-RPC request.")
PayloadTooLarge = _error(
    "PayloadTooLarge",
    "payload_too_large",
    "HTTP 413: the request body is over the relay's limit (1 MiB by default); ``data.limit_bytes`` says the limit.",
)
MethodNotFound = _error("MethodNotFound", "method_not_found", "-32601: no such JSON-RPC method.")
InvalidParams = _error(
    "InvalidParams",
    "invalid_params",
    "-32602 / HTTP 422: a parameter is malformed or out of range; ``data`` names each "
    "field and why (JSON-RPC: ``data['errors']``).",
)
InternalError = _error(
    "InternalError", "internal_error", "-32603 / HTTP 500: a relay bug; quote ``request_id`` when reporting it."
)
Unauthenticated = _error(
    "Unauthenticated", "unauthenticated", "-32001 / HTTP 401: missing, malformed or revoked API key."
)
Forbidden = _error("Forbidden", "forbidden", "-32002 / HTTP 403: this key may not read that identity.")


class RateLimited(RelayError):
    """-32003 / HTTP 429: over the per-agent rate limit, still so after the client's retries.

    ``retry_after`` is the number of whole seconds the relay asked to wait (the
    ``Retry-After`` header), or None if it gave none.
    """

    default_symbol = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any):
        super().__init__(message, **kw)
        self.retry_after = retry_after


_CLASSES["rate_limited"] = RateLimited
RecipientNotFound = _error(
    "RecipientNotFound", "recipient_not_found", "-32004: no (enabled) agent has the recipient handle."
)
RecipientDisabled = _error(
    "RecipientDisabled",
    "recipient_disabled",
    "-32020 / HTTP 409: the thread's other party is disabled; it takes no new messages until re-enabled.",
)
NotAParticipant = _error(
    "NotAParticipant",
    "not_a_participant",
    "-32005 / HTTP 403: the caller is neither the sender nor the recipient of the thread.",
)
ThreadNotFound = _error("ThreadNotFound", "thread_not_found", "-32006 / HTTP 404: no thread has that (well-formed) id.")
ThreadTerminal = _error(
    "ThreadTerminal",
    "thread_terminal",
    "-32007 / HTTP 409: the thread is in a final state (completed, cancelled, declined, failed, expired); no more messages.",
)
InvalidTransition = _error(
    "InvalidTransition",
    "invalid_transition",
    "-32008 / HTTP 409: the transition is not valid from the thread's current state (``data['state']``).",
)
NotAuthorizedTransition = _error(
    "NotAuthorizedTransition",
    "not_authorized_transition",
    "-32009 / HTTP 403: the other participant performs this transition (cancel: the sender; "
    "every other one: the recipient).",
)
StateChanged = _error(
    "StateChanged",
    "state_changed",
    "-32010 / HTTP 409: another call changed the thread first (compare-and-set lost), or the handoff is "
    "leased and the call's lease_token is missing or not the current one (:func:`lease_refused`); read it again.",
)
DuplicateIdempotencyKey = _error(
    "DuplicateIdempotencyKey",
    "duplicate_idempotency_key",
    "-32011 / HTTP 409: this client_idempotency_key was used with different params.",
)
InvalidIntentPayload = _error(
    "InvalidIntentPayload",
    "invalid_intent_payload",
    "-32012: proposed_action given without intent propose_action, or missing with it.",
)
TeammateBlocked = _error("TeammateBlocked", "teammate_blocked", "-32013: the recipient has blocked the caller.")
IdentityNotFound = _error(
    "IdentityNotFound", "identity_not_found", "HTTP 404: no identity with that handle is visible to the caller."
)
AgentExists = _error("AgentExists", "agent_exists", "HTTP 409: an agent with that handle already exists.")
KeyNotFound = _error("KeyNotFound", "key_not_found", "HTTP 404: no such API key.")
NotFound = _error("NotFound", "not_found", "HTTP 404: no such resource.")
ServiceUnavailable = _error(
    "ServiceUnavailable",
    "service_unavailable",
    "HTTP 503 (-32603): the relay's database or a proxy in front of it is unavailable; "
    "retried by the client before being raised.",
)
UnsupportedOperation = _error(
    "UnsupportedOperation",
    "unsupported_operation",
    "-32018: the operation is not supported (the relay's A2A v1.0 binding).",
)
VersionNotSupported = _error(
    "VersionNotSupported",
    "version_not_supported",
    "-32019: the requested protocol version is not supported (the relay's A2A v1.0 binding).",
)
ContentTypeNotSupported = _error(
    "ContentTypeNotSupported",
    "content_type_not_supported",
    "-32021: a part or a request body of a media type the relay does not carry (the relay's A2A v1.0 binding).",
)

MethodNotAllowed = _error(
    "MethodNotAllowed", "method_not_allowed", "HTTP 405: the path does not take that HTTP method (see ``Allow``)."
)
RequestTimeout = _error(
    "RequestTimeout", "request_timeout", "HTTP 408: the request body did not arrive within the relay's body timeout."
)
RequestLineTooLong = _error(
    "RequestLineTooLong", "request_line_too_long", "HTTP 414: the request line (path and query) is over 8190 bytes."
)
HeadersTooLarge = _error(
    "HeadersTooLarge", "headers_too_large", "HTTP 431: a request header field is over 8190 bytes, or too many fields."
)

# An answer without a symbol (a proxy's HTML 502, ...) is classified by its HTTP status.
_STATUS_SYMBOL = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    414: "request_line_too_long",
    422: "invalid_params",
    429: "rate_limited",
    431: "headers_too_large",
    500: "internal_error",
    502: "service_unavailable",
    503: "service_unavailable",
    504: "service_unavailable",
}
# Codes that name one symbol only, for a JSON-RPC error whose data lost its symbol.
_CODE_SYMBOL = {
    code: s for s, (code, _) in ERROR_SYMBOLS.items() if [c for c, _ in ERROR_SYMBOLS.values()].count(code) == 1
}


def lease_refused(exc: RelayError) -> bool:
    """Whether a ``state_changed`` is the relay refusing the call's lease token (missing or not the current one)."""
    data = exc.data if isinstance(exc.data, dict) else {}
    details = data.get("details") if isinstance(data.get("details"), dict) else data
    return exc.symbol == "state_changed" and details.get("field") == "lease_token"


def error_class(symbol: str | None) -> type[RelayError]:
    """The exception class for a relay error symbol; :class:`RelayError` for an unknown one."""
    return _CLASSES.get(symbol or "", RelayError)


# =========================================================================== results


def _ts(value: Any) -> datetime | None:
    # The relay writes ISO 8601 with a 'Z' and microseconds; fromisoformat (3.11+) reads it.
    if value is None:
        return None
    return datetime.fromisoformat(value)


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


# =========================================================================== Server-Sent Events

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEParser:
    """An incremental ``text/event-stream`` parser (the WHATWG HTML "event stream" rules).

    :meth:`feed` takes the body's bytes as they arrive, in chunks of any size (a chunk may
    end inside a UTF-8 sequence or between ``\\r`` and ``\\n``), and returns what they
    completed: ``("comment", text)`` for a ``:`` line and ``("event", type, data, id)``
    for each dispatched event, where ``type`` defaults to ``"message"``, ``data`` is the
    ``data:`` lines joined with ``\\n`` and ``id`` the last event ID seen so far (it
    persists across events, as the standard says). An event with no ``data`` line is not
    dispatched. ``retry`` holds the last valid ``retry:`` value, in milliseconds.
    """

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._buffer = ""
        self._started = False
        self._type = ""
        self._data: list[str] = []
        self.last_id: str | None = None
        self.retry: int | None = None

    def feed(self, chunk: bytes) -> list[tuple]:
        text = self._decode(chunk)
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        self._buffer += text
        out: list[tuple] = []
        pos = 0
        while (m := _LINE_END.search(self._buffer, pos)) is not None:
            if m.group() == "\r" and m.end() == len(self._buffer):
                break  # a "\r\n" may be split across chunks: wait for the next one
            item = self._line(self._buffer[pos : m.start()])
            if item is not None:
                out.append(item)
            pos = m.end()
        self._buffer = self._buffer[pos:]
        return out

    def _line(self, line: str) -> tuple | None:
        if not line:
            if not self._data:
                self._type = ""
                return None
            event = ("event", self._type or "message", "\n".join(self._data), self.last_id)
            self._type, self._data = "", []
            return event
        if line.startswith(":"):
            return ("comment", line[1:].strip())
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None


def _body_chunks(resp: requests.Response) -> Iterator[bytes]:
    """The response body as it arrives: whatever the socket has, never waiting for a full buffer.

    ``iter_content(chunk_size=None)`` waits for the end of a body sent without chunked
    encoding (a proxy may de-chunk a stream), so read ``read1`` where urllib3 has it (2.x).
    """
    raw = resp.raw
    if hasattr(raw, "read1"):
        while chunk := raw.read1(65536, decode_content=True):
            yield chunk
    else:  # urllib3 1.26
        yield from resp.iter_content(chunk_size=None)


# Raised while a streamed body is read (read1 bypasses requests, so urllib3's errors arrive unwrapped).
_READ_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)

#: the feed's longest single wait, seconds (the relay refuses more)
MAX_WAIT_SECONDS = 60


# =========================================================================== the client


def _when(value: datetime | str | None, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            # The relay refuses naive times, and guessing a zone here would silently shift a catch-up.
            raise ValueError(f"{name} must be timezone-aware, got {value!r}")
        return value.isoformat()
    raise TypeError(f"{name} must be a datetime or an ISO 8601 string, got {type(value).__name__}")


def _text_message(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"type": "text", "text": text}]}


def _retry_after(resp: requests.Response) -> float | None:
    seconds = parse_retry_after(resp.headers.get("Retry-After"))
    return None if seconds is None else float(seconds)


class _StreamPosition:
    """Where a :meth:`RelayClient.stream` is, across its reconnects."""

    def __init__(self, url: str, after: str | None, skip: set[str], on_ready: Callable[[], None] | None):
        self.url = url
        self.last_id = after  # sent as Last-Event-ID
        self.skip = skip  # the caller's seen ids (a since replay yields them again)
        self.recent: deque[str] = deque(maxlen=1000)  # ids yielded lately: a repeat is dropped
        self.on_ready = on_ready
        self.retry_ms: int | None = None  # the relay's "retry:" field
        self.opened = False  # any connection got a 200 text/event-stream
        self.ready = False  # this connection has its start position

    def mark_ready(self) -> None:
        if not self.ready:
            self.ready = True
            if self.on_ready is not None:
                self.on_ready()

    def take(self, data: str, event_id: str | None) -> FeedRow | None:
        """The row a message event carries, or None when it was yielded or seen already."""
        try:
            row = FeedRow.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadResponse(f"{self.url} sent an event that is not a feed row: {exc}") from None
        self.last_id = event_id or row.id
        self.mark_ready()  # a relay that sends no ': ready' comment: the first event says it
        if row.id in self.skip or row.id in self.recent:
            return None
        self.recent.append(row.id)
        return row


class RelayClient:
    """A client of one relay for one agent (its API key).

    Args:
        base_url: the relay's root, e.g. ``"https://relay.example.com"``.
        api_key: the agent's key (``ah_live_...``), sent as ``Authorization: Bearer``.
        timeout: seconds to wait for a connection and, separately, for the answer.
        max_retries: retries after the first attempt of one call (so at most
            ``max_retries + 1`` HTTP requests).
        backoff: seconds before the first retry; doubles each retry (capped at
            ``max_backoff``) with up to 25 % random jitter so many clients do not retry
            in step.
        session: a ``requests.Session`` to use (closed by :meth:`close` only if the
            client made it itself).
        retry_refused: retry a refused connection too (default: raise it at once).
        on_retry: called with a :class:`RetryNotice` before each retry's wait, e.g. to
            tell a user why a call is taking long; what it raises propagates.
        leases: where the client keeps the lease tokens its accepts and renews got,
            ``task_id -> token`` (default: a dict of its own, for this process only).

    Leases (docs/decisions.md, "The work lifecycle"). ``accept(..., lease_seconds=N)`` answers a ``lease_token``; the
    client remembers it per task and sends it on :meth:`complete`, :meth:`fail`,
    :meth:`release` and :meth:`renew` unless the call gives ``lease_token`` itself. Only
    tokens this client got from its own accept or renew are remembered (a :meth:`get`
    shows the current token but does not adopt it: that would defeat the fencing between
    two sessions of one agent). A token is forgotten when the lease ends through this
    client (complete, fail, release) or the relay refuses it as stale.

    Retries. A call is retried when the relay could not answer it: a connection reset
    or dropped before the answer, a timeout, an HTTP 5xx, a JSON-RPC
    ``service_unavailable`` error, or HTTP 429 (after the ``Retry-After`` seconds; a
    wait longer than ``max_retry_wait`` is not slept but raised as :class:`RateLimited`).
    A refused connection (nothing listens at ``base_url``: a wrong URL, or the relay is
    down) is raised as :class:`RelayConnectionError` on the first attempt, since waiting
    seconds for a port to open rarely helps; pass ``retry_refused=True`` to retry it
    like the rest (say, while a relay restarts). Domain errors (4xx, JSON-RPC errors other
    than ``service_unavailable``) are raised at once. A refused connection never reached
    the relay; any other attempt that failed in transit may still have been carried out:

    * ``send``/``reply`` are safe to retry because every call carries a
      ``client_idempotency_key`` (generated unless given) that stays the same across
      the client's retries of that call; the relay answers a replay with the first
      result (docs/api.md, "Conventions"), so a retry never makes a second thread.
    * transitions (``accept``, ``complete``, ``cancel``, ``decline``, ``fail``,
      ``release``, ``renew``) are not idempotent at the relay. If an attempt
      was carried out but its answer was lost, the retry answers
      :class:`InvalidTransition` (the thread already moved) or :class:`StateChanged`;
      the client raises that as it is (``attempts > 1`` on the exception tells you a
      retry happened): read the thread with :meth:`get` to see where it stands.
    * reads are always safe to retry.

    Tests may replace ``_sleep`` (``time.sleep`` by default) to observe or skip waits.
    The client is a context manager; leaving it closes its session. Use one client per
    thread: a ``requests.Session`` is not guaranteed to be thread-safe.
    """

    #: cap on one exponential-backoff wait, seconds
    max_backoff: float = 30.0
    #: the longest ``Retry-After`` the client will sleep through, seconds
    max_retry_wait: float = 60.0

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 10.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        session: requests.Session | None = None,
        *,
        retry_refused: bool = False,
        on_retry: Callable[[RetryNotice], None] | None = None,
        leases: MutableMapping[str, str] | None = None,
    ):
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        check_settings(base_url, api_key)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.retry_refused = retry_refused
        self.on_retry = on_retry
        self._own_session = session is None
        self.session = session if session is not None else requests.Session()
        self._sleep: Callable[[float], None] = time.sleep
        self._ids = itertools.count(1)
        self._handle: str | None = None
        #: task_id -> the lease token an accept (or renew) answered this client; sent on
        #: complete/fail/release/renew when no ``lease_token`` is given. In-process unless
        #: ``leases`` (any mutable mapping, such as relay-agent's file) was passed.
        self.leases: MutableMapping[str, str] = leases if leases is not None else {}

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the HTTP session if this client created it."""
        if self._own_session:
            self.session.close()

    def __enter__(self) -> RelayClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RelayClient({self.base_url!r}, handle={self._handle!r})"

    # ------------------------------------------------------------------ JSON-RPC methods (POST /a2a)

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

    # ------------------------------------------------------------------ REST

    def whoami(self) -> Identity:
        """The caller (``GET /api/v1/identities/me``); its handle is cached for the feed.

        Raises :class:`Unauthenticated` for a bad key.
        """
        ident = Identity.from_json(self._rest("GET", "/api/v1/identities/me"))
        self._handle = ident.handle
        return ident

    @property
    def handle(self) -> str:
        """The caller's handle (one ``whoami`` request the first time)."""
        if self._handle is None:
            self.whoami()
        return self._handle  # type: ignore[return-value]

    def block(self, handle: str) -> None:
        """Block ``handle``: its new handoffs to the caller fail with ``teammate_blocked``.

        Existing threads carry on (docs/decisions.md). Raises :class:`IdentityNotFound`
        / :class:`InvalidParams` for a handle that names no agent / is malformed.
        """
        self._rest("PUT", f"{self._identity_path(None)}/blocks/{quote(handle, safe='@')}")

    def unblock(self, handle: str) -> None:
        """Unblock ``handle`` (no error if it was not blocked)."""
        self._rest("DELETE", f"{self._identity_path(None)}/blocks/{quote(handle, safe='@')}")

    def messages(
        self,
        handle: str | None = None,
        *,
        direction: str | None = None,
        q: str | None = None,
        since: datetime | str | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
        role: str | None = None,
        requester_handle: str | None = None,
        worker_handle: str | None = None,
        limit: int = 100,
    ) -> Iterator[FeedRow]:
        """Every feed row matching the filters, newest first, across all pages.

        ``GET /api/v1/identities/{handle}/a2a/messages``, following ``next_cursor`` until
        it is null (a short page is not the end: pages also stop at a byte budget).
        ``handle`` defaults to the caller's own (a key reads only its own identity).
        Filters: ``direction`` ``inbound``/``outbound``/``both`` (who owns the task);
        ``role`` ``caller``/``agent`` (who wrote the message); ``q`` full-text search,
        1-500 characters; ``since`` inclusive on ``created_at``; ``task_id``,
        ``context_id``, ``requester_handle``, ``worker_handle``; ``limit`` rows per page, 1-100.

        Lazy: requests are made as the iterator is consumed, so errors
        (:class:`Forbidden`, :class:`IdentityNotFound`, :class:`InvalidParams`) surface on
        the first ``next()``.
        """
        query: dict[str, Any] = {
            "direction": direction,
            "q": q,
            "since": _when(since, "since"),
            "task_id": task_id,
            "context_id": context_id,
            "role": role,
            "requester_handle": requester_handle,
            "worker_handle": worker_handle,
            "limit": limit,
        }
        query = {k: v for k, v in query.items() if v is not None}
        return self._iter_feed(handle, query)

    def messages_page(self, handle: str | None = None, *, cursor: str | None = None, **filters: Any) -> Page[FeedRow]:
        """One page of the feed (filters as :meth:`messages`); ``next_cursor`` None on the last page."""
        if "since" in filters:
            filters["since"] = _when(filters["since"], "since")
        query = {k: v for k, v in {**filters, "cursor": cursor}.items() if v is not None}
        body = self._rest("GET", f"{self._identity_path(handle)}/a2a/messages", params=query)
        return Page(
            items=tuple(FeedRow.from_json(r) for r in body.get("items", [])),
            next_cursor=body.get("next_cursor"),
            raw=body,
        )

    def search(self, q: str, **filters: Any) -> Iterator[FeedRow]:
        """Feed rows whose text matches ``q`` (PostgreSQL ``websearch_to_tsquery``: any text is
        valid; quotes, ``-word``, ``or``), newest first, all pages. Same as ``messages(q=q, ...)``."""
        return self.messages(q=q, **filters)

    def catch_up(self, since: datetime | str, *, seen: Iterable[str] = (), **filters: Any) -> list[FeedRow]:
        """Every message at or after ``since``, each once, **oldest first** (docs/api.md, "Catching up after downtime").

        The feed's recovery loop: page the feed with ``since`` (inclusive, so the message
        at the saved time comes back: pass ids already processed in ``seen`` to drop
        them), follow ``next_cursor`` until it is null (a short page does not mean the
        end), and deduplicate on message ``id``. The feed walks newest first; the result
        is reversed so it can be processed in order and its last row's ``created_at``
        saved as the next ``since``. ``filters`` are :meth:`messages`'s (e.g.
        ``direction="inbound"``, ``limit=100``).
        """
        skip = set(seen)
        rows: list[FeedRow] = []
        for row in self.messages(since=since, **filters):
            if row.id in skip:
                continue
            skip.add(row.id)
            rows.append(row)
        rows.reverse()
        return rows

    def wait(
        self,
        *,
        after: str | None = None,
        since: datetime | str | None = None,
        seen: Iterable[str] = (),
        timeout: float = 60.0,
        handle: str | None = None,
        limit: int = 100,
        **filters: Any,
    ) -> list[FeedRow]:
        """Block until messages arrive after a position; return them **oldest first**, [] on timeout.

        A long-poll of the feed (``GET .../a2a/messages?wait=N``): the relay holds each
        request until a matching message commits (at most 60 s a request, so a longer
        ``timeout`` is several requests in a row) and answers at once when one is already
        there. The position is one of:

        * ``after``: a message id; only messages after it in the feed (exclusive).
        * ``since`` (an aware datetime or ISO 8601 string; inclusive) with ``seen``, the ids
          already processed at exactly that time, as :func:`next_position` returns them.
          Ignored when ``after`` is given.
        * neither: "now", the newest message matching ``filters`` when the call starts (one
          extra request).

        ``timeout`` is in seconds (the relay waits in whole seconds, so the call may end up
        to a second late; the client's retries of a failed request come on top); 0 reads
        once without waiting. What is returned is :meth:`catch_up`'s: every
        page followed, each message once, ``seen`` left out. The next position is the last
        row's ``id`` (or :func:`next_position` of the rows). ``filters`` are
        :meth:`messages`'s (``direction``, ``role``, ``task_id``, ...); ``limit`` is rows
        per page (1-100).

        Raises :class:`InvalidParams` (``after`` is not a message of this feed, a bad
        filter), :class:`RateLimited` (the agent already holds the relay's limit of waits
        and streams, ``RELAY_STREAMS_PER_AGENT``, still so after the client's retries),
        :class:`Unauthenticated` (the key was revoked, even mid-wait), or a transport error.
        """
        if timeout < 0:
            raise ValueError("timeout must be >= 0 seconds")
        deadline = time.monotonic() + timeout
        path = f"{self._identity_path(handle)}/a2a/messages"
        query: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        if "cursor" in query:
            raise TypeError("wait takes no cursor: it waits for what comes after a position")
        query["limit"] = limit
        if after is not None:
            query["after"] = after
        elif since is not None:
            query["since"] = _when(since, "since")
        else:
            newest = self._rest("GET", path, params={**query, "limit": 1}).get("items") or []
            if newest:
                query["after"] = newest[0]["id"]
        skip = set(seen)
        while True:
            remaining = deadline - time.monotonic()
            seconds = min(MAX_WAIT_SECONDS, math.ceil(remaining)) if remaining > 0 else 0
            first = {**query, "wait": seconds} if seconds else query
            # The read timeout outlasts the relay's wait; the connect timeout stays the client's.
            body = self._rest("GET", path, params=first, timeout=(self.timeout, seconds + self.timeout))
            items = body.get("items") or []
            if items:
                rows = [FeedRow.from_json(r) for r in items]
                cursor, used = body.get("next_cursor"), set()
                while cursor:  # a short page is not the end
                    cursor = _next_cursor(cursor, used)
                    page = self._rest("GET", path, params={**query, "cursor": cursor})
                    rows += [FeedRow.from_json(r) for r in page.get("items") or []]
                    cursor = page.get("next_cursor")
                fresh: list[FeedRow] = []
                for row in rows:
                    if row.id not in skip:
                        skip.add(row.id)
                        fresh.append(row)
                if fresh:
                    fresh.reverse()
                    return fresh
                # Only rows already seen (since is inclusive): wait after the newest of them.
                query.pop("since", None)
                query["after"] = rows[0].id
            if remaining <= 0:
                return []

    def stream(
        self,
        *,
        after: str | None = None,
        since: datetime | str | None = None,
        seen: Iterable[str] = (),
        handle: str | None = None,
        idle_timeout: float = 45.0,
        max_failures: int | None = 5,
        on_ready: Callable[[], None] | None = None,
        **filters: Any,
    ) -> Iterator[FeedRow]:
        """The feed's new messages as they commit, **oldest first**, each once: an endless iterator.

        Reads ``GET .../a2a/messages/stream`` (Server-Sent Events; ``filters`` as
        :meth:`messages`'s, e.g. ``direction="inbound"``). Where it starts:

        * ``after``: a message id; messages after it (sent as ``Last-Event-ID``).
        * ``since`` (inclusive) with ``seen`` (ids at exactly that time to leave out): a
          replay from that time, then new messages. Ignored when ``after`` is given.
        * neither: new messages only, from the newest one when the relay takes the position.

        When the connection drops, the relay closes it, no byte (not even the relay's
        heartbeat, every 15 s by default) arrives for ``idle_timeout`` seconds, or the
        relay answers 5xx or 429, the iterator reconnects with ``Last-Event-ID`` set to the
        last message it yielded, so nothing is skipped and nothing repeated. It first
        waits the relay's ``retry:`` time (2 s), doubling after each failed attempt in a
        row up to ``max_backoff`` (30 s), with jitter, or the ``Retry-After`` of a 429 if
        longer; ``on_retry`` (see the class) hears of each reconnect. When ``max_failures``
        reconnects in a row have failed (no stream opened; None: no limit) the last error
        is raised: :class:`RelayConnectionError`, :class:`RateLimited`,
        :class:`ServiceUnavailable`, :class:`InternalError`. A refused connection on the
        very first attempt is raised at once unless ``retry_refused``.

        ``on_ready`` is called each time a connection is open and the relay has taken its
        start position (its ``: ready`` comment): a message committed from then on will be
        yielded.

        Lazy: nothing is sent until the first ``next()``. Raises :class:`StreamUnavailable`
        (no stream at this relay: HTTP 404/405/501, or not ``text/event-stream``; poll
        instead), :class:`Unauthenticated`/:class:`Forbidden`/:class:`IdentityNotFound`/
        :class:`InvalidParams` as the relay answers them, and, mid-stream, the class of the
        relay's final ``event: error`` (``unauthenticated`` once the key is revoked or the
        agent disabled). Closing the iterator (``close()``, or leaving a ``for`` loop)
        closes the connection.
        """
        return self._stream_rows(
            handle,
            after,
            _when(since, "since") if after is None else None,
            set(seen),
            idle_timeout,
            max_failures,
            on_ready,
            {k: v for k, v in filters.items() if v is not None},
        )

    def _stream_rows(
        self,
        handle: str | None,
        after: str | None,
        since: str | None,
        skip: set[str],
        idle_timeout: float,
        max_failures: int | None,
        on_ready: Callable[[], None] | None,
        filters: dict[str, Any],
    ) -> Iterator[FeedRow]:
        path = f"{self._identity_path(handle)}/a2a/messages/stream"
        at = _StreamPosition(self.base_url + path, after, skip, on_ready)
        failures = 0  # connections in a row that ended before the stream was open and ready
        while True:
            at.ready = False
            error, asked = yield from self._stream_once(path, at, since, idle_timeout, filters)
            failures = 1 if at.ready else failures + 1
            if not at.opened and getattr(error, "reason", "") == "connection refused" and not self.retry_refused:
                raise error  # nothing listens at the URL: said at once, as for every other call
            if max_failures is not None and failures > max_failures:
                error.attempts = failures
                raise error
            base = at.retry_ms / 1000 if at.retry_ms is not None else max(self.backoff, 0.1)
            delay = min(self.max_backoff, base * 2 ** (failures - 1))
            delay = max(delay + random.uniform(0, delay / 4), asked or 0.0)
            if self.on_retry is not None:
                reason = getattr(error, "reason", None) or error.symbol or "error"
                connection = error.symbol == "connection_error"
                self.on_retry(RetryNotice("GET", at.url, failures, max_failures or 0, delay, reason, connection))
            self._sleep(delay)

    def _stream_once(
        self, path: str, at: _StreamPosition, since: str | None, idle_timeout: float, filters: dict[str, Any]
    ) -> Generator[FeedRow, None, tuple[RelayError, float | None]]:
        """One connection of :meth:`stream`: yield its rows; return ``(error, retry_after)`` once it
        ends in a way a reconnect may mend. Errors no reconnect mends are raised."""
        headers = {**self._headers(), "Accept": "text/event-stream", "Cache-Control": "no-cache"}
        params = dict(filters)
        if at.last_id is not None:
            headers["Last-Event-ID"] = at.last_id
        elif since is not None:
            params["since"] = since
        try:
            resp = self.session.get(
                at.url,
                params=params,
                headers=headers,
                stream=True,
                timeout=(self.timeout, idle_timeout),
                allow_redirects=False,
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            error = RelayConnectionError(f"GET {at.url} failed: {exc}", reason=transport_reason(exc))
            error.__cause__ = exc
            return error, None
        try:
            request_id = resp.headers.get("X-Request-Id")
            if resp.status_code != 200:
                error = self._answer_error(resp, 1, "GET", path)
                if resp.status_code == 429:
                    error.reason = "rate limited (HTTP 429)"  # type: ignore[attr-defined]
                    return error, getattr(error, "retry_after", None)
                if resp.status_code >= 500:
                    error.reason = f"HTTP {resp.status_code}"  # type: ignore[attr-defined]
                    return error, None
                if resp.status_code in (404, 405, 501) and error.symbol != "identity_not_found":
                    raise StreamUnavailable(
                        f"{at.url} answered HTTP {resp.status_code}: this relay has no message stream",
                        http_status=resp.status_code,
                        request_id=request_id,
                    )
                raise error
            kind = resp.headers.get("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                raise StreamUnavailable(
                    f"{at.url} answered {kind or 'no Content-Type'}, not text/event-stream",
                    http_status=resp.status_code,
                    request_id=request_id,
                )
            at.opened = True
            parser = SSEParser()
            chunks = _body_chunks(resp)
            while True:
                try:
                    chunk = next(chunks, b"")
                except _READ_ERRORS as exc:
                    error = RelayConnectionError(f"the stream from {at.url} broke: {exc}", reason=transport_reason(exc))
                    error.__cause__ = exc
                    return error, None
                if not chunk:
                    return RelayConnectionError(
                        f"{at.url} ended the stream", reason="the relay closed the stream"
                    ), None
                for item in parser.feed(chunk):
                    if item[0] == "comment":
                        if item[1] == "ready":
                            at.mark_ready()
                        continue
                    _, event, data, event_id = item
                    if event == "error":
                        raise self._stream_error(resp, data)
                    if event == "message":
                        row = at.take(data, event_id)
                        if row is not None:
                            yield row
                if parser.retry is not None:
                    at.retry_ms = parser.retry
        finally:
            resp.close()

    def _stream_error(self, resp: requests.Response, data: str) -> RelayError:
        """The exception for a stream's final ``event: error`` (``data: {"code", "message"}``)."""
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return BadResponse(f"the stream ended with an error event that is not JSON: {data[:200]}")
        symbol = doc.get("code") if isinstance(doc.get("code"), str) else None
        return error_class(symbol)(
            str(doc.get("message") or "the relay ended the stream"),
            symbol=symbol,
            data=doc,
            request_id=resp.headers.get("X-Request-Id"),
            http_status=resp.status_code,
        )

    # ------------------------------------------------------------------ internals

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

    def _iter_feed(self, handle: str | None, query: dict[str, Any]) -> Iterator[FeedRow]:
        path = f"{self._identity_path(handle)}/a2a/messages"
        cursor, used = None, set()
        while True:
            body = self._rest("GET", path, params={**query, **({"cursor": cursor} if cursor else {})})
            for r in body.get("items", []):
                yield FeedRow.from_json(r)
            if not body.get("next_cursor"):  # null only on the last page: a short page is not the end
                return
            cursor = _next_cursor(body["next_cursor"], used)

    def _identity_path(self, handle: str | None) -> str:
        return f"/api/v1/identities/{quote(handle or self.handle, safe='@')}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}

    def _delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2**attempt))
        return base + random.uniform(0, base / 4)

    def _rpc(self, method: str, params: dict[str, Any]) -> Any:
        """Call one JSON-RPC method; return its ``result`` or raise the error's class."""
        envelope = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}

        def rpc_unavailable(resp: requests.Response) -> bool:
            # -32603 service_unavailable comes with HTTP 200 inside a JSON-RPC answer when the
            # database dropped mid-request: the relay asks to retry, like a 503.
            if resp.status_code != 200:
                return False
            try:
                err = resp.json().get("error") or {}
            except (ValueError, AttributeError):
                return False
            data = err.get("data")
            return isinstance(data, dict) and data.get("symbol") == "service_unavailable"

        resp, attempts = self._exchange("POST", "/a2a", json_body=envelope, retry_also=rpc_unavailable)
        doc = self._json(resp)
        if resp.status_code == 200 and isinstance(doc, dict) and "result" in doc and "error" not in doc:
            return doc["result"]
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            err = doc["error"]
            data = err.get("data")
            symbol = data.get("symbol") if isinstance(data, dict) else None
            code = err.get("code") if isinstance(err.get("code"), int) else None
            if symbol is None:
                symbol = _CODE_SYMBOL.get(code) or _STATUS_SYMBOL.get(resp.status_code)
            raise self._make_error(resp, attempts, symbol, code, str(err.get("message") or ""), data)
        raise self._make_error(
            resp,
            attempts,
            _STATUS_SYMBOL.get(resp.status_code),
            None,
            f"unexpected answer to {method} (HTTP {resp.status_code}): {resp.text[:200]}",
            None,
        )

    def _rest(
        self,
        verb: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        *,
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        """One REST call; return its JSON body (None for 204) or raise the error's class.

        ``timeout`` overrides the client's for this call (a long-poll waits longer than that)."""
        resp, attempts = self._exchange(verb, path, params=params, json_body=json_body, timeout=timeout)
        if 200 <= resp.status_code < 300:
            return self._json(resp) if resp.content else None
        raise self._answer_error(resp, attempts, verb, path)

    def _answer_error(self, resp: requests.Response, attempts: int, verb: str, path: str) -> RelayError:
        """The exception for a REST answer that is not 2xx: its envelope's symbol, else its status's."""
        doc = self._json(resp)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            symbol = err.get("code") if isinstance(err.get("code"), str) else None
            return self._make_error(
                resp,
                attempts,
                symbol or _STATUS_SYMBOL.get(resp.status_code),
                None,
                str(err.get("message") or ""),
                err.get("details"),
            )
        return self._make_error(
            resp,
            attempts,
            _STATUS_SYMBOL.get(resp.status_code),
            None,
            f"HTTP {resp.status_code} from {verb} {path}: {resp.text[:200]}",
            None,
        )

    @staticmethod
    def _json(resp: requests.Response) -> Any:
        try:
            return resp.json()
        except ValueError:
            return None

    def _make_error(
        self, resp: requests.Response, attempts: int, symbol: str | None, code: int | None, message: str, data: Any
    ) -> RelayError:
        request_id = resp.headers.get("X-Request-Id")
        if request_id is None and isinstance(data, dict) and isinstance(data.get("request_id"), str):
            request_id = data["request_id"]
        kw: dict[str, Any] = dict(
            symbol=symbol, code=code, data=data, request_id=request_id, http_status=resp.status_code, attempts=attempts
        )
        cls = error_class(symbol)
        if cls is RateLimited:
            retry_after = _retry_after(resp)
            if retry_after is None and isinstance(data, dict) and isinstance(data.get("retry_after"), (int, float)):
                retry_after = float(data["retry_after"])
            return RateLimited(message, retry_after=retry_after, **kw)
        return cls(message, **kw)

    def _exchange(
        self,
        verb: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        retry_also: Callable[[requests.Response], bool] | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> tuple[requests.Response, int]:
        """Make the HTTP request, retrying transient failures; return the last answer and the attempt count.

        The same body (hence the same idempotency key) is sent on every attempt.
        Raises :class:`RelayConnectionError` when no attempt got an answer.
        """
        url = self.base_url + path
        attempt = 0

        def wait(delay: float, reason: str, connection: bool = False) -> None:
            if self.on_retry is not None:
                self.on_retry(RetryNotice(verb, url, attempt, self.max_retries, delay, reason, connection))
            self._sleep(delay)

        while True:
            attempt += 1
            retries_left = attempt <= self.max_retries
            try:
                resp = self.session.request(
                    verb,
                    url,
                    params=params,
                    json=json_body,
                    headers=self._headers(),
                    timeout=self.timeout if timeout is None else timeout,
                    allow_redirects=False,
                )
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                # ConnectionError covers refused, reset and dropped-before-answer
                # (RemoteDisconnected); requests' pool discards that connection, so the
                # retry opens a fresh one. A refused connect reached nothing: no retry.
                reason = transport_reason(exc)
                if not retries_left or (reason == "connection refused" and not self.retry_refused):
                    raise RelayConnectionError(
                        f"{verb} {url} failed after {attempt} attempt(s): {exc}", reason=reason, attempts=attempt
                    ) from exc
                wait(self._delay(attempt - 1), reason, connection=True)
                continue
            if resp.status_code == 429:
                asked = _retry_after(resp)
                if not retries_left or (asked is not None and asked > self.max_retry_wait):
                    return resp, attempt
                # Retry-After is whole seconds rounded up, so sleeping it is enough; the jitter
                # keeps clients that were refused together from returning together.
                wait(
                    (asked if asked is not None else self._delay(attempt - 1)) + random.uniform(0, self.backoff / 4),
                    "rate limited (HTTP 429)",
                )
                continue
            if resp.status_code >= 500 or (retry_also is not None and retry_also(resp)):
                if not retries_left:
                    return resp, attempt
                reason = f"HTTP {resp.status_code}" if resp.status_code >= 500 else "service unavailable"
                wait(self._delay(attempt - 1), reason)
                continue
            return resp, attempt


# =========================================================================== webhooks


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes | str) -> dict:
    """Verify a webhook delivery and return its parsed payload.

    ``secret`` is the endpoint's ``whsec_...`` secret (shown once when the endpoint is
    created or its secret rotated); ``headers`` the delivery's HTTP headers (any case:
    ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``); ``body`` the raw request
    body exactly as received (bytes or str; re-serialised JSON will not verify).

    The relay signs per Standard Webhooks (docs/webhooks.md): HMAC-SHA256
    over ``id.timestamp.body``, ``v1,<base64>``, and during a secret rotation with both
    secrets (either verifies). A timestamp more than 5 minutes from now is refused, which
    stops replays. Dedupe deliveries on ``webhook-id``: it is the same on every attempt.

    Returns the payload ``{"type": "message.created" | "task.updated", "timestamp", "data"}``.
    Raises :class:`WebhookVerificationError` for a bad or missing signature, a stale
    timestamp, a malformed header or secret, or a body that is not JSON.
    """
    import standardwebhooks

    try:
        payload = standardwebhooks.Webhook(secret).verify(body, dict(headers))
    except Exception as exc:  # the library also lets ValueError/binascii.Error out of malformed headers
        raise WebhookVerificationError(f"webhook did not verify: {exc}") from exc
    if not isinstance(payload, dict):
        raise WebhookVerificationError("webhook payload is not a JSON object")
    return payload
