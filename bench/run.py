"""``python -m bench run``: every API path against the stack's own ceiling, webhooks, memory."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
import requests

from bench import harness, profiles

PATHS = [
    # (name, kind, ceiling kind)
    ("message/send create", "send_create", "ceiling_insert"),
    ("message/send append", "send_append", "ceiling_insert"),
    ("REST reply", "rest_reply", "ceiling_insert"),
    ("tasks/get (10 messages)", "tasks_get", "ceiling_select"),
    ("tasks/list (page of 50)", "tasks_list", "ceiling_select"),
    ("feed first page", "feed", "ceiling_select"),
    ("feed with q", "feed_q", "ceiling_select"),
]
# Paths that write: the database is analyzed after each (harness.analyze), as autovacuum
# would be between phases this far apart.
WRITES = {"send_create", "send_append", "rest_reply"}
# Measured once the worker has indexed what the other paths wrote: without it, every
# message sent in the earlier phases is unindexed and each search computes their vectors.
AFTER_INDEXING = {"feed_q"}
WORDS = ["refactor", "endpoint", "pagination", "users", "cursor", "migration", "flaky", "timeout"]


def _rpc(url: str, key: str, method: str, params: dict) -> dict:
    r = requests.post(
        f"{url}/a2a",
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    body = r.json()
    if "error" in body:
        raise RuntimeError(f"{method}: {body['error']}")
    return body["result"]


def load(scenario: dict, web: harness.Proc | None = None) -> dict:
    """Run one closed-loop scenario (bench.closed_loop) in its own process; return its figures.

    With ``web``, the figures also hold the CPU milliseconds the web processes spent per
    request (user + system, every process of its group).
    """
    cpu0 = harness.cpu_seconds(web) if web is not None else 0.0
    machine0 = psutil.cpu_times()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(scenario, f)
        spec = f.name
    out = spec + ".out"
    subprocess.run(
        [sys.executable, "-m", "bench.closed_loop", spec, out],
        check=True,
        cwd=harness.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    figures = json.load(open(out))
    machine1 = psutil.cpu_times()
    busy = sum(machine1) - machine1.idle - (sum(machine0) - machine0.idle)
    # Cores busy on the whole machine during the run (of 2): what else shared them shows here.
    figures["machine_busy_cores"] = round(busy / figures["wall_s"], 2) if figures.get("wall_s") else None
    if web is not None and figures["requests"]:
        web_s = harness.cpu_seconds(web) - cpu0
        figures["web_cpu_ms_per_req"] = web_s * 1000 / figures["requests"]
        figures["web_cores"] = round(web_s / figures["wall_s"], 2)
    return figures


def median_of(runs: list[dict]) -> dict:
    keys = (
        "rps",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "generator_cpu_s",
        "web_cpu_ms_per_req",
        "web_cores",
        "machine_busy_cores",
    )
    result = {k: statistics.median(r[k] for r in runs) for k in keys if all(k in r for r in runs)}
    result["requests"] = sum(r["requests"] for r in runs)
    result["failures"] = sum(r["failures"] for r in runs)
    result["errors"] = [e for r in runs for e in r.get("errors", [])][:3]
    return result


def seed(url: str, keys: dict[str, str], handles: list[str], messages_per_thread: int) -> dict:
    """Make threads and messages through the API for the read and append paths."""
    pairs, threads, identities, replies, append_threads = [], [], [], [], []
    for i, h in enumerate(handles):
        other = handles[(i + 1) % len(handles)]
        pairs.append((keys[h], other))
        identities.append((keys[h], h))
    # The first threads are only read (tasks/get stays a thread of messages_per_thread
    # messages whatever ran before it); the others take the append and reply load.
    for i in range(len(handles) * 4):
        sender, recipient = handles[i % len(handles)], handles[(i + 1) % len(handles)]
        reads = i < len(handles) * 2
        res = _rpc(
            url,
            keys[sender],
            "message/send",
            {
                "recipient": recipient,
                "message": {
                    "parts": [
                        {
                            "type": "text",
                            "text": f"Please {WORDS[i % len(WORDS)]} the users endpoint; pagination uses a cursor",
                        }
                    ]
                },
                "artifacts": [{"type": "file_ref", "path": "src/api/users.py"}],
            },
        )
        for n in range(messages_per_thread - 1 if reads else 0):
            author = recipient if n % 2 == 0 else sender
            _rpc(
                url,
                keys[author],
                "message/send",
                {
                    "task_id": res["task_id"],
                    "message": {"parts": [{"type": "text", "text": f"note {n} about the {WORDS[n % len(WORDS)]}"}]},
                },
            )
        if reads:
            threads.append((keys[sender], res["task_id"]))
        else:
            append_threads.append((keys[sender], res["task_id"]))
            replies.append((keys[recipient], recipient, res["task_id"]))
    for i in range(60):  # a page of 50 in every inbox
        sender, recipient = handles[i % len(handles)], handles[(i + 1) % len(handles)]
        _rpc(
            url,
            keys[sender],
            "message/send",
            {
                "recipient": recipient,
                "message": {"parts": [{"type": "text", "text": f"inbox filler {i} {WORDS[i % len(WORDS)]}"}]},
            },
        )
    return {
        "pairs": pairs,
        "threads": threads,
        "append_threads": append_threads,
        "identities": identities,
        "replies": replies,
        "keys": [keys[h] for h in handles],
        "words": WORDS,
    }


def webhook_latency(url: str, env: dict, keys: dict[str, str], handles: list[str], rate: int, duration: float) -> dict:
    """Commit->received latency at a steady ``rate`` messages/s to a loopback receiver."""
    sender, recipient = handles[0], handles[1]
    with harness.Receiver() as receiver:
        r = requests.post(
            f"{url}/api/v1/identities/{recipient}/webhooks",
            json={"url": receiver.url, "events": ["message.created"]},
            headers={"Authorization": f"Bearer {keys[recipient]}"},
            timeout=10,
        )
        r.raise_for_status()
        hook_id = r.json()["id"]
        users = max(1, rate // 10)
        result = load(
            {
                "host": url,
                "kind": "send_create",
                "users": users,
                "duration": duration,
                "per_user_rate": rate / users,
                "data": {"pairs": [(keys[sender], recipient)]},
            }
        )
        expected = result["requests"] - result["failures"]
        receiver.wait_for(expected, timeout=60)
        lat = sorted(
            (arrived - datetime.fromisoformat(p["data"]["created_at"].replace("Z", "+00:00")).timestamp()) * 1000
            for arrived, p, _ in receiver.arrivals
        )
        requests.delete(
            f"{url}/api/v1/identities/{recipient}/webhooks/{hook_id}",
            headers={"Authorization": f"Bearer {keys[recipient]}"},
            timeout=10,
        )
    if not lat:
        return {"sent": expected, "received": 0}
    return {
        "rate_per_s": rate,
        "sent": expected,
        "received": len(lat),
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
    }


def fan_out_throughput(url: str, keys: dict[str, str], handles: list[str], count: int) -> dict:
    """Deliveries per second for a burst of ``count`` messages with the worker's default concurrency."""
    sender, recipient = handles[2 % len(handles)], handles[3 % len(handles)]
    with harness.Receiver() as receiver:
        r = requests.post(
            f"{url}/api/v1/identities/{recipient}/webhooks",
            json={"url": receiver.url},
            headers={"Authorization": f"Bearer {keys[recipient]}"},
            timeout=10,
        )
        r.raise_for_status()
        task_id = _rpc(
            url,
            keys[sender],
            "message/send",
            {"recipient": recipient, "message": {"parts": [{"type": "text", "text": "burst"}]}},
        )["task_id"]
        receiver.wait_for(1, 30)
        start = time.time()
        batch = [
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "message/send",
                "params": {"task_id": task_id, "message": {"parts": [{"type": "text", "text": f"burst {i}"}]}},
            }
            for i in range(count)
        ]
        for i in range(0, count, 100):
            requests.post(
                f"{url}/a2a", json=batch[i : i + 100], headers={"Authorization": f"Bearer {keys[sender]}"}, timeout=60
            )
        ok = receiver.wait_for(count + 1, timeout=120)
        elapsed = (receiver.arrivals[-1][0] - start) if receiver.arrivals else float("nan")
        ids = [w for _, _, w in receiver.arrivals]
    return {
        "messages": count,
        "received": len(ids) - 1,
        "complete": ok,
        "seconds": elapsed,
        "deliveries_per_s": (len(ids) - 1) / elapsed if elapsed else 0,
        "duplicate_ids": len(ids) - len(set(ids)),
    }


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=harness.ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "nogit"


