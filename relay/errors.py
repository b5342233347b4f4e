"""Relay errors: one symbol each, mapped to a JSON-RPC code and an HTTP status.

The codes and HTTP statuses are the table of docs/api.md, "Errors": -32001 an unauthenticated
call (401), -32003 a rate limit (429), -32004..-32013 the relay's own refusals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg2
from sqlalchemy.exc import DBAPIError, InvalidRequestError, ResourceClosedError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# Bounds on what one invalid_params error shows, so a bad body of a few hundred KB (a list
# of 349,000 bad items, 90,000 unknown members) is answered in a few KB, not tens of MB.
MAX_FIELD_ERRORS = 20  # field paths listed; the rest are only counted (``omitted``)
MAX_FIELD_NAME = 120  # characters of one path: an unknown member's name is the caller's text
MAX_REASONS = 5  # reasons kept for one path
MAX_MESSAGE = 2000  # characters of an error's message

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
    # Refusals of the HTTP request itself, before any method (relay/transport/errors.py).
    "method_not_allowed": (-32600, 405),
    "request_timeout": (-32600, 408),
    "request_line_too_long": (-32600, 414),
    "headers_too_large": (-32600, 431),
    # A2A v1.0 binding only (relay/transport/a2a.py answers them with A2A's own codes).
    "unsupported_operation": (-32018, 400),
    "version_not_supported": (-32019, 400),
    "content_type_not_supported": (-32021, 415),
}


class RelayError(Exception):
    """A domain error with a stable ``symbol``; transports map it to their own shape."""

    def __init__(self, symbol: str, message: str, details: Any = None, omitted: int = 0):
        """``omitted``: field errors of an invalid_params error left out of ``details``.

        An invalid_params error's field errors are capped here, wherever it was raised:
        at most MAX_FIELD_ERRORS paths (of MAX_FIELD_NAME characters) stay in ``details``
        and the rest are counted in ``omitted``; the message is cut to MAX_MESSAGE.
        """
        if symbol not in ERRORS:
            raise ValueError(f"unknown error symbol {symbol!r}")
        if symbol == "invalid_params" and isinstance(details, dict) and _needs_cap(details):
            details, more = cap_field_errors(details)
            omitted += more
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        super().__init__(message)
        self.symbol = symbol
        self.message = message
        self.details = details
        self.omitted = omitted

    @property
    def code(self) -> int:
        """The JSON-RPC error code."""
        return ERRORS[self.symbol][0]

    @property
    def http_status(self) -> int:
        """The HTTP status used by the REST transport."""
        return ERRORS[self.symbol][1]


def _needs_cap(details: dict) -> bool:
    return len(details) > MAX_FIELD_ERRORS or any(
        not isinstance(k, str) or len(k) > MAX_FIELD_NAME or (isinstance(v, list) and len(v) > MAX_REASONS)
        for k, v in details.items()
    )


def short_path(path: Any) -> str:
    """A field path of at most MAX_FIELD_NAME characters (cut with "…")."""
    text = str(path)
    return text if len(text) <= MAX_FIELD_NAME else text[: MAX_FIELD_NAME - 1] + "…"


def cap_field_errors(
    errors: Mapping[str, Any] | Iterable[tuple[str, Any]], limit: int = MAX_FIELD_ERRORS
) -> tuple[dict[str, Any], int]:
    """Return the first ``limit`` field errors (paths shortened) and the count of the others.

    ``errors`` is ``{path: [reasons]}`` or ``(path, reasons)`` pairs; reasons of one path
    (two long paths may shorten alike) are merged up to MAX_REASONS. The count is of
    errors not shown: further paths, and reasons past MAX_REASONS.
    """
    kept: dict[str, Any] = {}
    omitted = 0
    for path, reasons in errors.items() if isinstance(errors, Mapping) else errors:
        key = short_path(path)
        if not isinstance(reasons, (list, tuple)):
            reasons = [reasons]
        if key in kept:  # two paths shortened alike
            room = max(MAX_REASONS - len(kept[key]), 0)
            kept[key] = [*kept[key], *reasons[:room]]
            omitted += max(len(reasons) - room, 0)
        elif len(kept) < limit:
            kept[key] = list(reasons[:MAX_REASONS])
            omitted += max(len(reasons) - MAX_REASONS, 0)
        else:
            omitted += 1
    return kept, omitted


def invalid_fields(errors: Mapping[str, Any] | Iterable[tuple[str, Any]], omitted: int = 0) -> RelayError:
    """An ``invalid_params`` error listing the first MAX_FIELD_ERRORS field errors, counting the rest.

    The message reads ``invalid params: a.0: reason; b: reason; and 5 more``.
    """
    kept, more = cap_field_errors(errors)
    omitted += more
    summary = "; ".join(f"{path}: {' '.join(str(r) for r in reasons)}" for path, reasons in kept.items())
    if omitted:
        summary += f"; and {omitted} more"
    return RelayError("invalid_params", f"invalid params: {summary}", kept, omitted=omitted)


def invalid(field: str, reason: str) -> RelayError:
    """Return an ``invalid_params`` error naming one field and why it was refused."""
    return RelayError("invalid_params", f"{field}: {reason}", {field: [reason]})


# SQLSTATE classes about the connection or the server, not the statement: 08 connection
# exception, 53 insufficient resources, 57P operator intervention (shutdown, crash), and
# 25006 read_only_sql_transaction: a write reached a standby, which during a failover (the
# pooler not yet repointed at the promoted server) is an outage to retry, not a bug.
_CONNECTION_SQLSTATES = ("08", "53", "57P", "25006")


#: Seconds a 503 (database unreachable, pool exhausted) tells the client to wait (Retry-After).
UNAVAILABLE_RETRY_AFTER = 1

#: What a database outage raises: a driver error, wrapped by SQLAlchemy or raw from a hot
#: path's DBAPI cursor (is_connection_error tells which are outages), a session whose
#: connection was closed under it (ResourceClosedError, an InvalidRequestError), a pool
#: whose every reconnection on checkout failed, or the pool's timeout when no connection
#: came free.
DATABASE_ERRORS = (DBAPIError, psycopg2.Error, InvalidRequestError, PoolTimeout)


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` means the database could not be reached or used, not that a statement was wrong.

    That is: SQLAlchemy invalidated the connection (a disconnect), or the driver's error
    (wrapped by SQLAlchemy, or raw from a hot path's DBAPI cursor) has a connection-level
    SQLSTATE (class 08, 53 or 57P), or it is an OperationalError with no SQLSTATE at all
    (refused, reset, timed out before the server answered), or an InterfaceError or a
    closed session connection (it was cut mid-request: a killed backend, a restarted
    pooler), or a checkout whose reconnections all failed their ping (SQLAlchemy's "This
    connection is closed": a pooler that takes logins but reaches no server, as in a
    failover before the repoint), or the process's pool had no connection free within ``RELAY_DB_POOL_TIMEOUT``
    (the connection budget is full, which a client meets as a retryable 503, never a 500;
    docs/decisions.md, "Scale-out").
    """
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, ResourceClosedError):
        return "connection" in str(exc).lower()
    if isinstance(exc, InvalidRequestError):
        return str(exc) == "This connection is closed"  # pool/base.py: reconnection attempts exhausted
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig
    if isinstance(exc, psycopg2.InterfaceError):
        return True
    if not isinstance(exc, psycopg2.Error):
        return False
    code = exc.pgcode
    if code is None:
        return isinstance(exc, psycopg2.OperationalError)
    return code.startswith(_CONNECTION_SQLSTATES)


