"""``python -m bench run --quick`` works end to end (a smoke test: it checks no speed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.live import claimed_redis_db

ROOT = Path(__file__).resolve().parent.parent


def _bench(server_urls, *args: str) -> subprocess.CompletedProcess:
    """``python -m bench ARGS`` against the test servers, its worker's queue in a Redis db of its own."""
    # Its worker consumes the default queue: in a Redis db of its own (tests/live.py), so no
    # other worker (the Procfile test's, a parallel run's) takes its tasks, nor it theirs.
    with claimed_redis_db(server_urls[1]) as redis_url:
        env = {
            **os.environ,
            "DATABASE_URL": server_urls[0].replace("postgresql+psycopg2://", "postgresql://"),
            "REDIS_URL": redis_url,
        }
        return subprocess.run(
            [sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )


def test_quick_bench_runs_and_writes_every_figure(server_urls, tmp_path):
    results_dir = tmp_path / "results"  # empty and ours: never the repo's bench/results
    results_dir.mkdir()
    out = _bench(server_urls, "run", "--quick", "--results", str(results_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    written = sorted(results_dir.iterdir())
    assert len(written) == 1 and written[0].name.endswith("-quick.json"), (
        f"the run wrote {written}:\n{out.stdout[-2000:]}"
    )
    assert f"results written to {written[0]}" in out.stdout, out.stdout[-2000:]
    results = json.loads(written[0].read_text())
    assert set(results["ceilings"]) == {"ceiling_insert", "ceiling_select"}
    for name, fig in results["paths"].items():
        assert fig["requests"] > 0, name
        assert fig["failures"] == 0, (name, fig["errors"])
        assert fig["ratio_rps"] is not None, name
    assert results["webhook_latency"]["received"] == results["webhook_latency"]["sent"] > 0
    assert results["fan_out"]["complete"] and results["fan_out"]["duplicate_ids"] == 0
    assert results["peak_rss_mib"]["web_worker"] > 0 and results["peak_rss_mib"]["celery_worker"] > 0


def test_the_retention_bench_runs_on_the_current_schema(server_urls, tmp_path):
    # Its plain database is an old revision given the later non-partition schema by hand:
    # a migration that adds a column the hot queries use must be mirrored there, or this fails.
    out = _bench(
        server_urls, "retention", "--days", "30", "--per-day", "20", "--queries", "2", "--results", str(tmp_path)
    )
    assert out.returncode == 0, out.stderr[-3000:]
    [written] = list(tmp_path.glob("*-retention.json"))
    results = json.loads(written.read_text())
    assert results["partitioned"]["retention"]["dropped"], "the pass dropped no expired partition"
    for label in ("partitioned", "plain"):
        assert set(results[label]["hot_after"]) >= {"webhook_claim", "send_create", "feed_page"}, label
