"""A real HTTP receiver for webhook tests: a threaded server on 127.0.0.1 (port 0).

It records every request (method, path, headers, raw body) and answers each path from
a program: a list of responses used in order, then the path's default response.
A response is a status code or a dict ``{"status", "headers", "delay", "body", "gate"}``
(``gate``: a threading.Event the answer waits for, at most 30 s, before its delay).
No mocking: the relay connects to it over a real loopback socket.

    with Receiver() as rx:
        rx.program("/hook", [500, 500, 200])
        rx.program("/moved", [], default={"status": 302, "headers": {"Location": other.url("/x")}})
        ...
        requests = rx.wait_for(3, timeout=10, path="/hook")
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Recorded:
    """One request as the receiver saw it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    received_at: float = field(compare=False)
    peer: tuple = field(default=(), compare=False)  # the client's (address, port): one per connection

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def _response(spec: Any) -> dict[str, Any]:
    if isinstance(spec, int):
        return {"status": spec, "headers": {}, "delay": 0.0, "body": b"", "gate": None}
    out = {"status": 200, "headers": {}, "delay": 0.0, "body": b"", "gate": None, **spec}
    if isinstance(out["body"], str):
        out["body"] = out["body"].encode("utf-8")
    return out


class Receiver:
    """A loopback HTTP server with per-path programmed answers; a context manager."""

    def __init__(self, host: str = "127.0.0.1", keepalive: bool = False):
        """``keepalive``: speak HTTP/1.1 and keep connections open between requests."""
        self._host = host
        self._keepalive = keepalive
        self._in_flight: dict[str, int] = {}
        self._most_in_flight: dict[str, int] = {}
        self._lock = threading.Condition()
        self._requests: list[Recorded] = []
        self._programs: dict[str, list[dict[str, Any]]] = {}
        self._defaults: dict[str, dict[str, Any]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if receiver._keepalive else "HTTP/1.0"

            def _handle(self):
                try:
                    self._answer()
                finally:
                    receiver._ended(self.path)

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path
                reply = receiver._record_and_pick(
                    Recorded(
                        method=self.command,
                        path=path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                        received_at=time.monotonic(),
                        peer=tuple(self.client_address),
                    )
                )
                if reply["gate"] is not None:
                    reply["gate"].wait(30)
                if reply["delay"]:
                    time.sleep(reply["delay"])
                try:
                    self.send_response(reply["status"])
                    for name, value in reply["headers"].items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply["body"])))
                    self.end_headers()
                    if reply["body"]:
                        self.wfile.write(reply["body"])
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer

            do_POST = do_GET = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, format, *args):  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer((self._host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"receiver-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- programming -----------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "receiver not started"
        return self._server.server_address[1]

    def url(self, path: str = "/hook") -> str:
        return f"http://{self._host}:{self.port}{path}"

    def program(self, path: str, responses: list[Any], default: Any = 200) -> None:
        """Answer ``path`` with ``responses`` in order, then with ``default`` forever."""
        with self._lock:
            self._programs[path] = [_response(r) for r in responses]
            self._defaults[path] = _response(default)

    def _record_and_pick(self, req: Recorded) -> dict[str, Any]:
        with self._lock:
            self._requests.append(req)
            now = self._in_flight[req.path] = self._in_flight.get(req.path, 0) + 1
            self._most_in_flight[req.path] = max(now, self._most_in_flight.get(req.path, 0))
            queue = self._programs.get(req.path)
            reply = queue.pop(0) if queue else self._defaults.get(req.path, _response(200))
            self._lock.notify_all()
            return reply

    def _ended(self, path: str) -> None:
        with self._lock:
            if self._in_flight.get(path):
                self._in_flight[path] -= 1
            self._lock.notify_all()

    # --- inspection ------------------------------------------------------------------

    def most_in_flight(self, path: str) -> int:
        """The most requests to ``path`` the receiver was answering at one time."""
        with self._lock:
            return self._most_in_flight.get(path, 0)

    def in_flight(self, path: str) -> int:
        """Requests to ``path`` being answered now."""
        with self._lock:
            return self._in_flight.get(path, 0)

    def requests(self, path: str | None = None) -> list[Recorded]:
        with self._lock:
            return [r for r in self._requests if path is None or r.path == path]

    def count(self, path: str | None = None) -> int:
        return len(self.requests(path))

    def wait_for(self, n: int, timeout: float = 10.0, path: str | None = None) -> list[Recorded]:
        """Wait until at least ``n`` requests (to ``path`` if given) arrived; return them all.

        Raises AssertionError saying how many came if the deadline passes first.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                got = [r for r in self._requests if path is None or r.path == path]
                if len(got) >= n:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"receiver got {len(got)} request(s) on {path or 'any path'} within {timeout} s, expected {n}"
                    )
                self._lock.wait(min(left, 0.2))