def error_cause(exc: BaseException) -> tuple[str | None, str]:
    """``(SQLSTATE or None, first line of the server's message)`` of a database error.

    Never the statement or its parameters (message bodies).
    """
    orig = getattr(exc, "orig", None) or exc
    message = getattr(getattr(orig, "diag", None), "message_primary", None) or str(orig)
    lines = message.strip().splitlines()
    return getattr(orig, "pgcode", None), lines[0][:500] if lines else type(orig).__name__


def is_outage(exc: BaseException) -> bool:
    """True if ``exc`` means a server the relay depends on is unreachable: PostgreSQL (see
    :func:`is_connection_error`) or Redis (a refused, reset or timed-out connection).

    An outage is answered 503 with ``Retry-After``, never logged as a bug.
    """
    import redis

    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return True
    return is_connection_error(exc)


def describe(exc: BaseException) -> dict[str, str]:
    """What may be logged of an unexpected error: ``{"error_class", "pgcode"?, "constraint"?, "table"?}``.

    Only names the schema or the code fixes: the class (``IntegrityError``, or the
    driver's ``CheckViolation`` inside it), the SQLSTATE and the constraint and table
    names. Never the exception's text, which for a database error holds the statement,
    its parameters and the failing row (``DETAIL: Failing row contains (...)``), and so
    message bodies.
    """
    orig = getattr(exc, "orig", None) or exc
    facts = {"error_class": type(exc).__name__}
    if orig is not exc:
        facts["error_class"] += f"/{type(orig).__name__}"
    code = getattr(orig, "pgcode", None)
    if code:
        facts["pgcode"] = code
    diag = getattr(orig, "diag", None)
    for name, attr in (("constraint", "constraint_name"), ("table", "table_name")):
        value = getattr(diag, attr, None) if diag is not None else None
        if value:
            facts[name] = value
    return facts


def safe_traceback(exc: BaseException) -> str:
    """The frames of ``exc`` (file, line, function, source line), without any exception's text."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return "".join(traceback.format_list(frames[-10:]))


def log_unexpected(logger, exc: BaseException, what: str, **extra: Any) -> dict[str, str]:
    """Log an unexpected error at ERROR as ``what: <class> [SQLSTATE]`` with :func:`describe`'s
    fields, ``extra`` (say ``request_id``) and the frames (``stack``); return the fields.

    The one way the relay logs an error it did not expect: the record has no exc_info, so
    no handler prints the exception's text (statement parameters, a failing row).
    """
    facts = describe(exc)
    code = f" {facts['pgcode']}" if "pgcode" in facts else ""
    logger.error("%s: %s%s", what, facts["error_class"], code, extra={**facts, **extra, "stack": safe_traceback(exc)})
    return facts
