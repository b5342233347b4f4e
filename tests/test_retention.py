"""Time partitions and retention (relay/services/retention.py, migration 0009) on real PostgreSQL.

The tests that drop partitions run on a database of their own (migrated fresh), since a
drop changes the schema under every other test; the clock is moved, not the rows: a
pass run "as of" a later time sees today's partitions as old.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from relay.extensions import db
from relay.services import retention
from tests.conftest import extra_app, migrated_database, rpc

DAY = timedelta(days=1)


def _midnight(at: datetime) -> datetime:
    return datetime(at.year, at.month, at.day, tzinfo=UTC)


@pytest.fixture
def private(server_urls, base_env, celery_app, redis_url):
    """An app on a freshly migrated database of its own (direct connection, no pooler)."""
    with (
        migrated_database(server_urls[0], "relay_ret") as url,
        extra_app(base_env, celery_app, redis_url, DATABASE_URL=url, DATABASE_CONNECTION_POOL_URL="") as other,
    ):
        yield other
        with other.app_context():
            db.session.remove()
            db.engine.dispose()


def q(app, statement: str, **params):
    with app.app_context():
        result = db.session.execute(text(statement), params)
        rows = result.all() if result.returns_rows else None
        db.session.commit()
        return rows


def _names(app, table: str) -> list[str]:
    with app.app_context():
        found = [p.name for p in retention.partitions(db.session.connection(), table)]
        db.session.commit()
        return found


class Log:
    """Rows written straight into the log tables, at chosen times."""

    def __init__(self, app, events: str = "[]"):
        self.app = app
        self.agent = uuid.uuid4()
        self.endpoint = uuid.uuid4()
        q(app, "INSERT INTO agents (id, handle, org, name, role) VALUES (:a, 'ret@x', 'x', 'R', '')", a=self.agent)
        q(
            app,
            "INSERT INTO webhook_endpoints (id, agent_id, url, description, events, enabled, secret_encrypted)"
            " VALUES (:e, :a, 'http://127.0.0.1:9/', '', CAST(:events AS jsonb), true, 'x')",
            e=self.endpoint,
            a=self.agent,
            events=events,
        )

    def delivery(self, at: datetime, status: str, thread=None) -> uuid.UUID:
        """An event at ``at`` (fanned out) and its delivery (same created_at) in ``status``, with one attempt."""
        event, delivery = uuid.uuid4(), uuid.uuid4()
        q(
            self.app,
            "INSERT INTO events (id, type, agent_id, thread_id, payload, created_at, fanned_out_at)"
            " VALUES (:id, 'message.created', :a, :t, '{}', :at, :at)",
            id=event,
            a=self.agent,
            t=thread,
            at=at,
        )
        q(
            self.app,
            "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, attempt_count, next_attempt_at,"
            " created_at) VALUES (:id, :ev, :ep, :s, 1, CASE WHEN :s = 'pending' THEN now() END, :at)",
            id=delivery,
            ev=event,
            ep=self.endpoint,
            s=status,
            at=at,
        )
        q(
            self.app,
            "INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, duration_ms) VALUES (:d, :at, 500, 3)",
            d=delivery,
            at=at,
        )
        return delivery


def _db_now(app) -> datetime:
    return q(app, "SELECT now()")[0][0].astimezone(UTC)


def _pass(app, now):
    with app.app_context():
        return retention.run_pass(now)


def test_a_partition_holding_an_undelivered_delivery_is_never_dropped(private):
    app = private
    tomorrow = _midnight(_db_now(app)) + DAY  # the legacy partition's upper bound (0009)
    assert _names(app, "webhook_deliveries")[:2] == [
        "webhook_deliveries_legacy",
        f"webhook_deliveries_p{tomorrow:%Y%m%d}",
    ]
    log = Log(app)
    # Either side of the boundary: the last microsecond of the legacy partition, delivered;
    # the first of tomorrow's, still pending (to be retried); beside it a delivered one.
    before = log.delivery(tomorrow - timedelta(microseconds=1), "succeeded")
    pending = log.delivery(tomorrow, "pending")
    beside = log.delivery(tomorrow + timedelta(hours=5), "failed")
    later = log.delivery(tomorrow + 2 * DAY + timedelta(hours=1), "succeeded")

    # As of 30 days after tomorrow's partition ends: both it and the legacy one are past retention.
    report = _pass(app, tomorrow + DAY + timedelta(days=30, minutes=1))
    day1 = f"{tomorrow:%Y%m%d}"
    assert "webhook_deliveries_legacy" in report.dropped
    assert "events_legacy" in report.dropped and "webhook_attempts_legacy" in report.dropped
    skipped = {s["name"]: s["reason"] for s in report.skipped}
    assert skipped[f"webhook_deliveries_p{day1}"] == "a delivery not yet delivered or given up"
    assert skipped[f"webhook_attempts_p{day1}"] == "an attempt of a delivery not yet delivered or given up"
    assert skipped[f"events_p{day1}"] == "deliveries of these days (kept longer than their events)"
    ids = {r[0] for r in q(app, "SELECT id FROM webhook_deliveries")}
    assert before not in ids
    assert {pending, beside, later} <= ids  # the pending one, and its whole partition, kept
    [(events,)] = q(app, "SELECT count(*) FROM events")
    assert events == 3  # each kept delivery's event is still there to send

    # Delivered at last: the next pass drops the partition, its events and attempts.
    q(app, "UPDATE webhook_deliveries SET status = 'succeeded', next_attempt_at = NULL WHERE id = :d", d=pending)
    report = _pass(app, tomorrow + DAY + timedelta(days=30, minutes=2))
    assert {f"webhook_deliveries_p{day1}", f"events_p{day1}", f"webhook_attempts_p{day1}"} <= set(report.dropped)
    assert report.skipped == []
    assert {r[0] for r in q(app, "SELECT id FROM webhook_deliveries")} == {later}


def test_an_event_not_yet_fanned_out_keeps_its_partitions(private):
    app = private
    tomorrow = _midnight(_db_now(app)) + DAY
    log = Log(app)
    log.delivery(tomorrow + timedelta(hours=1), "succeeded")
    q(
        app,
        "INSERT INTO events (id, type, agent_id, payload, created_at) VALUES (:id, 'message.created', :a, '{}', :at)",
        id=uuid.uuid4(),
        a=log.agent,
        at=tomorrow + timedelta(hours=2),
    )
    report = _pass(app, tomorrow + DAY + timedelta(days=31))
    skipped = {s["name"]: s["reason"] for s in report.skipped}
    day1 = f"{tomorrow:%Y%m%d}"
    assert skipped[f"webhook_deliveries_p{day1}"] == "an event of these days not yet fanned out"
    assert skipped[f"events_p{day1}"] == "an event not yet fanned out"


def test_partitions_are_created_ahead_and_rows_land_in_them(private):
    app = private
    today = _midnight(_db_now(app))
    names = _names(app, "events")
    assert names[0] == "events_legacy"
    assert names[-1] == f"events_p{today + 3 * DAY:%Y%m%d}"
    # Three days ahead is writable; the day after is not, until a pass makes it.
    log = Log(app)
    log.delivery(today + 3 * DAY + timedelta(hours=23), "succeeded")
    with pytest.raises(Exception, match="no partition of relation"):
        log.delivery(today + 4 * DAY + timedelta(hours=1), "succeeded")

    with app.app_context():
        assert retention.ensure_ahead().created == []  # nothing missing today
        # As of a day later, one more of each table; as of ten days later (beat was down),
        # the days from then on, not the gap before.
        created = retention.ensure_ahead(today + DAY + timedelta(hours=1)).created
        assert sorted(created) == sorted(f"{t}_p{today + 4 * DAY:%Y%m%d}" for t in retention.PARTITIONED)
        created = retention.ensure_ahead(today + 10 * DAY).created
    assert f"events_p{today + 10 * DAY:%Y%m%d}" in created
    assert f"events_p{today + 13 * DAY:%Y%m%d}" in created
    assert f"events_p{today + 9 * DAY:%Y%m%d}" not in created
    log.delivery(today + 4 * DAY + timedelta(hours=1), "succeeded")
    log.delivery(today + 13 * DAY + timedelta(hours=1), "succeeded")


def test_a_missing_day_below_the_newest_partition_is_made_again(private):
    app = private
    tomorrow = _midnight(_db_now(app)) + DAY
    gone = f"events_p{tomorrow:%Y%m%d}"
    q(app, f"DROP TABLE {gone}")  # a day lost under the newest partition (hand DDL, a clock jump)
    with app.app_context():
        assert retention.ensure_ahead().created == [gone]
    Log(app).delivery(tomorrow + timedelta(hours=2), "succeeded")  # writable again


def test_expired_idempotency_records_go_with_their_partition(private):
    app = private
    now = _db_now(app)
    tomorrow = _midnight(now) + DAY
    agent = uuid.uuid4()
    q(app, "INSERT INTO agents (id, handle, org, name, role) VALUES (:a, 'i@x', 'x', 'I', '')", a=agent)
    for key, at in (("old", now), ("new", tomorrow + timedelta(hours=1))):
        q(
            app,
            "INSERT INTO idempotency_records (agent_id, key, request_hash, response, created_at, expires_at)"
            " VALUES (:a, :k, 'h', '{}', :at, :at + interval '24 hours')",
            a=agent,
            k=key,
            at=at,
        )
    # The TTL (24 h in the tests' settings) after the legacy partition ends, it goes; tomorrow's stays.
    report = _pass(app, tomorrow + DAY + timedelta(seconds=1))
    assert "idempotency_records_legacy" in report.dropped
    assert f"idempotency_records_p{tomorrow:%Y%m%d}" not in report.dropped
    assert [r[0] for r in q(app, "SELECT key FROM idempotency_records")] == ["new"]


def test_a_busy_partition_is_skipped_not_waited_for(private):
    app = private
    tomorrow = _midnight(_db_now(app)) + DAY
    Log(app).delivery(tomorrow - timedelta(hours=1), "succeeded")
    held, release = threading.Event(), threading.Event()

    def reader():
        with app.app_context():
            db.session.execute(text("SELECT count(*) FROM webhook_deliveries"))  # holds ACCESS SHARE
            held.set()
            release.wait(10)
            db.session.rollback()

    t = threading.Thread(target=reader)
    t.start()
    try:
        assert held.wait(5)
        started = datetime.now(UTC)
        with app.app_context():
            report = retention.drop_expired(tomorrow + timedelta(days=31))
        assert (datetime.now(UTC) - started).total_seconds() < 5
    finally:
        release.set()
        t.join()
    skipped = {s["name"]: s["reason"] for s in report.skipped}
    assert skipped["webhook_deliveries_legacy"].startswith("lock timeout")
    assert "webhook_deliveries_legacy" not in report.dropped
    with app.app_context():  # free now: the next pass drops it
        assert "webhook_deliveries_legacy" in retention.drop_expired(tomorrow + timedelta(days=31)).dropped


def test_closed_threads_are_kept_unless_retention_is_opted_in(server_urls, base_env, celery_app, redis_url):
    with migrated_database(server_urls[0], "relay_ret") as url:
        env = {"DATABASE_URL": url, "DATABASE_CONNECTION_POOL_URL": ""}
        with extra_app(base_env, celery_app, redis_url, **env) as app:
            log = Log(app)
            now = _db_now(app)
            threads = {}
            for name, state, closed_days_ago in (
                ("done_old", "completed", 10),
                ("cancelled_old", "cancelled", 10),
                ("done_recent", "completed", 2),
                ("open_old", "accepted", None),
                ("done_old_pending", "completed", 10),
            ):
                tid = threads[name] = uuid.uuid4()
                closed = None if closed_days_ago is None else now - timedelta(days=closed_days_ago)
                q(
                    app,
                    "INSERT INTO threads (id, context_id, sender_id, recipient_id, intent, summary, state, version,"
                    " last_sequence_no, created_at, updated_at, completed_at, cancelled_at) VALUES (:id, :ctx, :a,"
                    " :a, 'inform', 's', :st, 1, 1, :old, :old, CASE WHEN :st = 'completed' THEN CAST(:c AS"
                    " timestamptz) END, CASE WHEN :st = 'cancelled' THEN CAST(:c AS timestamptz) END)",
                    id=tid,
                    ctx=uuid.uuid4(),
                    a=log.agent,
                    st=state,
                    old=now - timedelta(days=20),
                    c=closed,
                )
                q(
                    app,
                    "INSERT INTO messages (id, thread_id, sequence_no, author_id, caller_id, target_id, role, body,"
                    " parts, artifacts, metadata) VALUES (:id, :t, 1, :a, :a, :a, 'caller', 'b', '[]', '[]', '{}')",
                    id=uuid.uuid4(),
                    t=tid,
                    a=log.agent,
                )
                q(
                    app,
                    "INSERT INTO audit_events (thread_id, actor_id, action) VALUES (:t, :a, 'create')",
                    t=tid,
                    a=log.agent,
                )
                log.delivery(now, "pending" if name == "done_old_pending" else "succeeded", thread=tid)
            report = _pass(app, None)
            assert report.threads_deleted == 0  # off by default: the ledger is kept
            assert q(app, "SELECT count(*) FROM threads")[0][0] == 5
        with extra_app(base_env, celery_app, redis_url, RELAY_RETAIN_CLOSED_THREADS_DAYS="7", **env) as app:
            with app.app_context():
                assert retention.delete_closed_threads() == 2
            left = {r[0] for r in q(app, "SELECT id FROM threads")}
            assert left == {threads["done_recent"], threads["open_old"], threads["done_old_pending"]}
            for table in ("messages", "audit_events", "events"):
                assert {r[0] for r in q(app, f"SELECT thread_id FROM {table}")} == left, table
            # Their deliveries and attempts went with them (no foreign key cascades into them).
            [(deliveries,)] = q(app, "SELECT count(*) FROM webhook_deliveries")
            [(attempts,)] = q(
                app,
                "SELECT count(*) FROM webhook_attempts a WHERE NOT EXISTS"
                " (SELECT 1 FROM webhook_deliveries d WHERE d.id = a.delivery_id)",
            )
            assert deliveries == 3 and attempts == 0
            with app.app_context():
                db.session.remove()
                db.engine.dispose()


def test_status_json_shape_and_the_metric(app, client, base_env, tmp_path):
    env = {**base_env, "RELAY_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "retention", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert list(status) == ["tables"]
    names = [t["name"] for t in status["tables"]]
    assert names == ["events", "webhook_deliveries", "webhook_attempts", "idempotency_records", "operator_audit"]
    days = {"idempotency_records": 1, "operator_audit": 365}
    for table in status["tables"]:
        assert set(table) == {"name", "retain_days", "partitions"}
        assert table["retain_days"] == days.get(table["name"], 30)
        assert len(table["partitions"]) >= 4  # legacy (through today), then up to three days ahead
        first, *rest = table["partitions"]
        for p in table["partitions"]:
            assert set(p) == {"name", "from", "to", "rows_estimate", "bytes"}
            assert isinstance(p["rows_estimate"], int) and isinstance(p["bytes"], int) and p["bytes"] > 0
        assert first["name"] == f"{table['name']}_legacy" and first["from"] is None
        for prev, p in zip(table["partitions"], rest, strict=False):
            assert p["from"] == prev["to"]  # contiguous
            assert p["name"] == f"{table['name']}_p{p['from'][:10].replace('-', '')}"
    # The same partitions, oldest first, from the metric.
    metrics = client.get("/metrics").get_data(as_text=True)
    lines = [line for line in metrics.splitlines() if line.startswith("relay_partition_oldest_age_seconds{")]
    assert sorted(line.split('"')[1] for line in lines) == sorted(names)
    assert all(float(line.rsplit(" ", 1)[1]) >= 0 for line in lines)

    proc = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "retention", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    # Made ahead at migration and nothing old yet (past a UTC midnight, one more day is made).
    lines = proc.stdout.strip().splitlines()
    assert lines == ["nothing to do"] or (lines and all(line.startswith("created ") for line in lines)), lines


def test_one_key_still_answers_once_under_concurrent_calls_and_after_expiry(app, client, make_agent):
    """The advisory lock that stands in for the dropped unique constraint (0009)."""
    from concurrent.futures import ThreadPoolExecutor

    _a, a_key = make_agent("idem@acme")
    b_handle, _ = make_agent("idem-b@acme")
    params = {
        "recipient": b_handle,
        "message": {"parts": [{"type": "text", "text": "once"}]},
        "metadata": {"client_idempotency_key": "same"},
    }
    barrier = threading.Barrier(8)

    def call(_i):
        with app.test_client() as c:
            barrier.wait(5)
            return rpc(c, a_key, "message/send", params)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(call, range(8)))
    assert len({a["task_id"] for a in answers}) == 1
    [(threads,)] = q(app, "SELECT count(*) FROM threads")
    [(records,)] = q(app, "SELECT count(*) FROM idempotency_records WHERE key = 'same'")
    assert threads == 1 and records == 1
    # Expired, the key answers a new call, and still one record a key.
    q(app, "UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE key = 'same'")
    with ThreadPoolExecutor(max_workers=8) as pool:
        again = list(pool.map(call, range(8)))
    assert len({a["task_id"] for a in again}) == 1 and again[0]["task_id"] != answers[0]["task_id"]
    [(records,)] = q(app, "SELECT count(*) FROM idempotency_records WHERE key = 'same'")
    assert records == 1


def test_beat_schedules_retention_hourly_and_a_worker_start_queues_one_pass():
    from workers import beat_schedule, queue_retention_pass

    entries = {e["task"]: e["schedule"] for e in beat_schedule().values()}
    assert entries["workers.tasks.retention"] == 3600.0
    assert "workers.tasks.purge_idempotency_records" not in entries  # no bulk DELETE any more
    sent = []

    class _App:
        def send_task(self, name):  # only enqueues: no database work in the signal
            sent.append(name)

    class _Consumer:
        app = _App()

    queue_retention_pass(sender=_Consumer())
    assert sent == ["workers.tasks.retention"]


# --------------------------------------------------------------------------- pending floors


def _floor(app, name: str = "webhook_deliveries") -> datetime:
    return q(app, "SELECT floor FROM relay_floors WHERE name = :n", n=name)[0][0]


def _raise(app) -> None:
    from relay.services import delivery

    with app.app_context():
        delivery.raise_floors()
        db.session.remove()


def test_a_pass_raises_each_floor_to_its_oldest_pending_row_at_most_raise_cap_back(private):
    app = private
    now = _db_now(app)
    assert _floor(app) < now - timedelta(days=3650)  # as migrated: prunes nothing
    log = Log(app)
    old = log.delivery(now - timedelta(days=3), "pending")
    log.delivery(now - timedelta(days=5), "succeeded")  # delivered: not a floor
    q(
        app,
        "INSERT INTO events (id, type, agent_id, payload, created_at) VALUES (:id, 'message.created', :a, '{}', :at)",
        id=uuid.uuid4(),
        a=log.agent,
        at=now - timedelta(days=2),
    )
    report = _pass(app, now).as_dict()
    assert _floor(app) == now - timedelta(days=3)
    assert _floor(app, "events") == now - timedelta(days=2)
    assert report["floors"]["webhook_deliveries"] == (now - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    q(app, "UPDATE webhook_deliveries SET status = 'succeeded', next_attempt_at = NULL WHERE id = :d", d=old)
    q(app, "UPDATE events SET fanned_out_at = now()")
    _raise(app)
    # Nothing pending: RAISE_CAP back, so a writer still in flight is above it.
    from relay.services.delivery.bounds import RAISE_CAP

    for name in ("webhook_deliveries", "events"):
        assert now - RAISE_CAP - timedelta(minutes=5) < _floor(app, name) <= _db_now(app) - RAISE_CAP


def _claimed(app, endpoint) -> set:
    from relay.services import delivery

    with app.app_context():
        found = {c.delivery_id for c in delivery.claim([endpoint], 10)}
        db.session.remove()
        return found


def test_a_redriven_delivery_older_than_the_floor_is_claimed(private):
    from relay.services import webhooks
    from relay.services.agents import get_agent

    app = private
    log = Log(app)
    failed = log.delivery(_db_now(app) - timedelta(days=3), "failed")
    _raise(app)
    assert _floor(app) > _db_now(app) - timedelta(days=1)  # above it: it was not pending
    with app.app_context():
        webhooks.redrive(get_agent("ret@x"), log.endpoint, failed)
        db.session.remove()
    assert _floor(app) <= _db_now(app) - timedelta(days=3)
    assert _claimed(app, log.endpoint) == {failed}


def test_a_recovered_old_event_is_claimed(private):
    from relay.services import webhooks
    from relay.services.agents import get_agent

    app = private
    log = Log(app, events='["message.created"]')
    at = _db_now(app) - timedelta(days=3)
    event = uuid.uuid4()
    q(
        app,
        "INSERT INTO events (id, type, agent_id, payload, created_at, fanned_out_at)"
        " VALUES (:id, 'message.created', :a, '{}', :at, :at)",
        id=event,
        a=log.agent,
        at=at,
    )
    _raise(app)
    with app.app_context():
        assert webhooks.recover(get_agent("ret@x"), log.endpoint, at - timedelta(hours=1))["created"] == 1
        db.session.remove()
    assert len(_claimed(app, log.endpoint)) == 1


def test_an_old_event_fanned_out_late_is_claimed_in_the_same_pump_cycle(private):
    from relay.services import delivery

    app = private
    log = Log(app, events='["message.created"]')
    at = _db_now(app) - timedelta(days=2)
    q(
        app,
        "INSERT INTO events (id, type, agent_id, payload, created_at) VALUES (:id, 'message.created', :a, '{}', :at)",
        id=uuid.uuid4(),
        a=log.agent,
        at=at,
    )
    _raise(app)  # the events' floor is the event's time; the deliveries' RAISE_CAP back
    assert _floor(app) > at
    with app.app_context():
        prepared, _again = delivery.cycle([], [], set(), True, 10)
        db.session.remove()
    assert [p.claimed.endpoint_id for p in prepared] == [log.endpoint]
    assert _floor(app) <= at


def test_a_raise_waits_for_a_writer_lowering_the_floor_and_then_sees_its_row(private):
    from relay.services import webhooks

    app = private
    log = Log(app)
    old = _db_now(app) - timedelta(days=3)
    failed = log.delivery(old, "failed")
    _raise(app)
    writer_lowered, commit = threading.Event(), threading.Event()
    errors = []

    def writer():
        try:
            with app.app_context():
                from relay.services import unit_of_work

                with unit_of_work() as session:
                    webhooks._requeue(session, [failed])
                    writer_lowered.set()
                    assert commit.wait(20), "the test never let the writer commit"
                db.session.remove()
        except Exception as exc:  # noqa: BLE001 (reported by the test below)
            errors.append(exc)

    w = threading.Thread(target=writer)
    w.start()
    assert writer_lowered.wait(20), "the writer did not requeue"
    r = threading.Thread(target=_raise, args=(app,))
    r.start()
    # The raise is blocked on the floor's row lock while the writer is open.
    deadline = time.monotonic() + 20
    while not q(
        app,
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND query LIKE '%relay_floors%'",
    ):
        assert time.monotonic() < deadline, "the raise never waited for the writer's lock"
        time.sleep(0.05)
    commit.set()
    w.join(20)
    r.join(20)
    assert not errors and not w.is_alive() and not r.is_alive()
    assert _floor(app) <= old, "the raise moved the floor above a delivery made pending while it ran"
    assert _claimed(app, log.endpoint) == {failed}


def test_the_pump_plans_only_the_partitions_between_the_floor_and_the_ceiling(private):
    from relay.services import delivery
    from relay.services.delivery.claims import _PICK_ANY

    app = private
    today = _midnight(_db_now(app))
    # A deploy 10 days into daily partitions: the (empty) legacy one replaced by days.
    q(app, "DROP TABLE webhook_deliveries_legacy")
    for n in range(10, -1, -1):
        day = today - n * DAY
        q(
            app,
            f"CREATE TABLE webhook_deliveries_p{day:%Y%m%d} PARTITION OF webhook_deliveries"
            f" FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + DAY).isoformat()}')",
        )
    names = _names(app, "webhook_deliveries")
    _raise(app)
    with app.app_context():
        bounds = delivery.floors(db.session).of_deliveries()
        params = {"eids": [str(uuid.uuid4())], "limits": [5], **bounds}
        plan = "\n".join(r[0] for r in db.session.execute(text("EXPLAIN " + _PICK_ANY.text), params).all())
        db.session.remove()
    planned = set(re.findall(r"\bwebhook_deliveries_p\d{8}\b(?!_)", plan))
    # Only the days that meet [floor, ceiling): today, and yesterday or tomorrow near midnight;
    # not the ten days before, nor the days made ahead.
    expected = set()
    for name in names:
        day = datetime.strptime(name.rsplit("_p", 1)[1], "%Y%m%d").replace(tzinfo=UTC)
        if day < bounds["ceiling"] and day + DAY > bounds["floor"]:
            expected.add(name)
    assert len(names) >= 13 and 1 <= len(expected) <= 2 and planned == expected, (sorted(planned), sorted(expected))


def test_a_delivery_log_page_reads_the_newest_day_first_and_then_the_rest_in_order(private):
    from relay.services import webhooks
    from relay.services.agents import get_agent

    app = private
    log = Log(app)
    now = _db_now(app)
    ats = [now - timedelta(hours=h) for h in (1, 30, 50, 80)]  # one inside the first window, three before it
    ids = [log.delivery(at, "succeeded") for at in ats]

    def page(limit, cursor=None):
        with app.app_context():
            got = webhooks.list_deliveries(get_agent("ret@x"), str(log.endpoint), limit, cursor)
            db.session.remove()
            return [uuid.UUID(i["id"]) for i in got["items"]], got["next_cursor"]

    assert page(10) == (ids, None)
    first, cursor = page(2)
    assert first == ids[:2] and cursor is not None
    # The second page starts a day before its cursor: again the window, then the rest.
    assert page(2, (ats[1], ids[1]))[0] == ids[2:]
    assert page(1, (ats[0], ids[0]))[0] == [ids[1]]
    # A cursor a day from the calendar's start: no window before it to read, an empty page (not a 500).
    assert page(2, (datetime(1, 1, 1, 12, tzinfo=UTC), ids[0])) == ([], None)


def test_the_operator_audit_log_goes_by_its_own_retention(private):
    app = private
    now = _db_now(app)
    tomorrow = _midnight(now) + DAY
    for target, at in (("old", now), ("new", tomorrow + timedelta(hours=1))):
        q(
            app,
            "INSERT INTO operator_audit (operator_email, org, action, target, outcome, created_at)"
            " VALUES ('ops@x', 'x', 'sign_in', :t, 'ok', :at)",
            t=target,
            at=at,
        )
    # Past the deliveries' 30 days it stays (RELAY_RETAIN_AUDIT_DAYS: 365 by default) ...
    assert "operator_audit_legacy" not in _pass(app, tomorrow + 31 * DAY).dropped
    # ... and 365 days after the legacy partition ends, it goes; tomorrow's stays.
    report = _pass(app, tomorrow + 365 * DAY + timedelta(seconds=1))
    assert "operator_audit_legacy" in report.dropped
    assert f"operator_audit_p{tomorrow:%Y%m%d}" not in report.dropped
    assert [r[0] for r in q(app, "SELECT target FROM operator_audit")] == ["new"]


def test_circuit_openings_older_than_a_week_are_deleted(private):
    app = private
    now = _db_now(app)
    Log(app)  # an agent and its endpoint
    for days in (8, 6):
        q(
            app,
            "INSERT INTO circuit_openings (endpoint_id, opened_at, until, reason)"
            " SELECT id, :at, :at, :why FROM webhook_endpoints",
            at=now - timedelta(days=days),
            why=f"{days} days ago",
        )
    _pass(app, now)
    assert [r[0] for r in q(app, "SELECT reason FROM circuit_openings")] == ["6 days ago"]
