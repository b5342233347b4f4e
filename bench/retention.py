"""``python -m bench retention``: a retention pass (partition drop) against the equivalent DELETE.

Two databases on the same server, filled with the same rows:

- **partitioned**: migrated to head (0009), its first partition replaced by daily ones
  from ``--days`` + 3 days ago, as a deploy that has run 0009 that long has them;
- **plain**: migrated to 0008, the same tables unpartitioned, plus the columns and
  tables the later migrations add besides partitions (``_plain_schema_since_0009``).

Each gets ``--per-day`` events a day over that span (one delivery each, to one of 20
endpoints, delivered, with one attempt; created by ``generate_series`` in SQL, not the
API), a few hundred threads made through the services, and 200 deliveries due now; the
partitioned one then has its pending floors raised, as each worker's first retention pass
does (relay/services/delivery/bounds.py). Then:

1. the hot queries, timed in process through the relay's own service calls: the webhook
   claim (``delivery.claims._claim``, rolled back each time), the delivery log's first page
   (``webhooks.list_deliveries``), a create (``threads.send_message``, committed: its
   event row goes into the partitioned outbox), the feed's first page and tasks/list;
2. retention: on the partitioned database one ``retention.drop_expired()`` pass at the
   default 30 days (DROP TABLE of the expired days' partitions); on the plain one the
   DELETE of the same rows (attempts, deliveries, events older than the same cutoff),
   then VACUUM of the three tables, each timed;
3. the hot queries again, on both.

Times are wall-clock on this machine (2 cores, PostgreSQL beside the bench process).
"""

from __future__ import annotations

import secrets
import statistics
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from bench import harness
from bench.run import git_commit

ENDPOINTS = 20
THREADS = 300
PENDING = 200
TABLES = ("events", "webhook_deliveries", "webhook_attempts")


@contextmanager
def _database(revision: str):
    base, _ = harness.server_urls()
    admin, u = harness._admin(base)
    name = f"relay_bench_ret_{secrets.token_hex(4)}"
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    url = u.set(database=name).render_as_string(hide_password=False)
    try:
        from relay.ops.migrate import upgrade

        upgrade(url, revision)
        yield url
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _plain_schema_since_0009(url: str) -> None:
    """Give the plain (0008) database what the later migrations add besides partitions.

    0010's ``claimed_by`` column (and its index), 0011's floors, at ``-infinity`` (on
    plain tables there is nothing to prune, so the floor only filters), 0016's and 0019's columns.
    """
    conn, _ = harness._admin(url)
    with conn.cursor() as cur:
        cur.execute("ALTER TABLE webhook_deliveries ADD COLUMN claimed_by uuid")
        cur.execute(
            "CREATE INDEX ix_webhook_deliveries_claimed_by ON webhook_deliveries (claimed_by)"
            " WHERE leased_until IS NOT NULL"
        )
        cur.execute("CREATE TABLE relay_floors (name text PRIMARY KEY, floor timestamptz NOT NULL)")
        cur.execute("INSERT INTO relay_floors VALUES ('webhook_deliveries', '-infinity'), ('events', '-infinity')")
        # 0016's lifecycle columns (the services read and write them); its indexes do not matter here.
        cur.execute(
            "ALTER TABLE threads ADD COLUMN priority varchar(8) NOT NULL DEFAULT 'normal',"
            " ADD COLUMN expires_at timestamptz, ADD COLUMN lease_expires_at timestamptz,"
            " ADD COLUMN declined_at timestamptz, ADD COLUMN failed_at timestamptz, ADD COLUMN expired_at timestamptz,"
            " ADD COLUMN lease_token varchar(64), ADD COLUMN lease_seconds integer, ADD COLUMN reason text"
        )
        cur.execute("ALTER TABLE messages ADD COLUMN read_at timestamptz")
        cur.execute("ALTER TABLE audit_events ADD COLUMN reason text")
        # 0019's input-required columns.
        cur.execute("ALTER TABLE threads ADD COLUMN question text, ADD COLUMN input_requested_at timestamptz")
        cur.execute("ALTER TABLE audit_events ADD COLUMN question text")
    conn.close()


