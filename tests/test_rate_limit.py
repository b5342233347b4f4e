"""Per-agent rate limit on ``POST /a2a``, counted in real Redis (docs/api.md, "Conventions").

Each test builds its own app limited to 5 calls a minute; agents are fresh per test,
so counters left in Redis by earlier runs never apply.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.conftest import message_params, post_a2a, rpc_doc

LIMIT = 5
ROOT = Path(__file__).resolve().parent.parent
DEAD_REDIS = "redis://127.0.0.1:1/0"


def build_app(env, **overrides):
    from relay.factory import create_app

    return create_app(env, RATELIMIT_KEY_PREFIX="rl-" + secrets.token_hex(4), **overrides)


@pytest.fixture
def limited(base_env):
    """A test client of an app limited to 5 calls per minute per agent."""
    return build_app({**base_env, "RELAY_RATE_LIMIT": f"{LIMIT}/minute"}).test_client()


def _tasks_list(id_=1) -> dict:
    """tasks/list's request document."""
    return rpc_doc("tasks/list", {}, id=id_)


def _batch(n: int) -> list[dict]:
    """A batch of ``n`` tasks/list requests, ids 0 to n - 1."""
    return [_tasks_list(i) for i in range(n)]


def assert_ok(resp):
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    if isinstance(body, list):
        assert all("result" in b for b in body), body
    else:
        assert "result" in body, body


def assert_limited(resp, id_=1):
    assert resp.status_code == 429, resp.get_data(as_text=True)
    assert resp.headers["Content-Type"].startswith("application/json")
    retry = resp.headers["Retry-After"]
    assert retry.isdigit(), retry
    assert 1 <= int(retry) <= 60
    body = resp.get_json()
    assert body["jsonrpc"] == "2.0"
    assert body["id"] == id_
    assert body["error"]["code"] == -32003
    assert body["error"]["data"]["symbol"] == "rate_limited"
    assert body["error"]["data"]["retry_after"] == int(retry)


def test_sixth_call_in_the_minute_is_429_with_retry_after(limited, make_agent):
    _a, a_key = make_agent("alice@acme")
    for i in range(LIMIT):
        assert_ok(post_a2a(limited, a_key, _tasks_list(i)))
    assert_limited(post_a2a(limited, a_key, _tasks_list(99)), id_=99)
    assert_limited(post_a2a(limited, a_key, _tasks_list("again")), id_="again")


def test_limit_is_per_agent_not_per_client_address(limited, make_agent):
    _a, a_key = make_agent("alice@acme")
    _b, b_key = make_agent("bob@acme")
    for i in range(LIMIT):
        assert_ok(post_a2a(limited, a_key, _tasks_list(i)))
    assert_limited(post_a2a(limited, a_key, _tasks_list()))
    # Same client, same remote address: agent B has its own full budget.
    for i in range(LIMIT):
        assert_ok(post_a2a(limited, b_key, _tasks_list(i)))
    assert_limited(post_a2a(limited, b_key, _tasks_list()))


def test_batch_counts_one_hit_per_element(limited, make_agent):
    _a, a_key = make_agent("alice@acme")
    resp = post_a2a(limited, a_key, _batch(3))
    assert_ok(resp)
    assert len(resp.get_json()) == 3
    assert_ok(post_a2a(limited, a_key, _tasks_list()))
    assert_ok(post_a2a(limited, a_key, _tasks_list()))
    assert_limited(post_a2a(limited, a_key, _tasks_list()))


def test_batch_larger_than_remaining_budget_is_429_and_not_counted(limited, make_agent):
    _a, a_key = make_agent("alice@acme")
    assert_ok(post_a2a(limited, a_key, _batch(3)))
    refused = post_a2a(limited, a_key, _batch(3))
    assert_limited(refused, id_=None)
    # The refused batch used nothing: the 2 calls left are still there.
    assert_ok(post_a2a(limited, a_key, _batch(2)))
    assert_limited(post_a2a(limited, a_key, _tasks_list()))


