"""The gunicorn worker the web process runs: gevent, with bounded reads for slow clients.

A sync worker spends a whole process on a client that sends its headers one byte a
second, so two such sockets stopped the relay. Here every connection is a greenlet,
PostgreSQL calls yield to other greenlets (psycogreen), and a connection is cut when

- its request head (request line and headers) has not arrived within
  ``RELAY_HEADER_TIMEOUT`` seconds (default 10) of the connection, or on a kept-alive
  connection of the head's first byte: the socket is closed;
- a kept-alive connection sends no next request within gunicorn's ``keepalive``
  (``GUNICORN_KEEPALIVE``, default 75 s: longer than the 60 s idle timeout of common
  proxies and load balancers, so they, not the relay, close idle connections; a proxy
  reusing a connection the server has just closed answers its client 502);
- its body has not arrived within ``RELAY_BODY_TIMEOUT`` seconds (default 30) of the
  head: the read raises ``TimeoutError`` and the app answers 408
  (``relay.transport.requests.read_body``);
- it sends nothing at all for ``RELAY_CLIENT_IDLE_TIMEOUT`` seconds (default 30) while
  a read or write waits on it.

A request gunicorn itself refuses before the app sees it (a header over
``limit_request_field_size``, a request line over ``limit_request_line``, a negative or
non-numeric Content-Length, Content-Length with Transfer-Encoding) is answered in the
JSON error envelope of its path's surface (relay/transport/errors.py), not gunicorn's
HTML page: the request line's first bytes say which path it was.

Settings are read from the environment when the worker starts, like the rest of
``gunicorn.conf.py``.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import gevent
from gunicorn.http import errors as http_errors
from gunicorn.http import wsgi as gunicorn_wsgi
from gunicorn.workers.base_async import AsyncWorker
from gunicorn.workers.ggevent import GeventWorker

from relay.config import ConfigError, seconds


def _seconds(name: str) -> float:
    try:
        return seconds(os.environ, name)
    except ConfigError as exc:
        sys.stderr.write(f"relay: configuration error: {exc}\n")
        # gunicorn stops the whole server (not just this worker) on exit code 3.
        raise SystemExit(3) from None


class _DeadlineSocket:
    """A client socket whose ``recv`` keeps the head, keep-alive and body deadlines.

    Between requests (``deadline`` None) ``recv`` reads a head: it answers end of file
    (gunicorn then closes the connection quietly) once ``head_deadline`` has passed, or when
    a kept-alive connection's next head has not begun within ``keepalive`` seconds.
    Within a request it raises TimeoutError once the body's ``deadline`` has passed.
    Everything else is the socket's own; gunicorn's parser and body reader call ``recv``.
    """

    __slots__ = (
        "_sock",
        "deadline",
        "body_timeout",
        "head_deadline",
        "head_timeout",
        "keepalive",
        "idle_timeout",
        "head_start",
    )

    def __init__(self, sock: socket.socket, body_timeout: float, head_timeout: float, keepalive: float, idle: float):
        self._sock = sock
        self.deadline: float | None = None
        self.body_timeout = body_timeout
        self.head_timeout, self.keepalive, self.idle_timeout = head_timeout, keepalive, idle
        self.head_deadline: float | None = time.monotonic() + head_timeout  # the first head: from the connect
        # The head's first bytes (its request line's start): the path of a head gunicorn refuses.
        self.head_start = b""

    def recv(self, *args):
        if self.deadline is None:
            return self._recv_head(*args)
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"request body not received within {self.body_timeout:g} s")
        return self._sock.recv(*args)

    def _recv_head(self, *args):
        if self.head_deadline is None:
            wait = self.keepalive  # kept alive, idle: the next head may start this late
        else:
            wait = self.head_deadline - time.monotonic()
            if wait <= 0:
                return b""
        self._sock.settimeout(wait)
        try:
            data = self._sock.recv(*args)
        except TimeoutError:
            return b""  # idle past keep-alive, or a head too slow: closed like a client that left
        finally:
            self._sock.settimeout(self.idle_timeout)
        if data and self.head_deadline is None:
            self.head_deadline = time.monotonic() + self.head_timeout
        if len(self.head_start) < _HEAD_START:
            self.head_start += data[: _HEAD_START - len(self.head_start)]
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


_HEAD_START = 512  # bytes of a head kept to find its path: enough for every surface's prefix

# gunicorn's refusals of a request it could not parse -> (status, reason, symbol); the rest are 400 invalid_request.
_REFUSALS: tuple[tuple[type[Exception], int, str, str], ...] = (
    (http_errors.LimitRequestLine, 414, "URI Too Long", "request_line_too_long"),
    (http_errors.LimitRequestHeaders, 431, "Request Header Fields Too Large", "headers_too_large"),
    (http_errors.UnsupportedTransferCoding, 501, "Not Implemented", "invalid_request"),
    (http_errors.ExpectationFailed, 417, "Expectation Failed", "invalid_request"),
    (http_errors.ForbiddenProxyRequest, 403, "Forbidden", "forbidden"),
)
# What is the server's fault, not the request's: gunicorn's own 500.
_NOT_REFUSALS = (
    http_errors.InvalidResponseHeader,
    http_errors.InvalidResponseHeaderName,
    http_errors.ConfigurationProblem,
)


def refusal(exc: BaseException, cfg) -> tuple[int, str, str, str] | None:
    """``(status, reason phrase, symbol, message)`` of a request gunicorn refused with ``exc``, or
    None when ``exc`` is not the request's fault. The message names the problem."""
    if not isinstance(exc, http_errors.ParseException) or isinstance(exc, _NOT_REFUSALS):
        return None
    status, reason, symbol = 400, "Bad Request", "invalid_request"
    for cls, *answer in _REFUSALS:
        if isinstance(exc, cls):
            status, reason, symbol = answer
            break
    if isinstance(exc, http_errors.LimitRequestLine):
        message = f"the request line is longer than {cfg.limit_request_line} bytes"
    elif isinstance(exc, http_errors.LimitRequestHeaders):
        message = (
            f"the request's header fields are too large (at most {cfg.limit_request_fields} fields of "
            f"{cfg.limit_request_field_size} bytes each): {exc}"
        )
    elif isinstance(exc, http_errors.InvalidHeader) and exc.hdr in ("CONTENT-LENGTH", "TRANSFER-ENCODING"):
        headers = {name for name, _value in getattr(exc.req, "headers", None) or ()}
        if {"CONTENT-LENGTH", "TRANSFER-ENCODING"} <= headers:
            message = "Content-Length and Transfer-Encoding together are refused: send one of them"
        elif exc.hdr == "CONTENT-LENGTH":
            message = "the Content-Length header must be a non-negative decimal number of bytes"
        else:
            message = "the Transfer-Encoding header must end with chunked (HTTP/1.1 only)"
    else:
        message = f"the request is malformed: {exc}"
    return status, reason, symbol, message


