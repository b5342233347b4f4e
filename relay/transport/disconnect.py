"""Noticing, while a feed wait or stream sleeps, that its client has gone
(docs/decisions.md, "Surviving the relay's own servers failing").

A waiting request writes only on a wake-up or a heartbeat, so a client that hung up is
otherwise found out only by the next write, up to ``RELAY_STREAM_HEARTBEAT`` seconds
later, and keeps one of its agent's ``RELAY_STREAMS_PER_AGENT`` slots until then: the
agent that reconnects at once is refused. The services' waits ask :func:`probe`'s
callable between short slices instead (relay/services/streams.py).
"""

from __future__ import annotations

import _socket  # the C socket type: gevent patches the socket module, not this, so a peek never yields
import socket
from collections.abc import Callable

_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


def probe(environ: dict) -> Callable[[], bool] | None:
    """A callable answering True once the request's client has closed its connection, or None.

    ``environ`` is the WSGI environ; the socket is gunicorn's (``gunicorn.socket``) or
    Werkzeug's development server's (``werkzeug.socket``); there is none under the test
    client, and then None: such a wait ends on its own time only. The callable never
    blocks and never consumes a byte: it peeks. End of file (the client closed, or shut
    its writing side) or a socket error counts as gone; bytes waiting (a pipelined
    request) or nothing to read as still there.
    """
    sock = environ.get("gunicorn.socket") or environ.get("werkzeug.socket")
    if sock is None:
        return None
    try:
        fd = sock.fileno()
    except OSError:
        return None
    if fd < 0:
        return None

    def gone() -> bool:
        try:
            view = _socket.socket(fileno=fd)
        except OSError:
            return True  # the descriptor is closed already
        try:
            return view.recv(1, _PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            view.detach()  # the descriptor stays the server's: never closed here

    return gone
