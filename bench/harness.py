"""Start what a bench run measures: a fresh database, agents made by the CLI, gunicorn, a worker."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import psycopg2
import requests
from sqlalchemy.engine import make_url

from relay.config import normalize_database_url
from relay.ops.embedded import free_port
from relay.ops.migrate import upgrade

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def server_urls() -> tuple[str, str]:
    return (
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
        os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    )


def _admin(url: str):
    u = make_url(normalize_database_url(url))
    conn = psycopg2.connect(
        host=u.host or u.query.get("host"),
        port=u.port,
        user=u.username or "postgres",
        password=u.password,
        dbname=u.database or "postgres",
    )
    conn.autocommit = True
    return conn, u


def analyze(url: str) -> dict:
    """``ANALYZE`` the database at ``url`` as autovacuum would after a burst of writes; return what was done.

    The bench fills a fresh database within seconds, faster than autovacuum's one-minute
    nap notices (and on this machine's server autovacuum is off): without statistics
    PostgreSQL plans a busy inbox as a handful of rows and sorts all of it.
    """
    conn, _ = _admin(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW autovacuum")
            autovacuum = cur.fetchone()[0]
            started = time.monotonic()
            cur.execute("ANALYZE")
        return {"autovacuum": autovacuum, "analyze_s": round(time.monotonic() - started, 2)}
    finally:
        conn.close()


@contextmanager
def fresh_database(prefix: str = "relay_bench"):
    """Yield the URL of a new, migrated database; drop it afterwards."""
    base, _ = server_urls()
    admin, u = _admin(base)
    name = f"{prefix}_{secrets.token_hex(4)}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    url = u.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        conn, _ = _admin(url)
        with conn.cursor() as cur:
            cur.execute(
                "CREATE TABLE bench_ceiling (id bigserial PRIMARY KEY, payload text NOT NULL, "
                "created_at timestamptz NOT NULL DEFAULT now())"
            )
            cur.execute("INSERT INTO bench_ceiling (payload) SELECT repeat('x', 200) FROM generate_series(1, 100)")
        conn.close()
        yield url
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def base_env(database_url: str, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": server_urls()[1],
            "RELAY_ENV": "development",
            "RELAY_RATE_LIMIT": "100000000/minute",
            "RELAY_REST_RATE_LIMIT": "100000000/minute",
            "RELAY_WEBHOOK_ALLOW_PRIVATE": "1",
            "RELAY_WEBHOOK_ALLOW_HTTP": "1",
            "RELAY_LOG_LEVEL": "WARNING",
            "HOST": "127.0.0.1",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    env.update(extra or {})
    return env


# Many agents in one process: one CLI call each took a second or more (the app's start), so
# a thousand waiting agents took longer to provision than to measure.
_CREATE_AGENTS = """
import json, sys
from relay.factory import create_app
from relay.services import agents
app, keys = create_app(), {}
with app.app_context():
    for handle in json.load(sys.stdin):
        keys[handle] = agents.create_agent(handle, handle.split("@")[0], "bench")[1].api_key
print("KEYS " + json.dumps(keys))
"""


def create_agents(env: dict, handles: list[str]) -> dict[str, str]:
    """Provision agents through the relay's service, in one process; return handle -> API key."""
    out = subprocess.run(
        [sys.executable, "-c", _CREATE_AGENTS],
        env=env,
        input=json.dumps(handles),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    line = next(line for line in out.stdout.splitlines() if line.startswith("KEYS "))
    return json.loads(line.removeprefix("KEYS "))


class Proc:
    """A child process group, stopped on exit."""

    def __init__(self, args: list[str], env: dict):
        # BENCH_LOGS=DIR keeps each process's output for a look after the run.
        log_dir = os.environ.get("BENCH_LOGS")
        out = (
            open(Path(log_dir) / f"{Path(args[0]).name}-{secrets.token_hex(3)}.log", "w")
            if log_dir
            else subprocess.DEVNULL
        )
        self.popen = subprocess.Popen(
            args, env=env, cwd=ROOT, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )

    def tree(self) -> list[psutil.Process]:
        try:
            parent = psutil.Process(self.popen.pid)
            return [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def cpu_seconds(proc: Proc) -> float:
    """CPU seconds (user + system) the process group has used so far, children included."""
    total = 0.0
    for p in proc.tree():
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def gunicorn(
    app_path: str, env: dict, workers: int, extra_args: list[str] | None = None, ready: str | None = None
) -> tuple[Proc, str]:
    """Start gunicorn the way the Procfile's web line does (plus ``extra_args``); return it and its base URL.

    ``ready``: the path that answers 200 once it is up (default ``/healthz`` for the relay, ``/select`` else).
    """
    port = free_port()
    proc = Proc(
        [str(BIN / "gunicorn"), app_path, "--config", str(ROOT / "gunicorn.conf.py"), *(extra_args or [])],
        {**env, "PORT": str(port), "WEB_CONCURRENCY": str(workers)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if (
                requests.get(
                    f"{url}{ready or ('/healthz' if app_path == 'app:app' else '/select')}", timeout=2
                ).status_code
                == 200
            ):
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.stop()
    raise RuntimeError(f"{app_path} did not start")


def celery_worker(env: dict) -> Proc:
    """Start the Celery worker exactly as the Procfile's ``worker`` line does."""
    from honcho.environ import parse_procfile

    command = parse_procfile((ROOT / "Procfile").read_text()).processes["worker"]
    return Proc(["/bin/sh", "-c", f"exec {command}"], env)


def celery_beat(env: dict) -> Proc:
    """Start celery beat exactly as the Procfile's ``beat`` line does (its schedule file under ``$RELAY_HOME``)."""
    from honcho.environ import parse_procfile

    command = parse_procfile((ROOT / "Procfile").read_text()).processes["beat"]
    return Proc(["/bin/sh", "-c", f"exec {command}"], env)


@contextmanager
def claimed_redis_db(url: str | None = None):
    """Claim a Redis db for this run alone, by the tests' own protocol (tests/live.py); yield its URL.

    Whoever holds the claim key in a db owns it, so a bench and a test suite on one Redis
    never take each other's Celery tasks; the db is emptied afterwards.
    """
    from tests.live import claimed_redis_db as claim

    with claim(url or server_urls()[1]) as claimed:
        yield claimed


class RssSampler:
    """Peak resident memory of some processes, sampled every half second."""

    def __init__(self, groups: dict[str, Proc]):
        self.groups = groups
        self.peak = {name: 0 for name in groups}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for name, proc in self.groups.items():
                children = proc.tree()[1:] or proc.tree()  # workers, not the master
                for p in children:
                    try:
                        self.peak[name] = max(self.peak[name], p.memory_info().rss)
                    except psutil.NoSuchProcess:
                        pass
            self._stop.wait(0.5)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class Receiver:
    """A loopback webhook receiver recording when each delivery arrived."""

    def __init__(self):
        self.arrivals: list[tuple[float, dict, str]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                now = time.time()
                with outer.lock:
                    outer.arrivals.append((now, json.loads(body), self.headers.get("webhook-id", "")))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()

    def wait_for(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.arrivals) >= n:
                    return True
            time.sleep(0.05)
        return False


def drained(database_url: str, timeout: float = 180) -> bool:
    """Wait until the worker has indexed every message and fanned out every event; False at ``timeout`` s."""
    conn, _ = _admin(database_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT (SELECT count(*) FROM messages WHERE search_vector IS NULL)"
                    " + (SELECT count(*) FROM events WHERE fanned_out_at IS NULL)"
                )
                if cur.fetchone()[0] == 0:
                    return True
            time.sleep(0.5)
        return False
    finally:
        conn.close()
