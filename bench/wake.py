"""``python -m bench wake``: N waiters (long-polls and SSE streams) woken by messages at a steady rate.

Reports commit->client wake latency (p50/p95/p99, by kind), the waiters the relay held
(its slots in Redis and the clients' open connections), the web workers' peak RSS, and
what holding them costs the send path: ``message/send`` (create) closed-loop throughput
to agents nobody waits on, as a ratio of the stack's own ceiling (bench/ceiling.py's
insert), with no waiters and with all of them held, in the same run. What waking them
costs is the steady phase's web CPU (``steady.web_cores``).

Load generators, chosen lean for two cores: the waiters are one asyncio process on raw
sockets (bench/wake_clients.py); the steady sender is threads on raw keep-alive sockets
(bench.closed_loop.Client); the throughput phases are bench.closed_loop. Each reports
its own CPU.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
import redis

from bench import harness
from bench.closed_loop import Client, _rpc
from bench.run import git_commit, load, median_of

WAKE_PREFIX = "wake "  # the steady phase's messages; the throughput phase's are not timed


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)] * 1000, 1)

    return {"count": len(ordered), "p50_ms": pct(50), "p95_ms": pct(95), "p99_ms": pct(99), "max_ms": pct(100)}


def _cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's CPU seconds so far: ``{pid: (name, seconds)}``."""
    seen = {}
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            t = proc.cpu_times()
            cmd = " ".join(proc.info["cmdline"] or [])[:60] or proc.info["name"]
            seen[proc.pid] = (cmd, t.user + t.system)
        except psutil.Error:
            pass
    return seen


def _top_cpu(before: dict, after: dict, wall: float, n: int = 8) -> list[tuple[str, float]]:
    """The ``n`` commands (processes of one command line summed) that used the most cores between two samples."""
    used: dict[str, float] = {}
    for pid, (cmd, seconds) in after.items():
        used[cmd] = used.get(cmd, 0.0) + seconds - before.get(pid, (cmd, 0.0))[1]
    return [(cmd, round(s / wall, 3)) for cmd, s in sorted(used.items(), key=lambda kv: -kv[1])[:n]]


def _web_rss(relay: harness.Proc) -> int:
    """Resident bytes of the web workers (not the master), summed."""
    total = 0
    for proc in relay.tree()[1:]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def _slots_held(client: redis.Redis) -> int:
    now = time.time()
    return sum(client.zcount(key, now, "+inf") for key in client.scan_iter("relay:waits:*", count=1000))


def _steady_sends(host: str, port: int, sender_key: str, recipients: list[str], rate: float, duration: float) -> dict:
    """Open loop: one message every 1/rate s, round robin over ``recipients``, from 4 threads."""
    threads_n = 4
    sent: list[tuple[str, str]] = []  # (recipient, message id)
    failures = []
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    total = int(rate * duration)

    def run(offset: int) -> None:
        client = Client(host, port)
        for n in range(offset, total, threads_n):
            due = start + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            recipient = recipients[n % len(recipients)]
            params = {"recipient": recipient, "message": {"parts": [{"type": "text", "text": f"{WAKE_PREFIX}{n}"}]}}
            status, body = client.request(_rpc(f"{host}:{port}", sender_key, "message/send", params))
            try:
                message_id = json.loads(body)["result"]["message_id"]
                with lock:
                    sent.append((recipient, message_id))
            except (ValueError, KeyError):
                with lock:
                    failures.append(f"HTTP {status}: {body[:200]!r}")
        client.close()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"sent": sent, "failures": failures, "wall_s": time.monotonic() - start}