def _wait_indexed(database_url: str, timeout: float) -> int:
    """Wait until the worker has indexed every message; return how many are still unindexed."""
    conn, _ = harness._admin(database_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM messages WHERE search_vector IS NULL")
                left = cur.fetchone()[0]
            if left == 0 or time.monotonic() > deadline:
                return left
            time.sleep(0.5)
    finally:
        conn.close()


def profile_path(relay: harness.Proc, scenario: dict, out: Path) -> list:
    """Run ``scenario`` once more under py-spy; save the raw profile to ``out``; return its summary."""
    spy = profiles.record(relay.popen.pid, scenario["duration"], out)
    load(scenario)
    spy.wait(timeout=60)
    return [[name, round(share, 1)] for name, share in profiles.summary(out)]


def run(
    quick: bool,
    workers: int,
    only: list[str] | None = None,
    users: int | None = None,
    profile_dir: Path | None = None,
    repeats: int | None = None,
    pooled: bool = False,
) -> dict:
    """Measure everything (or the ``only`` paths, by kind); return the results document.

    With ``pooled``, the relay's processes and both ceilings reach PostgreSQL through a
    private PgBouncer 1.18 in transaction mode (``DATABASE_CONNECTION_POOL_URL``; the
    relay's PREPARE then turns off, as in a deploy behind it); seeding and analyzing stay
    direct.

    The paths are measured as an independent run measures them: closed-loop
    clients, gunicorn, and no Celery worker (its CPU would be taken from the web tier on
    two cores; the sends it would have handled queue in Redis). The worker starts after,
    drains that queue, and then the webhook figures are taken. With ``profile_dir``, each
    path runs once more under py-spy and its raw profile is saved there.
    """
    duration, default_users, default_repeats = (2.0, 4, 1) if quick else (10.0, 8, 3)
    users = users or default_users
    repeats = repeats or default_repeats
    handles = [f"bench{i}@acme" for i in range(4 if quick else 10)]
    paths = [p for p in PATHS if not only or p[1] in only]
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": quick,
        "workers": workers,
        "users": users,
        "duration_s": duration,
        "repeats": repeats,
        "load_generator": "bench.closed_loop: threads on raw keep-alive sockets, closed loop (not locust)",
        "paths": {},
        "mode": "pooled" if pooled else "direct",
    }
    pooler = None
    with harness.fresh_database() as database_url:
        env = harness.base_env(database_url)
        keys = harness.create_agents(env, handles)
        if pooled:
            from relay.ops.pooler import Pooler

            pooler = Pooler(harness.server_urls()[0], pool_size=20)
            results["pooler"] = "PgBouncer 1.18, pool_mode=transaction, default_pool_size=20"
            env = {**env, "DATABASE_CONNECTION_POOL_URL": pooler.url(database_url)}
        relay, relay_url = harness.gunicorn("app:app", env, workers)
        ceiling, ceiling_url = harness.gunicorn("bench.ceiling:app", env, workers)
        worker = None
        try:
            with harness.RssSampler({"web_worker": relay}) as rss:
                data = seed(relay_url, keys, handles, messages_per_thread=10)
                results["analyzed"] = {"after seeding": harness.analyze(database_url)}
                ceilings = {}
                for kind in ("ceiling_insert", "ceiling_select"):
                    ceilings[kind] = median_of(
                        [
                            load({"host": ceiling_url, "kind": kind, "users": users, "duration": duration}, ceiling)
                            for _ in range(repeats)
                        ]
                    )
                results["ceilings"] = ceilings
                # Once, to show what a ping per checkout costs (SQLAlchemy's pool_pre_ping,
                # bench/ceiling_sqla.py); every ratio below is against the bare one.
                sqla, sqla_url = harness.gunicorn("bench.ceiling_sqla:app", env, workers)
                try:
                    results["ceilings_sqlalchemy_once"] = {
                        kind: load({"host": sqla_url, "kind": kind, "users": users, "duration": duration}, sqla)
                        for kind in ("ceiling_insert", "ceiling_select")
                    }
                finally:
                    sqla.stop()
                for kind, fig in results["ceilings_sqlalchemy_once"].items():
                    fig["of_bare"] = fig["rps"] / ceilings[kind]["rps"] if ceilings[kind]["rps"] else None

                def measure(kind: str, ceiling_kind: str) -> dict:
                    scenario = {"host": relay_url, "kind": kind, "users": users, "duration": duration, "data": data}
                    beside_scenario = {"host": ceiling_url, "kind": ceiling_kind, "users": users, "duration": duration}
                    # Each run right after a run of its ceiling: what earlier paths left the machine
                    # (autovacuum of their rows, checkpoints) weighs on both alike.
                    runs, beside = [], []
                    for _ in range(repeats):
                        beside.append(load(beside_scenario, ceiling))
                        runs.append(load(scenario, relay))
                    fig, near = median_of(runs), median_of(beside)
                    fig["each_run"] = [
                        {"rps": round(r["rps"], 1), "web_cpu_ms_per_req": round(r.get("web_cpu_ms_per_req", 0), 3),
                         "ceiling_rps": round(b["rps"], 1), "ceiling_web_cpu_ms_per_req": round(b.get("web_cpu_ms_per_req", 0), 3)}
                        for r, b in zip(runs, beside)
                    ]  # fmt: skip
                    fig["ceiling"] = ceiling_kind
                    fig["ceiling_rps_beside"] = near["rps"]
                    fig["ratio_rps"] = fig["rps"] / near["rps"] if near["rps"] else None
                    ceiling_cpu = near.get("web_cpu_ms_per_req")
                    if ceiling_cpu and fig.get("web_cpu_ms_per_req"):
                        fig["ratio_cpu"] = ceiling_cpu / fig["web_cpu_ms_per_req"]
                    if profile_dir is not None:
                        out = (
                            profile_dir
                            / f"{results['date'][:10]}-{results['commit']}-profile-{results['mode']}-{kind}.txt"
                        )
                        fig["profile"] = {"file": out.name, "top": profile_path(relay, scenario, out)}
                    return fig

                for name, kind, ceiling_kind in paths:
                    if kind not in AFTER_INDEXING:
                        results["paths"][name] = measure(kind, ceiling_kind)
                        if kind in WRITES:
                            results["analyzed"][f"after {kind}"] = harness.analyze(database_url)
            results["peak_rss_mib"] = {k: round(v / 2**20, 1) for k, v in rss.peak.items()}
            late = [(name, kind, ceiling_kind) for name, kind, ceiling_kind in paths if kind in AFTER_INDEXING]
            if late or not only:
                worker = harness.celery_worker(env)
                with harness.RssSampler({"celery_worker": worker}) as worker_rss:
                    results["unindexed_after_drain"] = _wait_indexed(database_url, 300)
                    for name, kind, ceiling_kind in late:
                        results["paths"][name] = measure(kind, ceiling_kind)
                if only:
                    return results
                with harness.RssSampler({"celery_worker": worker}) as worker_rss:
                    results["webhook_latency"] = webhook_latency(
                        relay_url, env, keys, handles, rate=20 if quick else 100, duration=duration
                    )
                    results["fan_out"] = fan_out_throughput(relay_url, keys, handles, count=50 if quick else 1000)
                results["peak_rss_mib"]["celery_worker"] = round(worker_rss.peak["celery_worker"] / 2**20, 1)
        finally:
            for proc in (relay, ceiling, worker):
                if proc is not None:
                    proc.stop()
            if pooler is not None:
                pooler.stop()
    return results


