"""Relay errors: one symbol each, mapped to a JSON-RPC code and an HTTP status.

Codes -32004..-32013 come from seed 000's error tables; -32001/-32003 and the HTTP
statuses from DESIGN.md ("JSON-RPC endpoint", "REST").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError

# symbol -> (JSON-RPC code, HTTP status for REST)
ERRORS: dict[str, tuple[int, int]] = {
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
    # A2A v1.0 binding only (relay/transport/a2a.py answers them with A2A's own codes).
    "unsupported_operation": (-32018, 400),
    "version_not_supported": (-32019, 400),
}


class RelayError(Exception):
    """A domain error with a stable ``symbol``; transports map it to their own shape."""

    def __init__(self, symbol: str, message: str, details: Any = None):
        if symbol not in ERRORS:
            raise ValueError(f"unknown error symbol {symbol!r}")
        super().__init__(message)
        self.symbol = symbol
        self.message = message
        self.details = details

    @property
    def code(self) -> int:
        """The JSON-RPC error code."""
        return ERRORS[self.symbol][0]

    @property
    def http_status(self) -> int:
        """The HTTP status used by the REST transport."""
        return ERRORS[self.symbol][1]


def invalid(field: str, reason: str) -> RelayError:
    """Return an ``invalid_params`` error naming one field and why it was refused."""
    return RelayError("invalid_params", f"{field}: {reason}", {field: [reason]})


# SQLSTATE classes about the connection or the server, not the statement: 08 connection
# exception, 53 insufficient resources, 57P operator intervention (shutdown, crash).
_CONNECTION_SQLSTATES = ("08", "53", "57P")


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` means the database could not be reached or used, not that a statement was wrong.

    That is: SQLAlchemy invalidated the connection (a disconnect), or the driver's error
    has a connection-level SQLSTATE (class 08, 53 or 57P), or it is an OperationalError
    with no SQLSTATE at all (refused, reset, timed out before the server answered).
    """
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    code = getattr(exc.orig, "pgcode", None)
    if code is None:
        return isinstance(exc, OperationalError)
    return code.startswith(_CONNECTION_SQLSTATES)


def error_cause(exc: BaseException) -> tuple[str | None, str]:
    """``(SQLSTATE or None, first line of the server's message)`` of a database error.

    Never the statement or its parameters (message bodies).
    """
    orig = getattr(exc, "orig", None) or exc
    message = getattr(getattr(orig, "diag", None), "message_primary", None) or str(orig)
    lines = message.strip().splitlines()
    return getattr(orig, "pgcode", None), lines[0][:500] if lines else type(orig).__name__