def test_unauthenticated_requests_get_401_and_use_no_budget(limited, make_agent):
    _a, a_key = make_agent("alice@acme")
    unknown_key = "ah_live_" + "a" * 32
    for i in range(LIMIT + 2):
        resp = post_a2a(limited, None if i % 2 else unknown_key, _tasks_list(i))
        assert resp.status_code == 401, resp.get_data(as_text=True)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        body = resp.get_json()
        assert body["error"]["code"] == -32001
        assert body["error"]["data"]["symbol"] == "unauthenticated"
    for i in range(LIMIT):
        assert_ok(post_a2a(limited, a_key, _tasks_list(i)))
    assert_limited(post_a2a(limited, a_key, _tasks_list()))
    # Once an agent is limited, a request without a valid key is still 401, not 429.
    assert post_a2a(limited, None, _tasks_list()).status_code == 401


def test_unreachable_redis_fails_open(base_env, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    dead = build_app({**base_env, "REDIS_URL": DEAD_REDIS, "RELAY_RATE_LIMIT": f"{LIMIT}/minute"}).test_client()
    sent = post_a2a(dead, a_key, rpc_doc("message/send", message_params(b_handle, "still works")))
    assert_ok(sent)
    assert sent.get_json()["result"]["status"] == {"state": "pending"}
    for i in range(3):
        assert_ok(post_a2a(dead, a_key, _tasks_list(i)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gunicorn exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if requests.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"gunicorn did not answer /healthz within 30 s:\n{log.read_text()[-4000:]}")


def _over_http(url, key, id_):
    """tasks/list over a connection of its own (``Connection: close``)."""
    return post_a2a(url, key, _tasks_list(id_), headers={"Connection": "close"}, timeout=10)


class HeldRequest:
    """A request whose headers are sent but not finished, so one sync worker waits on it.

    While it is held, every other connection is served by the other worker; finishing
    it makes the held worker count a hit too. That way both workers see agent A's calls
    whatever order the kernel hands connections out in.
    """

    def __init__(self, port, key, id_):
        body = json.dumps(_tasks_list(id_)).encode()
        head = (
            f"POST /a2a HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        )
        self.rest = b"\r\n" + body
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(head.encode())

    def finish(self) -> tuple[int, dict, dict]:
        self.sock.sendall(self.rest)
        data = b""
        while chunk := self.sock.recv(65536):
            data += chunk
        self.sock.close()
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), headers, json.loads(body)


@contextmanager
def gunicorn(env):
    port = _free_port()
    env = {**env, "HOST": "127.0.0.1", "PORT": str(port)}
    log_fd, log_name = tempfile.mkstemp(prefix="relay-gunicorn-", suffix=".log")
    log = Path(log_name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "app:app", "--config", "gunicorn.conf.py"],
        cwd=ROOT,
        env=env,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
    )
    os.close(log_fd)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, log)
        yield url, port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.unlink(missing_ok=True)


def test_limit_is_shared_by_two_gunicorn_workers(base_env, make_agent):
    _a, a_key = make_agent("alice@acme")
    _b, b_key = make_agent("bob@acme")
    env = {**base_env, "WEB_CONCURRENCY": "2", "RELAY_RATE_LIMIT": f"{LIMIT}/minute"}
    with gunicorn(env) as (url, port):
        held = HeldRequest(port, a_key, 0)  # one worker now waits on this request
        first = [_over_http(url, a_key, i) for i in (1, 2)]  # ...so the other worker serves these
        held_status, held_headers, held_body = held.finish()
        rest = [_over_http(url, a_key, i) for i in range(3, LIMIT + 3)]
        statuses = [r.status_code for r in first] + [held_status] + [r.status_code for r in rest]
        assert statuses == [200] * LIMIT + [429] * 3, statuses
        assert "result" in held_body, held_body
        for r in rest[LIMIT - 3 :]:
            assert r.headers["Retry-After"].isdigit() and 1 <= int(r.headers["Retry-After"]) <= 60
            assert r.json()["error"]["code"] == -32003
            assert r.json()["error"]["data"]["symbol"] == "rate_limited"
        ok_b = _over_http(url, b_key, 1)
        assert ok_b.status_code == 200
        assert "result" in ok_b.json()
