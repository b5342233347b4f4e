"""What a bad body just under ``RELAY_MAX_BODY_BYTES`` costs: response bytes, latency, server CPU.

Each case is one invalid request of about 1 MiB (a list of 349,000 bad items, 100,000
unknown members, NUL strings in freeform metadata, one huge string) on one surface: the
relay's JSON-RPC dialect (``POST /a2a``), REST (``POST .../a2a/tasks/{id}/messages``) and the A2A v1.0
binding (``POST /a2a/agents/{handle}``). Every one must be refused with a small answer.

    measure(post, n=5, handle=..., peer=..., cpu=None) -> {case: figures}

``post(path, body, headers) -> (status, response bytes)`` sends one request (see
``requests_post`` for a live relay and ``client_post`` for a Flask test client);
``handle`` is the caller's handle (``key``'s agent) and ``peer`` another agent's; ``cpu``,
if given, returns the server's cumulative CPU seconds, read before and after each call.

    python -m bench.bad_bodies [--n 5]          in-process Flask test client (CPU: this process)
    python -m bench.bad_bodies --live [--n 5]   gunicorn, 2 workers (CPU: the workers' cpu_times)

Both start on a fresh database with two agents; nothing here is asserted (tests/test_bad_bodies.py is).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable

BODY_LIMIT = 1_048_576  # RELAY_MAX_BODY_BYTES' default
TARGET = BODY_LIMIT - 512  # just under it
FILL = "__FILL__"
UNKNOWN_TASK = "01HXYZ4K2VNJQP7R8MWDB3CSTF"  # a well-formed id no thread has: bodies are checked first

Post = Callable[[str, bytes, dict], tuple[int, bytes]]


def filled(doc: dict, item: str) -> bytes:
    """``doc`` as compact JSON with the string ``"__FILL__"`` replaced by ``[item,item,...]`` up to TARGET bytes."""
    text = _compact(doc)
    room = TARGET - len(text) + len(json.dumps(FILL)) - 2
    count = room // (len(item) + 1) + 1
    return text.replace(json.dumps(FILL), "[" + ",".join([item] * count) + "]").encode()


def _compact(doc) -> str:
    return json.dumps(doc, separators=(",", ":"))


def _rpc(method: str, params: dict) -> dict:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


TEXT = [{"type": "text", "text": "hi"}]
A2A = {"A2A-Version": "1.0"}


def _cases(handle: str, peer: str) -> dict[str, tuple[str, bytes, dict]]:
    """case name -> (path, body, extra headers)."""
    unknown = "{" + ",".join(f'"k{i}":1' for i in range(90_000)) + "}"
    nul_meta = {f"k{i}": "\x00" for i in range(50_000)}
    a2a_msg = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER"}
    reply = f"/api/v1/identities/{handle}/a2a/tasks/{UNKNOWN_TASK}/messages"
    return {
        "rpc message/send parts": (
            "/a2a",
            filled(_rpc("message/send", {"recipient": peer, "message": {"role": "user", "parts": FILL}}), "1"),
            {},
        ),
        "rpc message/send artifacts": (
            "/a2a",
            filled(
                _rpc(
                    "message/send", {"recipient": peer, "message": {"role": "user", "parts": TEXT}, "artifacts": FILL}
                ),
                "1",
            ),
            {},
        ),
        "rpc tasks/list filter.status": ("/a2a", filled(_rpc("tasks/list", {"filter": {"status": FILL}}), "1"), {}),
        "rpc unknown params": (
            "/a2a",
            _compact(_rpc("tasks/list", {"filter": {}})).replace('"filter":{}', unknown[1:-1]).encode(),
            {},
        ),
        "rpc huge text": (
            "/a2a",
            json.dumps(
                _rpc(
                    "message/send",
                    {"recipient": peer, "message": {"parts": [{"type": "text", "text": "x" * 1_040_000}]}},
                )
            ).encode(),
            {},
        ),
        "rest reply parts": (reply, filled({"message": {"role": "user", "parts": FILL}}, "1"), {}),
        "a2a SendMessage parts": (
            f"/a2a/agents/{peer}",
            filled(_rpc("SendMessage", {"message": {**a2a_msg, "parts": FILL}}), "1"),
            A2A,
        ),
        "a2a SendMessage extensions": (
            f"/a2a/agents/{peer}",
            filled(_rpc("SendMessage", {"message": {**a2a_msg, "parts": [{"text": "hi"}], "extensions": FILL}}), "1"),
            A2A,
        ),
        "a2a SendMessage NUL metadata": (
            f"/a2a/agents/{peer}",
            json.dumps(
                _rpc("SendMessage", {"message": {**a2a_msg, "parts": [{"text": "hi"}]}, "metadata": nul_meta})
            ).encode(),
            A2A,
        ),
    }


def measure(
    post: Post,
    n: int = 5,
    handle: str = "alice@bench",
    peer: str = "bob@bench",
    cpu: Callable[[], float] | None = None,
) -> dict:
    """Send each bad-body case ``n`` times; return {case: status, request and response bytes, ms p50/max, CPU ms}."""
    results: dict[str, dict] = {}
    for name, (path, body, extra) in _cases(handle, peer).items():
        headers = {"Content-Type": "application/json", **extra}
        wall: list[float] = []
        used: list[float] = []
        status, size = 0, 0
        for _ in range(n):
            cpu0 = cpu() if cpu else 0.0
            started = time.perf_counter()
            status, answer = post(path, body, headers)
            wall.append(time.perf_counter() - started)
            if cpu:
                used.append(cpu() - cpu0)
            size = max(size, len(answer))
        results[name] = {
            "status": status,
            "request_bytes": len(body),
            "response_bytes": size,
            "ms_p50": round(statistics.median(wall) * 1000, 1),
            "ms_max": round(max(wall) * 1000, 1),
            **(
                {"cpu_ms_p50": round(statistics.median(used) * 1000, 1), "cpu_ms_max": round(max(used) * 1000, 1)}
                if used
                else {}
            ),
        }
    return results


def requests_post(base_url: str, key: str) -> Post:
    """A ``post`` for ``measure`` sending to a live relay at ``base_url`` as ``key``'s agent."""
    import requests

    session = requests.Session()
    auth = {"Authorization": f"Bearer {key}"}

    def post(path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        resp = session.post(base_url.rstrip("/") + path, data=body, headers={**auth, **headers}, timeout=120)
        return resp.status_code, resp.content

    return post


def client_post(client, key: str) -> Post:
    """A ``post`` for ``measure`` through a Flask test client as ``key``'s agent."""
    auth = {"Authorization": f"Bearer {key}"}

    def post(path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        resp = client.post(path, data=body, headers={**auth, **headers})
        return resp.status_code, resp.get_data()

    return post


def print_results(results: dict) -> None:
    print(f"{'case':32} {'status':>6} {'req B':>9} {'resp B':>10} {'ms p50':>9} {'ms max':>9} {'cpu p50':>9}")
    for name, r in results.items():
        print(
            f"{name:32} {r['status']:>6} {r['request_bytes']:>9} {r['response_bytes']:>10} "
            f"{r['ms_p50']:>9} {r['ms_max']:>9} {r.get('cpu_ms_p50', '-'):>9}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bad_bodies")
    parser.add_argument("--n", type=int, default=5, help="requests per case (default 5)")
    parser.add_argument("--live", action="store_true", help="against gunicorn instead of the Flask test client")
    args = parser.parse_args()
    from bench.harness import base_env, create_agents, fresh_database, gunicorn

    with fresh_database("relay_bench_bad") as db_url:
        env = base_env(db_url)
        keys = create_agents(env, ["alice@bench", "bob@bench"])
        if args.live:
            web, url = gunicorn("app:app", env, 2)
            try:

                def cpu() -> float:
                    return sum(sum(p.cpu_times()[:2]) for p in web.tree()[1:])

                results = measure(requests_post(url, keys["alice@bench"]), args.n, cpu=cpu)
            finally:
                web.stop()
        else:
            import secrets

            from relay.factory import create_app

            app = create_app(env, TESTING=True, RATELIMIT_KEY_PREFIX=f"b{secrets.token_hex(4)}")
            results = measure(client_post(app.test_client(), keys["alice@bench"]), args.n, cpu=time.process_time)
    print_results(results)


if __name__ == "__main__":
    main()
