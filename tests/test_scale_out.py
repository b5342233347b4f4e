"""Scale-out (docs/decisions.md, "Scale-out"): the connection budget, pool exhaustion, and PREPARE on or off.

Each rule is met on the real servers: ``relay config check`` as a subprocess against the
session's PostgreSQL, a pool really emptied by holding its only connection, and the
server's own ``pg_prepared_statements`` read on the connection the app used.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from sqlalchemy import text

from relay.config import ConfigError, load_settings
from relay.extensions import db
from tests.conftest import bearer, connect, extra_app, message_params, post_a2a, rpc_doc, tcp_address


def feed(handle: str) -> str:
    return f"/api/v1/identities/{handle}/a2a/messages"


def _config_check(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "config", "check", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _direct_env(base_env: dict, tmp_path, **extra: str) -> dict:
    """base_env on the direct URL only (no pooler), with an isolated RELAY_HOME."""
    env = {k: v for k, v in base_env.items() if k != "DATABASE_CONNECTION_POOL_URL"}
    env.update({"RELAY_HOME": str(tmp_path / "home"), **extra})
    return env


def _server_slots(database_url: str) -> int:
    conn = connect(database_url)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int"
            " - coalesce(current_setting('reserved_connections', true)::int, 0)"
        )
        (slots,) = cur.fetchone()
    conn.close()
    return slots


def _budget(stdout: str) -> dict[str, tuple[int, int, int]]:
    """``{process type: (processes, each, product)}`` and ``total`` from config check's budget lines."""
    rows = {
        m[1]: (int(m[2]), int(m[3]), int(m[4]))
        for m in re.finditer(r"^\s+(\w+)\s+(\d+) x (\d+) = (\d+)$", stdout, re.M)
    }
    total = re.search(r"^\s+total\s+(\d+) connections$", stdout, re.M)
    assert total, stdout
    rows["total"] = (0, 0, int(total[1]))
    return rows


def test_the_default_deploy_fits_twenty_connections(base_env, tmp_path):
    env = {k: v for k, v in _direct_env(base_env, tmp_path).items() if not k.startswith(("RELAY_DB_", "WEB_CONC"))}
    proc = _config_check(env)
    assert proc.returncode == 0, proc.stderr
    budget = _budget(proc.stdout)
    # The Procfile's default: two gunicorn workers, one Celery worker, beat; 5 + 0 each.
    assert budget["web"] == (2, 5, 10)
    assert budget["worker"] == (1, 5, 5)
    assert budget["beat"] == (1, 0, 0)
    assert budget["total"][2] == 15 <= 20


def test_config_check_multiplies_processes_by_their_pools(base_env, tmp_path):
    env = _direct_env(base_env, tmp_path, WEB_CONCURRENCY="3", RELAY_DB_POOL_SIZE="2", RELAY_DB_MAX_OVERFLOW="1")
    proc = _config_check(env, "--web-dynos", "2", "--worker-dynos", "2")
    assert proc.returncode == 0, proc.stderr
    budget = _budget(proc.stdout)
    assert budget["web"] == (6, 3, 18)
    assert budget["worker"] == (2, 3, 6)
    assert budget["total"][2] == 24
    slots = _server_slots(base_env["DATABASE_URL"])
    assert f"= {slots} for PostgreSQL" in proc.stdout
    assert "warning" not in proc.stdout


