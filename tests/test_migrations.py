"""Alembic migrations against real PostgreSQL: they match the models, 0003 goes down and up cleanly, and
0007 neither rewrites the messages nor blocks writes (the sweep reindexes their search vectors)."""

from __future__ import annotations

import uuid

import psycopg2
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

import relay.models  # noqa: F401  (the tables register on db.metadata)
from relay.config import normalize_database_url
from relay.extensions import db
from relay.ids import new_ulid
from relay.models import is_partition
from relay.ops.migrate import alembic_config, upgrade
from tests.conftest import fresh_database, migrated_database


def _connect(url: str):
    return psycopg2.connect(normalize_database_url(url).replace("postgresql+psycopg2://", "postgresql://"))


def test_head_matches_the_models(server_urls):
    with migrated_database(server_urls[0], "relay_mig") as url:
        engine = create_engine(normalize_database_url(url))
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    # The time partitions are retention's (0009), not the models'.
                    "include_name": lambda name, type_, _p: not (type_ == "table" and is_partition(name)),
                },
            )
            diff = compare_metadata(context, db.metadata)
        engine.dispose()
    assert diff == [], diff


def test_downgrading_0003_removes_push_configs_and_keeps_webhooks(server_urls):
    with migrated_database(server_urls[0], "relay_mig") as url:
        conn = _connect(url)
        conn.autocommit = True
        agent, thread = uuid.uuid4(), new_ulid()
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO agents (id, handle, org, name, role) VALUES (%s, 'a@x', 'x', 'A', '')", (str(agent),)
            )
            cur.execute(
                "INSERT INTO threads (id, context_id, sender_id, recipient_id, intent, summary, state, version,"
                " last_sequence_no) VALUES (%s, %s, %s, %s, 'inform', 's', 'pending', 1, 1)",
                (str(thread), str(new_ulid()), str(agent), str(agent)),
            )
            for kind, thread_id, config_id in (("webhook", None, None), ("a2a_push", str(thread), "c1")):
                cur.execute(
                    "INSERT INTO webhook_endpoints (id, agent_id, url, description, events, enabled,"
                    " secret_encrypted, kind, thread_id, push_config_id) VALUES"
                    " (%s, %s, 'http://127.0.0.1:9/', '', '[]', true, 'x', %s, %s, %s)",
                    (str(uuid.uuid4()), str(agent), kind, thread_id, config_id),
                )
            # A push config must name its task, and a webhook must not.
            try:
                cur.execute(
                    "INSERT INTO webhook_endpoints (id, agent_id, url, description, events, enabled,"
                    " secret_encrypted, kind) VALUES (%s, %s, 'http://x/', '', '[]', true, 'x', 'a2a_push')",
                    (str(uuid.uuid4()), str(agent)),
                )
                raise AssertionError("a push config without a task was stored")
            except psycopg2.errors.CheckViolation:
                pass
        command.downgrade(alembic_config(url), "0002")
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM webhook_endpoints")
            assert cur.fetchone()[0] == 1
        upgrade(url)
        with conn.cursor() as cur:
            cur.execute("SELECT kind FROM webhook_endpoints")
            assert cur.fetchall() == [("webhook",)]
        conn.close()


def _message_rows(cur):
    cur.execute("SELECT id::text, xmin::text, search_vector::text FROM messages ORDER BY id")
    return cur.fetchall()


def test_0007_adds_search_version_without_rewriting_messages_and_goes_down_and_up(server_urls):
    with fresh_database(server_urls[0], "relay_mig") as url:
        upgrade(url, "0006")
        conn = _connect(url)
        conn.autocommit = True
        agent, thread = uuid.uuid4(), new_ulid()
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO agents (id, handle, org, name, role) VALUES (%s, 'a@x', 'x', 'A', '')", (str(agent),)
            )
            cur.execute(
                "INSERT INTO threads (id, context_id, sender_id, recipient_id, intent, summary, state, version,"
                " last_sequence_no) VALUES (%s, %s, %s, %s, 'inform', 's', 'pending', 1, 2)",
                (str(thread), str(new_ulid()), str(agent), str(agent)),
            )
            for seq, vector in ((1, "to_tsvector('english', 'GET /users')"), (2, "NULL")):
                cur.execute(
                    "INSERT INTO messages (id, thread_id, sequence_no, author_id, caller_id, target_id, role, body,"
                    " parts, artifacts, metadata, search_vector) VALUES (%s, %s, %s, %s, %s, %s, 'caller',"
                    f" 'GET /users', '[]', '[]', '{{}}', {vector})",
                    (str(uuid.uuid4()), str(thread), seq, str(agent), str(agent), str(agent)),
                )
            before = _message_rows(cur)
        upgrade(url)
        with conn.cursor() as cur:
            assert _message_rows(cur) == before  # the same row versions (xmin): nothing was rewritten
            cur.execute("SELECT count(*) FROM messages WHERE search_version IS NOT NULL")
            assert cur.fetchone()[0] == 0
            cur.execute(
                "SELECT i.indisvalid, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = 'ix_messages_stale_vector'"
            )
            valid, predicate = cur.fetchone()
            assert valid is True
            assert "search_version" in predicate and "< 2" in predicate, predicate
            cur.execute(
                "SELECT count(*) FROM messages WHERE search_vector IS NOT NULL AND index_error IS NULL"
                " AND coalesce(search_version, 1) < 2"
            )
            assert cur.fetchone()[0] == 1  # the indexed row is due for the sweep; the unindexed one is not
        command.downgrade(alembic_config(url), "0006")
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM information_schema.columns WHERE column_name = 'search_version'")
            assert cur.fetchone()[0] == 0
            cur.execute("SELECT count(*) FROM pg_class WHERE relname = 'ix_messages_stale_vector'")
            assert cur.fetchone()[0] == 0
            assert [r[2] for r in _message_rows(cur)] == [r[2] for r in before]
        upgrade(url)
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_class WHERE relname = 'ix_messages_stale_vector'")
            assert cur.fetchone()[0] == 1
        conn.close()


