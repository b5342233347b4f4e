"""Fixtures on the real servers: a fresh PostgreSQL database per session, real Redis.

``DATABASE_URL``/``REDIS_URL`` name the servers (the database in the URL is only used
to connect and create the test database); when unset, embedded ones are started under a
temporary folder of this session, both on free 127.0.0.1 ports, so no test reaches a
server it was not given.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import psycopg2
import psycopg2.errors
import pytest
import requests
from sqlalchemy.engine import make_url

from relay.config import normalize_database_url
from relay.ops.migrate import upgrade

_TMP = Path(tempfile.mkdtemp(prefix="relay-tests-"))

# --------------------------------------------------------------------------- parallel runs (pytest-xdist)
# Under ``-n N`` (the README's test command) each worker is a session of its own: its own
# database, Celery queue and rate-limit prefix; live stacks claim a Redis db each
# (tests/live.py). Each module runs whole on one worker, so a module-scoped live stack
# starts once; the longest modules go first, so no long one starts last. The drills and
# the bench smoke test load the machine on purpose and time what they watch: they run one
# after the other on one worker, never beside each other.
RUN_TOGETHER = "drills and bench"
TOGETHER = {"tests/test_drills.py": RUN_TOGETHER, "tests/test_bench_smoke.py": RUN_TOGETHER}
# Each test's duration in a whole run, as pytest-split stores them (docs/operations.md#tests:
# ``--store-durations --durations-path tests/durations.json``). A module takes the sum of its
# tests; a module the file does not know yet is scheduled first, as if it were the longest.
DURATIONS = Path(__file__).with_name("durations.json")


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def module_seconds(durations: dict[str, float]) -> dict[str, float]:
    """Seconds per module (or per group run together) from per-test ``durations``."""
    seconds: dict[str, float] = {}
    for nodeid, spent in durations.items():
        scope = TOGETHER.get(_module(nodeid), _module(nodeid))
        seconds[scope] = seconds.get(scope, 0.0) + spent
    return seconds


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike
        try:
            seconds = module_seconds(json.loads(DURATIONS.read_text()))
        except FileNotFoundError:
            return
        unknown = float("inf")
        items.sort(key=lambda item: -seconds.get(TOGETHER.get(_module(item.nodeid), _module(item.nodeid)), unknown))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole modules (and the drills with the bench) to one worker each, in collection order."""
    if config.getvalue("dist") not in ("load", "loadscope", "loadfile"):
        return None  # each, worksteal, loadgroup: as asked
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return TOGETHER.get(module, module)

    config.option.loadscopereorder = False  # keep the stored durations' order, not the count of tests
    return ByModule(config, log)


def _server_urls() -> tuple[str, str]:
    db = os.environ.get("DATABASE_URL")
    rd = os.environ.get("REDIS_URL")
    if not db or not rd:
        from relay.ops import embedded

        if not db:
            # Over TCP: the pooled pass's PgBouncer and the outage tests' proxy need a host and port.
            pg, db = embedded.start_postgres(_TMP, tcp=True)
            _TMP_PG.append(pg)
        if not rd:
            _TMP_REDIS.append(embedded.start_redis(_TMP)[0])
            rd = f"redis://127.0.0.1:{_TMP_REDIS[-1].server_config['port']}/0"
    return normalize_database_url(db), rd


_TMP_REDIS: list = []
_TMP_PG: list = []


def _connect_admin(url):
    return psycopg2.connect(
        host=url.host or url.query.get("host"),
        port=url.port,
        user=url.username or "postgres",
        password=url.password,
        dbname=url.database or "postgres",
    )


@contextmanager
def fresh_database(server_url: str, prefix: str):
    """Yield the URL of a new, empty database on ``server_url``'s server; drop it (FORCE) after.

    The URL keeps every part of ``server_url`` but the database name, so a socket URL
    (the embedded server's ``?host=/path``) stays a socket URL.
    """
    base = make_url(server_url)
    name = f"{prefix}_{secrets.token_hex(6)}"
    admin = _connect_admin(base)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextmanager
def migrated_database(server_url: str, prefix: str):
    """Yield the URL of a new database on ``server_url``'s server, migrated; drop it (FORCE) after."""
    with fresh_database(server_url, prefix) as url:
        upgrade(url)
        yield url