def print_table(results: dict) -> None:
    print(
        f"\nbench run {results['date']} commit {results['commit']} "
        f"({'quick' if results['quick'] else 'full'}; {results['workers']} gunicorn workers, {results['users']} users)"
    )
    print(
        f"{'path':<26}{'req/s':>9}{'ratio':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'fail':>6}"
        f"{'web cpu ms':>11}{'gen cpu s':>10}"
    )
    for name, fig in {**{k: v for k, v in results["ceilings"].items()}, **results["paths"]}.items():
        ratio = f"{fig['ratio_rps']:.2f}" if fig.get("ratio_rps") is not None else "1.00"
        print(
            f"{name:<26}{fig['rps']:>9.1f}{ratio:>8}{fig['p50_ms']:>9.1f}{fig['p95_ms']:>9.1f}{fig['p99_ms']:>9.1f}"
            f"{fig['failures']:>6}{fig.get('web_cpu_ms_per_req', 0):>11.2f}{fig.get('generator_cpu_s', 0):>10.1f}"
        )
    for kind, fig in results.get("ceilings_sqlalchemy_once", {}).items():
        print(
            f"{kind} through SQLAlchemy with pool_pre_ping, once: {fig['rps']:.1f} req/s = {fig['of_bare']:.2f}x the bare one"
        )
    if "webhook_latency" in results:
        print(f"webhook latency: {results['webhook_latency']}")
        print(f"fan-out: {results['fan_out']}")
    print(f"peak RSS (MiB): {results['peak_rss_mib']}")