def _log_rows(cur):
    rows = {}
    for table in ("events", "webhook_deliveries", "webhook_attempts", "idempotency_records"):
        cur.execute(f"SELECT id::text, xmin::text FROM {table} ORDER BY id")
        rows[table] = cur.fetchall()
    return rows


def _relkinds(cur) -> dict[str, str]:
    cur.execute(
        "SELECT relname, relkind::text FROM pg_class WHERE relname IN"
        " ('events', 'webhook_deliveries', 'webhook_attempts', 'idempotency_records')"
    )
    return dict(cur.fetchall())


def test_0009_partitions_the_logs_without_rewriting_them_and_goes_down_and_up(server_urls):
    with fresh_database(server_urls[0], "relay_mig") as url:
        upgrade(url, "0008")
        conn = _connect(url)
        conn.autocommit = True
        agent, endpoint, event, delivery = (str(uuid.uuid4()) for _ in range(4))
        with conn.cursor() as cur:
            cur.execute("INSERT INTO agents (id, handle, org, name, role) VALUES (%s, 'a@x', 'x', 'A', '')", (agent,))
            cur.execute(
                "INSERT INTO webhook_endpoints (id, agent_id, url, description, events, enabled, secret_encrypted)"
                " VALUES (%s, %s, 'http://127.0.0.1:9/', '', '[]', true, 'x')",
                (endpoint, agent),
            )
            cur.execute(
                "INSERT INTO events (id, type, agent_id, payload, created_at, fanned_out_at)"
                " VALUES (%s, 't', %s, '{}', now() - interval '40 days', now())",
                (event, agent),
            )
            cur.execute(
                "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, attempt_count, created_at)"
                " VALUES (%s, %s, %s, 'succeeded', 1, now() - interval '40 days')",
                (delivery, event, endpoint),
            )
            cur.execute(
                "INSERT INTO webhook_attempts (delivery_id, attempted_at, duration_ms) VALUES (%s, now(), 4)",
                (delivery,),
            )
            cur.execute(
                "INSERT INTO idempotency_records (agent_id, key, request_hash, response, expires_at)"
                " VALUES (%s, 'k', 'h', '{}', now())",
                (agent,),
            )
            before = _log_rows(cur)
        upgrade(url)
        with conn.cursor() as cur:
            assert _relkinds(cur) == dict.fromkeys(before, "p")
            assert _log_rows(cur) == before  # the same row versions: attached, not copied
            for table in before:
                cur.execute(f"SELECT count(*) FROM {table}_legacy")
                assert cur.fetchone()[0] == 1, table
                cur.execute(
                    "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass",
                    (table,),
                )
                assert cur.fetchone()[0] >= 4  # legacy, then daily through three days ahead
            # The sequences belong to the parents, so dropping the legacy partition keeps them
            # (tomorrow's partition: the legacy one held today).
            cur.execute("DROP TABLE webhook_attempts_legacy")
            cur.execute(
                "INSERT INTO webhook_attempts (delivery_id, attempted_at, duration_ms)"
                " VALUES (%s, now() + interval '1 day', 4) RETURNING id",
                (delivery,),
            )
            assert cur.fetchone()[0] == 2
        command.downgrade(alembic_config(url), "0008")
        with conn.cursor() as cur:
            assert _relkinds(cur) == dict.fromkeys(before, "r")
            after = _log_rows(cur)
            assert {t: [r[0] for r in rows] for t, rows in after.items()} == {
                t: [r[0] for r in rows] for t, rows in before.items() if t != "webhook_attempts"
            } | {"webhook_attempts": ["2"]}
            cur.execute(
                "SELECT conname FROM pg_constraint WHERE conname IN"
                " ('uq_idempotency_agent_key', 'fk_webhook_deliveries_event_id_events',"
                " 'fk_webhook_attempts_delivery_id_webhook_deliveries') ORDER BY 1"
            )
            assert len(cur.fetchall()) == 3
        upgrade(url)
        with conn.cursor() as cur:
            assert _relkinds(cur) == dict.fromkeys(before, "p")
        conn.close()
