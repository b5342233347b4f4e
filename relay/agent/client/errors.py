"""The client's exceptions: one class per relay error symbol, and the tables that pick one for an answer."""

from __future__ import annotations

from typing import Any


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