# --- variants of one deploy, measured side by side in one run ---------------------------------

# name -> (what it is, env beside the defaults, through the pooler). The baseline of a set is its first.
VARIANTS = {
    "prepare1-direct": ("RELAY_DB_PREPARE=1, direct connections, pool 4+1 (the new defaults)", {"RELAY_DB_PREPARE": "1"}, False),
    "prepare0-direct": ("RELAY_DB_PREPARE=0, direct connections, pool 4+1", {"RELAY_DB_PREPARE": "0"}, False),
    "prepare0-pooled": ("RELAY_DB_PREPARE=0 through PgBouncer 1.18 (transaction mode), pool 4+1", {"RELAY_DB_PREPARE": "0"}, True),
    "pool-4-1": ("RELAY_DB_POOL_SIZE=4, RELAY_DB_MAX_OVERFLOW=1 (the defaults until 2026-12-03), direct, prepare on", {"RELAY_DB_POOL_SIZE": "4", "RELAY_DB_MAX_OVERFLOW": "1"}, False),
    "pool-15-5": ("RELAY_DB_POOL_SIZE=15, RELAY_DB_MAX_OVERFLOW=5 (old defaults), direct, prepare on", {"RELAY_DB_POOL_SIZE": "15", "RELAY_DB_MAX_OVERFLOW": "5"}, False),
    "pool-5-0": ("RELAY_DB_POOL_SIZE=5, RELAY_DB_MAX_OVERFLOW=0 (the defaults: the same 5 a process as 4 + 1, all kept open), direct, prepare on", {}, False),
}  # fmt: skip
VARIANT_SETS = {
    "prepare": ["prepare1-direct", "prepare0-direct", "prepare0-pooled"],
    "pools": ["pool-5-0", "pool-15-5", "pool-4-1"],
    "all": ["prepare1-direct", "prepare0-direct", "prepare0-pooled", "pool-15-5"],
}
COMPARE_PATHS = ["send_create", "tasks_get", "tasks_list", "feed"]