def wake(
    waiters: int = 500,
    rate: float = 20.0,
    duration: float = 30.0,
    workers: int = 2,
    worker_class: str | None = None,
    threads: int | None = None,
    per_agent: int = 10,
    throughput_s: float = 10.0,
    ramp: float = 0.0,
) -> dict:
    """Run the wake bench; return the results document (see the module docstring).

    ``ramp``: seconds over which the waiters connect (0: 1,000 a second); spread over the
    long-polls' wait (30 s), their re-asks are spread as a fleet's are.
    """
    agents_n = math.ceil(waiters / per_agent)
    recipients = [f"w{i}@bench" for i in range(agents_n)]
    senders = [f"s{i}@bench" for i in range(4)]
    # The throughput phases send to agents nobody waits on: what they measure is the cost of
    # holding the waiters (their slow ticks, heartbeats and memory), not of waking them.
    quiet = [f"q{i}@bench" for i in range(8)]
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "waiters": waiters,
        "rate_per_s": rate,
        "ramp_s": ramp,
        "duration_s": duration,
        "workers": workers,
        "worker_class": worker_class or "relay.transport.server.RelayWorker (gevent)",
        "agents": agents_n,
        "load_generators": {
            "waiters": "bench.wake_clients: one asyncio process, raw sockets",
            "steady sender": "4 threads on raw keep-alive sockets (bench.closed_loop.Client)",
            "throughput": "bench.closed_loop: 8 threads on raw keep-alive sockets, closed loop",
        },
    }
    extra_args: list[str] = []
    if worker_class:
        extra_args += ["--worker-class", worker_class]
    if threads:
        extra_args += ["--threads", str(threads)]
    with harness.fresh_database() as database_url, harness.claimed_redis_db() as redis_url:
        env = harness.base_env(
            database_url,
            {"REDIS_URL": redis_url, "RELAY_STREAMS_PER_AGENT": str(per_agent)},
        )
        keys = harness.create_agents(env, recipients + senders + quiet)
        relay, relay_url = harness.gunicorn("app:app", env, workers, extra_args)
        ceiling, ceiling_url = harness.gunicorn("bench.ceiling:app", env, workers)
        worker = harness.celery_worker(env)
        host, port = "127.0.0.1", int(relay_url.rsplit(":", 1)[1])
        clients = None
        try:
            pairs = [[keys[senders[i % len(senders)]], quiet[i % len(quiet)]] for i in range(64)]

            def throughput(label: str) -> dict:
                ceil = median_of(
                    [
                        load({"host": ceiling_url, "kind": "ceiling_insert", "users": 8, "duration": throughput_s})
                        for _ in range(2)
                    ]
                )
                fig = median_of(
                    [
                        load(
                            {
                                "host": relay_url,
                                "kind": "send_create",
                                "users": 8,
                                "duration": throughput_s,
                                "data": {"pairs": pairs},
                            },
                            relay,
                        )
                        for _ in range(2)
                    ]
                )
                fig["ceiling_rps"] = ceil["rps"]
                fig["ratio_rps"] = round(fig["rps"] / ceil["rps"], 3) if ceil["rps"] else None
                fig["label"] = label
                return fig

            spec = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
            json.dump(
                {
                    "host": host,
                    "port": port,
                    "wait": 30,
                    # Seconds for every waiter to be in (a poll sent, a stream's ": ready" read).
                    "ready_within": max(120, waiters / 40) + ramp,
                    "ramp_seconds": ramp,
                    "timed_prefix": WAKE_PREFIX,
                    "waiters": [
                        {
                            "kind": "poll" if i % 2 == 0 else "sse",
                            "handle": recipients[i % agents_n],
                            "key": keys[recipients[i % agents_n]],
                        }
                        for i in range(waiters)
                    ],
                },
                spec,
            )
            spec.close()
            out = spec.name + ".out"
            rss_before = _web_rss(relay)
            clients = subprocess.Popen([sys.executable, "-m", "bench.wake_clients", spec.name, out], cwd=harness.ROOT)
            deadline = time.monotonic() + max(180, waiters / 40 + 60) + ramp
            while not Path(out + ".ready").exists():
                if clients.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the waiters did not connect")
                time.sleep(0.2)
            slots = redis.Redis.from_url(redis_url)
            while (held := _slots_held(slots)) < waiters and time.monotonic() < deadline:
                time.sleep(0.2)
            results["waiters_held_before"] = held
            rss_held = _web_rss(relay)
            results["memory_per_waiter_kib"] = round((rss_held - rss_before) / 1024 / max(held, 1), 1)
            results["web_rss_mib_before_and_holding"] = [round(rss_before / 2**20, 1), round(rss_held / 2**20, 1)]
            # Phases in this order so that none runs while the worker drains another's backlog
            # (thousands of messages to index and fan out would take the cores from it).
            with harness.RssSampler({"web_worker": relay}) as rss:
                busy0, cpu0, wcpu0 = psutil.cpu_times(), harness.cpu_seconds(relay), harness.cpu_seconds(worker)
                every0 = _cpu_by_process()
                steady = _steady_sends(host, port, keys[senders[0]], recipients, rate, duration)
                every1 = _cpu_by_process()
                busy1, cpu1, wcpu1 = psutil.cpu_times(), harness.cpu_seconds(relay), harness.cpu_seconds(worker)
                time.sleep(2)  # the last wake-ups
                results["waiters_held_after"] = _slots_held(slots)
                if not harness.drained(database_url, 300):
                    raise RuntimeError("the worker had not indexed and fanned out everything within 300 s")
                results["send_with_waiters"] = throughput(f"{waiters} waiters held")
            results["peak_rss_mib"] = {"web_worker": round(rss.peak["web_worker"] / 2**20, 1)}
            wall = steady["wall_s"]
            results["steady"] = {
                "sent": len(steady["sent"]),
                "failures": steady["failures"][:3],
                "machine_busy_cores": round(
                    (sum(busy1) - busy1.idle - (sum(busy0) - busy0.idle)) / wall if wall else 0, 2
                ),
                "web_cores": round((cpu1 - cpu0) / wall, 2) if wall else None,
                "worker_cores": round((wcpu1 - wcpu0) / wall, 2) if wall else None,
                "top_cores": _top_cpu(every0, every1, wall) if wall else [],
            }
            clients.send_signal(signal.SIGTERM)
            clients.wait(timeout=60)
            got = json.load(open(out))
            per_kind = {kind: _percentiles(values) for kind, values in got["latency_s"].items()}
            per_kind["all"] = _percentiles([v for values in got["latency_s"].values() for v in values])
            results["latency"] = per_kind
            # Every waiter of a recipient should have seen each of its steady messages.
            waiters_of = {}
            for i in range(waiters):
                waiters_of[recipients[i % agents_n]] = waiters_of.get(recipients[i % agents_n], 0) + 1
            expected = sum(waiters_of[r] for r, _ in steady["sent"])
            received_ids = {h: set(ids) for h, ids in got["received"].items()}
            missing_messages = sum(1 for r, m in steady["sent"] if m not in received_ids.get(r, set()))
            results["deliveries"] = {
                "expected": expected,
                "timed": per_kind["all"]["count"],
                "messages_no_waiter_saw": missing_messages,
                "duplicates": got["duplicates"],
                "client_errors": got["errors"],
                "waiter_process_cpu_s": round(got["cpu_seconds"], 2),
            }
            results["waiters_held_after_stop"] = _slots_held(slots)
            if not harness.drained(database_url, 300):
                raise RuntimeError("the worker had not indexed and fanned out everything within 300 s")
            results["send_without_waiters"] = throughput("no waiters")
            results["send_path_ratio"] = (
                round(results["send_with_waiters"]["rps"] / results["send_without_waiters"]["rps"], 3)
                if results["send_without_waiters"]["rps"]
                else None
            )
        finally:
            if clients is not None and clients.poll() is None:
                clients.kill()
            for proc in (relay, ceiling, worker):
                proc.stop()
    return results


