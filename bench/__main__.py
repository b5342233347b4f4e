"""``python -m bench run [--quick]``, ``scale [--messages N --threads T --agents A]``, ``dialects``, ``hostile [--duration S]``, ``webhooks``, ``wake``, ``modes [--set prepare|pools|all]``, ``budget``,
``pools-probe``, ``nodes``, ``retention``, ``plans [--sizes 500,25000,100000]``, ``grow [--rounds 3 | --sizes 0,25000,100000,1000000] [--pooled]``, ``faults [--quick] [--only S] [--failover]``,
``tck --kit PATH [--transport jsonrpc,http_json] [-- KIT_ARGS]``, ``mcp-conformance``.

- ``modes``: the run bench's paths on variants of one deploy in the same run (PREPARE on/off,
  direct or through PgBouncer; pool 4+1 against the old 15+5), each against one bare ceiling.
- ``pools-probe``: the web workers' waits for a pooled connection, timed inside SQLAlchemy's pool, at 4+1 and 15+5.
- ``budget``: PostgreSQL connections one default deploy (web, worker, beat) holds under a burst of 40 clients.
- ``retention``: a retention pass (partition drop) against the equivalent DELETE, and the hot queries.
- ``nodes``: two full stacks through one PgBouncer: send throughput, webhooks, wake-ups across nodes, CPU, connections.
- ``mcp-conformance``: the MCP conformance suite (npx) against relay-mcp --http and the relay's /mcp; exit 1
  when a scenario that should pass fails (bench/mcp_conformance.py).
- ``faults``: Redis and PostgreSQL stopped and crashed, workers killed, a failover to a standby, under load;
  invariants (nothing lost or duplicated, every webhook and attempt logged) and recovery times (bench/faults.py).
- ``tck``: A2A's compatibility kit (a2a-tck) run as published on both bindings, through a proxy that
  signs its calls as a caller agent, with a responder agent answering the kit's scenarios (bench/tck.py);
  the kit's reports go to ``RESULTS/tck/<transport>/``.

Each writes one JSON file to ``--results DIR`` (else ``$BENCH_RESULTS``, else ``bench/results``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_dir(arg: str | None) -> Path:
    """Where the results file goes: ``--results``, else ``$BENCH_RESULTS``, else ``bench/results``."""
    return Path(arg or os.environ.get("BENCH_RESULTS") or RESULTS)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--results", metavar="DIR", help="folder for the results file (default $BENCH_RESULTS, else bench/results)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", parents=[common], help="throughput and latency of every API path against the ceiling")
    run_p.add_argument("--quick", action="store_true", help="small data, short runs: a smoke test, not a measurement")
    run_p.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2, as on this 2-core machine)")
    run_p.add_argument("--profile", action="store_true", help="run each path once more under py-spy; save profiles")
    run_p.add_argument("--users", type=int, help="closed-loop clients (default 8; 4 with --quick)")
    run_p.add_argument("--only", help="comma-separated path kinds, e.g. send_create,tasks_list (no webhook phase)")
    run_p.add_argument("--repeats", type=int, help="runs of each path and of its ceiling, alternating (default 3)")
    run_p.add_argument(
        "--pooled", action="store_true", help="relay and ceiling through a private PgBouncer in transaction mode"
    )
    modes_p = sub.add_parser(
        "modes",
        parents=[common],
        help="run's paths on deploy variants side by side: PREPARE on/off, pooler, pool sizes",
    )
    modes_p.add_argument(
        "--set",
        dest="variant_set",
        default="all",
        help="prepare, pools or all (default), or variant names, comma-separated",
    )
    modes_p.add_argument("--quick", action="store_true", help="small data, short runs: a smoke test")
    modes_p.add_argument("--workers", type=int, default=2, help="gunicorn workers a variant (default 2)")
    modes_p.add_argument("--profile", action="store_true", help="run each path of each variant once more under py-spy")
    modes_p.add_argument("--users", type=int, help="closed-loop clients (default 8; 4 with --quick)")
    modes_p.add_argument("--only", help="comma-separated path kinds (default send_create,tasks_get,tasks_list,feed)")
    modes_p.add_argument("--repeats", type=int, help="runs of each variant and of the ceiling, alternating (default 3)")
    budget_p = sub.add_parser(
        "budget", parents=[common], help="PostgreSQL connections of a default deploy under a burst of 40 clients"
    )
    budget_p.add_argument("--clients", type=int, default=40, help="concurrent clients (default 40)")
    budget_p.add_argument("--duration", type=float, default=30.0, help="seconds of the burst (default 30)")
    probe_p = sub.add_parser(
        "pools-probe", parents=[common], help="time the SQLAlchemy pool's checkouts in the web workers, 4+1 vs 15+5"
    )
    probe_p.add_argument("--only", default="tasks_list,feed", help="path kinds (default tasks_list,feed)")
    probe_p.add_argument("--repeats", type=int, default=2, help="runs of each pool setting, alternating (default 2)")
    nodes_p = sub.add_parser(
        "nodes", parents=[common], help="two stacks through one PgBouncer: throughput, webhooks, wake across nodes, CPU"
    )
    nodes_p.add_argument("--throughput-seconds", type=float, default=10.0, help="each send-throughput run (10)")
    nodes_p.add_argument("--rate", type=float, default=50.0, help="webhook phase messages/s, open loop (default 50)")
    nodes_p.add_argument("--duration", type=float, default=20.0, help="seconds of the webhook and wake phases (20)")
    nodes_p.add_argument("--quick", action="store_true", help="short phases: a smoke test")
    scale_p = sub.add_parser(
        "scale", parents=[common], help="feed, search, inbox and tasks/get at 1M (or 10M) messages; index burst"
    )
    scale_p.add_argument("--messages", type=int, default=1_000_000, help="e.g. 10000000 with --threads 500000")
    scale_p.add_argument("--threads", type=int, default=50_000)
    scale_p.add_argument("--agents", type=int, default=1_000, help="at least 12")
    scale_p.add_argument("--queries", type=int, default=200, help="timed calls per query (default 200)")
    scale_p.add_argument("--big-thread", type=int, default=1000, help="messages of the tasks/get thread (1000)")
    scale_p.add_argument("--burst", type=int, default=100_000, help="new unindexed messages to index (0: skip)")
    scale_p.add_argument("--burst-batch", type=int, default=500, help="ids per index_messages call (500)")
    scale_p.add_argument("--index-connections", type=int, default=2, help="connections writing vectors (2)")
    scale_p.add_argument(
        "--simple-vectors", action="store_true", help="seed vectors with to_tsvector(body), not the relay's definition"
    )
    scale_p.add_argument(
        "--wait-log",
        metavar="FILE",
        help='before each heavy step, wait (<= 20 min) until FILE holds "results written to"',
    )
    scale_p.add_argument("--timing-flag", metavar="FILE", help="create FILE while a timed phase runs, delete it after")
    scale_p.add_argument(
        "--idle-below", type=float, metavar="PCT", help="before a timed phase, wait (<= 20 min) for CPU below PCT%%"
    )
    dialects_p = sub.add_parser(
        "dialects", parents=[common], help="POST /a2a vs the A2A v1.0 binding: latency per call"
    )
    dialects_p.add_argument("--calls", type=int, default=300)
    hostile_p = sub.add_parser(
        "hostile", parents=[common], help="other clients' latency under slow sockets and oversized bad bodies"
    )
    hostile_p.add_argument("--duration", type=float, default=30.0, help="seconds a phase (default 30)")
    hostile_p.add_argument("--slow", type=int, default=50, help="slow-head sockets, and as many slow-body ones")
    hostile_p.add_argument("--hostile-agents", type=int, default=2, help="agents sending bad bodies at 60/minute")
    wh = sub.add_parser(
        "webhooks", parents=[common], help="webhook delivery under load: commit->received, lost, duplicates, CPU"
    )
    wh.add_argument("--rate", type=float, default=100.0, help="messages/s, open loop (default 100)")
    wh.add_argument("--duration", type=float, default=30.0, help="seconds of sending a phase (default 30)")
    wh.add_argument("--endpoints", type=int, default=10, help="healthy endpoints, one per recipient agent")
    wh.add_argument("--slow", type=int, default=8, help="endpoints answering after --slow-delay s (default 8)")
    wh.add_argument("--slow-delay", type=float, default=8.0, help="seconds a slow endpoint takes (default 8)")
    wh.add_argument("--slow-share", type=float, default=0.10, help="share of messages to slow endpoints (0.10)")
    wh.add_argument("--refusing", type=int, default=0, help="endpoints on a port that refuses connections")
    wh.add_argument("--blackhole", type=int, default=0, help="endpoints that accept and never answer")
    wh.add_argument(
        "--bad-share", type=float, default=0.02, help="share of messages to refusing + blackhole endpoints (0.02)"
    )
    wh.add_argument("--drain-timeout", type=float, default=120.0, help="seconds to wait for deliveries (120)")
    wh.add_argument("--senders", type=int, default=4, help="sender threads, at least rate/10 (default 4)")
    wh.add_argument("--saturation", action="store_true", help="step the rate until p99 > 1 s or senders fall behind")
    wh.add_argument("--steps", help="saturation rates, comma-separated (default 50,100,150,200,250,300,400,...)")
    wh.add_argument("--tenant", action="store_true", help="org A's 20 held endpoints beside org B's one endpoint")
    wh.add_argument("--tenant-rate", type=float, default=20.0, help="org A's messages/s in the tenant drill (20)")
    wh.add_argument("--tenant-hold", type=float, default=12.0, help="seconds org A's receiver holds a request (12)")
    wake_p = sub.add_parser(
        "wake", parents=[common], help="long-poll and SSE waiters woken by messages: latency, capacity, RSS, send cost"
    )
    wake_p.add_argument("--waiters", type=int, default=500, help="long-polls and streams, half each (default 500)")
    wake_p.add_argument("--rate", type=float, default=20.0, help="messages/s in the steady phase (default 20)")
    wake_p.add_argument("--duration", type=float, default=30.0, help="seconds of the steady phase (default 30)")
    wake_p.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2)")
    wake_p.add_argument("--worker-class", help="override gunicorn's worker class (e.g. gthread), for comparison")
    wake_p.add_argument("--threads", type=int, help="threads per worker, with --worker-class gthread")
    wake_p.add_argument("--ramp", type=float, default=0.0, help="seconds over which the waiters connect (0: 1,000/s)")
    wake_p.add_argument("--throughput-seconds", type=float, default=10.0, help="each send-throughput run (10)")
    ret_p = sub.add_parser(
        "retention", parents=[common], help="a retention pass (partition drop) vs the equivalent DELETE; hot queries"
    )
    ret_p.add_argument("--days", type=int, default=30, help="days of delivery log before the expired ones (30)")
    ret_p.add_argument("--per-day", type=int, default=10_000, help="events a day, one delivery and attempt each")
    ret_p.add_argument("--queries", type=int, default=200, help="timed calls per query and phase (200)")
    grow_p = sub.add_parser(
        "grow", parents=[common], help="send, tasks/list and the feed beside the ceiling while the ledger grows"
    )
    grow_p.add_argument(
        "--rounds", type=int, default=3, help="measured rounds after a warm-up (3); sends grow the data"
    )
    grow_p.add_argument("--sizes", help="grow in SQL to these thread counts instead, e.g. 0,25000,100000,1000000")
    grow_p.add_argument("--workers", type=int, default=2, help="gunicorn workers (2)")
    grow_p.add_argument("--users", type=int, default=8, help="closed-loop clients (8)")
    grow_p.add_argument("--duration", type=float, default=10.0, help="seconds a run (10)")
    grow_p.add_argument("--pooled", action="store_true", help="relay and ceiling behind a private PgBouncer")
    grow_p.add_argument("--profile", action="store_true", help="profile each path once more at the end (py-spy)")
    plans_p = sub.add_parser(
        "plans", parents=[common], help="feed first page and tasks/list as the ledger grows: custom vs generic plans"
    )
    plans_p.add_argument("--sizes", default="500,25000,100000", help="threads at each step (500,25000,100000)")
    plans_p.add_argument("--calls", type=int, default=200, help="serial calls per p50 (200)")
    plans_p.add_argument("--repeats", type=int, default=3, help="rounds of the relay's requests per size (3)")
    plans_p.add_argument(
        "--analyze-each", action="store_true", help="ANALYZE after every size (default: the first only)"
    )
    sub.add_parser(
        "mcp-conformance",
        parents=[common],
        help="the MCP conformance suite against relay-mcp --http and the relay's /mcp (needs npx)",
    )
    faults_p = sub.add_parser(
        "faults",
        parents=[common],
        help="the stack under steady sends while servers and processes are broken; invariants and recovery times",
    )
    faults_p.add_argument(
        "--quick", "--short", action="store_true", help="CI's preset: the five faults in one run, then the failover"
    )
    faults_p.add_argument(
        "--only",
        help="scenarios, comma-separated: redis,pg-stop,gunicorn,celery,pg-crash,all,failover-sync,failover-async",
    )
    faults_p.add_argument("--failover", action="store_true", help="only the two failover drills")
    faults_p.add_argument("--rate", type=float, help="sends/s (default 30; 10 with --quick)")
    faults_p.add_argument("--outage", type=float, help="seconds each server stays down (default 5; 2 with --quick)")
    faults_p.add_argument("--settle", type=float, help="seconds between faults (default 20; 6 with --quick)")
    faults_p.add_argument("--drain-timeout", type=float, help="seconds to wait for every webhook after the load")
    faults_p.add_argument("--logs", metavar="DIR", help="keep each scenario's process logs here")
    tck_p = sub.add_parser(
        "tck", parents=[common], help="A2A's compatibility kit (a2a-tck) on both bindings against a live relay"
    )
    tck_p.add_argument("--kit", required=True, help="path of an a2a-tck checkout (branch 1.0-dev)")
    tck_p.add_argument("--python", help="the kit's interpreter (default KIT/.venv/bin/python)")
    tck_p.add_argument("--transport", default="jsonrpc,http_json", help="jsonrpc, http_json or both (default)")
    tck_p.add_argument(
        "kit_args",
        nargs="*",
        help="after --: passed to the kit's run_tck.py (e.g. -- --level must; pytest's own after a second --: -- -- -k card)",
    )
    args = parser.parse_args()
    if args.command == "mcp-conformance":
        from bench.mcp_conformance import main as conformance

        raise SystemExit(conformance(results_dir(args.results)))
    if args.command == "webhooks" and not (
        0 <= args.slow_share and 0 <= args.bad_share and args.slow_share + args.bad_share < 1 and args.endpoints >= 1
    ):
        parser.error("webhooks: --endpoints must be at least 1 and --slow-share + --bad-share below 1")
    folder = results_dir(args.results)
    folder.mkdir(parents=True, exist_ok=True)
    if args.command == "run":
        from bench.run import print_table, run

        results = run(
            args.quick,
            args.workers,
            args.only.split(",") if args.only else None,
            args.users,
            folder if args.profile else None,
            repeats=args.repeats,
            pooled=args.pooled,
        )
        print_table(results)
        only = f"-{args.only.replace(',', '+')}" if args.only else ""
        mode = "-pooled" if args.pooled else ""
        name = f"{results['date'][:10]}-{results['commit']}{'-quick' if args.quick else ''}{mode}{only}.json"
    elif args.command == "modes":
        from bench.run import VARIANT_SETS, VARIANTS, compare, print_compare

        names = VARIANT_SETS.get(args.variant_set) or args.variant_set.split(",")
        if unknown := [n for n in names if n not in VARIANTS]:
            parser.error(f"modes: unknown variants {unknown}; known: {sorted(VARIANTS)}")
        results = compare(
            names,
            args.quick,
            args.workers,
            args.only.split(",") if args.only else None,
            args.users,
            folder if args.profile else None,
            repeats=args.repeats,
        )
        print_compare(results)
        label = args.variant_set.replace(",", "+")
        name = f"{results['date'][:10]}-{results['commit']}-modes-{label}{'-quick' if args.quick else ''}.json"
    elif args.command == "budget":
        from bench.budget import budget, print_budget

        results = budget(args.clients, args.duration)
        print_budget(results)
        name = f"{results['date'][:10]}-{results['commit']}-budget-{args.clients}.json"
    elif args.command == "pools-probe":
        from bench.pool_probe import probe

        results = probe(args.only.split(","), repeats=args.repeats)
        for kind, runs in results["paths"].items():
            for r in runs:
                print(kind, r)
        name = f"{results['date'][:10]}-{results['commit']}-pools-probe.json"
    elif args.command == "nodes":
        from bench.nodes import nodes, print_nodes

        results = nodes(args)
        print_nodes(results)
        name = f"{results['date'][:10]}-{results['commit']}-nodes{'-quick' if args.quick else ''}.json"
    elif args.command == "wake":
        from bench.wake import print_wake, wake

        results = wake(
            args.waiters,
            args.rate,
            args.duration,
            args.workers,
            args.worker_class,
            args.threads,
            throughput_s=args.throughput_seconds,
            ramp=args.ramp,
        )
        print_wake(results)
        klass = f"-{args.worker_class}" if args.worker_class else ""
        name = f"{results['date'][:10]}-{results['commit']}-wake-{args.waiters}{klass}.json"
    elif args.command == "retention":
        from bench.retention import print_retention, retention_bench

        results = retention_bench(args.days, args.per_day, args.queries)
        print_retention(results)
        name = f"{results['date'][:10]}-{results['commit']}-retention.json"
    elif args.command == "grow":
        from bench.grow import grow_bench, print_grow

        sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else None
        results = grow_bench(
            args.rounds, sizes, args.workers, args.users, args.duration, args.pooled, folder if args.profile else None
        )
        print_grow(results)
        name = f"{results['date'][:10]}-{results['commit']}-grow-{results['grown_by']}-{results['mode']}.json"
    elif args.command == "plans":
        from bench.plans import plans_bench, print_plans

        sizes = tuple(int(n) for n in args.sizes.split(","))
        results = plans_bench(sizes, args.calls, args.repeats, folder, args.analyze_each)
        print_plans(results)
        stem = f"{results['date'][:10]}-{results['commit']}-plans{'-analyzed' if args.analyze_each else ''}"
        # Runs are repeated on one commit (their medians are the figures): none overwrites another.
        name, n = f"{stem}.json", 1
        while (folder / name).exists():
            n += 1
            name = f"{stem}-run{n}.json"
    elif args.command == "dialects":
        from bench.dialects import dialects, print_dialects
        from bench.run import git_commit

        results = {**dialects(args.calls), "commit": git_commit()}
        print_dialects(results)
        name = f"{results['date'][:10]}-{results['commit']}-dialects.json"
    elif args.command == "hostile":
        from bench.hostile import hostile, print_hostile
        from bench.run import git_commit

        results = {**hostile(args.duration, args.slow, args.hostile_agents), "commit": git_commit()}
        print_hostile(results)
        name = f"{results['date'][:10]}-{results['commit']}-hostile.json"
    elif args.command == "tck":
        from bench.run import git_commit
        from bench.tck import print_tck, tck

        results = tck(Path(args.kit), folder / "tck", args.transport.split(","), args.python, args.kit_args)
        results["commit"] = git_commit()
        print_tck(results)
        name = f"tck/{results['date'][:10]}-{results['commit']}-tck.json"
    elif args.command == "faults":
        from bench.faults import faults, print_faults

        results = faults(args)
        print_faults(results)
        name = f"{results['date'][:10]}-{results['commit']}-faults{'-quick' if args.quick else ''}.json"
    elif args.command == "webhooks":
        from bench.webhooks import print_webhooks, webhooks

        results = webhooks(args)
        print_webhooks(results)
        mode = results.get("mode", "steady")
        rate = "" if mode == "tenant" else f"-{args.rate:g}"
        name = f"{results['date'][:10]}-{results['commit']}-webhooks-{mode}{rate}.json"
    else:
        from bench.scale import print_scale, scale

        if args.agents < 12:
            parser.error("scale: --agents must be at least 12")
        results = scale(
            args.messages,
            args.threads,
            args.agents,
            args.queries,
            big_thread=args.big_thread,
            burst=args.burst,
            burst_batch=args.burst_batch,
            index_connections=max(1, args.index_connections),
            simple_vectors=args.simple_vectors,
            wait_log=args.wait_log,
            timing_flag_path=args.timing_flag,
            idle_below=args.idle_below,
        )
        print_scale(results)
        name = f"{results['date'][:10]}-{results['commit']}-scale-{args.messages}.json"
    path = folder / name
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"results written to {path}")
    if args.command == "faults" and not results["ok"]:
        raise SystemExit(1)  # an invariant failed: the results file says which


if __name__ == "__main__":
    main()
