"""The in-process key cache (relay/services/agents.py, migration 0006): a key that
authenticated lately costs no key query, and revocation stays immediate on every path.

Each rule is checked through real requests against real PostgreSQL: the revocations are
made on another connection (plain SQL, as another process or host would), never by
calling the cache.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import event

from relay.extensions import db
from tests.conftest import bearer, connect, message_params, post_a2a, rpc_doc, sql

TASKS_LIST = rpc_doc("tasks/list", {})


def _statements(app, fn):
    """Run ``fn()``; return the SQL statements the app's engine executed meanwhile."""
    seen: list[str] = []

    def record(conn, cursor, statement, *args):
        seen.append(statement)

    with app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return seen


def _generation(database_url):
    conn = connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT value FROM relay_generations WHERE name = 'api_keys'")
            return cur.fetchone()[0]
    finally:
        conn.close()


def _on_other_connection(database_url, statement, commit=True):
    conn = connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()


def test_a_cached_key_costs_no_key_query(app, client, alice):
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    statements = _statements(app, lambda: post_a2a(client, key, TASKS_LIST))
    assert statements, "the request ran no statement at all"
    assert not [s for s in statements if "api_keys" in s], statements


def test_a_key_revoked_by_plain_sql_elsewhere_is_refused_at_once(client, alice, database_url):
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now()")
    assert post_a2a(client, key, TASKS_LIST).status_code == 401


def test_an_agent_disabled_by_plain_sql_elsewhere_is_refused_at_once(client, alice, database_url):
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    _on_other_connection(database_url, "UPDATE agents SET disabled_at = now()")
    assert post_a2a(client, key, TASKS_LIST).status_code == 401


def test_a_deleted_key_is_refused_at_once(client, alice, database_url):
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    _on_other_connection(database_url, "DELETE FROM api_keys")
    assert post_a2a(client, key, TASKS_LIST).status_code == 401


def test_a_rolled_back_revocation_changes_nothing(app, client, alice, database_url):
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    before = _generation(database_url)
    _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now()", commit=False)
    assert _generation(database_url) == before
    statements = _statements(app, lambda: post_a2a(client, key, TASKS_LIST))
    assert not [s for s in statements if "api_keys" in s], "a rollback emptied the cache"


def test_last_used_writes_keep_the_generation(alice, database_url, app):
    _handle, _key = alice
    before = _generation(database_url)
    sql(app, "UPDATE api_keys SET last_used_at = now() - interval '1 hour'")
    assert _generation(database_url) == before


def test_revocation_is_immediate_under_concurrent_requests(app, alice, database_url):
    """Real threads keep calling with a cached key while another connection revokes it:
    no request that starts after the revocation committed is answered 200."""
    _handle, key = alice
    assert post_a2a(app.test_client(), key, TASKS_LIST).status_code == 200
    revoked_at: list[float] = []
    results: list[tuple[float, int]] = []
    lock = threading.Lock()
    halt = threading.Event()

    def caller():
        client = app.test_client()
        while not halt.is_set():
            started = time.monotonic()
            status = post_a2a(client, key, TASKS_LIST).status_code
            with lock:
                results.append((started, status))

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now()")
        revoked_at.append(time.monotonic())
        time.sleep(0.3)
    finally:
        halt.set()
        for t in threads:
            t.join(timeout=30)
    before = [s for started, s in results if started < revoked_at[0]]
    after = [s for started, s in results if started > revoked_at[0]]
    # One that started just before may already see the revocation: only "after" is a rule.
    assert 200 in before, before[:10]
    assert after and set(after) == {401}, after[:10]


# --- the guard in the first statement (migration 0018) ------------------------------


def _sent(app, fn):
    """Run ``fn()``; return every query text the process's cursors sent meanwhile (below SQLAlchemy).

    What psycopg2 sent after merging parameters, so the key guard prefixed to a
    statement shows, and so do statements no SQLAlchemy event sees (raw cursors).
    """
    from relay.extensions import GuardedCursor

    sent: list[str] = []
    execute = GuardedCursor.execute

    def record(self, query, vars=None):
        try:
            return execute(self, query, vars)
        finally:
            sent.append(self.query.decode() if self.query else str(query))

    GuardedCursor.execute = record
    try:
        fn()
    finally:
        GuardedCursor.execute = execute
    return sent


def _handoff_to(recipient: str) -> dict:
    """message/send's request document: a text to ``recipient``."""
    return rpc_doc("message/send", message_params(recipient, "please review"))


def test_a_cached_request_sends_one_query_that_carries_the_guard(app, client, alice):
    """No checkout ping and no generation read apart: the page and its guard travel together."""
    _handle, key = alice
    for _ in range(6):  # every pooled connection has PREPAREd the page (the pool hands them out in turn)
        assert post_a2a(client, key, TASKS_LIST).status_code == 200
    sent = _sent(app, lambda: post_a2a(client, key, TASKS_LIST))
    assert len(sent) == 1, sent
    assert sent[0].startswith("SELECT relay_check_key_generation("), sent[0][:120]


