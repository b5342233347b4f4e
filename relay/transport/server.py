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

Settings are read from the environment when the worker starts, like the rest of
``gunicorn.conf.py``.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import gevent
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

    __slots__ = ("_sock", "deadline", "body_timeout", "head_deadline", "head_timeout", "keepalive", "idle_timeout")

    def __init__(self, sock: socket.socket, body_timeout: float, head_timeout: float, keepalive: float, idle: float):
        self._sock = sock
        self.deadline: float | None = None
        self.body_timeout = body_timeout
        self.head_timeout, self.keepalive, self.idle_timeout = head_timeout, keepalive, idle
        self.head_deadline: float | None = time.monotonic() + head_timeout  # the first head: from the connect

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
        return data

    def __getattr__(self, name):
        return getattr(self._sock, name)


class RelayWorker(GeventWorker):
    """gunicorn's gevent worker with per-connection header, body and idle deadlines."""

    def patch(self) -> None:
        super().patch()
        from psycogreen.gevent import patch_psycopg

        patch_psycopg()

    def init_process(self) -> None:
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
        sock.deadline = time.monotonic() + self.body_timeout
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            sock.deadline = None
