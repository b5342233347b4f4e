"""``python -m bench pools-probe``: where a request waits for the SQLAlchemy pool, at 4+1 against 15+5.

``bench.pool_probe:app`` is the relay's WSGI app with SQLAlchemy's ``QueuePool`` timed in
each web worker: how many checkouts, how long each waited for a connection, how many
overflow connections were opened and closed again. Every worker writes its counters to
``$BENCH_POOL_PROBE_DIR/<pid>.json`` once a second. The probe only reads the pool; the
relay's code is unchanged. ``probe()`` runs one path on both pool settings with it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from pathlib import Path

from sqlalchemy.pool import impl

from app import app  # noqa: F401 (the WSGI app gunicorn serves)

_stats = {"checkouts": 0, "wait_s": 0.0, "waits_over_1ms": 0, "max_wait_ms": 0.0, "opened": 0, "overflow_closed": 0}
_lock = threading.Lock()
_get, _create, _dec = impl.QueuePool._do_get, impl.QueuePool._create_connection, impl.QueuePool._dec_overflow


def _timed_get(self):
    t = time.perf_counter()
    try:
        return _get(self)
    finally:
        waited = time.perf_counter() - t
        with _lock:
            _stats["checkouts"] += 1
            _stats["wait_s"] += waited
            _stats["waits_over_1ms"] += waited > 0.001
            _stats["max_wait_ms"] = max(_stats["max_wait_ms"], waited * 1000)


def _counted_create(self):
    with _lock:
        _stats["opened"] += 1
    return _create(self)


def _counted_dec(self):
    with _lock:
        _stats["overflow_closed"] += 1
    return _dec(self)


impl.QueuePool._do_get = _timed_get
impl.QueuePool._create_connection = _counted_create
impl.QueuePool._dec_overflow = _counted_dec


def _dump() -> None:
    folder = Path(os.environ.get("BENCH_POOL_PROBE_DIR", "/tmp"))
    while True:
        time.sleep(1)
        with _lock:
            snapshot = dict(_stats)
        tmp = folder / f".{os.getpid()}.tmp"
        tmp.write_text(json.dumps(snapshot))
        os.replace(tmp, folder / f"{os.getpid()}.json")  # whole files only, for the reader


if os.environ.get("BENCH_POOL_PROBE_DIR"):
    threading.Thread(target=_dump, daemon=True, name="bench-pool-probe").start()


def _totals(folder: Path) -> dict:
    out: dict = {"workers": 0}
    for f in folder.glob("*.json"):
        s = json.loads(f.read_text())
        out["workers"] += 1
        for k, v in s.items():
            out[k] = max(out.get(k, 0), v) if k == "max_wait_ms" else out.get(k, 0) + v
    return out


def probe(kinds: list[str], users: int = 8, duration: float = 10.0, repeats: int = 2) -> dict:
    """Each path, ``repeats`` runs alternating 4+1 and 15+5 under the probe; the pool's counters per run."""
    import tempfile

    from bench import harness
    from bench.run import git_commit, load, seed

    handles = [f"bench{i}@acme" for i in range(10)]
    settings = {"4+1": {}, "15+5": {"RELAY_DB_POOL_SIZE": "15", "RELAY_DB_MAX_OVERFLOW": "5"}}
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "probe": "SQLAlchemy QueuePool._do_get timed, _create_connection and _dec_overflow counted, per web worker",
        "users": users,
        "duration_s": duration,
        "paths": {},
    }
    procs = []
    with harness.fresh_database() as database_url, harness.claimed_redis_db() as redis_url:
        try:
            env = harness.base_env(database_url, {"REDIS_URL": redis_url})
            keys = harness.create_agents(env, handles)
            stacks = {}
            for label, extra in settings.items():
                folder = Path(tempfile.mkdtemp(prefix=f"pool-probe-{label.replace('+', '-')}-"))
                proc, url = harness.gunicorn(
                    "bench.pool_probe:app", {**env, **extra, "BENCH_POOL_PROBE_DIR": str(folder)}, 2, ready="/healthz"
                )
                procs.append(proc)
                stacks[label] = (proc, url, folder)
            data = seed(stacks["4+1"][1], keys, handles, messages_per_thread=10)
            harness.analyze(database_url)
            for kind in kinds:
                runs = []
                for _ in range(repeats):
                    for label, (proc, url, folder) in stacks.items():
                        time.sleep(1.2)
                        before = _totals(folder)
                        fig = load(
                            {"host": url, "kind": kind, "users": users, "duration": duration, "data": data}, proc
                        )
                        time.sleep(1.2)  # the workers' next dump
                        after = _totals(folder)
                        pool = {
                            k: after.get(k, 0) - before.get(k, 0) for k in after if k not in ("workers", "max_wait_ms")
                        }
                        n = pool.get("checkouts") or 1
                        pool["mean_wait_ms"] = round(pool.get("wait_s", 0) * 1000 / n, 3)
                        pool["wait_ms_per_request"] = round(pool.get("wait_s", 0) * 1000 / max(1, fig["requests"]), 3)
                        runs.append({
                            "pool": label, "rps": round(fig["rps"], 1), "p50_ms": round(fig["p50_ms"], 1),
                            "p99_ms": round(fig["p99_ms"], 1), "web_cpu_ms_per_req": round(fig.get("web_cpu_ms_per_req", 0), 2),
                            "requests": fig["requests"], "pool_counters": pool,
                        })  # fmt: skip
                results["paths"][kind] = runs
        finally:
            for proc in procs:
                proc.stop()
    return results