def test_a_cached_create_is_one_query_with_its_guard(app, client, alice, bob):
    _handle, key = alice
    for _ in range(6):
        assert post_a2a(client, key, _handoff_to(bob[0])).status_code == 200
    sent = _sent(app, lambda: post_a2a(client, key, _handoff_to(bob[0])))
    assert len(sent) == 1, sent
    assert sent[0].startswith("SELECT relay_check_key_generation("), sent[0][:120]


def test_another_keys_revocation_reruns_the_request_once_and_loses_nothing(app, client, alice, bob, database_url):
    """The generation moved for bob's key: alice's cached create is refused by its guard,
    her key is looked up again, and the create runs once: one thread, answered 200."""
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    before = sql(app, "SELECT count(*) FROM threads")[0][0]
    _on_other_connection(database_url, f"UPDATE api_keys SET revoked_at = now() WHERE agent_id = "
                         f"(SELECT id FROM agents WHERE handle = '{bob[0]}')")  # fmt: skip
    resp = post_a2a(client, key, _handoff_to(bob[0]))
    assert resp.status_code == 200 and "result" in resp.get_json(), resp.get_json()
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == before + 1
    assert post_a2a(client, key, TASKS_LIST).status_code == 200


def test_the_run_again_reads_the_key_even_when_it_was_cached_anew(app, client, alice, bob, database_url, monkeypatch):
    """Another request may cache the key between the guard's failure and the run again (the
    hostile review's 500 under load): forget_key doing nothing stands in for it. The run
    again reads the key itself, so no second guard can fail where nothing answers it."""
    from relay.services import agents as agent_service

    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    before = sql(app, "SELECT count(*) FROM threads")[0][0]
    monkeypatch.setattr(agent_service, "forget_key", lambda raw_key: None)
    _on_other_connection(database_url, f"UPDATE agents SET name = 'Bob B' WHERE handle = '{bob[0]}'")
    resp = post_a2a(client, key, _handoff_to(bob[0]))
    assert resp.status_code == 200 and "result" in resp.get_json(), resp.get_json()
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == before + 1


def test_a_revoked_cached_key_creates_nothing(app, client, alice, bob, database_url):
    _handle, key = alice
    assert post_a2a(client, key, _handoff_to(bob[0])).status_code == 200
    before = sql(app, "SELECT count(*) FROM threads")[0][0]
    _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now() WHERE agent_id = "
                         f"(SELECT id FROM agents WHERE handle = '{alice[0]}')")  # fmt: skip
    resp = post_a2a(client, key, _handoff_to(bob[0]))
    assert resp.get_json()["error"]["code"] == -32001, resp.get_json()
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == before


def test_a_revoked_cached_key_is_refused_where_no_statement_runs(client, alice, database_url):
    """An unknown method and a malformed task_id are answered before any query: the guard is checked apart."""
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    unknown = {"jsonrpc": "2.0", "id": 1, "method": "tasks/nope", "params": {}}
    assert client.post("/a2a", json=unknown, headers=bearer(key)).get_json()["error"]["code"] == -32601
    bad = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"task_id": "not-a-uuid"}}
    assert client.post("/a2a", json=bad, headers=bearer(key)).get_json()["error"]["code"] == -32602
    _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now()")
    assert client.post("/a2a", json=unknown, headers=bearer(key)).get_json()["error"]["code"] == -32001
    assert client.post("/a2a", json=bad, headers=bearer(key)).get_json()["error"]["code"] == -32001


def test_a_connection_the_server_closed_is_replaced_at_checkout(app, client, alice, database_url):
    """With no ping, the checkout polls the socket: a terminated backend is noticed before use, not a 503."""
    _handle, key = alice
    assert post_a2a(client, key, TASKS_LIST).status_code == 200
    admin = connect(database_url)
    try:
        with admin.cursor() as cur:
            from tests.conftest import _admin_conns

            spared = [c.get_backend_pid() for c in _admin_conns.values() if not c.closed]  # the fixtures' own
            cur.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND NOT pid = ANY(%s)",
                (spared,),
            )
            assert cur.fetchone()[0] >= 1
        admin.commit()
    finally:
        admin.close()
    time.sleep(0.2)  # the FATAL message and the close reach the pooled connection's socket
    for _ in range(3):
        assert post_a2a(client, key, TASKS_LIST).status_code == 200


def test_the_key_guard_wraps_every_view_but_mcps_own(app):
    """Registration order (relay/transport/__init__.py steps): the guard wraps each view registered
    before it, and /mcp, registered after it, runs no statement of its own."""
    unguarded = sorted(name for name, view in app.view_functions.items() if not hasattr(view, "__wrapped__"))
    assert unguarded == ["mcp.not_served", "mcp.post"], unguarded