def _connections_by_app(database_url: str) -> dict[str, int]:
    conn, _ = harness._admin(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT application_name, count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
            )
            return dict(cur.fetchall())
    finally:
        conn.close()


def compare(
    names: list[str],
    quick: bool,
    workers: int,
    only: list[str] | None = None,
    users: int | None = None,
    profile_dir: Path | None = None,
    repeats: int | None = None,
) -> dict:
    """Measure each path on several variants of the relay (``VARIANTS``) in one run; return the results.

    One database and one Redis db; one gunicorn per variant (the others idle meanwhile), and
    one bare ceiling (bench/ceiling.py, direct, default pool). For every path and repeat:
    a ceiling run, then one run of each variant (their order rotated each repeat), as ``run``
    alternates a path with its ceiling. No Celery worker runs, as in ``run``. Each variant's
    figure is the median of its runs, as a ratio to the median ceiling run of that path
    and to the set's first variant.
    """
    from relay.ops.pooler import Pooler

    duration, default_users, default_repeats = (2.0, 4, 1) if quick else (10.0, 8, 3)
    users = users or default_users
    repeats = repeats or default_repeats
    handles = [f"bench{i}@acme" for i in range(4 if quick else 10)]
    kinds = [k for k in COMPARE_PATHS if not only or k in only]
    names_of = {kind: name for name, kind, _ in PATHS}
    ceiling_of = {kind: ceiling for _, kind, ceiling in PATHS}
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": quick,
        "workers": workers,
        "users": users,
        "duration_s": duration,
        "repeats": repeats,
        "load_generator": "bench.closed_loop: threads on raw keep-alive sockets, closed loop (not locust)",
        "ceiling": "bench.ceiling under the same gunicorn config, direct connection, default pool (4+1)",
        "variants": {n: {"what": VARIANTS[n][0], "env": VARIANTS[n][1], "pooled": VARIANTS[n][2]} for n in names},
        "baseline": names[0],
        "paths": {},
    }
    procs: list[harness.Proc] = []
    pooler = None
    with harness.fresh_database() as database_url, harness.claimed_redis_db() as redis_url:
        try:
            env = harness.base_env(database_url, {"REDIS_URL": redis_url})
            keys = harness.create_agents(env, handles)
            if any(VARIANTS[n][2] for n in names):
                pooler = Pooler(harness.server_urls()[0], pool_size=20)
                results["pooler"] = "PgBouncer 1.18, pool_mode=transaction, default_pool_size=20"
            urls, relays = {}, {}
            for n in names:
                _, extra, pooled = VARIANTS[n]
                venv = {**env, **extra}
                # Each variant's connections are told apart in pg_stat_activity by application_name.
                if pooled:
                    venv["DATABASE_CONNECTION_POOL_URL"] = pooler.url(database_url) + f"?application_name=bench-{n}"
                else:
                    venv["DATABASE_URL"] = database_url + f"?application_name=bench-{n}"
                relays[n], urls[n] = harness.gunicorn("app:app", venv, workers)
                procs.append(relays[n])
            ceiling_env = {**env, "DATABASE_URL": database_url + "?application_name=bench-ceiling"}
            ceiling, ceiling_url = harness.gunicorn("bench.ceiling:app", ceiling_env, workers)
            procs.append(ceiling)
            data = seed(urls[names[0]], keys, handles, messages_per_thread=10)
            results["analyzed"] = {"after seeding": harness.analyze(database_url)}
            peak_connections: dict[str, int] = {}
            for kind in kinds:
                runs: dict[str, list[dict]] = {n: [] for n in names}
                beside: list[dict] = []
                each = []
                ceiling_kind = ceiling_of[kind]
                for r in range(repeats):
                    beside.append(
                        load({"host": ceiling_url, "kind": ceiling_kind, "users": users, "duration": duration}, ceiling)
                    )
                    order = names[r % len(names) :] + names[: r % len(names)]
                    pair = {"ceiling_rps": round(beside[-1]["rps"], 1)}
                    for n in order:
                        scenario = {"host": urls[n], "kind": kind, "users": users, "duration": duration, "data": data}
                        runs[n].append(load(scenario, relays[n]))
                        pair[n] = round(runs[n][-1]["rps"], 1)
                        for app, count in _connections_by_app(database_url).items():
                            peak_connections[app] = max(peak_connections.get(app, 0), count)
                    each.append(pair)
                near = median_of(beside)
                fig: dict = {"ceiling": ceiling_kind, "ceiling_rps": near["rps"], "each_run": each, "variants": {}}
                base_rps = statistics.median(x["rps"] for x in runs[names[0]])
                for n in names:
                    m = median_of(runs[n])
                    m["ratio_rps"] = m["rps"] / near["rps"] if near["rps"] else None
                    m["vs_baseline"] = m["rps"] / base_rps if base_rps else None
                    if near.get("web_cpu_ms_per_req") and m.get("web_cpu_ms_per_req"):
                        m["ratio_cpu"] = near["web_cpu_ms_per_req"] / m["web_cpu_ms_per_req"]
                    if profile_dir is not None:
                        scenario = {"host": urls[n], "kind": kind, "users": users, "duration": duration, "data": data}
                        out = profile_dir / f"{results['date'][:10]}-{results['commit']}-profile-{n}-{kind}.txt"
                        m["profile"] = {"file": out.name, "top": profile_path(relays[n], scenario, out)}
                    fig["variants"][n] = m
                results["paths"][names_of[kind]] = fig
                if kind in WRITES:
                    results["analyzed"][f"after {kind}"] = harness.analyze(database_url)
            # Idle connections left right after the runs (each pool keeps what it opened, up
            # to its size), by variant's application_name: sampled between runs, so a floor.
            results["connections_after_runs"] = peak_connections
            if pooler is not None:
                results["pooler_pools"] = [list(map(str, row)) for row in pooler.admin("SHOW POOLS")]
        finally:
            for proc in procs:
                proc.stop()
            if pooler is not None:
                pooler.stop()
    return results


def print_compare(results: dict) -> None:
    names = list(results["variants"])
    print(
        f"\nbench modes {results['date']} commit {results['commit']} ({results['users']} users, "
        f"{results['repeats']} x {results['duration_s']:g} s; ratio = req/s over the ceiling beside it)"
    )
    print(f"{'path':<26}{'ceiling':>9}" + "".join(f"{n:>30}" for n in names))
    for path, fig in results["paths"].items():
        cells = "".join(
            f"{v['rps']:>9.0f} {v['ratio_rps']:.2f}x {v['vs_baseline']:.2f}b {v.get('web_cpu_ms_per_req', 0):.2f}ms"
            for v in (fig["variants"][n] for n in names)
        )
        print(f"{path:<26}{fig['ceiling_rps']:>9.0f}{cells}")
    print(f"connections after runs (by application_name): {results.get('connections_after_runs')}")