def _daily_partitions(url: str, first_day: datetime) -> None:
    """Replace each table's (empty) legacy partition with daily ones from ``first_day`` on."""
    from relay.models import PARTITIONED

    conn, _ = harness._admin(url)
    with conn.cursor() as cur:
        for table in PARTITIONED:
            cur.execute(f"DROP TABLE {table}_legacy")
            cur.execute(
                "SELECT min(substring(c.relname from '_p([0-9]{8})$')) FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
                (table,),
            )
            first_kept = datetime.strptime(cur.fetchone()[0], "%Y%m%d").replace(tzinfo=UTC)
            day = first_day
            while day < first_kept:
                nxt = day + timedelta(days=1)
                cur.execute(
                    f"CREATE TABLE {table}_p{day:%Y%m%d} PARTITION OF {table}"
                    f" FOR VALUES FROM ('{day:%Y-%m-%d} 00:00:00+00') TO ('{nxt:%Y-%m-%d} 00:00:00+00')"
                )
                day = nxt
    conn.close()


def _seed_log(url: str, agent: uuid.UUID, endpoints: list[uuid.UUID], start: datetime, days: int, per_day: int):
    conn, _ = harness._admin(url)
    total = days * per_day
    started = time.monotonic()
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO events (id, type, agent_id, payload, created_at, fanned_out_at)"
            " SELECT gen_random_uuid(), 'message.created', %s,"
            " jsonb_build_object('task_id', md5(g::text), 'text', repeat('x', 120)), ts, ts"
            " FROM (SELECT g, %s::timestamptz + (g * (86400.0 * %s / %s)) * interval '1 second' AS ts"
            "       FROM generate_series(0, %s - 1) g) s",
            (str(agent), start, days, total, total),
        )
        cur.execute(
            "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, attempt_count, created_at, completed_at)"
            " SELECT gen_random_uuid(), e.id, (CAST(%s AS uuid[]))[1 + (abs(hashtext(e.id::text)) %% %s)],"
            " 'succeeded', 1, e.created_at, e.created_at + interval '1 second' FROM events e",
            ([str(e) for e in endpoints], len(endpoints)),
        )
        cur.execute(
            "INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, duration_ms)"
            " SELECT id, created_at + interval '1 second', 200, 40 FROM webhook_deliveries"
        )
        # Due now: what the claim query finds.
        cur.execute(
            "WITH ev AS (INSERT INTO events (id, type, agent_id, payload, created_at, fanned_out_at)"
            " SELECT gen_random_uuid(), 'message.created', %s, '{}', now(), now() FROM generate_series(1, %s)"
            " RETURNING id, created_at)"
            " INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, attempt_count, next_attempt_at,"
            " created_at) SELECT gen_random_uuid(), ev.id, (CAST(%s AS uuid[]))[1 + (abs(hashtext(ev.id::text)) %% %s)],"
            " 'pending', 0, now() - interval '1 minute', ev.created_at FROM ev",
            (str(agent), PENDING, [str(e) for e in endpoints], len(endpoints)),
        )
        cur.execute("VACUUM ANALYZE")
    conn.close()
    return round(time.monotonic() - started, 2)


def _raise_floors(app) -> None:
    from relay.extensions import db
    from relay.services import delivery

    with app.app_context():
        delivery.raise_floors()
        db.session.remove()


def _sizes(url: str) -> dict:
    conn, _ = harness._admin(url)
    out = {}
    with conn.cursor() as cur:
        for table in TABLES:
            cur.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " WHERE c.oid = %s::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass)",
                (table, table),
            )
            size = cur.fetchone()[0]
            cur.execute(f"SELECT count(*) FROM {table}")
            out[table] = {"rows": cur.fetchone()[0], "bytes": int(size)}
    conn.close()
    return out


def _timed(fn, n: int) -> dict:
    fn()  # warm: plans, caches
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {
        "n": n,
        "p50_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[int(0.95 * (n - 1))], 3),
    }


