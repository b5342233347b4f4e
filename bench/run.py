"""``python -m bench run``: every API path against the stack's own ceiling, webhooks, memory."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

import requests

from bench import harness

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


def load(scenario: dict) -> dict:
    """Run one locust scenario in its own process; return its figures."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(scenario, f)
        spec = f.name
    out = spec + ".out"
    subprocess.run(
        [sys.executable, "-m", "bench.load", spec, out],
        check=True,
        cwd=harness.ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return json.load(open(out))


def median_of(runs: list[dict]) -> dict:
    keys = ("rps", "p50_ms", "p95_ms", "p99_ms")
    result = {k: statistics.median(r[k] for r in runs) for k in keys}
    result["requests"] = sum(r["requests"] for r in runs)
    result["failures"] = sum(r["failures"] for r in runs)
    result["errors"] = [e for r in runs for e in r.get("errors", [])][:3]
    return result


def seed(url: str, keys: dict[str, str], handles: list[str], messages_per_thread: int) -> dict:
    """Make threads and messages through the API for the read and append paths."""
    pairs, threads, identities, replies = [], [], [], []
    for i, h in enumerate(handles):
        other = handles[(i + 1) % len(handles)]
        pairs.append((keys[h], other))
        identities.append((keys[h], h))
    for i in range(len(handles) * 2):
        sender, recipient = handles[i % len(handles)], handles[(i + 1) % len(handles)]
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
        for n in range(messages_per_thread - 1):
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
        threads.append((keys[sender], res["task_id"]))
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


def run(quick: bool, workers: int) -> dict:
    """Measure everything; return the results document."""
    duration, users, repeats = (2.0, 4, 1) if quick else (10.0, 16, 3)
    handles = [f"bench{i}@acme" for i in range(4 if quick else 10)]
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": quick,
        "workers": workers,
        "users": users,
        "duration_s": duration,
        "repeats": repeats,
        "paths": {},
    }
    with harness.fresh_database() as database_url:
        env = harness.base_env(database_url)
        keys = harness.create_agents(env, handles)
        relay, relay_url = harness.gunicorn("app:app", env, workers)
        ceiling, ceiling_url = harness.gunicorn("bench.ceiling:app", env, workers)
        worker = harness.celery_worker(env)
        try:
            with harness.RssSampler({"web_worker": relay, "celery_worker": worker}) as rss:
                data = seed(relay_url, keys, handles, messages_per_thread=10)
                ceilings = {}
                for kind in ("ceiling_insert", "ceiling_select"):
                    ceilings[kind] = median_of(
                        [
                            load({"host": ceiling_url, "kind": kind, "users": users, "duration": duration})
                            for _ in range(repeats)
                        ]
                    )
                results["ceilings"] = ceilings
                for name, kind, ceiling_kind in PATHS:
                    fig = median_of(
                        [
                            load({"host": relay_url, "kind": kind, "users": users, "duration": duration, "data": data})
                            for _ in range(repeats)
                        ]
                    )
                    fig["ceiling"] = ceiling_kind
                    fig["ratio_rps"] = (
                        fig["rps"] / ceilings[ceiling_kind]["rps"] if ceilings[ceiling_kind]["rps"] else None
                    )
                    results["paths"][name] = fig
                results["webhook_latency"] = webhook_latency(
                    relay_url, env, keys, handles, rate=20 if quick else 100, duration=duration
                )
                results["fan_out"] = fan_out_throughput(relay_url, keys, handles, count=50 if quick else 1000)
            results["peak_rss_mib"] = {k: round(v / 2**20, 1) for k, v in rss.peak.items()}
        finally:
            for proc in (relay, ceiling, worker):
                proc.stop()
    return results


def print_table(results: dict) -> None:
    print(
        f"\nbench run {results['date']} commit {results['commit']} "
        f"({'quick' if results['quick'] else 'full'}; {results['workers']} gunicorn workers, {results['users']} users)"
    )
    print(f"{'path':<26}{'req/s':>9}{'ratio':>8}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'fail':>6}")
    for name, fig in {**{k: v for k, v in results["ceilings"].items()}, **results["paths"]}.items():
        ratio = f"{fig['ratio_rps']:.2f}" if fig.get("ratio_rps") is not None else "1.00"
        print(
            f"{name:<26}{fig['rps']:>9.1f}{ratio:>8}{fig['p50_ms']:>9.1f}{fig['p95_ms']:>9.1f}{fig['p99_ms']:>9.1f}"
            f"{fig['failures']:>6}"
        )
    print(f"webhook latency: {results['webhook_latency']}")
    print(f"fan-out: {results['fan_out']}")
    print(f"peak RSS (MiB): {results['peak_rss_mib']}")
