"""``python -m bench run [--quick]``, ``scale [--messages N]``, ``dialects``, ``hostile [--duration S]``.

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
    scale_p = sub.add_parser("scale", parents=[common], help="feed, search and inbox queries at a million messages")
    scale_p.add_argument("--messages", type=int, default=1_000_000)
    scale_p.add_argument("--threads", type=int, default=50_000)
    scale_p.add_argument("--agents", type=int, default=1_000)
    scale_p.add_argument("--queries", type=int, default=200)
    dialects_p = sub.add_parser(
        "dialects", parents=[common], help="seed dialect vs the A2A v1.0 binding: latency per call"
    )
    dialects_p.add_argument("--calls", type=int, default=300)
    hostile_p = sub.add_parser(
        "hostile", parents=[common], help="other clients' latency under slow sockets and oversized bad bodies"
    )
    hostile_p.add_argument("--duration", type=float, default=30.0, help="seconds a phase (default 30)")
    hostile_p.add_argument("--slow", type=int, default=50, help="slow-head sockets, and as many slow-body ones")
    hostile_p.add_argument("--hostile-agents", type=int, default=2, help="agents sending bad bodies at 60/minute")
    args = parser.parse_args()
    folder = results_dir(args.results)
    folder.mkdir(parents=True, exist_ok=True)
    if args.command == "run":
        from bench.run import print_table, run

        results = run(args.quick, args.workers)
        print_table(results)
        name = f"{results['date'][:10]}-{results['commit']}{'-quick' if args.quick else ''}.json"
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
    else:
        from bench.scale import print_scale, scale

        results = scale(args.messages, args.threads, args.agents, args.queries)
        print_scale(results)
        name = f"{results['date'][:10]}-{results['commit']}-scale-{args.messages}.json"
    path = folder / name
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"results written to {path}")


if __name__ == "__main__":
    main()
