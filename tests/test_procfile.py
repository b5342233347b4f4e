"""The Procfile as a Heroku-style host runs it: release, web, worker, beat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from honcho.environ import parse_procfile
from sqlalchemy.engine import make_url

from relay.ops.embedded import free_port
from tests.conftest import connect, fresh_database
from tests.live import claimed_redis_db, stop_groups

ROOT = Path(__file__).resolve().parent.parent
PROCFILE = parse_procfile((ROOT / "Procfile").read_text()).processes


@pytest.fixture
def heroku_env(server_urls, tmp_path, pooler):
    """An empty database named by a Heroku-style ``postgres://`` URL, dropped afterwards.

    Built from the run's own servers (embedded ones when DATABASE_URL is unset): the
    URL is the test server's with another database name and Heroku's scheme. The Redis
    is the test server's too, in a db claimed for this test (tests/live.py): its worker
    consumes the default queue, which must hold no other run's tasks (the bench smoke
    test's, a parallel worker's), nor this test's go to another's worker. In the pooled run
    DATABASE_CONNECTION_POOL_URL names the session's PgBouncer, as Heroku's pooling does.
    """
    with fresh_database(server_urls[0], "relay_proc") as url, claimed_redis_db(server_urls[1]) as redis_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
        env.update(
            {
                "DATABASE_URL": "postgres://" + url.split("://", 1)[1],
                "REDIS_URL": redis_url,
                "RELAY_HOME": str(tmp_path),
                "RELAY_RATE_LIMIT": "4/minute",
                "WEB_CONCURRENCY": "1",
                "HOST": "127.0.0.1",
                "CELERY_CONCURRENCY": "1",
                "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
            }
        )
        env.pop("DATABASE_CONNECTION_POOL_URL", None)
        if pooler is not None:
            env["DATABASE_CONNECTION_POOL_URL"] = pooler.url(url)
        yield env


def _shell(command: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", "-c", command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, **kw
    )


def _start(command: str, env: dict, log: Path | None = None) -> subprocess.Popen:
    out = open(log, "w") if log is not None else subprocess.DEVNULL
    return subprocess.Popen(
        ["/bin/sh", "-c", f"exec {command}"],
        env=env,
        cwd=ROOT,
        start_new_session=True,
        stdout=out,
        stderr=subprocess.DEVNULL,
    )


def _wait_healthy(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "process exited before serving"
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200:
                return
        except requests.RequestException:  # not listening yet, or still booting its worker
            pass
        time.sleep(0.3)
    raise AssertionError(f"no /healthz on port {port}")


def test_release_migrates_an_empty_database_and_is_a_noop_the_second_time(heroku_env):
    first = _shell(PROCFILE["release"], heroku_env)
    assert first.returncode == 0, first.stderr
    second = _shell(PROCFILE["release"], heroku_env)
    assert second.returncode == 0, second.stderr
    conn = connect(heroku_env["DATABASE_URL"])
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM alembic_version")
        assert cur.fetchone()[0] == 1
        cur.execute("SELECT to_regclass('public.messages') IS NOT NULL")
        assert cur.fetchone()[0] is True
    conn.close()


def test_web_worker_and_beat_run_and_two_web_processes_share_data_and_rate_limits(heroku_env, tmp_path):
    assert _shell(PROCFILE["release"], heroku_env).returncode == 0
    made = _shell("relay agents create frank@acme --name Frank --role frontend --json", heroku_env)
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["api_key"]
    assert _shell("relay agents create bob@acme --name Bob --json", heroku_env).returncode == 0
    port_a, port_b = free_port(), free_port()
    procs = [
        _start(PROCFILE["web"], {**heroku_env, "PORT": str(port_a)}),
        _start(PROCFILE["web"], {**heroku_env, "PORT": str(port_b)}),
        _start(PROCFILE["worker"], heroku_env, log=tmp_path / "worker.log"),
        _start(PROCFILE["beat"], heroku_env),
    ]
    try:
        _wait_healthy(port_a, procs[0])
        _wait_healthy(port_b, procs[1])
        headers = {"Authorization": f"Bearer {key}"}
        # Values only, no response kept: a live response keeps its connection open (requests
        # 2.34), and gunicorn's graceful stop below would wait for it until the head deadline.
        task_id = requests.post(
            f"http://127.0.0.1:{port_a}/a2a",
            headers=headers,
            timeout=10,
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "message/send",
                "params": {
                    "recipient": "bob@acme",
                    "message": {"parts": [{"type": "text", "text": "over the Procfile"}]},
                },
            },
        ).json()["result"]["task_id"]
        # The other web process sees the same data ...
        got = requests.post(
            f"http://127.0.0.1:{port_b}/a2a",
            headers=headers,
            timeout=10,
            json={"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"task_id": task_id}},
        ).json()
        assert got["result"]["summary"] == "over the Procfile"
        # ... and the same rate-limit budget (4/minute): two more calls fit, the fifth does not.
        codes = [
            requests.post(
                f"http://127.0.0.1:{port}/a2a",
                headers=headers,
                timeout=10,
                json={"jsonrpc": "2.0", "id": 3, "method": "tasks/list"},
            ).status_code
            for port in (port_a, port_b, port_b)
        ]
        assert codes == [200, 200, 429]
        # The worker and beat are running (they would have exited on a bad configuration).
        assert procs[2].poll() is None and procs[3].poll() is None
        # The worker indexes the message for search.
        deadline = time.monotonic() + 30
        conn = connect(heroku_env["DATABASE_URL"])
        conn.autocommit = True
        indexed = False
        while time.monotonic() < deadline and not indexed:
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM messages WHERE search_vector IS NOT NULL")
                indexed = cur.fetchone()[0] == 1
            time.sleep(0.3)
        conn.close()
        assert indexed
        # The worker's own log lines are JSON too (Celery neither hijacks logging nor stdout).
        worker_lines = [
            json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.startswith("{")
        ]
        assert any(
            line["logger"] == "celery.apps.worker" and line["message"].endswith("ready.") for line in worker_lines
        )
    finally:
        stop_groups(procs)


BURST_CLIENTS = 40  # half send, half read the feed (plain reads and long-polls)
BURST_ROUNDS = 5
BUDGET = 20  # a small managed tier's connection limit (Heroku Essential)


def _connections(heroku_env: dict, pooler, admin) -> int:
    """PostgreSQL connections the deploy holds on its database; behind the pooler, its clients there."""
    name = make_url(heroku_env["DATABASE_URL"]).database
    if pooler is not None:
        return sum(1 for row in pooler.admin("SHOW CLIENTS") if row["database"] == name)
    with admin.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
        return cur.fetchone()[0]


def test_the_default_deploy_holds_at_most_20_connections_under_a_40_client_burst(heroku_env, tmp_path, pooler):
    env = {
        **{k: v for k, v in heroku_env.items() if k not in ("WEB_CONCURRENCY", "CELERY_CONCURRENCY")},
        # The Procfile's defaults but the rate limits, which would turn the burst away first.
        "RELAY_RATE_LIMIT": "100000/minute",
        "RELAY_REST_RATE_LIMIT": "100000/minute",
    }
    assert _shell(PROCFILE["release"], env).returncode == 0
    keys = {}
    for handle in ("frank@acme", "bob@acme"):
        made = _shell(f"relay agents create {handle} --name X --json", env)
        assert made.returncode == 0, made.stderr
        keys[handle] = json.loads(made.stdout)["api_key"]
    port = free_port()
    procs = [
        _start(PROCFILE["web"], {**env, "PORT": str(port)}),
        _start(PROCFILE["worker"], env),
        _start(PROCFILE["beat"], env),
    ]
    admin = connect(env["DATABASE_URL"])
    admin.autocommit = True
    base = f"http://127.0.0.1:{port}"
    feed = f"{base}/api/v1/identities/bob@acme/a2a/messages"
    statuses: list[int] = []
    errors: list[BaseException] = []
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _connections(env, pooler, admin))
            time.sleep(0.02)

    def sender(i: int):
        with requests.Session() as http:
            for r in range(BURST_ROUNDS):
                resp = http.post(
                    f"{base}/a2a",
                    headers={"Authorization": f"Bearer {keys['frank@acme']}"},
                    json={
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "message/send",
                        "params": {
                            "recipient": "bob@acme",
                            "message": {"parts": [{"type": "text", "text": f"burst {i}.{r}"}]},
                        },
                    },
                    timeout=30,
                )
                statuses.append(resp.status_code if "result" in resp.json() else -resp.status_code)

    def reader(i: int):
        with requests.Session() as http:
            for _ in range(BURST_ROUNDS):
                params = {"wait": "2"} if i % 2 else {}  # half long-poll, half plain reads
                resp = http.get(
                    feed, headers={"Authorization": f"Bearer {keys['bob@acme']}"}, params=params, timeout=30
                )
                statuses.append(resp.status_code)

    def guarded(fn, i):
        try:
            fn(i)
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        _wait_healthy(port, procs[0])
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        clients = [
            threading.Thread(target=guarded, args=(sender if i % 2 else reader, i), daemon=True)
            for i in range(BURST_CLIENTS)
        ]
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        assert not any(t.is_alive() for t in clients), "the burst had not finished within 120 s"
        time.sleep(1)  # the worker's indexing of the burst, after the last answer
        done.set()
        sampler.join(10)
        assert errors == []
        assert statuses == [200] * (BURST_CLIENTS * BURST_ROUNDS), sorted(set(statuses))
        assert 0 < peak[0] <= BUDGET, f"the deploy held {peak[0]} connections"
        with admin.cursor() as cur:
            cur.execute("SELECT count(*) FROM messages")
            assert cur.fetchone()[0] == BURST_CLIENTS // 2 * BURST_ROUNDS
    finally:
        done.set()
        admin.close()
        stop_groups(procs)