def test_config_check_warns_in_one_line_when_the_budget_exceeds_the_servers_slots(base_env, tmp_path):
    slots = _server_slots(base_env["DATABASE_URL"])
    dynos = slots // 10 + 1  # 2 workers x 5 connections a dyno: just past the server's slots
    proc = _config_check(_direct_env(base_env, tmp_path), "--web-dynos", str(dynos))
    assert proc.returncode == 0, proc.stderr
    total = _budget(proc.stdout)["total"][2]
    assert total == dynos * 10 + 5 > slots
    warnings = [line for line in proc.stdout.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, proc.stdout
    for setting in ("RELAY_DB_POOL_SIZE", "RELAY_DB_MAX_OVERFLOW", "WEB_CONCURRENCY", "DATABASE_CONNECTION_POOL_URL"):
        assert setting in warnings[0]
    assert f"({total})" in warnings[0] and f"the {slots} connections" in warnings[0]


def test_config_check_says_which_url_each_process_uses(base_env, tmp_path):
    direct = _config_check(_direct_env(base_env, tmp_path))
    assert "web, worker, beat          DATABASE_URL (direct); prepared statements on" in direct.stdout
    pooled_env = _direct_env(base_env, tmp_path, DATABASE_CONNECTION_POOL_URL="postgres://u:hunter2@127.0.0.1:6432/d")
    pooled = _config_check(pooled_env)
    assert pooled.returncode == 0, pooled.stderr
    assert "release (migrations)       DATABASE_URL (direct)" in pooled.stdout
    assert "DATABASE_CONNECTION_POOL_URL (pooler); prepared statements off" in pooled.stdout
    assert "hunter2" not in pooled.stdout
    assert "warning" not in pooled.stdout
    forced = _config_check({**pooled_env, "RELAY_DB_PREPARE": "1"})
    assert [line for line in forced.stdout.splitlines() if line.startswith("warning:")] == [
        "warning: RELAY_DB_PREPARE=1 behind DATABASE_CONNECTION_POOL_URL: a transaction-mode pooler"
        " fails prepared statements; set RELAY_DB_PREPARE=auto or 0"
    ]


@pytest.mark.parametrize(
    ("env", "prepare"),
    [
        ({}, True),
        ({"DATABASE_CONNECTION_POOL_URL": "postgresql://p@127.0.0.1:6432/d"}, False),
        ({"DATABASE_CONNECTION_POOL_URL": "postgresql://p@127.0.0.1:6432/d", "RELAY_DB_PREPARE": "1"}, True),
        ({"RELAY_DB_PREPARE": "0"}, False),
    ],
)
def test_prepare_is_off_behind_a_pooler_unless_asked(env, prepare):
    settings = load_settings({"DATABASE_URL": "postgresql://p@127.0.0.1/d", "REDIS_URL": "redis://x", **env})
    assert settings.db_prepare is prepare
    expected = env.get("DATABASE_CONNECTION_POOL_URL", "postgresql://p@127.0.0.1/d")
    assert settings.app_database_url == expected.replace("postgresql://", "postgresql+psycopg2://")


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("RELAY_DB_PREPARE", "yes"),
        ("DATABASE_CONNECTION_POOL_URL", "mysql://x/y"),
        ("DATABASE_CONNECTION_POOL_URL", "postgres://u@h:notaport/db"),
        ("DATABASE_URL", "postgresql://u:p@[::1/db"),
        ("RELAY_DB_POOL_TIMEOUT", "0"),
        # Past what a date or PostgreSQL's lock_timeout holds: refused here, not a traceback in beat.
        ("RELAY_RETAIN_DELIVERIES_DAYS", "100000000"),
        ("RELAY_RETENTION_LOCK_TIMEOUT_MS", "99999999999"),
    ],
)
def test_a_bad_pool_setting_is_refused_naming_it(name, raw):
    with pytest.raises(ConfigError, match=name):
        load_settings({"DATABASE_URL": "postgresql://p@127.0.0.1/d", "REDIS_URL": "redis://x", name: raw})


@pytest.fixture
def one_connection_app(base_env, celery_app, redis_url):
    """An app whose pool holds one connection, no overflow, and waits 0.3 s for it."""
    with extra_app(
        base_env,
        celery_app,
        redis_url,
        RELAY_DB_POOL_SIZE="1",
        RELAY_DB_MAX_OVERFLOW="0",
        RELAY_DB_POOL_TIMEOUT="0.3",
    ) as other:
        yield other


def test_a_request_that_cannot_get_a_connection_answers_503_with_retry_after(one_connection_app, alice, bob):
    client = one_connection_app.test_client()
    headers = bearer(alice[1])
    assert client.get(feed(alice[0]), headers=headers).status_code == 200  # the key is known, the pool works
    send = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "queued behind a full pool"}]}},
    }
    with one_connection_app.app_context():
        held = db.engine.connect()  # the pool's only connection, taken as a burst would
        held.execute(text("SELECT 1"))
        try:
            rest = client.get(feed(alice[0]), headers=headers)
            rpc = client.post("/a2a", json=send, headers=headers)
        finally:
            held.close()
    assert rest.status_code == 503
    assert rest.headers["Retry-After"] == "1"
    assert rest.get_json()["error"]["code"] == "service_unavailable"
    assert rpc.status_code == 503
    assert rpc.headers["Retry-After"] == "1"
    assert rpc.get_json()["error"]["data"]["symbol"] == "service_unavailable"
    # The connection back in the pool, the same calls succeed: nothing was left half done.
    assert client.get(feed(alice[0]), headers=headers).status_code == 200
    again = client.post("/a2a", json=send, headers=headers)
    assert again.status_code == 200 and "result" in again.get_json(), again.get_data(as_text=True)


