"""``python -m bench hostile``: other clients' latency while hostile clients work the relay.

One live stack (gunicorn from ``gunicorn.conf.py``, a Celery worker) on a fresh database,
default rate limits. Probe agents call ``GET /healthz`` and ``tasks/list`` at a steady
pace in every phase; the figures are their p50/p95/p99 and the ratio of each phase's p99
to the quiet phase's (the stack's own latency on this machine, measured in the same run).

Phases, each ``duration`` seconds:

- ``quiet``: the probes alone.
- ``slow``: ``slow`` sockets that send request headers one byte a second and ``slow``
  that send a body one byte a second after a complete head; a socket the relay cuts is
  reopened, so that many stay open the whole phase.
- ``bad_bodies``: ``hostile`` agents each send ~1 MB invalid ``message/send`` bodies
  (349,000 one-item parts) as fast as the default rate limit (60/minute) lets them.

The load generator is plain threads on ``http.client`` keep-alive connections and one
``selectors`` loop for every slow socket: a few percent of one core, not locust.
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import statistics
import threading
import time
from datetime import datetime

import psutil

from bench import harness

BAD_PARTS = 349_000


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _summary(samples: list[float], failures: int) -> dict:
    return {
        "n": len(samples),
        "failures": failures,
        "p50_ms": round(_percentile(samples, 0.50), 1),
        "p95_ms": round(_percentile(samples, 0.95), 1),
        "p99_ms": round(_percentile(samples, 0.99), 1),
        "max_ms": round(max(samples), 1) if samples else None,
    }


class Probe(threading.Thread):
    """Call one path every ``interval`` seconds on a keep-alive connection; record latencies."""

    def __init__(
        self, host: str, port: int, method: str, path: str, body: bytes | None, headers: dict, interval: float
    ):
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.method, self.path, self.body, self.headers, self.interval = method, path, body, headers, interval
        self.samples: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        next_at = time.monotonic()
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                conn.request(self.method, self.path, body=self.body, headers=self.headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status != 200:
                    self.failures += 1
                else:
                    self.samples.append((time.perf_counter() - started) * 1000)
            except (OSError, http.client.HTTPException):
                self.failures += 1
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
            next_at += self.interval
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        conn.close()


class SlowSockets(threading.Thread):
    """Keep ``heads`` slow-head and ``bodies`` slow-body sockets open, one byte a second each."""

    HEAD = b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Pad: " + b"a" * 4000 + b"\r\n\r\n"
    BODY_HEAD = (
        b"POST /a2a HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer ah_live_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\nContent-Length: 100000\r\n\r\n"
    )

    def __init__(self, host: str, port: int, heads: int, bodies: int):
        super().__init__(daemon=True)
        self.addr = (host, port)
        self.want = {"head": heads, "body": bodies}
        self.cut = {"head": 0, "body": 0}
        self.answers: dict[str, int] = {}
        self.stop = threading.Event()
        self.open_min = heads + bodies

    def _open(self, kind: str, sel: selectors.BaseSelector, state: dict) -> None:
        sock = socket.create_connection(self.addr, timeout=5)
        sock.setblocking(False)
        if kind == "body":
            sock.sendall(self.BODY_HEAD)
        state[sock] = {"kind": kind, "sent": 0}
        sel.register(sock, selectors.EVENT_READ)

    def run(self):
        sel = selectors.DefaultSelector()
        state: dict[socket.socket, dict] = {}
        for kind, n in self.want.items():
            for _ in range(n):
                self._open(kind, sel, state)
        next_tick = time.monotonic()
        while not self.stop.is_set():
            for key, _ in sel.select(timeout=max(0.0, next_tick - time.monotonic())):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                info = state[sock]
                if data:
                    status = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")
                    self.answers[status] = self.answers.get(status, 0) + 1
                sel.unregister(sock)
                sock.close()
                del state[sock]
                self.cut[info["kind"]] += 1
                self._open(info["kind"], sel, state)
            if time.monotonic() >= next_tick:
                next_tick += 1.0
                for sock, info in list(state.items()):
                    data = self.HEAD if info["kind"] == "head" else b" " * 100000
                    if info["sent"] < len(data):
                        try:
                            sock.send(data[info["sent"] : info["sent"] + 1])
                            info["sent"] += 1
                        except OSError:
                            pass
                self.open_min = min(self.open_min, len(state))
        for sock in state:
            sock.close()


class BadBodies(threading.Thread):
    """Send ~1 MB invalid ``message/send`` bodies as one agent, paced to the default 60/minute."""

    def __init__(self, host: str, port: int, key: str, interval: float = 1.0):
        super().__init__(daemon=True)
        self.host, self.port, self.key, self.interval = host, port, key, interval
        parts = ",".join(["1"] * BAD_PARTS)
        self.body = (
            '{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"recipient":"probe0@acme",'
            f'"message":{{"parts":[{parts}]}}}}}}'
        ).encode()
        self.sizes: list[int] = []
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self):
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        next_at = time.monotonic()
        while not self.stop.is_set():
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
            started = time.perf_counter()
            try:
                conn.request("POST", "/a2a", body=self.body, headers=headers)
                resp = conn.getresponse()
                answer = resp.read()
                self.sizes.append(len(answer))
                self.latencies.append((time.perf_counter() - started) * 1000)
                self.statuses[resp.status] = self.statuses.get(resp.status, 0) + 1
            except (OSError, http.client.HTTPException):
                self.statuses[0] = self.statuses.get(0, 0) + 1
            finally:
                conn.close()
            next_at += self.interval
            self.stop.wait(max(0.0, next_at - time.monotonic()))


def _phase(host: str, port: int, probe_keys: list[str], duration: float, hostile: list[threading.Thread]) -> dict:
    rpc = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {"page": {"limit": 20}}}).encode()
    # tasks/list probes stay within the default per-agent budget (60/minute): one call every 1.1 s each.
    probes = [Probe(host, port, "GET", "/healthz", None, {}, 0.05)] + [
        Probe(
            host, port, "POST", "/a2a", rpc, {"Authorization": f"Bearer {k}", "Content-Type": "application/json"}, 1.1
        )
        for k in probe_keys
    ]
    gen = psutil.Process()
    cpu0 = gen.cpu_times()
    for t in hostile:
        t.start()
    time.sleep(1.0 if hostile else 0.0)  # hostile clients settle in before the probes count
    for p in probes:
        p.start()
    time.sleep(duration)
    for t in [*probes, *hostile]:
        t.stop.set()
    for t in [*probes, *hostile]:
        t.join(35)
    cpu1 = gen.cpu_times()
    rpc_samples = [s for p in probes[1:] for s in p.samples]
    return {
        "healthz": _summary(probes[0].samples, probes[0].failures),
        "tasks_list": _summary(rpc_samples, sum(p.failures for p in probes[1:])),
        "load_generator_cpu_s": round((cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), 2),
    }


def hostile(duration: float = 30.0, slow: int = 50, hostile_agents: int = 2, workers: int = 2) -> dict:
    """Run the three phases; return the results document (see the module docstring)."""
    probe_handles = [f"probe{i}@acme" for i in range(6)]
    bad_handles = [f"hostile{i}@acme" for i in range(hostile_agents)]
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "duration_s": duration,
        "slow_sockets": {"heads": slow, "bodies": slow},
        "hostile_agents": hostile_agents,
        "workers": workers,
        "rate_limit": "60/minute (default)",
        "load_generator": "threads on http.client + one selectors loop (not locust)",
        "phases": {},
    }
    with harness.fresh_database() as database_url:
        # Default limits: the point is what a client can do within them.
        env = harness.base_env(database_url, {"RELAY_RATE_LIMIT": "60/minute", "RELAY_REST_RATE_LIMIT": "600/minute"})
        keys = harness.create_agents(env, probe_handles + bad_handles)
        relay, url = harness.gunicorn("app:app", env, workers)
        worker = harness.celery_worker(env)
        host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
        try:
            with harness.RssSampler({"web_worker": relay}) as rss:
                probe_keys = [keys[h] for h in probe_handles]
                results["phases"]["quiet"] = _phase(host, port, probe_keys, duration, [])
                slow_sockets = SlowSockets(host, port, slow, slow)
                results["phases"]["slow"] = _phase(host, port, probe_keys, duration, [slow_sockets])
                results["phases"]["slow"]["sockets"] = {
                    "fewest_open": slow_sockets.open_min,
                    "cut": slow_sockets.cut,
                    "answers": slow_sockets.answers,
                }
                bad = [BadBodies(host, port, keys[h]) for h in bad_handles]
                results["phases"]["bad_bodies"] = _phase(host, port, probe_keys, duration, bad)
                sizes = [s for b in bad for s in b.sizes]
                lat = [x for b in bad for x in b.latencies]
                statuses: dict[int, int] = {}
                for b in bad:
                    for code, n in b.statuses.items():
                        statuses[code] = statuses.get(code, 0) + n
                results["phases"]["bad_bodies"]["bad_requests"] = {
                    "sent": len(sizes),
                    "request_bytes": len(bad[0].body) if bad else 0,
                    "answer_bytes_max": max(sizes) if sizes else None,
                    "latency_ms_p50": round(statistics.median(lat), 1) if lat else None,
                    "latency_ms_max": round(max(lat), 1) if lat else None,
                    "statuses": statuses,
                }
            results["peak_rss_mib"] = {k: round(v / 2**20, 1) for k, v in rss.peak.items()}
        finally:
            relay.stop()
            worker.stop()
    quiet = results["phases"]["quiet"]
    for phase in results["phases"].values():
        for path in ("healthz", "tasks_list"):
            base = quiet[path]["p99_ms"]
            phase[path]["p99_ratio_to_quiet"] = round(phase[path]["p99_ms"] / base, 2) if base else None
    return results


def print_hostile(results: dict) -> None:
    print(f"\nbench hostile {results['date']} ({results['duration_s']} s a phase, {results['load_generator']})")
    print(f"{'phase':<12}{'path':<12}{'n':>6}{'fail':>6}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'p99/quiet':>11}")
    for name, phase in results["phases"].items():
        for path in ("healthz", "tasks_list"):
            f = phase[path]
            print(
                f"{name:<12}{path:<12}{f['n']:>6}{f['failures']:>6}{f['p50_ms']:>9}{f['p95_ms']:>9}{f['p99_ms']:>9}"
                f"{f['p99_ratio_to_quiet']:>11}"
            )
    print(f"slow sockets: {results['phases']['slow'].get('sockets')}")
    print(f"bad bodies: {results['phases']['bad_bodies'].get('bad_requests')}")
    print(f"peak RSS (MiB): {results.get('peak_rss_mib')}")
