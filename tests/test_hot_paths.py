"""Rules the hot paths must keep while they take shortcuts (docs/performance.md, "Request paths").

- a create is one statement: its thread, message, audit and outbox rows share one time;
- a create waits for the feed lock an append to one of its participants holds (one lock per identity);
- response JSON goes through orjson, but an integer past 64 bits comes back exactly;
- committed messages are published in batches, each message exactly once;
- a wake-up does not wait for its message's batch;
- ULIDs are formatted as python-ulid formats them;
- times are formatted in UTC with six digits of microseconds and ``Z``, whatever their zone;
- json and jsonb columns read back as the standard library reads them;
- a feed page writes an agent's JSON documents out as they are, every number exact.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
import uuid

import pytest
import redis
from sqlalchemy import text
from ulid import ULID

from relay.encoding import loads
from relay.ids import format_ulid, iso, ulid_of_uuid_text
from tests.conftest import bearer, message_params, rpc, rpc_answer, send_message, sql, wait_until


def test_a_create_writes_its_four_rows_with_one_time(app, client, alice, bob):
    _a, a_key = alice
    b_handle, _b_key = bob
    task_id = send_message(client, a_key, b_handle)["task_id"]
    rows = sql(
        app,
        "SELECT t.created_at, t.updated_at, m.created_at, a.created_at, e.created_at, a.action, e.type, m.sequence_no"
        " FROM threads t JOIN messages m ON m.thread_id = t.id JOIN audit_events a ON a.message_id = m.id"
        " JOIN events e ON e.message_id = m.id",
    )
    assert len(rows) == 1, rows
    *times, action, kind, seq = rows[0]
    assert len(set(times)) == 1, times
    assert (action, kind, seq) == ("create", "message.created", 1)
    [(state, last_seq)] = sql(app, "SELECT state, last_sequence_no FROM threads")
    assert (state, last_seq) == ("pending", 1)
    assert task_id


def test_a_failed_create_writes_nothing(app, client, alice, bob):
    """The one-statement create is atomic: a row it cannot write leaves no other behind."""
    _a, a_key = alice
    b_handle, _b_key = bob
    # The outbox row, written last in the statement, is refused: no other row may stay.
    sql(app, "ALTER TABLE events ADD CONSTRAINT test_refuse CHECK (type <> 'message.created') NOT VALID")
    try:
        resp = client.post(
            "/a2a",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "message/send",
                "params": {"recipient": b_handle, "message": {"parts": [{"type": "text", "text": "hi"}]}},
            },
            headers=bearer(a_key),
        )
        assert resp.status_code in (200, 500), resp.status_code
        assert "error" in resp.get_json()
    finally:
        sql(app, "ALTER TABLE events DROP CONSTRAINT test_refuse")
    for table in ("threads", "messages", "audit_events", "events"):
        assert sql(app, f"SELECT count(*) FROM {table}") == [(0,)], table


def test_integers_past_64_bits_come_back_exactly(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    big = 123456789012345678901234567890
    task_id = send_message(client, a_key, b_handle, metadata={"n": big, "small": 1})["task_id"]
    [message] = rpc(client, b_key, "tasks/get", {"task_id": task_id})["messages"]
    assert message["payload"] == {"n": big, "small": 1}
    feed = client.get(f"/api/v1/identities/{b_handle}/a2a/messages", headers=bearer(b_key))
    assert feed.status_code == 200
    assert json.loads(feed.get_data())["items"][0]["metadata"]["n"] == big


@pytest.fixture
def private_queue(app, redis_url):
    """Point the app's enqueues at a queue of this test's own, so no Celery worker an earlier
    test started (and that may still be draining the session's queue) takes what it reads."""
    conf = app.extensions["celery"].conf
    session_queue = conf.task_default_queue
    conf.task_default_queue = f"{session_queue}-{secrets.token_hex(3)}"
    try:
        yield conf.task_default_queue
    finally:
        redis.Redis.from_url(redis_url).delete(conf.task_default_queue)
        conf.task_default_queue = session_queue


def _queued(app, redis_url) -> list[tuple[str, list]]:
    """The (task name, args) of every message waiting in the session's Celery queue."""
    queue = app.extensions["celery"].conf.task_default_queue
    conn = redis.Redis.from_url(redis_url)
    try:
        raw = conn.lrange(queue, 0, -1)
    finally:
        conn.close()
    out = []
    for item in raw:
        envelope = json.loads(item)
        args, _kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        out.append((envelope["headers"]["task"], args))
    return out


def test_committed_messages_are_published_in_batches_each_once(app, alice, bob, redis_url, private_queue):
    """Real threads send at once; the queue then holds fewer publishes than messages, and
    every committed message (with its event) in exactly one of them."""
    a_handle, a_key = alice
    b_handle, b_key = bob
    sent: list[str] = []
    lock = threading.Lock()

    def sender(key, recipient):
        client = app.test_client()
        for _ in range(10):
            result = send_message(client, key, recipient)
            with lock:
                sent.append(result["message_id"])

    threads = [threading.Thread(target=sender, args=args) for args in [(a_key, b_handle), (b_key, a_handle)] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(sent) == 60
    committed = {m for (m,) in sql(app, "SELECT id::text FROM messages")}
    assert committed == set(sent)

    def all_published():
        # Only this test's messages: an earlier test's app may still publish its last batch
        # into the session's queue (its window is dispatch.BATCH_SECONDS).
        tasks = [
            (name, args)
            for name, args in _queued(app, redis_url)
            if name == "workers.tasks.messages_committed" and any(pair[0] in committed for pair in args[0])
        ]
        ids = [pair[0] for _, args in tasks for pair in args[0]]
        return tasks if sorted(ids) == sorted(committed) else None

    tasks = wait_until(all_published, timeout=10, what="every committed message published, each once")
    assert len(tasks) < len(sent), f"{len(tasks)} publishes for {len(sent)} messages: not batched"
    events = {e for (e,) in sql(app, "SELECT id::text FROM events")}
    assert {pair[1] for _, args in tasks for pair in args[0]} == events


def _batch_of(app, redis_url, message_id):
    """The queued messages_committed batches holding ``message_id`` (an earlier test's may land too)."""
    return [args for _, args in _queued(app, redis_url) if any(p[0] == message_id for p in args[0])]


def test_a_wake_up_does_not_wait_for_its_batch(app, alice, bob, redis_url, monkeypatch, private_queue):
    """The wake-up PUBLISH goes out at once; a message sent right after a publish waits for
    the next one (dispatch.BATCH_SECONDS after it)."""
    from relay.services import dispatch, wakeup

    monkeypatch.setattr(dispatch, "BATCH_SECONDS", 3.0)
    _a_handle, a_key = alice
    b_handle, _b_key = bob
    listener = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    listener.subscribe(wakeup.channel(app.config["RELAY"].database_url))
    client = app.test_client()
    try:
        listener.get_message(timeout=1.0)  # the subscription confirmation
        first = send_message(client, a_key, b_handle)["message_id"]
        wait_until(lambda: _batch_of(app, redis_url, first), timeout=10, what="the first message's batch")
        wait_until(lambda: listener.get_message(timeout=0.1), timeout=2, what="the first wake-up")
        sent = time.monotonic()
        message_id = send_message(client, a_key, b_handle)["message_id"]
        woken = wait_until(lambda: listener.get_message(timeout=0.1), timeout=2, what="the wake-up PUBLISH")
        assert woken["type"] == "message"
        assert _batch_of(app, redis_url, message_id) == [], "the batch was published before its window"
        assert time.monotonic() - sent < dispatch.BATCH_SECONDS
        wait_until(lambda: _batch_of(app, redis_url, message_id), timeout=10, what="the batch after its window")
    finally:
        listener.close()


def test_a_message_after_a_quiet_spell_is_published_at_once(app, alice, bob, redis_url, monkeypatch, private_queue):
    """No publish for BATCH_SECONDS: the next committed message does not wait for a window."""
    from relay.services import dispatch

    monkeypatch.setattr(dispatch, "BATCH_SECONDS", 3.0)
    _a_handle, a_key = alice
    b_handle, _b_key = bob
    publisher = app.extensions.get("relay_publisher")
    if publisher is not None:  # this app published before: let its window pass
        time.sleep(max(0.0, publisher._published_at + dispatch.BATCH_SECONDS - time.monotonic()))
    sent = time.monotonic()
    message_id = send_message(app.test_client(), a_key, b_handle)["message_id"]
    wait_until(lambda: _batch_of(app, redis_url, message_id), timeout=10, what="the message's batch")
    assert time.monotonic() - sent < dispatch.BATCH_SECONDS / 2, "the first message waited for a window"


def test_ulids_are_formatted_as_python_ulid_formats_them():
    values = [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.UUID(int=1), uuid.UUID(int=2**125)]
    values += [uuid.uuid4() for _ in range(2000)] + [ULID().to_uuid() for _ in range(100)]
    for value in values:
        assert format_ulid(value) == str(ULID.from_uuid(value)), value
        assert ulid_of_uuid_text(str(value)) == str(ULID.from_uuid(value)), value


def test_times_are_utc_with_microseconds_and_z():
    from datetime import UTC, datetime, timedelta, timezone

    assert iso(datetime(2026, 12, 1, 20, 11, 7, 0, tzinfo=UTC)) == "2026-12-01T20:11:07.000000Z"
    assert iso(datetime(2026, 12, 1, 20, 11, 7, 5, tzinfo=UTC)) == "2026-12-01T20:11:07.000005Z"
    east = timezone(timedelta(hours=5, minutes=30))
    assert iso(datetime(2026, 12, 2, 1, 41, 7, 833036, tzinfo=east)) == "2026-12-01T20:11:07.833036Z"
    assert iso(None) is None


def test_times_formatted_in_sql_match_iso(app):
    """Pages format their times in the query (services.iso_text): the same text as iso()."""
    from datetime import UTC, datetime

    from sqlalchemy import bindparam, select
    from sqlalchemy.dialects.postgresql import TIMESTAMP

    from relay.extensions import db
    from relay.services import iso_text

    times = [
        datetime(2026, 12, 1, 20, 11, 7, 0, tzinfo=UTC),
        datetime(2026, 12, 1, 20, 11, 7, 5, tzinfo=UTC),
        datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, 0, 120000, tzinfo=UTC),
    ]
    with app.app_context():
        db.session.execute(text("SET TIME ZONE 'Asia/Kolkata'"))  # the session's zone must not leak in
        for when in times:
            got = db.session.scalar(select(iso_text(bindparam("t", when, type_=TIMESTAMP(timezone=True)))))
            assert got == iso(when), when
        assert db.session.scalar(select(iso_text(bindparam("t", None, type_=TIMESTAMP(timezone=True))))) is None
        db.session.rollback()


def test_json_columns_read_back_as_the_standard_library_reads_them(app):
    """The orjson reader falls back to json where orjson would change a value or refuse it."""
    docs = [
        '{"n": 123456789012345678901234567890, "m": -98765432109876543210}',
        '{"id": "12345678901234567890123", "f": 1.5, "e": 1e-7, "u": "caf\u00e9 \ud83d\ude00"}',
        '{"lone": "\ud800"}',
        "[1e400]",
        '{"a": [true, false, null, 0, -1, 18446744073709551615]}',
    ]
    for doc in docs:
        assert loads(doc) == json.loads(doc), doc
    rows = sql(app, "SELECT CAST(:d AS jsonb), CAST(:d AS json)", d=docs[0])
    assert rows[0][0] == rows[0][1] == json.loads(docs[0])


def test_a_feed_page_writes_json_documents_as_they_are(client, alice, bob):
    """Parts, artifacts and metadata pass through the feed as PostgreSQL's text: nothing
    re-encoded, the idempotency key still left out, and the webhook rows still parsed."""
    from relay.services.feed import message_feed_rows

    a_handle, a_key = alice
    b_handle, _b_key = bob
    meta = {"n": 2**70 + 1, "x": 1.25, "s": 'caf\u00e9 "q" \n', "client_idempotency_key": "k-1", "nest": {"a": [1, {}]}}
    artifacts = [{"type": "link", "url": "https://example.com/a?b=1", "title": "t"}]
    send_message(client, a_key, b_handle, metadata=meta, artifacts=artifacts)
    resp = client.get(f"/api/v1/identities/{a_handle}/a2a/messages", headers=bearer(a_key))
    item = json.loads(resp.get_data())["items"][0]
    assert item["metadata"] == {k: v for k, v in meta.items() if k != "client_idempotency_key"}
    assert item["artifacts"] == artifacts
    assert item["parts"] == [{"type": "text", "text": "hi"}]
    with client.application.app_context():
        [row] = message_feed_rows([uuid.UUID(item["id"])]).values()
    assert row["metadata"]["n"] == 2**70 + 1 and row["parts"] == item["parts"]


def test_json_fragments_survive_the_standard_library_fallback():
    """A response orjson refuses (an integer past 64 bits outside a fragment) is written by
    json, which writes each raw_json fragment's value instead of failing on it."""
    from relay.encoding import dumps_bytes, raw_json

    doc = {"big": 2**70, "row": {"parts": raw_json('[{"text": "caf\u00e9", "n": 123456789012345678901234567890}]')}}
    assert json.loads(dumps_bytes(doc)) == {
        "big": 2**70,
        "row": {"parts": [{"text": "café", "n": 123456789012345678901234567890}]},
    }
    assert json.loads(dumps_bytes({"x": raw_json('{"a": 1}')})) == {"x": {"a": 1}}  # orjson's own path


def test_a_create_waits_for_the_feed_locks_an_append_holds(app, alice, bob):
    """A create (its statement) and an append (threads.common._serialize_feed_writes) lock one
    feed lock per identity: while a message write to alice is uncommitted, a create from alice
    waits for it, or the feed's commit-order rule (docs/api.md, "Catching up after downtime")
    would not hold between the two."""
    from relay.extensions import db
    from relay.services.threads import common

    a_handle, a_key = alice
    b_handle, _ = bob
    [(alice_id,)] = sql(app, "SELECT id FROM agents WHERE handle = :h", h=a_handle)
    answers: list = []

    def create():
        answers.append(rpc_answer(app.test_client(), a_key, "message/send", message_params(b_handle, "hi")))

    waiting = text(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
    )
    with app.app_context():
        common._serialize_feed_writes(db.session, alice_id)  # an append's locks, held until the rollback
        creator = threading.Thread(target=create)
        creator.start()
        try:
            with db.engine.connect() as watcher:
                # The create either waits on an advisory lock, as it must, or ends without waiting.
                wait_until(
                    lambda: answers or watcher.execute(waiting).scalar(), timeout=20, what="the create to wait or end"
                )
                watcher.rollback()
            assert not answers, f"the create did not wait for alice's feed lock: {answers}"
        finally:
            db.session.rollback()
            creator.join(timeout=30)
    assert "result" in answers[0], answers
