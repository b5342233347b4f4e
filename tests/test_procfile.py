"""The Procfile as a Heroku-style host runs it: release, web, worker, beat."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from honcho.environ import parse_procfile

from relay.ops.embedded import free_port
from tests.conftest import connect, fresh_database
from tests.live import claimed_redis_db, stop_groups

ROOT = Path(__file__).resolve().parent.parent
PROCFILE = parse_procfile((ROOT / "Procfile").read_text()).processes


@pytest.fixture
def heroku_env(server_urls, tmp_path):
    """An empty database named by a Heroku-style ``postgres://`` URL, dropped afterwards.

    Built from the run's own servers (embedded ones when DATABASE_URL is unset): the
    URL is the test server's with another database name and Heroku's scheme. The Redis
    is the test server's too, in a db claimed for this test (tests/live.py): its worker
    consumes the default queue, which must hold no other run's tasks (the bench smoke
    test's, a parallel worker's), nor this test's go to another's worker.
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
    import json

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