@pytest.mark.parametrize("prepare", ["0", "1"])
def test_prepared_statements_follow_relay_db_prepare(base_env, celery_app, redis_url, alice, bob, prepare):
    direct = {k: v for k, v in base_env.items() if k != "DATABASE_CONNECTION_POOL_URL"}
    with extra_app(direct, celery_app, redis_url, RELAY_DB_PREPARE=prepare, RELAY_DB_POOL_SIZE="1") as other:
        client = other.test_client()
        send = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "hot path"}]}},
        }
        assert "result" in client.post("/a2a", json=send, headers=bearer(alice[1])).get_json()
        assert client.get(feed(bob[0]), headers=bearer(bob[1])).status_code == 200
        with other.app_context():
            # The pool's one connection: the one both requests ran on.
            names = db.session.execute(text("SELECT name FROM pg_prepared_statements")).scalars().all()
            db.session.rollback()
    relay_names = [n for n in names if n.startswith("relay_")]
    if prepare == "1":
        assert relay_names, "the hot statements were not prepared"
    else:
        assert relay_names == []


def test_feed_and_list_pages_are_planned_on_every_call(base_env, celery_app, redis_url, alice, bob):
    """The feed's page and tasks/list are PREPAREd but never run a cached generic plan: a plan
    made while the tables were small would stay on the connection as they grow
    (docs/performance.md, "Plans as the ledger grows"). Sends keep PostgreSQL's choice."""
    from relay.services import feed as feed_service
    from relay.services.threads.create import _CREATE
    from relay.services.threads.listing import _LIST_PAGES

    direct = {k: v for k, v in base_env.items() if k != "DATABASE_CONNECTION_POOL_URL"}
    with extra_app(direct, celery_app, redis_url, RELAY_DB_PREPARE="1", RELAY_DB_POOL_SIZE="1") as other:
        client = other.test_client()
        send = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "plans"}]}},
        }
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tasks/list", "params": {"page": {"limit": 50}}}
        # More than five runs each: past them PostgreSQL settles on a generic plan when it may.
        for _ in range(8):
            assert "result" in client.post("/a2a", json=send, headers=bearer(alice[1])).get_json()
            assert client.get(feed(bob[0]), headers=bearer(bob[1])).status_code == 200
            assert "result" in client.post("/a2a", json=listing, headers=bearer(bob[1])).get_json()
        with other.app_context():
            # The pool's one connection: the one every request ran on.
            rows = db.session.execute(text("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"))
            counts = {name: (generic, custom) for name, generic, custom in rows}
            db.session.rollback()
    for shapes in (feed_service._PAGES, _LIST_PAGES):
        names = {s.name for s in shapes._statements.values() if s.prepare}
        ran = {name: counts[name] for name in names if name in counts}
        assert ran, f"no page statement of {shapes.build.__name__} prepared: {sorted(counts)}"
        # Each parsed once, planned for each call's values and the tables of now.
        for name, (generic, custom) in ran.items():
            assert generic == 0 and custom >= 8, (shapes.build.__name__, name, generic, custom)
    assert _CREATE.name in counts, "the send's statement was not prepared"


@pytest.mark.parametrize("surface", ["feed", "send"])
def test_a_connection_cut_mid_request_answers_503_not_500(app, database_url, alice, bob, surface):
    """A backend killed while the request's statement runs (a restart, a failover, a pooler's
    server connection dropped) is an outage: 503 with Retry-After, as before it started."""
    import threading

    client = app.test_client()
    client.get(feed(bob[0]), headers=bearer(bob[1]))  # the key cached, the pool warm
    admin = connect(database_url)
    admin.autocommit = True
    blocker = connect(database_url)
    answer: dict = {}

    def call():
        if surface == "feed":
            answer["resp"] = client.get(feed(bob[0]), headers=bearer(bob[1]))
        else:
            answer["resp"] = post_a2a(client, alice[1], rpc_doc("message/send", message_params(bob[0], "cut")))

    try:
        with blocker.cursor() as cur:  # the request's statement waits on this lock ...
            cur.execute("LOCK TABLE messages IN ACCESS EXCLUSIVE MODE")
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        with admin.cursor() as cur:  # ... until its backend is killed under it
            deadline = 200
            killed = 0
            while not killed and deadline:
                cur.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> %s",
                    (blocker.get_backend_pid(),),
                )
                killed = cur.fetchone()[0]
                deadline -= 1
                threading.Event().wait(0.05)
            assert killed, "the request never waited on the lock"
        caller.join(30)
        assert not caller.is_alive(), "the request did not answer within 30 s"
    finally:
        blocker.rollback()
        blocker.close()
        admin.close()
    resp = answer["resp"]
    assert resp.status_code == 503, resp.get_data(as_text=True)
    assert resp.headers["Retry-After"] == "1"
    # The next call gets a fresh connection and succeeds.
    assert client.get(feed(bob[0]), headers=bearer(bob[1])).status_code == 200


def test_the_pooler_keeps_answering_after_thousands_of_logins(server_urls):
    """relay.ops.pooler: PgBouncer logs every login; its log must never block it (a full stderr
    pipe froze the pooled CI pass for good after a few hundred connections)."""
    import psycopg2

    from relay.ops.pooler import Pooler

    tcp_address(server_urls[0])  # PgBouncer reaches its server over TCP
    pooler = Pooler(server_urls[0])
    try:
        for _ in range(2000):
            psycopg2.connect(
                host="127.0.0.1", port=pooler.port, user=pooler.user, dbname="postgres", connect_timeout=5
            ).close()
        assert "login attempt" in pooler.log()
    finally:
        pooler.stop()


