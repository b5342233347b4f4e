"""``python -m bench grow``: send, tasks/list and the feed against the bare ceiling while the ledger grows.

Two ways to grow it, each path measured side by side with its ceiling (bench/ceiling.py)
in the same run, as ratios, under the relay's own gunicorn config:

- **rounds** (the default): a warm-up round and then ``--rounds`` rounds; each round runs
  ``message/send`` (create), then ``tasks/list`` (a page of 50), then the feed's first
  page, each for ``duration`` seconds of closed-loop clients right after a run of its
  ceiling. The sends are real creates, so the ledger grows by every send of a round
  (about 25,000 threads over three rounds at this machine's rates) and nothing analyzes
  the tables but autovacuum, as in a deploy. What a path must hold: its last round within
  15% of its first.
- **sizes** (``--sizes 0,25000,100000,1000000``): before each step the ledger is grown in
  SQL to that many threads (bench/plans.py's ``_GROW``: a ring of the bench's agents, one
  message a thread, three for every fourth), then each path runs once beside its ceiling.

``--pooled`` puts the relay and the ceiling behind a private PgBouncer in transaction mode.
The web workers' peak RSS is sampled throughout. No Celery worker runs while the paths are
measured (as in ``bench run``): its CPU would come out of the web tier's two cores.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from bench import harness, profiles
from bench.plans import _grow
from bench.run import git_commit, load, seed

PATHS = [
    # (name, kind, ceiling kind)
    ("message/send create", "send_create", "ceiling_insert"),
    ("tasks/list (page of 50)", "tasks_list", "ceiling_select"),
    ("feed first page", "feed", "ceiling_select"),
]


def _threads(database_url: str) -> int:
    conn, _ = harness._admin(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM threads")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _side_by_side(relay, relay_url, ceiling, ceiling_url, kind, ceiling_kind, users, duration, data) -> dict:
    """One run of the ceiling, then one of the path; the path's figures with its ratio."""
    near = load({"host": ceiling_url, "kind": ceiling_kind, "users": users, "duration": duration}, ceiling)
    fig = load({"host": relay_url, "kind": kind, "users": users, "duration": duration, "data": data}, relay)
    out = {
        "rps": round(fig["rps"], 1),
        "p50_ms": round(fig["p50_ms"], 2),
        "p99_ms": round(fig["p99_ms"], 2),
        "web_cpu_ms_per_req": round(fig.get("web_cpu_ms_per_req", 0.0), 3),
        "failures": fig["failures"],
        "errors": fig.get("errors", [])[:2],
        "machine_busy_cores": fig.get("machine_busy_cores"),
        "ceiling_rps": round(near["rps"], 1),
        "ceiling_web_cpu_ms_per_req": round(near.get("web_cpu_ms_per_req", 0.0), 3),
    }
    out["ratio"] = round(fig["rps"] / near["rps"], 3) if near["rps"] else None
    return out


def grow_bench(
    rounds: int,
    sizes: list[int] | None,
    workers: int,
    users: int,
    duration: float,
    pooled: bool,
    profile_dir: Path | None = None,
) -> dict:
    """Measure the three paths as the ledger grows; return the results document.

    ``sizes`` None: rounds mode (a warm-up and ``rounds`` rounds, data grown by the sends);
    else sizes mode (threads grown in SQL to each size, one run of each path there). With
    ``profile_dir``, each path of the last step is profiled once more with py-spy.
    """
    handles = [f"bench{i}@acme" for i in range(10)]
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "mode": "pooled" if pooled else "direct",
        "grown_by": "sizes" if sizes else "rounds",
        "workers": workers,
        "users": users,
        "duration_s": duration,
        "load_generator": "bench.closed_loop: threads on raw keep-alive sockets, closed loop",
        "steps": [],
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
        try:
            with harness.RssSampler({"web_worker": relay}) as rss:
                data = seed(relay_url, keys, handles, messages_per_thread=10)
                harness.analyze(database_url)
                steps = (
                    [("size", n) for n in sizes]
                    if sizes
                    else [("round", "warm-up")] + [("round", i + 1) for i in range(rounds)]
                )
                for label, value in steps:
                    grown_s = None
                    if label == "size":
                        have = _threads(database_url)
                        if value > have:
                            grown_s = _grow(database_url, have, value - 1, analyze=False)
                    step = {label: value, "threads_before": _threads(database_url), "paths": {}}
                    if grown_s is not None:
                        step["grown_in_s"] = grown_s
                    for name, kind, ceiling_kind in PATHS:
                        step["paths"][name] = _side_by_side(
                            relay, relay_url, ceiling, ceiling_url, kind, ceiling_kind, users, duration, data
                        )
                    step["threads_after"] = _threads(database_url)
                    results["steps"].append(step)
                    print(_step_line(step), flush=True)
                if profile_dir is not None:
                    results["profiles"] = {}
                    for _, kind, _ in PATHS:
                        out = (
                            profile_dir
                            / f"{results['date'][:10]}-{results['commit']}-grow-{results['mode']}-{kind}.txt"
                        )
                        scenario = {"host": relay_url, "kind": kind, "users": users, "duration": duration, "data": data}
                        proc = profiles.record(relay.popen.pid, duration, out)
                        load(scenario, relay)
                        proc.wait(timeout=duration + 30)
                        results["profiles"][kind] = {"file": out.name, "top": profiles.summary(out, top=30)}
            results["peak_rss_mib"] = round(rss.peak["web_worker"] / 2**20, 1)
        finally:
            for proc in (relay, ceiling):
                proc.stop()
            if pooler is not None:
                pooler.stop()
    measured = [s for s in results["steps"] if s.get("round") != "warm-up"]
    results["drift"] = {
        name: round(measured[-1]["paths"][name]["rps"] / measured[0]["paths"][name]["rps"], 3)
        for name, _, _ in PATHS
        if measured and measured[0]["paths"][name]["rps"]
    }
    return results


def _step_line(step: dict) -> str:
    label = f"round {step['round']}" if "round" in step else f"{step['size']:,} threads"
    cells = "; ".join(
        f"{name.split(' (')[0]} {fig['rps']:.0f} req/s ({fig['ratio']:.2f}x, p50 {fig['p50_ms']:.1f} ms)"
        for name, fig in step["paths"].items()
    )
    return f"{label:>16} [{step['threads_before']:,} -> {step['threads_after']:,}]: {cells}"


def print_grow(results: dict) -> None:
    print(
        f"\nbench grow {results['date']} commit {results['commit']} ({results['mode']}, by {results['grown_by']}; "
        f"{results['workers']} workers, {results['users']} users, {results['duration_s']} s a run)"
    )
    for step in results["steps"]:
        print(_step_line(step))
    print("last / first measured step, req/s:", results["drift"])
    print(f"peak web worker RSS: {results['peak_rss_mib']} MiB")
