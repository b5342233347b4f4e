"""``python -m bench nodes``: two full stacks through one PgBouncer, against one PostgreSQL and one Redis.

Each node is the Procfile's web (gunicorn, 2 workers) and worker, with default settings
and ``DATABASE_CONNECTION_POOL_URL`` pointing at one private PgBouncer 1.18 in transaction
mode (relay/ops/pooler.py; ``RELAY_DB_PREPARE`` left at auto, so off); one beat serves
both. Every process group connects with its own ``application_name`` (``nodeA-web``,
``nodeB-worker``, ``beat``...), so PgBouncer's ``SHOW CLIENTS`` and PostgreSQL's
``pg_stat_activity`` tell them apart. Three phases, each on both nodes at once:

1. **Send throughput**: ``message/send`` creates from closed-loop clients, each sending to
   node A and node B in turn (bench.closed_loop with ``hosts``), alternating with runs of
   the bare ceiling (bench/ceiling.py's insert, 2 gunicorn workers, through the same PgBouncer).
2. **Webhooks**: an open-loop rate of messages, each through node A or B in turn, to
   recipients with one endpoint each on loopback receivers (bench/webhooks.Receivers);
   commit->received latency (``data.created_at`` to arrival), lost and duplicate
   deliveries (by ``webhook-id`` and by message), and every signature checked
   (Standard Webhooks, with the secret each endpoint was given).
3. **Wake-ups across nodes**: long-polls and SSE streams held on node B for some agents
   and on node A for others (bench/wake_clients.py, one process per node); each message
   goes through the other node, so every wake-up crossed nodes through Redis.

Throughout, each process group's CPU seconds (psutil over its process tree), and every
200 ms ``pg_stat_activity`` for the database (by application_name and state) and
PgBouncer's clients and server connections: the most each node held.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import psutil
import psycopg2
import requests

from bench import harness
from bench.closed_loop import Client, _rpc
from bench.run import git_commit, load, median_of
from bench.webhooks import CpuSampler, Receivers, _create_agents, _machine_busy_s, _postgres_groups

WAKE_PREFIX = "wake "
NODES = ("A", "B")


def _pct(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)] * 1000, 1)

    return {"count": len(ordered), "p50_ms": at(50), "p95_ms": at(95), "p99_ms": at(99), "max_ms": at(100)}


class Connections:
    """Every 200 ms: pg_stat_activity of the database and PgBouncer's clients and servers for it."""

    def __init__(self, database_url: str, pooler, dbname: str, interval: float = 0.2):
        self.database_url, self.pooler, self.dbname, self.interval = database_url, pooler, dbname, interval
        self.phase = "start"
        self.max: dict[str, dict[str, int]] = {}  # phase -> key -> most seen in one sample
        self.samples = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-connections")

    def _note(self, counts: Counter) -> None:
        for phase in (self.phase, "whole run"):
            seen = self.max.setdefault(phase, {})
            for key, n in counts.items():
                seen[key] = max(seen.get(key, 0), n)

    def _run(self) -> None:
        pg, _ = harness._admin(self.database_url)
        bouncer = psycopg2.connect(host="127.0.0.1", port=self.pooler.port, user=self.pooler.user, dbname="pgbouncer")
        bouncer.autocommit = True
        try:
            with pg.cursor() as cur:
                cur.execute("SET application_name = 'bench-sampler'")
            while not self._halt.is_set():
                counts: Counter = Counter()
                with pg.cursor() as cur:
                    cur.execute(
                        "SELECT application_name, coalesce(state, backend_type) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    rows = cur.fetchall()
                counts["postgres: all backends of the database"] = len(rows)
                for app, state in rows:
                    counts[f"postgres: {app or '(none)'}"] += 1
                    counts[f"postgres: {app or '(none)'} {state}"] += 1
                with bouncer.cursor() as cur:
                    for command, side in (("SHOW CLIENTS", "client"), ("SHOW SERVERS", "server")):
                        cur.execute(command)
                        names = [d[0] for d in cur.description]
                        for row in cur.fetchall():
                            r = dict(zip(names, row))
                            if r.get("database") != self.dbname:
                                continue
                            counts[f"pgbouncer {side}s: all"] += 1
                            if side == "client":
                                counts[f"pgbouncer clients: {r.get('application_name') or '(none)'}"] += 1
                            else:
                                counts[f"pgbouncer servers: {r.get('state')}"] += 1
                for key in list(counts):
                    if key.startswith("pgbouncer clients: node"):
                        counts[f"pgbouncer clients: node {key.split('node', 1)[1][0]} (web + worker)"] += counts[key]
                    elif key.startswith("postgres: node") and key.count(" ") == 1:
                        counts[f"postgres: node {key.split('node', 1)[1][0]} (web + worker)"] += counts[key]
                self.samples += 1
                self._note(counts)
                self._halt.wait(self.interval)
        finally:
            pg.close()
            bouncer.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(10)


def _open_loop(plan, urls: list[str], rate: float, duration: float, threads_n: int = 4) -> dict:
    """Send ``rate * duration`` messages at a steady rate; message n is ``plan(n)`` = (node, key, recipient, text)."""
    sent: list[dict] = []
    failures: list[str] = []
    lock = threading.Lock()
    start = time.monotonic() + 0.2
    total = int(rate * duration)
    hosts = [u.removeprefix("http://") for u in urls]

    def run(offset: int) -> None:
        clients = [Client("127.0.0.1", int(h.rsplit(":", 1)[1])) for h in hosts]
        for n in range(offset, total, threads_n):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            node, key, recipient, text = plan(n)
            params = {"recipient": recipient, "message": {"parts": [{"type": "text", "text": text}]}}
            try:
                status, body = clients[node].request(_rpc(hosts[node], key, "message/send", params))
                message_id = json.loads(body)["result"]["message_id"]
            except (OSError, ValueError, KeyError) as exc:
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                sent.append({"node": NODES[node], "recipient": recipient, "message_id": message_id})
        for c in clients:
            c.close()

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return {"sent": sent, "failures": failures, "wall_s": round(time.monotonic() - start, 2)}


def _send(url: str, key: str, recipient: str, text: str) -> dict:
    r = requests.post(
        f"{url}/a2a",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": recipient, "message": {"parts": [{"type": "text", "text": text}]}},
        },
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    body = r.json()
    if "result" not in body:
        raise RuntimeError(f"message/send through {url} failed: {body}")
    return body["result"]


def _verify(secret: str, headers: dict, body: bytes) -> bool:
    import standardwebhooks

    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
        return True
    except Exception:  # noqa: BLE001 (any failure to verify counts as a bad signature)
        return False


def nodes(args) -> dict:
    """Run the three phases on two nodes; return the results document (see the module docstring)."""
    from relay.ops.pooler import Pooler

    quick = args.quick
    throughput_s = 3.0 if quick else args.throughput_seconds
    rate = 20.0 if quick else args.rate
    duration = 5.0 if quick else args.duration
    repeats = 1 if quick else 2
    users = 8
    senders = [f"s{i}@nodes" for i in range(4)]
    quiet = [f"q{i}@nodes" for i in range(8)]
    hooked = [f"h{i}@nodes" for i in range(10)]
    waited = {"A": [f"wa{i}@nodes" for i in range(5)], "B": [f"wb{i}@nodes" for i in range(5)]}
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": quick,
        "topology": "2 nodes (each: gunicorn web with WEB_CONCURRENCY=2 and a Celery worker, Procfile lines, default"
        " settings), 1 beat, 1 PgBouncer 1.18 (transaction mode, default_pool_size 20), 1 PostgreSQL, 1 Redis db;"
        " all on this 2-core machine with the load generators",
        "pooler": "relay.ops.pooler.Pooler: PgBouncer 1.18 pool_mode=transaction default_pool_size=20",
        "settings": {
            "throughput_s": throughput_s,
            "repeats": repeats,
            "users": users,
            "rate": rate,
            "duration": duration,
        },
        "machine": {"cpus": psutil.cpu_count()},
    }
    with ExitStack() as cleanup:
        database_url = cleanup.enter_context(harness.fresh_database("relay_bench_nodes"))
        redis_url = cleanup.enter_context(harness.claimed_redis_db())
        beat_home = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="relay-bench-beat-"))
        dbname = database_url.rsplit("/", 1)[1].split("?")[0]
        pooler = Pooler(harness.server_urls()[0], pool_size=20)
        cleanup.callback(pooler.stop)
        pooled = pooler.url(database_url)
        env = harness.base_env(database_url, {"REDIS_URL": redis_url, "RELAY_HOME": beat_home})

        def as_app(app: str) -> dict:
            return {**env, "DATABASE_CONNECTION_POOL_URL": f"{pooled}?application_name={app}"}

        keys = _create_agents(env, senders + quiet + hooked + waited["A"] + waited["B"])
        webs, urls, groups = [], [], {}
        for node in NODES:
            web, url = harness.gunicorn("app:app", as_app(f"node{node}-web"), 2)
            cleanup.callback(web.stop)
            worker = harness.celery_worker(as_app(f"node{node}-worker"))
            cleanup.callback(worker.stop)
            webs.append(web)
            urls.append(url)
            groups[f"node {node} web"] = web.tree
            groups[f"node {node} worker"] = worker.tree
        beat = harness.celery_beat(as_app("beat"))
        cleanup.callback(beat.stop)
        groups["beat"] = beat.tree
        ceiling, ceiling_url = harness.gunicorn(
            "bench.ceiling:app", {**env, "DATABASE_URL": f"{pooled}?application_name=ceiling"}, 2
        )
        cleanup.callback(ceiling.stop)
        groups["ceiling (bench.ceiling, 2 workers)"] = ceiling.tree
        groups["pgbouncer"] = lambda: [psutil.Process(pooler.proc.pid)] if pooler.proc.poll() is None else []
        groups["bench process (receivers, senders, samplers)"] = lambda: [psutil.Process()]
        groups.update(_postgres_groups(dbname))
        cpu = CpuSampler(groups)
        cpu.start()
        cleanup.callback(cpu.stop)
        connections = Connections(database_url, pooler, dbname)
        connections.start()
        cleanup.callback(connections.stop)
        receivers = Receivers()
        receivers.keep_signatures = True
        cleanup.callback(receivers.close)
        # Both nodes answer and both workers are up: one message through each.
        for i, url in enumerate(urls):
            _send(url, keys[senders[0]], quiet[i], "warm-up")

        def window(label: str, fn):
            connections.phase = label
            before, busy0, t0 = cpu.mark(), _machine_busy_s(), time.monotonic()
            out = fn()
            after, busy1, wall = cpu.mark(), _machine_busy_s(), time.monotonic() - t0
            used = {k: round(after[k] - before[k], 2) for k in after}
            # Everything on the machine, ours and not (other test suites share these cores).
            used["machine busy (2 cores)"] = round(busy1 - busy0, 2)
            return out, {"wall_s": round(wall, 2), "cpu_s": used}

        # 1. Send throughput, closed loop, each client alternating nodes.
        pairs = [[keys[senders[i % len(senders)]], quiet[i % len(quiet)]] for i in range(64)]
        relay_runs, ceiling_runs, cpu_windows = [], [], []
        for _ in range(repeats):
            ceiling_runs.append(
                load({"host": ceiling_url, "kind": "ceiling_insert", "users": users, "duration": throughput_s})
            )
            fig, used = window(
                "throughput",
                lambda: load(
                    {
                        "hosts": urls,
                        "kind": "send_create",
                        "users": users,
                        "duration": throughput_s,
                        "data": {"pairs": pairs},
                    }
                ),
            )
            relay_runs.append(fig)
            cpu_windows.append(used)
        fig, near = median_of(relay_runs), median_of(ceiling_runs)
        fig["each_run"] = [
            {"rps": round(r["rps"], 1), "ceiling_rps": round(c["rps"], 1)} for r, c in zip(relay_runs, ceiling_runs)
        ]
        fig["ceiling_rps"] = near["rps"]
        fig["ratio_rps"] = fig["rps"] / near["rps"] if near["rps"] else None
        fig["cpu_s_per_run"] = cpu_windows
        results["throughput"] = fig
        results["throughput_drained"] = harness.drained(database_url)

        # 2. Webhooks: each message through node A or B in turn, one endpoint per recipient.
        secrets_of, path_of = {}, {}
        for i, recipient in enumerate(hooked):
            port = receivers.listen("ok")
            path = f"/hook/{i}"
            r = requests.post(
                f"{urls[i % 2]}/api/v1/identities/{recipient}/webhooks",
                json={"url": f"http://127.0.0.1:{port}{path}", "events": ["message.created"]},
                headers={"Authorization": f"Bearer {keys[recipient]}"},
                timeout=30,
            )
            r.raise_for_status()
            secrets_of[path] = r.json()["secret"]
            path_of[recipient] = path
        arrivals_before = len(receivers.arrivals)

        def hook_plan(n: int):
            return n % 2, keys[senders[n % len(senders)]], hooked[n % len(hooked)], f"hook {n}"

        def hook_phase():
            sent = _open_loop(hook_plan, urls, rate, duration)
            expected = {(path_of[s["recipient"]], s["message_id"]): s["node"] for s in sent["sent"]}
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = {
                    (path, json.loads(body)["data"]["id"])
                    for _, path, _, body in receivers.arrivals[arrivals_before:]
                    if path.startswith("/hook/")
                }
                if expected.keys() <= got:
                    break
                time.sleep(0.25)
            time.sleep(2)  # any duplicate that was on its way
            return sent, expected

        (sent, expected), used = window("webhooks", hook_phase)
        firsts: dict[tuple[str, str], float] = {}
        by_message: Counter = Counter()
        by_webhook_id: Counter = Counter()
        latency: dict[str, list[float]] = {"A": [], "B": [], "all": []}
        bad_signatures = 0
        for arrived, path, webhook_id, body in receivers.arrivals[arrivals_before:]:
            data = json.loads(body)["data"]
            key = (path, data["id"])
            by_message[key] += 1
            by_webhook_id[(path, webhook_id)] += 1
            if key not in firsts:
                firsts[key] = arrived
                created = datetime.fromisoformat(data["created_at"].replace("Z", "+00:00")).timestamp()
                node = expected.get(key)
                if node:
                    latency[node].append(arrived - created)
                    latency["all"].append(arrived - created)
        signed = [x for x in receivers.signed if x[0] in secrets_of]
        bad_signatures = sum(
            1
            for path, wid, ts, sig, body in signed
            if not _verify(
                secrets_of[path], {"webhook-id": wid, "webhook-timestamp": ts, "webhook-signature": sig}, body
            )
        )
        results["webhooks"] = {
            "rate_per_s": rate,
            "duration_s": duration,
            "sent": len(sent["sent"]),
            "send_failures": sent["failures"][:3],
            "sent_through": dict(Counter(s["node"] for s in sent["sent"])),
            "expected_deliveries": len(expected),
            "delivered": sum(1 for k in expected if k in firsts),
            "lost": sum(1 for k in expected if k not in firsts),
            "duplicate_deliveries_by_message": sum(n - 1 for n in by_message.values() if n > 1),
            "duplicate_webhook_ids": sum(n - 1 for n in by_webhook_id.values() if n > 1),
            "unexpected": sum(1 for k in by_message if k not in expected),
            "signatures_checked": len(signed),
            "bad_signatures": bad_signatures,
            "latency_commit_to_received": {k: _pct(v) for k, v in latency.items()},
            "latency_note": "receiver arrival time.time() - data.created_at, by the node the message was sent through",
            "window": used,
        }
        results["webhooks_drained"] = harness.drained(database_url)

        # 3. Wake-ups across nodes: waiters on node B for wb*, on node A for wa*; each message through the other.
        clients, outs = [], {}
        for i, node in enumerate(NODES):
            port = int(urls[i].rsplit(":", 1)[1])
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
                json.dump(
                    {
                        "host": "127.0.0.1",
                        "port": port,
                        "wait": 30,
                        "timed_prefix": WAKE_PREFIX,
                        "waiters": [
                            {"kind": kind, "handle": h, "key": keys[h]}
                            for h in waited[node]
                            for kind in ("poll", "sse")
                        ],
                    },
                    spec,
                )
            outs[node] = spec.name + ".out"
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.wake_clients", spec.name, outs[node]], cwd=harness.ROOT
            )
            cleanup.callback(lambda p=proc: p.kill() if p.poll() is None else None)
            clients.append(proc)
        deadline = time.monotonic() + 60
        while not all(Path(o + ".ready").exists() for o in outs.values()):
            if time.monotonic() > deadline or any(p.poll() is not None for p in clients):
                raise RuntimeError("the waiters did not connect")
            time.sleep(0.1)
        time.sleep(1)

        def wake_plan(n: int):
            # even: to a waiter on B, sent through A; odd: to a waiter on A, sent through B
            target = "B" if n % 2 == 0 else "A"
            through = 0 if target == "B" else 1
            return through, keys[senders[n % len(senders)]], waited[target][(n // 2) % 5], f"{WAKE_PREFIX}{n}"

        wake_rate = 10.0
        wake_sent, used = window("wake", lambda: _open_loop(wake_plan, urls, wake_rate, duration))
        time.sleep(2)
        for p in clients:
            p.terminate()
        for p in clients:
            p.wait(timeout=30)
        wake: dict = {
            "rate_per_s": wake_rate,
            "sent": len(wake_sent["sent"]),
            "send_failures": wake_sent["failures"][:3],
            "waiters": {node: f"{len(waited[node])} agents x (1 long-poll wait=30 + 1 SSE stream)" for node in NODES},
            "latency_note": "waiter's receipt time.time() - message created_at; every message sent through the other node",
            "window": used,
        }
        for node in NODES:
            got = json.load(open(outs[node]))
            sent_to = [s for s in wake_sent["sent"] if s["recipient"] in waited[node]]
            received = {h: set(ids) for h, ids in got["received"].items()}
            other = "A" if node == "B" else "B"
            wake[f"sent on {other}, waiting on {node}"] = {
                "poll": _pct(got["latency_s"]["poll"]),
                "sse": _pct(got["latency_s"]["sse"]),
                "messages": len(sent_to),
                "messages_no_waiter_saw": sum(1 for s in sent_to if s["message_id"] not in received.get(s["recipient"], set())),
                "duplicates": got["duplicates"],
                "client_errors": got["errors"],
                "waiter_process_cpu_s": round(got["cpu_seconds"], 2),
            }  # fmt: skip
        results["wake"] = wake
        connections.stop()
        results["connections"] = {
            "samples": connections.samples,
            "note": "the most seen in one 200 ms sample, per key and phase. Through PgBouncer in transaction mode"
            " a server connection's application_name is that of the client it last served, so 'postgres: <app>'"
            " counts server connections last used by that app; 'pgbouncer clients' are the relay's own pools.",
            "max": connections.max,
        }
        results["cpu_s_whole_run"] = {k: round(v, 2) for k, v in cpu.mark().items()}
        results["pgbouncer_pools"] = [list(map(str, row)) for row in pooler.admin("SHOW POOLS")]
        results["pgbouncer_log_errors"] = [
            line for line in pooler.log().splitlines() if "ERROR" in line or "WARNING" in line
        ][:10]
    return results


def print_nodes(results: dict) -> None:
    t = results["throughput"]
    print(f"\nbench nodes {results['date']} commit {results['commit']}")
    print(
        f"  send throughput (8 clients alternating nodes): {t['rps']:.0f} req/s = {t['ratio_rps']:.2f}x the ceiling"
        f" ({t['ceiling_rps']:.0f} req/s), p50 {t['p50_ms']:.1f} p99 {t['p99_ms']:.1f} ms, {t['failures']} failures"
    )
    w = results["webhooks"]
    print(
        f"  webhooks: {w['sent']} sent {w['sent_through']}, {w['delivered']}/{w['expected_deliveries']} delivered,"
        f" lost {w['lost']}, duplicates {w['duplicate_deliveries_by_message']} / {w['duplicate_webhook_ids']}"
    )
    print(f"  webhook latency: {w['latency_commit_to_received']}")
    for k, v in results["wake"].items():
        if k.startswith("sent on"):
            print(f"  wake {k}: {v}")
    for phase, seen in results["connections"]["max"].items():
        print(f"  connections, {phase}: {seen}")
    print(f"  CPU s whole run: {results['cpu_s_whole_run']}")
