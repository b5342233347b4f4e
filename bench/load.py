"""One load run with locust (headless, in its own process so gevent patches nothing else).

Usage: python -m bench.load SCENARIO_JSON OUT_JSON
The scenario names the host, the user count, the duration and the requests to make;
the output holds p50/p95/p99 (ms), requests/s and failures.
"""

from __future__ import annotations

import gevent.monkey

gevent.monkey.patch_all()

import itertools  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
from locust import FastHttpUser, constant, constant_throughput, task  # noqa: E402
from locust.env import Environment  # noqa: E402


def build_user(scenario: dict):
    kind = scenario["kind"]
    data = scenario.get("data", {})
    keys = data.get("keys", [])
    counter = itertools.count()

    class RelayUser(FastHttpUser):
        host = scenario["host"]
        wait_time = constant_throughput(scenario["per_user_rate"]) if scenario.get("per_user_rate") else constant(0)

        def rpc(self, key: str, method: str, params: dict, name: str):
            with self.client.post(
                "/a2a",
                json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                headers={"Authorization": f"Bearer {key}"},
                name=name,
                catch_response=True,
            ) as r:
                if r.status_code != 200 or "error" in (r.json() or {}):
                    r.failure(f"{r.status_code} {r.text[:200]}")

        @task
        def one(self):
            n = next(counter)
            if kind == "ceiling_insert":
                self.client.post("/insert", name=kind)
            elif kind == "ceiling_select":
                self.client.get("/select", name=kind)
            elif kind == "send_create":
                sender, recipient = data["pairs"][n % len(data["pairs"])]
                self.rpc(
                    sender,
                    "message/send",
                    {
                        "recipient": recipient,
                        "message": {
                            "parts": [{"type": "text", "text": f"bench handoff {n}: refactor the users endpoint"}]
                        },
                    },
                    kind,
                )
            elif kind == "send_append":
                key, task_id = data["threads"][n % len(data["threads"])]
                self.rpc(
                    key,
                    "message/send",
                    {"task_id": task_id, "message": {"parts": [{"type": "text", "text": f"bench reply {n}"}]}},
                    kind,
                )
            elif kind == "tasks_get":
                key, task_id = data["threads"][n % len(data["threads"])]
                self.rpc(key, "tasks/get", {"task_id": task_id}, kind)
            elif kind == "tasks_list":
                key = keys[n % len(keys)]
                self.rpc(key, "tasks/list", {"page": {"limit": 50}}, kind)
            elif kind in ("feed", "feed_q"):
                key, handle = data["identities"][n % len(data["identities"])]
                params = {"limit": 50}
                if kind == "feed_q":
                    params["q"] = random.choice(data["words"])
                self.client.get(
                    f"/api/v1/identities/{handle}/a2a/messages",
                    params=params,
                    headers={"Authorization": f"Bearer {key}"},
                    name=kind,
                )
            elif kind == "rest_reply":
                key, handle, task_id = data["replies"][n % len(data["replies"])]
                self.client.post(
                    f"/api/v1/identities/{handle}/a2a/tasks/{task_id}/messages",
                    json={"message": {"parts": [{"type": "text", "text": f"rest reply {n}"}]}},
                    headers={"Authorization": f"Bearer {key}"},
                    name=kind,
                )
            else:
                raise SystemExit(f"unknown scenario kind {kind}")

    return RelayUser


def main() -> None:
    scenario = json.load(open(sys.argv[1]))
    # At the deadline each user finishes the request it has in flight (stop_timeout), so
    # every request the relay may have committed is counted: the webhook latency figure
    # expects exactly as many deliveries as counted sends.
    env = Environment(user_classes=[build_user(scenario)], stop_timeout=30)
    runner = env.create_local_runner()
    runner.start(scenario["users"], spawn_rate=scenario["users"])
    gevent.spawn_later(scenario["duration"], runner.quit)
    runner.greenlet.join()
    total = env.stats.total
    out = {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "rps": total.num_requests / max(scenario["duration"], 1e-9),
        "p50_ms": total.get_response_time_percentile(0.50),
        "p95_ms": total.get_response_time_percentile(0.95),
        "p99_ms": total.get_response_time_percentile(0.99),
        "errors": [str(e.error)[:200] for e in list(env.stats.errors.values())[:3]],
    }
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
