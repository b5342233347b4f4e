"""Every error answer the relay sends that a view did not build itself, in the shape of the path's surface.

A path belongs to one surface, each with its own error envelope (docs/api.md, "Errors"):

=============================================  ========  ==========================================
path                                           surface   envelope
=============================================  ========  ==========================================
``/a2a``                                       seed      JSON-RPC error object (the relay's codes)
``/a2a/agents/{handle}``                       a2a       JSON-RPC error object (A2A codes, ErrorInfo)
``/a2a/agents/{handle}/http/...``              a2a_http  ``google.rpc.Status``
``/console/...``                               console   a plain HTML page
anything else (``/api/v1/...``, cards, health)  rest      ``{"error": {code, message, details}}``
=============================================  ========  ==========================================

Here live, once for every surface:

- the unexpected-error path (:func:`unexpected`): roll the session back; an outage
  (PostgreSQL or Redis unreachable) is ``service_unavailable`` (503, ``Retry-After``);
  anything else is logged by class, SQLSTATE and request id only (never the exception's
  text, which holds statement parameters and failing rows: message bodies) and
  answered ``internal_error`` (500) with the request id;
- the answer headers (:func:`_answer_headers`, after every request): ``WWW-Authenticate``
  on every 401, ``Retry-After`` on every 429 (the seconds noted by :func:`retry_later`)
  and 503;
- the envelopes (:func:`envelope`) that the app's catch-all handlers and the gunicorn
  worker's own refusals (relay/transport/server.py: a header too large, a bad
  Content-Length, a request line too long) answer with.
"""

from __future__ import annotations

import html
import logging

import orjson
from flask import Flask, Response, g, has_request_context, request
from werkzeug.exceptions import HTTPException

from relay.errors import ERRORS, UNAVAILABLE_RETRY_AFTER, RelayError, describe, is_connection_error, is_outage
from relay.errors import log_unexpected as _log_unexpected

log = logging.getLogger("relay.errors")

SEED, A2A, A2A_HTTP, REST, CONSOLE = "seed", "a2a", "a2a_http", "rest", "console"
_AGENTS = "/a2a/agents/"
AUTHENTICATE = 'Bearer realm="relay"'


def surface_for(path: str) -> str:
    """The surface (SEED, A2A, A2A_HTTP, CONSOLE or REST) whose error envelope answers ``path``."""
    if path == "/a2a":
        return SEED
    if path.startswith(_AGENTS):
        _handle, slash, tail = path[len(_AGENTS) :].partition("/")
        if not slash:
            return A2A
        if tail == "http" or tail.startswith("http/"):
            return A2A_HTTP
        return REST  # the agent's card, /.well-known/agent-card.json
    if path == "/console" or path.startswith("/console/"):
        return CONSOLE
    return REST


def _request_id() -> str | None:
    return g.get("request_id") if has_request_context() else None


def unexpected(exc: BaseException) -> RelayError:
    """The answer to an exception no rule expected, after rolling the request's session back.

    Returns ``service_unavailable`` (details ``{"request_id"}``; HTTP 503 with
    ``Retry-After``) when PostgreSQL or Redis is unreachable (:func:`relay.errors.is_outage`),
    logged at WARNING by class; else ``internal_error`` (500), logged at ERROR with the
    error's class, SQLSTATE, constraint and table names, the request id and the frames,
    never its text.
    """
    from relay.extensions import db

    try:
        db.session.rollback()
    except Exception:  # noqa: BLE001 (the connection itself is gone; the pool replaces it)
        pass
    request_id = _request_id()
    if is_outage(exc):
        facts = describe(exc)
        server = "the database" if is_connection_error(exc) else "Redis"
        log.warning("%s unavailable: %s", server, facts["error_class"], extra={**facts, "request_id": request_id})
        return RelayError("service_unavailable", f"{server} is unavailable; retry shortly", {"request_id": request_id})
    _log_unexpected(log, exc, "unexpected error", request_id=request_id)
    return RelayError("internal_error", "internal error", {"request_id": request_id})


def retry_later(seconds: int) -> int:
    """Note that this request's answer (a 429) asks the client to wait ``seconds``; return them.

    :func:`_answer_headers` writes it as ``Retry-After`` whichever surface built the answer.
    """
    g._relay_retry_after = seconds
    return seconds