def print_wake(results: dict) -> None:
    print(
        f"\nbench wake {results['date']} commit {results['commit']}: {results['waiters']} waiters, "
        f"{results['rate_per_s']:g} msg/s for {results['duration_s']:g} s, {results['worker_class']}"
    )
    for kind, fig in results["latency"].items():
        if fig.get("count"):
            print(
                f"  wake latency {kind:>4}: p50 {fig['p50_ms']} ms  p95 {fig['p95_ms']} ms  "
                f"p99 {fig['p99_ms']} ms  max {fig['max_ms']} ms  ({fig['count']} wake-ups)"
            )
    print(f"  waiters held: {results['waiters_held_before']} before, {results['waiters_held_after']} after")
    print(f"  web worker peak RSS: {results['peak_rss_mib']['web_worker']} MiB")
    print(
        f"  web workers' RSS before the waiters and holding them: {results['web_rss_mib_before_and_holding']} MiB, "
        f"{results['memory_per_waiter_kib']} KiB a waiter"
    )
    print(f"  deliveries: {results['deliveries']}")
    for key in ("send_without_waiters", "send_with_waiters"):
        fig = results[key]
        print(
            f"  message/send create, {fig['label']}: {fig['rps']:.0f} req/s, "
            f"{fig['ratio_rps']:.2f}x the ceiling ({fig['ceiling_rps']:.0f} req/s)"
        )
    print(f"  send throughput held/none: {results['send_path_ratio']}")
    print(f"  steady phase: {results['steady']}")
