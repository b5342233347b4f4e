"""Keep-alive: the server keeps idle connections longer than the
proxies in front of it, and the client survives the race when a reused one closes anyway.

The server side runs the Procfile's gunicorn (relay/transport/server.py) with a short
``GUNICORN_KEEPALIVE`` so the test does not wait 75 s; the default is read from
``gunicorn.conf.py`` itself. The client side runs :class:`relay.client.RelayClient`
against a real loopback HTTP server that answers the first request on a connection and
closes the connection, unanswered, when the next request arrives on it: what a client
sees when it reuses a keep-alive connection the moment the server closes it.
"""

from __future__ import annotations

import json
import runpy
import socket
import threading
import time
from pathlib import Path

import pytest

from relay.agent.client import RelayClient, RelayConnectionError
from tests.conftest import bearer
from tests.live import live_relay

ROOT = Path(__file__).resolve().parent.parent
KEEPALIVE = 3  # seconds, for the live relay of this module


def test_the_default_keep_alive_outlasts_a_load_balancers_sixty_seconds(monkeypatch):
    monkeypatch.delenv("GUNICORN_KEEPALIVE", raising=False)
    conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))
    assert conf["keepalive"] == 75 and conf["keepalive"] > 60


@pytest.fixture(scope="module")
def live(base_env):
    with live_relay(base_env, worker=False, GUNICORN_KEEPALIVE=str(KEEPALIVE)) as base:
        yield base


def _get(sock: socket.socket, path: str, key: str) -> bytes:
    """One GET on a kept-alive socket; the whole answer (Content-Length framed)."""
    auth = bearer(key)["Authorization"]
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: relay\r\nAuthorization: {auth}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_an_idle_connection_is_kept_for_keepalive_seconds_then_closed(live, alice):
    host, port = live.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=KEEPALIVE + 10)
    try:
        assert _get(sock, "/api/v1/identities/me", alice[1]).startswith(b"HTTP/1.1 200")
        time.sleep(KEEPALIVE - 1.5)  # idle, but within keep-alive: the same connection serves again
        assert _get(sock, "/api/v1/identities/me", alice[1]).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert sock.recv(1) == b""  # then idle past keep-alive: the server closes it
        closed_after = time.monotonic() - started
    finally:
        sock.close()
    assert KEEPALIVE - 1 < closed_after < KEEPALIVE + 5, f"closed after {closed_after:.1f} s idle"


class ClosingOnReuse:
    """A loopback HTTP/1.1 server: answers each connection's first request from ``answer``,
    keeps the connection, and closes it unanswered when a second request arrives on it."""

    def __init__(self, answer):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests: list[tuple[int, bytes, bytes]] = []  # (connection number, head, body)
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        served = 0
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next(
                    (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append((number, head, body))
                if served:
                    return  # the race: the request arrived as the server closed the connection
                served += 1
                payload = json.dumps(self.answer(head, body)).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )

    def close(self) -> None:
        self.listener.close()


def _answer(head: bytes, body: bytes) -> dict:
    if head.startswith(b"GET"):
        return {"handle": "alice@acme", "name": "Alice", "role": "frontend"}
    call = json.loads(body)
    return {"jsonrpc": "2.0", "id": call["id"], "result": {"task_id": "01J00000000000000000000000", "message_id": "m"}}


@pytest.fixture
def closing():
    server = ClosingOnReuse(_answer)
    yield server
    server.close()


def test_a_get_on_a_reused_connection_that_closed_is_retried_once_on_a_new_one(closing):
    client = RelayClient(closing.url, "ah_live_" + "a" * 32, backoff=0.01)
    try:
        client._rest("GET", "/api/v1/identities/me")
        client._rest("GET", "/api/v1/identities/me")  # reuses the connection; it closes unanswered
    finally:
        client.close()
    assert [(n, head.split(b" ")[0]) for n, head, _ in closing.requests] == [(1, b"GET"), (1, b"GET"), (2, b"GET")]


def test_a_send_on_a_reused_connection_that_closed_is_retried_with_the_same_idempotency_key(closing):
    client = RelayClient(closing.url, "ah_live_" + "a" * 32, backoff=0.01)
    try:
        client._rest("GET", "/api/v1/identities/me")
        client.send("bob@acme", "one thread, however many tries")  # no key given: the client makes one
    finally:
        client.close()
    sends = [(n, json.loads(body)) for n, head, body in closing.requests if head.startswith(b"POST")]
    assert [n for n, _ in sends] == [1, 2], "the send was not retried on a fresh connection"
    keys = [call["params"]["metadata"]["client_idempotency_key"] for _, call in sends]
    assert keys[0] and keys[0] == keys[1]


def test_a_refused_connection_is_not_a_reused_one_and_is_not_retried():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    client = RelayClient(f"http://127.0.0.1:{port}", "ah_live_" + "a" * 32, backoff=0.01)
    with pytest.raises(RelayConnectionError) as info:
        client._rest("GET", "/api/v1/identities/me")
    assert info.value.attempts == 1
