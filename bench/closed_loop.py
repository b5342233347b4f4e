"""A lean closed-loop load generator: raw sockets, keep-alive, one request in flight per client.

Usage: ``python -m bench.closed_loop SCENARIO_JSON OUT_JSON``. The scenario names the
host, the client count, the duration and the kind of request (see ``bench.run.PATHS``);
the output holds requests/s, p50/p95/p99 (ms), failures and the generator's own CPU
seconds, so a reader can see what the load cost the two cores.

Why not locust: on two cores its own CPU (gevent, its HTTP client, stats) took a large
share of what the relay under test needed, which distorted every ratio. Here each client
is a thread that writes a pre-built request with ``sendall`` and reads the answer with
one ``recv`` loop, parsing only the status line and ``Content-Length``: a few tens of
microseconds of Python per request, most of it with the GIL released in socket calls.
"""

from __future__ import annotations

import itertools
import json
import random
import resource
import socket
import sys
import threading
import time
from urllib.parse import urlencode, urlsplit


class Client:
    """One keep-alive HTTP/1.1 connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw`` (a whole request) and return (status, body)."""
        for attempt in (0, 1):
            if self.sock is None:
                self._connect()
            try:
                self.sock.sendall(raw)
                return self._read()
            except (ConnectionError, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _read(self) -> tuple[int, bytes]:
        buf = self.buf
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the answer")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed mid-body")
            rest += chunk
        body, self.buf = rest[:length], rest[length:]
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None


def _raw(method: str, host: str, path: str, body: bytes = b"", key: str | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    if key:
        head.append(f"Authorization: Bearer {key}")
    if body or method == "POST":
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _rpc(host: str, key: str, method: str, params: dict) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    return _raw("POST", host, "/a2a", body, key)


def request_for(kind: str, n: int, host: str, data: dict) -> tuple[bytes, bool]:
    """The nth request of a scenario kind, and whether its answer is a JSON-RPC envelope."""
    if kind == "ceiling_insert":
        return _raw("POST", host, "/insert"), False
    if kind == "ceiling_select":
        return _raw("GET", host, "/select"), False
    if kind == "send_create":
        sender, recipient = data["pairs"][n % len(data["pairs"])]
        params = {
            "recipient": recipient,
            "message": {"parts": [{"type": "text", "text": f"bench handoff {n}: refactor the users endpoint"}]},
        }
        return _rpc(host, sender, "message/send", params), True
    if kind == "send_append":
        key, task_id = data["append_threads"][n % len(data["append_threads"])]
        params = {"task_id": task_id, "message": {"parts": [{"type": "text", "text": f"bench reply {n}"}]}}
        return _rpc(host, key, "message/send", params), True
    if kind == "tasks_get":
        key, task_id = data["threads"][n % len(data["threads"])]
        return _rpc(host, key, "tasks/get", {"task_id": task_id}), True
    if kind == "tasks_list":
        key = data["keys"][n % len(data["keys"])]
        return _rpc(host, key, "tasks/list", {"page": {"limit": 50}}), True
    if kind in ("feed", "feed_q"):
        key, handle = data["identities"][n % len(data["identities"])]
        query = {"limit": 50}
        if kind == "feed_q":
            query["q"] = random.choice(data["words"])
        return _raw("GET", host, f"/api/v1/identities/{handle}/a2a/messages?{urlencode(query)}", key=key), False
    if kind == "rest_reply":
        key, handle, task_id = data["replies"][n % len(data["replies"])]
        body = json.dumps({"message": {"parts": [{"type": "text", "text": f"rest reply {n}"}]}}).encode()
        return _raw("POST", host, f"/api/v1/identities/{handle}/a2a/tasks/{task_id}/messages", body, key), False
    raise SystemExit(f"unknown scenario kind {kind}")


def run(scenario: dict) -> dict:
    """Run ``scenario["users"]`` closed-loop clients for ``scenario["duration"]`` s; return the figures."""
    # ``hosts`` (bench nodes): each client keeps a connection to every host and sends its
    # requests to them in turn.
    hosts = [urlsplit(h) for h in scenario.get("hosts") or [scenario["host"]]]
    kind, data = scenario["kind"], scenario.get("data", {})
    counter = itertools.count()
    latencies: list[list[float]] = []
    failures: list[str] = []
    start = threading.Event()
    deadline = [0.0]

    def client_loop() -> None:
        clients = [Client(h.hostname, h.port) for h in hosts]
        mine: list[float] = []
        latencies.append(mine)
        start.wait()
        turn = 0
        # A request started before the deadline is finished and counted: every write the
        # relay may have committed is in the figures.
        while time.perf_counter() < deadline[0]:
            client, host_header = clients[turn % len(clients)], hosts[turn % len(clients)].netloc
            turn += 1
            raw, is_rpc = request_for(kind, next(counter), host_header, data)
            t = time.perf_counter()
            try:
                status, body = client.request(raw)
            except OSError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            mine.append(time.perf_counter() - t)
            if not 200 <= status < 300 or (is_rpc and b'"error"' in body[:200]):
                failures.append(f"{status} {body[:200]!r}")
        for client in clients:
            client.close()

    threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(scenario["users"])]
    for t in threads:
        t.start()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    deadline[0] = t0 + scenario["duration"]
    start.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    every = sorted(x for mine in latencies for x in mine)

    def pct(p: float) -> float:
        return every[min(len(every) - 1, int(p * len(every)))] * 1000 if every else 0.0

    return {
        "requests": len(every),
        "failures": len(failures),
        "rps": len(every) / wall,
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "p99_ms": pct(0.99),
        "generator_cpu_s": round((cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime), 2),
        "wall_s": round(wall, 2),
        "errors": failures[:3],
    }


def main() -> None:
    scenario = json.load(open(sys.argv[1]))
    json.dump(run(scenario), open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