def tcp_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of the PostgreSQL server ``url`` names (libpq's 5432 when it names a host
    and no port); skip the test, in one line, when ``url`` names a Unix socket instead."""
    parsed = make_url(normalize_database_url(url))
    if not parsed.host:
        pytest.skip("needs PostgreSQL over TCP (host and port); DATABASE_URL names a Unix socket")
    return parsed.host, parsed.port or 5432


def connect(url: str):
    """A psycopg2 connection to ``url`` (any form: TCP, socket, Heroku's ``postgres://``)."""
    return _connect_admin(make_url(normalize_database_url(url)))


def wait_until(fn, timeout=20.0, what="condition", interval=0.05):
    """Poll ``fn`` until it returns something truthy; return it (AssertionError on the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {value!r})")
        time.sleep(interval)


@contextmanager
def extra_app(base_env, celery_app, redis_url, **env):
    """Another app in this process built from ``base_env`` plus ``env``; its queue is private
    (dropped after) and the session's Celery stays the default."""
    import redis

    from relay.factory import create_app

    other = create_app({**base_env, **env}, TESTING=True, RATELIMIT_KEY_PREFIX=f"x{secrets.token_hex(4)}")
    # Anything it enqueues must not land where a worker of this or another session consumes.
    queue = other.extensions["celery"].conf.task_default_queue = f"relay-test-extra-{secrets.token_hex(4)}"
    celery_app.set_default()
    try:
        yield other
    finally:
        conn = redis.Redis.from_url(redis_url)
        conn.delete(queue)
        conn.close()
        celery_app.set_default()


# --------------------------------------------------------------------------- requests to POST /a2a
# The one copy of the tests' JSON-RPC calls (tests/test_house_rules.py keeps modules from
# defining their own). ``client`` is a Flask test client, or a live relay's base URL
# (``http://host:port``) reached over HTTP with requests.
JSON = "application/json"
A2A_VERSION = {"A2A-Version": "1.0"}


def rpc_doc(method: str, params, *, id=1) -> dict:
    """Build one JSON-RPC 2.0 request: ``{"jsonrpc": "2.0", "id", "method", "params"}``."""
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def message_params(recipient: str | None, text: str, **more) -> dict:
    """Build message/send's params: one text part to ``recipient`` (none when None, as in an append), then ``more``."""
    to = {} if recipient is None else {"recipient": recipient}
    return {**to, "message": {"parts": [{"type": "text", "text": text}]}, **more}


def post_a2a(client, key: str | None, body, *, agent: str | None = None, headers=None, content_type=JSON, **kw):
    """POST ``body`` to ``/a2a`` with ``key``'s bearer header (none when ``key`` is None); return the response.

    ``body``: a dict or list goes as JSON; str (as UTF-8) or bytes go as they are, labelled
    ``content_type`` (no Content-Type when None). ``agent``: the A2A binding's JSON-RPC endpoint instead,
    ``/a2a/agents/<agent>`` with ``A2A-Version: 1.0``. ``headers`` are added last; ``kw`` goes
    to the client's ``post`` (a URL's requests call has a 30 s timeout unless ``timeout`` is given).
    """
    path = "/a2a" if agent is None else f"/a2a/agents/{agent}"
    sent = {**({} if key is None else bearer(key)), **({} if agent is None else A2A_VERSION)}
    if isinstance(body, (str, bytes)):
        kw["data"] = body.encode() if isinstance(body, str) else body
        if content_type is not None:
            sent["Content-Type"] = content_type
    else:
        kw["json"] = body
    sent.update(headers or {})
    if isinstance(client, str):
        return requests.post(client + path, headers=sent, **{"timeout": 30, **kw})
    return client.post(path, headers=sent, **kw)


def answer_of(resp) -> dict | list:
    """Return the JSON document of a Flask test response or of a requests response."""
    return resp.json() if isinstance(resp, requests.Response) else resp.get_json()


def rpc_answer(client, key, method: str, params, *, id=1, status: int | None = 200, **kw) -> dict:
    """Call a JSON-RPC method; return the whole answer (its ``result`` or its ``error``).

    Asserts the HTTP ``status`` (any when None) and, on a 200, that the answer echoes ``id``.
    ``kw`` as for ``post_a2a`` (``agent``, ``headers``, ...).
    """
    resp = post_a2a(client, key, rpc_doc(method, params, id=id), **kw)
    text = resp.text if isinstance(resp, requests.Response) else resp.get_data(as_text=True)
    assert status is None or resp.status_code == status, (resp.status_code, text)
    body = answer_of(resp)
    assert resp.status_code != 200 or body["id"] == id, body
    return body


def rpc(client, key, method: str, params, **kw) -> dict:
    """Call a JSON-RPC method that must succeed (HTTP 200); return its ``result``."""
    body = rpc_answer(client, key, method, params, **kw)
    assert "result" in body, body
    return body["result"]


def rpc_error(client, key, method: str, params, **kw) -> dict:
    """Call a JSON-RPC method that must fail (HTTP 200 unless ``status`` says otherwise); return its ``error``."""
    body = rpc_answer(client, key, method, params, **kw)
    assert "error" in body, body
    return body["error"]


def send_message(client, key, recipient: str | None, text: str = "hi", **more) -> dict:
    """Send one text part with message/send (``message_params``), which must succeed; return its result."""
    return rpc(client, key, "message/send", message_params(recipient, text, **more))


@pytest.fixture(scope="session")
def server_urls():
    return _server_urls()


@pytest.fixture(scope="session")
def database_url(server_urls):
    """Create a database with a random name, migrate it with Alembic, drop it at the end."""
    try:
        with migrated_database(server_urls[0], "relay_test") as url:
            yield url
            for conn in _admin_conns.values():  # before the database is dropped under them
                conn.close()
    finally:
        for client in _TMP_REDIS:
            from relay.ops.embedded import stop_redis

            stop_redis(client)
        for server in _TMP_PG:  # stop the embedded PostgreSQL before its data directory goes
            server.cleanup()
        shutil.rmtree(_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(server_urls):
    return server_urls[1]


# The pooled run (.ci/run's second pass, docs/operations.md#tests): with RELAY_TEST_POOLER=1 every
# relay the tests build or start (apps, gunicorn, Celery, the CLI) reaches PostgreSQL
# through a private PgBouncer in transaction mode (DATABASE_CONNECTION_POOL_URL), as a
# Heroku deploy does; migrations and the tests' own checks stay on the direct URL.
POOLED = os.environ.get("RELAY_TEST_POOLER") == "1"


@pytest.fixture(scope="session")
def pooler(server_urls):
    """The session's PgBouncer (relay.ops.pooler) in the pooled run, else None."""
    if not POOLED:
        yield None
        return
    from relay.ops.pooler import Pooler

    running = Pooler(server_urls[0])
    try:
        yield running
    finally:
        running.stop()


def with_application_name(env: dict, name: str) -> dict:
    """``env`` with both database URLs naming their connections ``name``, so a test can count them."""
    out = dict(env)
    for var in ("DATABASE_URL", "DATABASE_CONNECTION_POOL_URL"):
        if url := out.get(var):
            out[var] = f"{url}{'&' if '?' in url else '?'}application_name={name}"
    return out


def connections_named(app, pooler, name: str) -> int:
    """Connections a relay named ``name`` holds open: to PostgreSQL, or in the pooled run to the
    pooler (its clients; the pooler's own server connections are shared by every client)."""
    if pooler is None:
        return sql(app, "SELECT count(*) FROM pg_stat_activity WHERE application_name = :n", n=name)[0][0]
    return sum(1 for row in pooler.admin("SHOW CLIENTS") if row["application_name"] == name)


@pytest.fixture(scope="session")
def base_env(database_url, redis_url, pooler):
    """Environment for create_app and for subprocesses (CLI, gunicorn, celery)."""
    return session_environment(os.environ, database_url, redis_url, pooler.url(database_url) if pooler else None)


def session_environment(environ, database_url: str, redis_url: str, pool_url: str | None) -> dict:
    """``environ`` with the session's servers and the tests' settings (``base_env``)."""
    env = dict(environ)
    env.pop("DATABASE_CONNECTION_POOL_URL", None)
    # A RELAY_HOME exported for the runner's own relay up is that relay's: a test that needs a
    # home makes its own (tests/live.py a temporary one), so no beat of the tests shares its files.
    env.pop("RELAY_HOME", None)
    if pool_url is not None:
        env["DATABASE_CONNECTION_POOL_URL"] = pool_url
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "RELAY_ENV": "test",
            "RELAY_SECRET_KEY": "test-secret",
            "RELAY_RATE_LIMIT": "100000/minute",
            "RELAY_REST_RATE_LIMIT": "100000/minute",
            # Tests send bad keys from 127.0.0.1 on purpose; tests/test_auth_failures.py sets its own.
            "RELAY_AUTH_FAILURE_LIMIT": "100000/minute",
            # Console sign-ins come from 127.0.0.1 with a few emails; tests/test_console_http.py sets its own.
            "RELAY_CONSOLE_LOGIN_LIMIT": "100000/minute",
            "RELAY_CONSOLE_LOGIN_ADDRESS_LIMIT": "100000/minute",
            # Test receivers listen on 127.0.0.1 over plain http.
            "RELAY_WEBHOOK_ALLOW_PRIVATE": "1",
            "RELAY_WEBHOOK_ALLOW_HTTP": "1",
            "RELAY_WEBHOOK_SCHEDULE": "0,1,2,5",
            "RELAY_WEBHOOK_TIMEOUT": "3",
            # Most tests send A2A messages nobody works: a blocking SendMessage answers at once
            # here. tests/test_a2a_blocking.py runs relays with the bound set.
            "RELAY_A2A_BLOCKING_SECONDS": "0",
        }
    )
    return env