def test_a_database_that_accepts_but_never_answers_is_a_503_within_the_connect_timeout(
    base_env, celery_app, redis_url, alice
):
    """config.Settings: a new connection waits at most ceil(RELAY_DB_POOL_TIMEOUT) s (2 s at
    least) for the server's answer, so a frozen server or pooler is a 503, not a hung thread."""
    import socket
    import threading
    import time

    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    held: list[socket.socket] = []

    def hold() -> None:  # accept each connection and say nothing; let go after 20 s so a
        while True:  # relay without the timeout fails this test instead of hanging the suite
            try:
                conn, _ = silent.accept()
            except OSError:
                return
            held.append(conn)
            threading.Timer(20, conn.close).start()

    threading.Thread(target=hold, daemon=True).start()
    name = "DATABASE_CONNECTION_POOL_URL" if base_env.get("DATABASE_CONNECTION_POOL_URL") else "DATABASE_URL"
    try:
        with extra_app(
            base_env,
            celery_app,
            redis_url,
            RELAY_DB_POOL_TIMEOUT="1",
            **{name: f"postgresql://postgres@127.0.0.1:{port}/relay"},
        ) as other:
            started = time.monotonic()
            resp = other.test_client().get(feed(alice[0]), headers=bearer(alice[1]))
            waited = time.monotonic() - started
    finally:
        silent.close()
        for conn in held:
            conn.close()
    assert resp.status_code == 503, resp.get_data(as_text=True)
    assert resp.headers["Retry-After"] == "1"
    assert waited < 15, f"waited {waited:.1f} s"  # libpq's 2 s per attempt, not until the server lets go


def test_a_pooler_that_reaches_no_server_is_a_503_and_the_repoint_is_taken_up(
    base_env, celery_app, redis_url, database_url, alice
):
    """A pooler whose server is gone (a failover before the repoint) is an outage (503), not a
    500; once the pooler points at a live server the same app answers again, with no restart."""
    from sqlalchemy.engine import make_url

    from relay.ops.embedded import free_port
    from relay.ops.pooler import Pooler

    direct = make_url(database_url)
    host, port = tcp_address(database_url)  # PgBouncer reaches its server over TCP
    pooler = Pooler(database_url, query_wait_timeout=1)  # each ping waits 1 s for a server, then fails
    try:
        with extra_app(base_env, celery_app, redis_url, DATABASE_CONNECTION_POOL_URL=pooler.url(database_url)) as other:
            client = other.test_client()
            assert client.get(feed(alice[0]), headers=bearer(alice[1])).status_code == 200  # params cached
            pooler.repoint(free_port(), [direct.database])  # nothing listens there
            pooler.admin("RECONNECT")  # its server connections go, as a crashed primary's would
            gone = client.get(feed(alice[0]), headers=bearer(alice[1]))
            rpc = client.post(
                "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}}, headers=bearer(alice[1])
            )
            pooler.repoint(port, [direct.database], host=host)
            back = client.get(feed(alice[0]), headers=bearer(alice[1]))
    finally:
        pooler.stop()
    assert gone.status_code == 503, gone.get_data(as_text=True)
    assert gone.headers["Retry-After"] == "1"
    assert rpc.status_code == 503, rpc.get_data(as_text=True)
    assert rpc.get_json()["error"]["data"]["symbol"] == "service_unavailable"
    assert back.status_code == 200, back.get_data(as_text=True)


def test_a_checkout_whose_every_reconnection_fails_its_ping_is_an_outage(database_url):
    """errors.is_connection_error: when each reconnection on checkout fails the ping too (the
    bench's failover drill met it: PgBouncer took logins while its server was gone),
    SQLAlchemy gives up with InvalidRequestError "This connection is closed"; that is an
    outage to answer 503, and DATABASE_ERRORS catches it."""
    from sqlalchemy import create_engine, event
    from sqlalchemy import exc as sa_exc

    from relay.config import normalize_database_url
    from relay.errors import DATABASE_ERRORS, is_connection_error

    engine = create_engine(normalize_database_url(database_url), pool_size=1, max_overflow=0)

    @event.listens_for(engine, "checkout")
    def _no_server(dbapi_connection, record, proxy):
        raise sa_exc.DisconnectionError("the pooler reached no server")

    try:
        with pytest.raises(DATABASE_ERRORS) as info:
            engine.connect()
    finally:
        engine.dispose()
    assert type(info.value) is sa_exc.InvalidRequestError and str(info.value) == "This connection is closed"
    assert is_connection_error(info.value)
