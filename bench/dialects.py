"""``python -m bench dialects``: what the A2A v1.0 binding costs over ``POST /a2a``.

The relay's own JSON-RPC dialect (``POST /a2a``, docs/api.md) is the baseline.

One client, sequential calls against gunicorn (the Procfile's web line, 2 workers) and a
Celery worker on a fresh database: the same handoff opened, read and listed through
``POST /a2a`` and through ``POST /a2a/agents/{handle}`` (A2A v1.0). Latency is
per call, measured by the client; the difference is the binding's translation plus
SendMessage's read-back of the task it answers with.
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime

import requests

from bench.harness import base_env, celery_worker, create_agents, fresh_database, gunicorn


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
        "calls": len(ordered),
    }


def _timed(session: requests.Session, url: str, headers: dict, method: str, params: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    resp = session.post(
        url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers, timeout=30
    )
    elapsed = time.perf_counter() - started
    body = resp.json()
    if "result" not in body:
        raise RuntimeError(f"{method} failed: {body}")
    return elapsed, body["result"]


def dialects(calls: int = 300, workers: int = 2) -> dict:
    """Run ``calls`` sends, gets and lists per dialect; return p50/p95 per operation."""
    with fresh_database("relay_bench_dialects") as db_url:
        env = base_env(db_url)
        keys = create_agents(env, ["alice@bench", "bob@bench"])
        web, url = gunicorn("app:app", env, workers)
        worker = celery_worker(env)
        try:
            session = requests.Session()
            seed_h = {"Authorization": f"Bearer {keys['alice@bench']}"}
            a2a_h = {**seed_h, "A2A-Version": "1.0"}
            a2a_url = f"{url}/a2a/agents/bob@bench"
            samples: dict[str, list[float]] = {
                k: []
                for k in (
                    "seed message/send",
                    "a2a SendMessage",
                    "seed tasks/get",
                    "a2a GetTask",
                    "seed tasks/list",
                    "a2a ListTasks",
                )
            }
            for i in range(calls):
                text = f"bench handoff {i}: adopt the paginated /users shape"
                t, sent = _timed(
                    session,
                    f"{url}/a2a",
                    seed_h,
                    "message/send",
                    {
                        "recipient": "bob@bench",
                        "message": {"parts": [{"type": "text", "text": text}]},
                        "metadata": {"client_idempotency_key": str(uuid.uuid4())},
                    },
                )
                samples["seed message/send"].append(t)
                t, a2a = _timed(
                    session,
                    a2a_url,
                    a2a_h,
                    "SendMessage",
                    {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}},
                )
                samples["a2a SendMessage"].append(t)
                samples["seed tasks/get"].append(
                    _timed(session, f"{url}/a2a", seed_h, "tasks/get", {"task_id": sent["task_id"]})[0]
                )
                samples["a2a GetTask"].append(_timed(session, a2a_url, a2a_h, "GetTask", {"id": a2a["task"]["id"]})[0])
                samples["seed tasks/list"].append(
                    _timed(
                        session,
                        f"{url}/a2a",
                        seed_h,
                        "tasks/list",
                        {"filter": {"role": "sender"}, "page": {"limit": 50}},
                    )[0]
                )
                samples["a2a ListTasks"].append(_timed(session, a2a_url, a2a_h, "ListTasks", {"pageSize": 50})[0])
        finally:
            worker.stop()
            web.stop()
    return {
        "date": datetime.now(UTC).isoformat(),
        "workers": workers,
        "operations": {name: _percentiles(values) for name, values in samples.items()},
    }


def print_dialects(results: dict) -> None:
    print(f"{'operation':22} {'p50 ms':>8} {'p95 ms':>8} {'calls':>6}")
    for name, figures in results["operations"].items():
        print(f"{name:22} {figures['p50_ms']:8.2f} {figures['p95_ms']:8.2f} {figures['calls']:6d}")