@pytest.fixture(scope="session")
def app(base_env, redis_url):
    from relay.factory import create_app

    app = create_app(base_env, TESTING=True, RATELIMIT_KEY_PREFIX=f"t{secrets.token_hex(4)}")
    # Every test's after-commit enqueues go to a queue private to this session, removed at the end.
    queue = f"relay-test-{secrets.token_hex(4)}"
    app.extensions["celery"].conf.task_default_queue = queue
    yield app
    import redis

    client = redis.Redis.from_url(redis_url)
    client.delete(queue)
    client.close()


TABLES = (
    "audit_events",
    "events",
    "read_positions",
    "messages",
    "threads",
    "idempotency_records",
    "blocks",
    "api_keys",
    "agents",
)


@pytest.fixture(autouse=True)
def _clean_tables(database_url):
    yield
    # A webhook pump started in this process (by an in-process worker or a sweep run
    # inline) must not outlive its test: it would send the next test's webhooks.
    from workers.delivery import stop_pumps

    stop_pumps(timeout=5.0)
    _empty_tables(database_url)


# Up to this many rows in all, the tables are emptied with DELETE (about 1 ms for the few
# rows a test writes, against 30-100 ms for a TRUNCATE of every table, which makes new
# files for each table and index); past it with TRUNCATE, so a bulk test's dead rows do
# not stay behind in the next tests' tables.
_DELETE_AT_MOST = 2000
_admin_conns: dict[str, object] = {}