def _answer_headers(resp: Response) -> Response:
    # The one place these headers are added, whichever surface built the answer.
    if resp.status_code == 401:
        resp.headers.setdefault("WWW-Authenticate", AUTHENTICATE)
    elif resp.status_code == 429:
        retry = g.get("_relay_retry_after")
        if retry is not None:
            resp.headers.setdefault("Retry-After", str(retry))
    elif resp.status_code == 503:
        # A pool wait, a restart, a failover: every outage says when to come back.
        resp.headers.setdefault("Retry-After", str(UNAVAILABLE_RETRY_AFTER))
    return resp


# --------------------------------------------------------------------------- envelopes

# The symbol an HTTP-level refusal has on the JSON-RPC surfaces (REST names it by the status).
_HTTP_SYMBOLS = {
    404: "method_not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    414: "request_line_too_long",
    431: "headers_too_large",
}


def symbol_for(status: int, name: str | None = None) -> str:
    """The error symbol of an HTTP-level refusal (405, 413, 431...) on ``status``.

    ``name``: the status's phrase, which gives the REST code of a status the relay has no
    symbol for (``Unsupported Media Type`` -> ``unsupported_media_type``).
    """
    if status in _HTTP_SYMBOLS:
        return _HTTP_SYMBOLS[status]
    if status == 500:
        return "internal_error"
    if status == 503:
        return "service_unavailable"
    if name:
        return name.lower().replace(" ", "_").replace("-", "_")
    return "invalid_request"


def envelope(surface: str, status: int, symbol: str, message: str, details: dict | None = None) -> tuple[bytes, str]:
    """``(body, content type)`` of an error answer on ``surface`` with HTTP ``status``.

    JSON-RPC surfaces answer ``id`` null, the symbol's code (-32600 for one JSON-RPC has
    no code for) and ``data`` holding the symbol and ``details``; A2A HTTP+JSON a
    ``google.rpc.Status``; the console a plain page; REST ``{"error": {code, message,
    details}}``. Needs no request: the gunicorn worker's own refusals use it too.
    """
    details = dict(details or {})
    if surface in (SEED, A2A):
        from relay.transport import jsonrpc

        dialect = jsonrpc.SEED_DIALECT
        if surface == A2A:
            from relay.transport import a2a

            dialect = a2a.ERRORS_ONLY
        code = ERRORS.get(symbol, (-32600, status))[0]
        return orjson.dumps(jsonrpc.error_object(dialect, None, code, message, {"symbol": symbol, **details})), (
            "application/json"
        )
    if surface == A2A_HTTP:
        from relay.transport import a2a_http

        exc = RelayError(symbol if symbol in ERRORS else "invalid_request", message, details or None)
        return orjson.dumps(a2a_http.status_body(exc, status)), a2a_http.MEDIA_TYPE
    if surface == CONSOLE:
        return _page(status, message).encode(), "text/html; charset=utf-8"
    return orjson.dumps({"error": {"code": symbol, "message": message, "details": details or None}}), (
        "application/json"
    )


def _page(status: int, message: str) -> str:
    text = html.escape(message)
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{status}</title></head>'
        f'<body><h1>{status}</h1><p>{text}</p><p><a href="/console/">Back to the console</a></p></body></html>\n'
    )


def respond(surface: str, status: int, symbol: str, message: str, details: dict | None = None, headers=None):
    """:func:`envelope` as a Flask response (with ``headers``)."""
    body, content_type = envelope(surface, status, symbol, message, details)
    resp = Response(body, status=status, content_type=content_type)
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


def raw_response(path: str, status: int, reason: str, symbol: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer (``Connection: close``) to a request for ``path`` the server refused
    before the app saw it (relay/transport/server.py)."""
    body, content_type = envelope(surface_for(path), status, symbol, message)
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


# --------------------------------------------------------------------------- the app's handlers


def init_app(app: Flask) -> None:
    """Answer every error no view answered in the path's surface's envelope; add the answer headers."""
    app.after_request(_answer_headers)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        if exc.response is not None:  # e.g. flask-limiter's 429, already shaped
            return exc.response
        status = exc.code or 500
        # Keep the exception's own headers (405's Allow, which HTTP requires) in our shape.
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        surface = surface_for(request.path)
        symbol = symbol_for(status, exc.name) if surface != REST else (exc.name or "error").lower().replace(" ", "_")
        return respond(surface, status, symbol, exc.description or exc.name or "error", None, headers)

    @app.errorhandler(Exception)
    def _unhandled(exc: Exception):
        error = unexpected(exc)
        return respond(surface_for(request.path), error.http_status, error.symbol, error.message, error.details)
