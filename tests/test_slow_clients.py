"""Slow clients against the shipped web tier (gunicorn with relay.transport.server.RelayWorker).

Two sockets that send their headers one byte a second used to hold both sync workers,
and /healthz stopped answering. Each test opens more slow sockets than there are worker
processes and asserts the relay still answers everyone else, and that the slow ones are
cut (a close for a slow head, a 408 for a slow body).
"""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
import requests

from tests.live import live_relay

SLOW = 12  # more than WEB_CONCURRENCY (2) times any plausible per-process slot count


@pytest.fixture(scope="module")
def slow_relay(base_env):
    with live_relay(base_env, worker=False, RELAY_HEADER_TIMEOUT="3", RELAY_BODY_TIMEOUT="3") as url:
        yield url


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


class Trickler(threading.Thread):
    """Send ``data`` one byte every ``interval`` seconds; record how the server ended it."""

    def __init__(self, url: str, data: bytes, interval: float = 0.5):
        super().__init__(daemon=True)
        self.url, self.data, self.interval = url, data, interval
        self.outcome: str | None = None
        self.response = b""
        self.stop = threading.Event()

    def run(self):
        sock = _connect(self.url)
        try:
            for byte in self.data:
                if self.stop.is_set():
                    self.outcome = "stopped"
                    return
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    self.outcome = "cut"
                    return
                time.sleep(self.interval)
            self.outcome = "sent everything"
        finally:
            try:
                sock.settimeout(10)
                while chunk := sock.recv(65536):
                    self.response += chunk
                if self.outcome is None:
                    self.outcome = "closed"
            except OSError:
                pass
            sock.close()


def _wait_for_outcomes(tricklers: list[Trickler], timeout: float) -> None:
    for t in tricklers:
        t.join(timeout)
    alive = [t for t in tricklers if t.is_alive()]
    for t in alive:
        t.stop.set()
    assert not alive, f"{len(alive)} slow connections were never cut"


def test_slow_headers_do_not_stop_other_clients_and_are_cut(slow_relay):
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
    tricklers = [Trickler(slow_relay, head) for _ in range(SLOW)]
    for t in tricklers:
        t.start()
    time.sleep(1.0)  # let every slow socket be accepted and start its head
    codes = [requests.get(f"{slow_relay}/healthz", timeout=5).status_code for _ in range(10)]
    assert codes == [200] * 10
    _wait_for_outcomes(tricklers, 30)
    # Cut before the head was complete: the server closed, nothing was answered.
    assert {t.outcome for t in tricklers} <= {"cut", "closed"}, [t.outcome for t in tricklers]
    assert all(t.response == b"" for t in tricklers)


def test_slow_bodies_do_not_stop_other_clients_and_get_408(slow_relay):
    head = (
        b"POST /a2a HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer ah_live_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nContent-Length: 100000\r\n\r\n"
    )
    # The head goes at once; the body trickles one byte every half second.
    socks = [_connect(slow_relay) for _ in range(SLOW)]
    for s in socks:
        s.sendall(head)
    stop = threading.Event()

    def trickle(s: socket.socket, out: list):
        try:
            while not stop.is_set():
                s.sendall(b" ")
                time.sleep(0.5)
        except OSError:
            pass
        finally:
            s.settimeout(10)
            try:
                while chunk := s.recv(65536):
                    out.append(chunk)
            except OSError:
                pass

    outs: list[list[bytes]] = [[] for _ in socks]
    threads = [threading.Thread(target=trickle, args=(s, o), daemon=True) for s, o in zip(socks, outs)]
    for th in threads:
        th.start()
    time.sleep(1.0)
    codes = [requests.get(f"{slow_relay}/healthz", timeout=5).status_code for _ in range(10)]
    assert codes == [200] * 10
    for th in threads:
        th.join(30)
    stop.set()
    assert not any(th.is_alive() for th in threads), "slow bodies were never cut"
    answers = [b"".join(o) for o in outs]
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), [a[:80] for a in answers]
    for s in socks:
        s.close()