def _admin_conn(database_url: str):
    """An autocommit admin connection to ``database_url``, kept for the session (reopened if closed)."""
    conn = _admin_conns.get(database_url)
    if conn is None or conn.closed:
        conn = _admin_conns[database_url] = _connect_admin(make_url(database_url))
        conn.autocommit = True
    return conn


def _children_first(cur, names: list[str]) -> list[str]:
    """``names`` ordered so that each table comes before every table its foreign keys point to."""
    cur.execute(
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
        " WHERE contype = 'f' AND connamespace = 'public'::regnamespace AND conrelid <> confrelid"
    )
    parents: dict[str, set[str]] = {n: set() for n in names}
    for child, parent in cur.fetchall():
        child, parent = child.strip('"'), parent.strip('"')
        if child in parents and parent in parents:
            parents[child].add(parent)
    children = {n: {c for c in names if n in parents[c]} for n in names}
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [n for n in names if n not in ordered and children[n] <= set(ordered)]
        if not ready:  # a cycle: DELETE cannot order it; the caller truncates instead
            return []
        ordered += ready
    return ordered


def _empty_tables(database_url: str) -> None:
    """Empty every table of the session's database (its schema and Alembic's version stay)."""
    with _admin_conn(database_url).cursor() as cur:
        # relay_generations is schema state, like alembic_version (migration 0006); so are
        # relay_floors' rows (0011), set back to what the migration wrote: a test's rows
        # may be of any age, and a floor raised by an earlier test's pass would hide them.
        cur.execute("UPDATE relay_floors SET floor = '-infinity'")
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename NOT IN ('alembic_version', 'relay_generations', 'relay_floors')"
        )
        names = sorted(r[0] for r in cur.fetchall())
        if not names:
            return
        cur.execute(
            "SELECT "
            + " + ".join(
                f'(SELECT count(*) FROM (SELECT 1 FROM "{n}" LIMIT {_DELETE_AT_MOST + 1}) AS x)' for n in names
            )
        )
        ordered = _children_first(cur, names) if cur.fetchone()[0] <= _DELETE_AT_MOST else []
        if ordered:
            statement = "BEGIN; " + " ".join(f'DELETE FROM "{n}";' for n in ordered) + " COMMIT;"
        else:
            statement = "TRUNCATE " + ", ".join(f'"{n}"' for n in names) + " CASCADE"
        # A live stack's worker (tests/live.py) may still be writing search vectors or
        # deliveries; PostgreSQL then picks the cleanup as a deadlock victim, or (DELETE)
        # a row the worker added meanwhile still points at a parent. Retry.
        for attempt in range(10):
            try:
                cur.execute(statement)
                break
            except (psycopg2.errors.DeadlockDetected, psycopg2.errors.ForeignKeyViolation):
                cur.execute("ROLLBACK")
                if attempt == 9:
                    raise
                time.sleep(0.2)