def _path(req, sock) -> str:
    """The path of the refused request: parsed, or read from its head's first bytes."""
    path = getattr(req, "path", None)
    if isinstance(path, str) and path:
        return path
    line = bytes(getattr(sock, "head_start", b"")).split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    target = parts[1] if len(parts) > 1 else b""
    return target.split(b"?", 1)[0].decode("latin-1")


class OneWriteResponse(gunicorn_wsgi.Response):
    """gunicorn's response, with a whole small body sent in the same write as its head.

    gunicorn writes the head, then each body chunk: two ``send`` calls, and on loopback
    two passes through the TCP stack, for every JSON answer. When the first chunk is the
    whole body of a response of known length (a Flask JSON answer always is), head and
    body go out as one ``sendall``. Anything else (streams, chunked answers, files,
    bodiless answers) is gunicorn's own path.
    """

    def write(self, arg):
        if (
            self.headers_sent
            or self.chunked
            or self._omits_body
            or not isinstance(arg, bytes)
            or self.response_length is None
            or len(arg) != self.response_length
        ):
            return super().write(arg)
        head = self.default_headers()
        head.extend([f"{name}: {value}\r\n" for name, value in self.headers])
        head.append("\r\n")
        self.headers_sent = True
        self.sent += len(arg)
        self.sock.sendall("".join(head).encode("latin-1") + arg)


class RelayWorker(GeventWorker):
    """gunicorn's gevent worker with per-connection header, body and idle deadlines."""

    def patch(self) -> None:
        super().patch()
        from psycogreen.gevent import patch_psycopg

        patch_psycopg()

    def init_process(self) -> None:
        # gunicorn builds each request's response from this module global (wsgi.create's
        # default response class); set in the worker process only.
        gunicorn_wsgi.Response = OneWriteResponse
        self.header_timeout = _seconds("RELAY_HEADER_TIMEOUT")
        self.body_timeout = _seconds("RELAY_BODY_TIMEOUT")
        self.idle_timeout = _seconds("RELAY_CLIENT_IDLE_TIMEOUT")
        super().init_process()

    def timeout_ctx(self):
        # gunicorn wraps every request-head read in this; False: give up silently (close).
        # _DeadlineSocket keeps the real deadlines; this only bounds the worst case.
        return gevent.Timeout(self.cfg.keepalive + self.header_timeout, False)

    def handle(self, listener, client, addr):
        client.setblocking(1)
        client.settimeout(self.idle_timeout)
        sock = _DeadlineSocket(client, self.body_timeout, self.header_timeout, self.cfg.keepalive, self.idle_timeout)
        AsyncWorker.handle(self, listener, sock, addr)

    def handle_request(self, listener_name, req, sock, addr):
        sock.head_deadline = None  # the head is in
        sock.head_start = b""
        sock.deadline = time.monotonic() + self.body_timeout
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            sock.deadline = None

    def handle_error(self, req, client, addr, exc):
        """Answer a request gunicorn refused in its path's surface's envelope (relay/transport/errors.py);
        anything else as gunicorn does."""
        answer = refusal(exc, self.cfg)
        if answer is None:
            return super().handle_error(req, client, addr, exc)
        from relay.transport.errors import raw_response

        status, reason, symbol, message = answer
        self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        path = _path(req or getattr(exc, "req", None), client)
        try:
            client.sendall(raw_response(path, status, reason, symbol, message))
        except OSError:
            self.log.debug("Failed to send error message.")