def _app(url: str, queue: str):
    from relay.context import create_base_app

    app = create_base_app(harness.base_env(url, {"RELAY_LOG_LEVEL": "ERROR"}))
    # The creates' after-commit tasks go to a queue of the bench's own, removed at the end.
    app.extensions["celery"].conf.task_default_queue = queue
    return app


def _setup_relay(app):
    """Two agents, endpoints of the receiving one, and THREADS threads made through the services."""
    from relay.extensions import db
    from relay.models import Agent, WebhookEndpoint
    from relay.services import threads

    with app.app_context():
        sender = Agent(handle="sender@bench", org="bench", name="S", role="")
        receiver = Agent(handle="receiver@bench", org="bench", name="R", role="")
        db.session.add_all([sender, receiver])
        db.session.commit()
        endpoints = []
        for i in range(ENDPOINTS):
            ep = WebhookEndpoint(
                agent_id=receiver.id,
                url=f"http://127.0.0.1:9/{i}",
                events=["message.created"],
                secret_encrypted="x",
                enabled=False,  # nothing fans out to them during the bench's own creates
            )
            db.session.add(ep)
            endpoints.append(ep)
        db.session.commit()
        ids = [e.id for e in endpoints]
        for i in range(THREADS):
            threads.send_message(
                sender, {"recipient": receiver.handle, "message": {"parts": [{"type": "text", "text": f"t{i}"}]}}
            )
        return sender.id, receiver.id, ids


def _hot(app, sender_id, receiver_id, endpoints, n: int) -> dict:
    from relay.extensions import db
    from relay.models import Agent, WebhookEndpoint
    from relay.services import feed, threads, webhooks
    from relay.services.delivery.claims import _claim

    with app.app_context():
        sender, receiver = db.session.get(Agent, sender_id), db.session.get(Agent, receiver_id)
        db.session.expunge_all()
        # Enabled for the claim (rolled back each time); the creates fan out to none of them.
        db.session.execute(WebhookEndpoint.__table__.update().values(enabled=True))
        db.session.commit()

        def claim():
            try:
                assert _claim(db.session, endpoints, 50)
            finally:
                db.session.rollback()

        def delivery_log():
            webhooks.list_deliveries(receiver, str(endpoints[0]))
            db.session.rollback()

        def create():
            threads.send_message(
                sender, {"recipient": receiver.handle, "message": {"parts": [{"type": "text", "text": "x"}]}}
            )

        def feed_page():
            feed.list_messages(receiver)
            db.session.rollback()

        def tasks_list():
            threads.list_threads(receiver)
            db.session.rollback()

        out = {
            "webhook_claim": _timed(claim, n),
            "delivery_log_page": _timed(delivery_log, n),
            "send_create": _timed(create, n),
            "feed_page": _timed(feed_page, n),
            "tasks_list": _timed(tasks_list, n),
        }
        db.session.execute(WebhookEndpoint.__table__.update().values(enabled=False))
        db.session.commit()
        return out


def _delete_equivalent(url: str, cutoff: datetime) -> dict:
    conn, _ = harness._admin(url)
    out = {}
    with conn.cursor() as cur:
        total = time.monotonic()
        for table, column in (
            ("webhook_attempts", "attempted_at"),
            ("webhook_deliveries", "created_at"),
            ("events", "created_at"),
        ):
            t0 = time.monotonic()
            cur.execute(f"DELETE FROM {table} WHERE {column} < %s", (cutoff,))
            out[f"delete_{table}_s"] = round(time.monotonic() - t0, 3)
            out[f"delete_{table}_rows"] = cur.rowcount
        out["delete_total_s"] = round(time.monotonic() - total, 3)
        t0 = time.monotonic()
        for table in TABLES:
            cur.execute(f"VACUUM {table}")
        out["vacuum_s"] = round(time.monotonic() - t0, 3)
        out["delete_plus_vacuum_s"] = round(time.monotonic() - total, 3)
    conn.close()
    return out


