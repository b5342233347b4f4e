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
from tests.conftest import bearer, connect, sql


def _tasks_list(client, key):
    return client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}},
        headers=bearer(key),
    )


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
    assert _tasks_list(client, key).status_code == 200
    statements = _statements(app, lambda: _tasks_list(client, key))
    assert statements, "the request ran no statement at all"
    assert not [s for s in statements if "api_keys" in s], statements


def test_a_key_revoked_by_plain_sql_elsewhere_is_refused_at_once(client, alice, database_url):
    _handle, key = alice
    assert _tasks_list(client, key).status_code == 200
    _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now()")
    assert _tasks_list(client, key).status_code == 401


def test_an_agent_disabled_by_plain_sql_elsewhere_is_refused_at_once(client, alice, database_url):
    _handle, key = alice
    assert _tasks_list(client, key).status_code == 200
    _on_other_connection(database_url, "UPDATE agents SET disabled_at = now()")
    assert _tasks_list(client, key).status_code == 401


def test_a_deleted_key_is_refused_at_once(client, alice, database_url):
    _handle, key = alice
    assert _tasks_list(client, key).status_code == 200
    _on_other_connection(database_url, "DELETE FROM api_keys")
    assert _tasks_list(client, key).status_code == 401


def test_a_rolled_back_revocation_changes_nothing(app, client, alice, database_url):
    _handle, key = alice
    assert _tasks_list(client, key).status_code == 200
    before = _generation(database_url)
    _on_other_connection(database_url, "UPDATE api_keys SET revoked_at = now()", commit=False)
    assert _generation(database_url) == before
    statements = _statements(app, lambda: _tasks_list(client, key))
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
    assert _tasks_list(app.test_client(), key).status_code == 200
    revoked_at: list[float] = []
    results: list[tuple[float, int]] = []
    lock = threading.Lock()
    halt = threading.Event()

    def caller():
        client = app.test_client()
        while not halt.is_set():
            started = time.monotonic()
            status = _tasks_list(client, key).status_code
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
