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


class Probe:
    """Whether a request's client has gone: call it to peek; :meth:`watch` to be told when to.

    Calling it never blocks and never consumes a byte: it peeks. End of file (the client
    closed, or shut its writing side) or a socket error counts as gone; bytes waiting (a
    pipelined request) or nothing to read as still there.
    """

    __slots__ = ("fd",)

    def __init__(self, fd: int):
        self.fd = fd

    def __call__(self) -> bool:
        try:
            view = _socket.socket(fileno=self.fd)
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

    def watch(self, readable: Callable[[], None]) -> Callable[[], None] | None:
        """Have ``readable()`` called once when the socket has something to read (its end of
        file included); return the function that cancels it, or None when this process
        cannot watch (not gevent's): the caller then peeks in slices.

        A sleeping wait is told at once instead of peeking every half second: with
        thousands of waits held, the peeks alone were thousands of wake-ups a second.
        """
        from gevent import get_hub, monkey

        if not monkey.is_module_patched("socket"):
            return None
        watcher = get_hub().loop.io(self.fd, 1)  # 1: readable

        def fired() -> None:
            watcher.stop()
            readable()

        watcher.start(fired)

        def cancel() -> None:
            watcher.stop()
            watcher.close()

        return cancel


def probe(environ: dict) -> Probe | None:
    """The request's client :class:`Probe`, or None.

    ``environ`` is the WSGI environ; the socket is gunicorn's (``gunicorn.socket``) or
    Werkzeug's development server's (``werkzeug.socket``); there is none under the test
    client, and then None: such a wait ends on its own time only.
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
    return Probe(fd)
