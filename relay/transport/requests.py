"""Per-request plumbing: the request id (``X-Request-Id`` accepted and echoed), bounded bodies."""

from __future__ import annotations

import re
import uuid

from flask import Flask, current_app, g, request
from flask.sessions import SecureCookieSessionInterface
from werkzeug.exceptions import RequestTimeout

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class _CookieSessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, with nothing to open when a request has no cookie.

    Only the console's people carry one; an agent's request has none, and Flask built a
    signing serializer for each of them anyway (2% of a send's CPU).
    """

    def open_session(self, app, request):
        if app.secret_key and not request.cookies.get(self.get_cookie_name(app)):
            return self.session_class()
        return super().open_session(app, request)


def init_app(app: Flask) -> None:
    """Register the request-id hooks and the session interface on ``app``."""
    app.session_interface = _CookieSessions()

    @app.before_request
    def _assign_request_id() -> None:
        supplied = request.headers.get("X-Request-Id", "")
        g.request_id = supplied if _SAFE_ID.match(supplied) else uuid.uuid4().hex

    @app.before_request
    def _read_body_first() -> None:
        # Before authentication and before any database work: a body that trickles in
        # must not hold a pooled PostgreSQL connection while it does (the key lookup
        # checks one out until the request ends).
        if request.method in ("POST", "PUT", "PATCH"):
            try:
                read_body()
            except BodyTooLarge:
                pass  # the view answers it in its own error shape, from the cached verdict

    @app.after_request
    def _echo_request_id(response):
        response.headers["X-Request-Id"] = g.get("request_id", "")
        return response


# Drain at most this much of an oversized body so the client reads our 413, not a reset.
DRAIN_LIMIT = 64 * 1024 * 1024
_TOO_LARGE = object()
_TIMED_OUT = object()


class BodyTooLarge(Exception):
    """The request body passed RELAY_MAX_BODY_BYTES."""


def read_body() -> bytes:
    """Return the raw body (read once per request); raise BodyTooLarge past RELAY_MAX_BODY_BYTES.

    Read here rather than through werkzeug's MAX_CONTENT_LENGTH, which truncates a
    chunked body (no Content-Length) silently instead of refusing it. A body that does
    not arrive in time (the web worker's RELAY_BODY_TIMEOUT / RELAY_CLIENT_IDLE_TIMEOUT,
    relay.transport.server) raises werkzeug's RequestTimeout: HTTP 408.
    """
    cached = g.get("_relay_body")
    if cached is _TOO_LARGE:
        raise BodyTooLarge()
    if cached is _TIMED_OUT:
        raise RequestTimeout("the request body did not arrive in time")
    if cached is not None:
        return cached
    limit = current_app.config["RELAY"].max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        g._relay_body = _TOO_LARGE
        _drain(length)
        raise BodyTooLarge()
    stream = request.environ.get("wsgi.input")
    try:
        body = b"" if stream is None else _read_up_to(stream, limit + 1 if length is None else length)
    except TimeoutError:  # socket.timeout included
        g._relay_body = _TIMED_OUT
        raise RequestTimeout("the request body did not arrive in time") from None
    if len(body) > limit:
        g._relay_body = _TOO_LARGE
        raise BodyTooLarge()
    g._relay_body = body
    return body


def _read_up_to(stream, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining > 0:
        chunk = stream.read(min(65536, remaining))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _drain(length: int) -> None:
    stream = request.environ.get("wsgi.input")
    if stream is None or length > DRAIN_LIMIT:
        return
    try:
        _read_up_to(stream, length)
    except Exception:  # the client went away; nothing left to protect
        pass