@contextmanager
def _dropping_queue(queue: str):
    import redis

    try:
        yield
    finally:
        conn = redis.Redis.from_url(harness.server_urls()[1])
        conn.delete(queue)
        conn.close()


def retention_bench(days: int, per_day: int, queries: int) -> dict:
    """Run the comparison; return the results dict (see the module docstring)."""
    from relay.extensions import db
    from relay.services import retention

    now = datetime.now(UTC)
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    span = days + 3  # three days past retention, for the pass to drop
    start = today - timedelta(days=span)
    results = {
        "date": now.isoformat(),
        "commit": git_commit(),
        "days": span,
        "per_day": per_day,
        "retain_days": 30,
        "queries_per_case": queries,
    }
    queue = f"relay-bench-retention-{secrets.token_hex(4)}"
    with _database("head") as part_url, _database("0008") as plain_url, _dropping_queue(queue):
        _daily_partitions(part_url, start)
        _plain_schema_since_0009(plain_url)
        runs = {}
        for label, url in (("partitioned", part_url), ("plain", plain_url)):
            app = _app(url, queue)
            sender, receiver, endpoints = _setup_relay(app)
            seeded = _seed_log(url, receiver, endpoints, start, span, per_day)
            if label == "partitioned":
                _raise_floors(app)  # as each worker's first retention pass does
            runs[label] = {"app": app, "ids": (sender, receiver, endpoints), "seed_s": seeded, "url": url}
        for run in runs.values():
            run["sizes_before"] = _sizes(run["url"])
            run["hot_before"] = _hot(run["app"], *run["ids"], queries)
        # Retention: the same cutoff for both, the upper bound of the newest expired day.
        app = runs["partitioned"]["app"]
        with app.app_context():
            t0 = time.monotonic()
            report = retention.drop_expired()
            drop_s = round(time.monotonic() - t0, 3)
            db.session.remove()
        dropped_days = sorted({name.rsplit("_p", 1)[1] for name in report.dropped if name.rsplit("_p", 1)[0] in TABLES})
        cutoff = datetime.strptime(dropped_days[-1], "%Y%m%d").replace(tzinfo=UTC) + timedelta(days=1)
        runs["partitioned"]["retention"] = {
            "drop_pass_s": drop_s,
            "dropped": report.dropped,
            "skipped": report.skipped,
            "cutoff": cutoff.isoformat(),
        }
        runs["plain"]["retention"] = {**_delete_equivalent(runs["plain"]["url"], cutoff), "cutoff": cutoff.isoformat()}
        for run in runs.values():
            run["sizes_after"] = _sizes(run["url"])
            run["hot_after"] = _hot(run["app"], *run["ids"], queries)
            with run["app"].app_context():
                db.session.remove()
                db.engine.dispose()
        for label, run in runs.items():
            results[label] = {k: v for k, v in run.items() if k not in ("app", "ids", "url")}
    return results


def print_retention(results: dict) -> None:
    part, plain = results["partitioned"], results["plain"]
    print(f"{results['days']} days x {results['per_day']} events/day (one delivery and one attempt each)")
    for label, run in (("partitioned", part), ("plain", plain)):
        rows = ", ".join(f"{t} {v['rows']}" for t, v in run["sizes_before"].items())
        print(f"  {label}: seeded in {run['seed_s']} s: {rows}")
    print(
        f"retention pass (DROP of {len(part['retention']['dropped'])} partitions): {part['retention']['drop_pass_s']} s"
    )
    r = plain["retention"]
    print(f"equivalent DELETE: {r['delete_total_s']} s, + VACUUM {r['vacuum_s']} s = {r['delete_plus_vacuum_s']} s")
    print(
        f"{'query':<20} {'part p50':>9} {'plain p50':>9} {'part p95':>9} {'plain p95':>9}   (before -> after retention)"
    )
    for phase in ("hot_before", "hot_after"):
        for case, v in part[phase].items():
            w = plain[phase][case]
            print(f"{case:<20} {v['p50_ms']:>9} {w['p50_ms']:>9} {v['p95_ms']:>9} {w['p95_ms']:>9}   {phase}")