@pytest.fixture(scope="session")
def celery_app(app):
    """The app's Celery, on the queue private to this test session."""
    return app.extensions["celery"]


WORKER_POLL = 0.1  # seconds


@pytest.fixture
def celery_worker(celery_app):
    """A real Celery worker (threads pool) consuming from real Redis for one test."""
    import logging

    from celery.contrib.testing.worker import start_worker

    # start_worker's loglevel lowers the root logger for the whole process; later tests
    # read the INFO request log line, so put the root logger back as it was.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    # The worker's consumer blocks in BRPOP for kombu's polling interval (1 s by default)
    # and only sees the stop after it returns: poll every 0.1 s so stopping takes ~0.1 s.
    # The worker's connection reads the option when it starts; the app's is put back after.
    options = celery_app.conf.broker_transport_options
    celery_app.conf.broker_transport_options = {**options, "polling_interval": WORKER_POLL}
    try:
        with start_worker(
            celery_app, pool="threads", concurrency=4, perform_ping_check=False, shutdown_timeout=15, loglevel="WARNING"
        ) as worker:
            yield worker
    finally:
        celery_app.conf.broker_transport_options = options
        root.setLevel(level)
        root.handlers[:] = handlers


@pytest.fixture(scope="module")
def relay_url(base_env):
    """A live relay for one test module (tests/live.py): gunicorn and a Celery worker."""
    from tests.live import live_relay

    with live_relay(base_env) as url:
        yield url


# Outbox work a live worker still has to do: the autouse TRUNCATE after a test can
# deadlock with it (and then retries), so tests of a live stack wait for it first. Left
# out, because no worker will ever do them: messages whose indexing failed for good
# (``index_error``) and deliveries held for a disabled agent (pending, no due time).
_BACKLOG = {
    "outbox events not fanned out": "SELECT id::text FROM events WHERE fanned_out_at IS NULL",
    "messages not indexed": "SELECT id::text FROM messages WHERE search_vector IS NULL AND index_error IS NULL",
    "deliveries pending": (
        "SELECT id::text FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at IS NOT NULL"
    ),
}
SETTLE_TIMEOUT = 20.0


def backlog(app) -> dict[str, list[str]]:
    """The outbox work still to do, by kind: ``{kind: [row id, ...]}`` (kinds with none left out)."""
    left = {kind: [row[0] for row in sql(app, query)] for kind, query in _BACKLOG.items()}
    return {kind: ids for kind, ids in left.items() if ids}


@pytest.fixture
def settled(app):
    """After the test, wait until the live worker has done its outbox work; fail if it has not
    within ``SETTLE_TIMEOUT`` seconds, naming what is left."""
    yield
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while left := backlog(app):
        if time.monotonic() > deadline:
            named = "; ".join(f"{len(ids)} {kind} (e.g. {', '.join(ids[:3])})" for kind, ids in left.items())
            raise AssertionError(f"the live worker left work undone after {SETTLE_TIMEOUT:g} s: {named}")
        time.sleep(0.1)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def make_agent(app):
    """Create an agent through the service; return ``(handle, api_key)``."""
    from relay.services.agents import create_agent

    def _make(handle: str, name: str | None = None, role: str = "backend"):
        with app.app_context():
            agent, key = create_agent(handle, name or handle.split("@")[0].title(), role)
        return agent.handle, key.api_key

    return _make


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def alice(make_agent):
    """``alice@acme`` (frontend): ``(handle, api_key)``."""
    return make_agent("alice@acme", name="Alice", role="frontend")


@pytest.fixture
def bob(make_agent):
    """``bob@acme`` (backend): ``(handle, api_key)``."""
    return make_agent("bob@acme", name="Bob", role="backend")


def slots_in(app, redis_url: str, handle: str) -> int:
    """How many waits and streams ``handle`` holds now in the Redis at ``redis_url`` (its unexpired
    slots, services/wakeup.Slot), across every web process of the relay using it."""
    import redis

    agent_id = sql(app, "SELECT id FROM agents WHERE handle = :h", h=handle)[0][0]
    client = redis.Redis.from_url(redis_url)
    try:
        return client.zcount(f"relay:waits:{uuid.UUID(str(agent_id)).hex}", time.time(), "+inf")
    finally:
        client.close()


def sql(app, statement: str, **params):
    """Run one SQL statement in its own committed transaction; return its rows, if any."""
    from sqlalchemy import text

    from relay.extensions import db

    with app.app_context():
        result = db.session.execute(text(statement), params)
        rows = result.fetchall() if result.returns_rows else None
        db.session.commit()
    return rows
