"""``python -m bench budget``: the PostgreSQL connections one default deploy holds under a burst.

The deploy is the Procfile's web (gunicorn, ``WEB_CONCURRENCY=2``), worker and beat with
default settings (no ``RELAY_DB_*``), direct connections, no pooler. The burst is
``--clients`` (40) concurrent clients for ``--duration`` s: half send ``message/send``
creates (closed loop), a quarter read the REST messages feed (closed loop), a quarter hold
long-polls on it (``wait=30``, re-asked at once with ``after``), woken by the sends; every
recipient has a webhook endpoint on a loopback receiver, so the worker fans out and
delivers as it would. The rate limits are lifted (``bench.harness.base_env``), so every
request reaches the database: the worst case for the budget.

A sampler reads ``pg_stat_activity`` for the database every 100 ms (its own connection is
left out) and attributes each backend to the process holding its client port (psutil),
with its state. It reports the most connections seen at once, during the burst and while
the worker drains after it, what held them at that moment, and each process's own maximum.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import psutil
import requests

from bench import harness
from bench.run import git_commit

TARGET = 20


def _tcp(p: psutil.Process):
    getter = getattr(p, "net_connections", None) or p.connections
    return getter(kind="tcp")


class ConnectionSampler:
    """``pg_stat_activity`` of one database every ``interval`` s, each backend named by the process holding it."""

    def __init__(self, database_url: str, groups: dict[str, harness.Proc], interval: float = 0.1):
        self.database_url, self.groups, self.interval = database_url, groups, interval
        self.samples: list[dict] = []
        self.phase = "before"
        self._known: dict[int, str] = {}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-connections")

    def _owners(self, ports: set[int]) -> dict[int, str]:
        """Client port -> ``group`` (or ``group[i]`` for the i-th child of a group with several).

        The processes' sockets are read again only when a port not seen before turns up
        (a pool's connections keep their ports), so a sample costs a query, not a scan.
        """
        if ports <= self._known.keys():
            return self._known
        owners = {}
        for group, proc in self.groups.items():
            tree = proc.tree()
            children = tree[1:]
            for p in tree:
                label = group if len(children) <= 1 or p is tree[0] else f"{group}[{children.index(p) + 1}]"
                if p is tree[0] and len(children) > 1:
                    label = f"{group} master"
                try:
                    for c in _tcp(p):
                        if c.raddr and c.raddr.port == 5432:
                            owners[c.laddr.port] = label
                except psutil.Error:
                    continue
        self._known.update(owners)
        return self._known

    def _run(self) -> None:
        conn, _ = harness._admin(self.database_url)
        try:
            with conn.cursor() as cur:
                cur.execute("SET application_name = 'bench-sampler'")
            while not self._halt.is_set():
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT client_port, coalesce(state, backend_type) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    rows = cur.fetchall()
                owners = self._owners({port for port, _ in rows if port is not None})
                held = Counter(f"{owners.get(port, 'unattributed')}: {state}" for port, state in rows)
                self.samples.append({"t": time.time(), "phase": self.phase, "total": len(rows), "held": dict(held)})
                self._halt.wait(self.interval)
        finally:
            conn.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._halt.set()
        self._thread.join(10)

    def summary(self, phase: str) -> dict:
        mine = [s for s in self.samples if s["phase"] == phase]
        if not mine:
            return {"samples": 0}
        peak = max(mine, key=lambda s: s["total"])
        per_process: dict[str, int] = {}
        per_state: dict[str, int] = {}
        for s in mine:
            by_process, by_state = Counter(), Counter()
            for label, n in s["held"].items():
                who, _, state = label.partition(": ")
                by_process[who] += n
                by_state[state] += n
            for who, n in by_process.items():
                per_process[who] = max(per_process.get(who, 0), n)
            for state, n in by_state.items():
                per_state[state] = max(per_state.get(state, 0), n)
        return {
            "samples": len(mine),
            "max_connections": peak["total"],
            "at_max": dict(sorted(peak["held"].items())),
            "max_by_process": dict(sorted(per_process.items())),
            "max_by_state": dict(sorted(per_state.items())),
            "mean_connections": round(sum(s["total"] for s in mine) / len(mine), 1),
        }


def _closed_loop(scenario: dict) -> tuple[subprocess.Popen, str]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(scenario, f)
    out = f.name + ".out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.closed_loop", f.name, out],
        cwd=harness.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, out


def _config_check(env: dict) -> str:
    out = subprocess.run(
        [str(harness.BIN / "relay"), "config", "check"], env=env, capture_output=True, text=True, timeout=60
    )
    return (out.stdout + out.stderr).strip()


def budget(clients: int = 40, duration: float = 30.0) -> dict:
    """Run the burst against one default deploy; return the results document."""
    from bench.webhooks import Receivers

    senders_n, readers_n = clients // 2, clients // 4
    polls_n = clients - senders_n - readers_n
    senders = [f"s{i}@burst" for i in range(4)]
    recipients = [f"r{i}@burst" for i in range(10)]
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "deploy": "Procfile web (gunicorn, WEB_CONCURRENCY=2), worker and beat; default RELAY_DB_* settings;"
        " DATABASE_URL direct, no DATABASE_CONNECTION_POOL_URL; rate limits lifted",
        "clients": {
            "message/send create (closed loop)": senders_n,
            "REST feed first page (closed loop)": readers_n,
            "REST feed long-poll wait=30 (re-asked with after)": polls_n,
        },
        "duration_s": duration,
        "target_max_connections": TARGET,
        "sampler": "pg_stat_activity of the database every 100 ms, the sampler's own connection left out;"
        " each backend named by the process holding its client port",
    }
    procs: list = []
    with (
        harness.fresh_database("relay_bench_budget") as database_url,
        harness.claimed_redis_db() as redis_url,
        tempfile.TemporaryDirectory(prefix="relay-bench-beat-") as beat_home,
    ):
        env = harness.base_env(database_url, {"REDIS_URL": redis_url, "RELAY_HOME": beat_home})
        receivers = Receivers()
        try:
            results["config_check"] = _config_check(env)
            keys = harness.create_agents(env, senders + recipients)
            web, url = harness.gunicorn("app:app", env, 2)
            procs.append(web)
            worker = harness.celery_worker(env)
            procs.append(worker)
            beat = harness.celery_beat(env)
            procs.append(beat)
            for i, r in enumerate(recipients):
                port = receivers.listen("ok")
                requests.post(
                    f"{url}/api/v1/identities/{r}/webhooks",
                    json={"url": f"http://127.0.0.1:{port}/hook/{i}", "events": ["message.created"]},
                    headers={"Authorization": f"Bearer {keys[r]}"},
                    timeout=30,
                ).raise_for_status()
            # One message each, delivered: the worker is up before the burst starts.
            for r in recipients:
                requests.post(
                    f"{url}/a2a",
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "message/send",
                        "params": {"recipient": r, "message": {"parts": [{"type": "text", "text": "warm-up"}]}},
                    },
                    headers={"Authorization": f"Bearer {keys[senders[0]]}"},
                    timeout=30,
                ).raise_for_status()
            deadline = time.monotonic() + 60
            while len(receivers.arrivals) < len(recipients) and time.monotonic() < deadline:
                time.sleep(0.2)
            results["warm_up_deliveries"] = len(receivers.arrivals)
            host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
                json.dump(
                    {
                        "host": host,
                        "port": port,
                        "wait": 30,
                        "waiters": [
                            {"kind": "poll", "handle": recipients[i % len(recipients)], "key": keys[recipients[i % len(recipients)]]}
                            for i in range(polls_n)
                        ],
                    },
                    spec,
                )  # fmt: skip
            polls_out = spec.name + ".out"
            polls = subprocess.Popen(
                [sys.executable, "-m", "bench.wake_clients", spec.name, polls_out], cwd=harness.ROOT
            )
            procs.append(polls)
            deadline = time.monotonic() + 60
            while not Path(polls_out + ".ready").exists():
                if polls.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the long-polls did not connect")
                time.sleep(0.1)
            groups = {"web": web, "worker": worker, "beat": beat}
            with ConnectionSampler(database_url, groups) as sampler:
                time.sleep(2)
                sampler.phase = "burst"
                busy0, t0 = psutil.cpu_times(), time.monotonic()
                pairs = [[keys[senders[i % len(senders)]], recipients[i % len(recipients)]] for i in range(40)]
                identities = [[keys[r], r] for r in recipients]
                send = _closed_loop(
                    {
                        "host": url,
                        "kind": "send_create",
                        "users": senders_n,
                        "duration": duration,
                        "data": {"pairs": pairs},
                    }
                )
                read = _closed_loop(
                    {"host": url, "kind": "feed", "users": readers_n, "duration": duration, "data": {"identities": identities}}
                )  # fmt: skip
                figures = {}
                for label, (proc, out) in (("send", send), ("feed", read)):
                    proc.wait(timeout=duration + 120)
                    figures[label] = json.load(open(out))
                sampler.phase = "drain"
                busy1, wall = psutil.cpu_times(), time.monotonic() - t0
                # Both cores, ours and not: other test suites may share the machine.
                results["machine_busy_cores_during_burst"] = round(
                    (sum(busy1) - busy1.idle - (sum(busy0) - busy0.idle)) / wall, 2
                )
                sent = figures["send"]["requests"] - figures["send"]["failures"]
                deadline = time.monotonic() + 120
                while len(receivers.arrivals) < len(recipients) + sent and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(2)
            polls.terminate()
            polls.wait(timeout=30)
            got = json.load(open(polls_out)) if Path(polls_out).exists() else {}
            results["requests"] = {
                label: {k: fig[k] for k in ("requests", "failures", "rps", "p50_ms", "p99_ms", "errors")}
                for label, fig in figures.items()
            }
            results["long_polls"] = {
                "answers_with_messages": sum(len(v) for v in got.get("latency_s", {}).values()),
                "errors": got.get("errors"),
            }
            results["webhooks_delivered"] = len(receivers.arrivals) - len(recipients)
            results["connections"] = {
                "before (idle, 2 s)": sampler.summary("before"),
                "burst": sampler.summary("burst"),
                "drain (the worker delivering what the burst sent)": sampler.summary("drain"),
            }
            peak = max(results["connections"]["burst"].get("max_connections", 0), results["connections"]["drain (the worker delivering what the burst sent)"].get("max_connections", 0))  # fmt: skip
            results["max_connections"] = peak
            results["within_target"] = peak <= TARGET
        finally:
            for proc in reversed(procs):
                if isinstance(proc, subprocess.Popen):
                    if proc.poll() is None:
                        proc.kill()
                else:
                    proc.stop()
            receivers.close()
    return results


def print_budget(results: dict) -> None:
    print(
        f"\nbench budget {results['date']} commit {results['commit']}: {results['clients']}, {results['duration_s']:g} s"
    )
    print(results["config_check"])
    for label, fig in results["requests"].items():
        print(
            f"  {label}: {fig['rps']:.0f} req/s, {fig['failures']} failures, p50 {fig['p50_ms']:.1f} p99 {fig['p99_ms']:.1f} ms {fig['errors'][:1]}"
        )
    print(f"  long-polls: {results['long_polls']}; webhooks delivered {results['webhooks_delivered']}")
    for phase, s in results["connections"].items():
        print(f"  {phase}: {s}")
    print(
        f"  max PostgreSQL connections: {results['max_connections']} (target <= {TARGET}: {'met' if results['within_target'] else 'MISSED'})"
    )
