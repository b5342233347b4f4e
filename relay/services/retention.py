"""Retention: the logs' daily time partitions made ahead, and dropped once past retention.

The delivery log (``webhook_deliveries``, ``webhook_attempts``), the outbox (``events``) and
``idempotency_records`` are range-partitioned by time, one partition a UTC day
(``<table>_pYYYYMMDD``), after the first one (``<table>_legacy``, the table as it was
before migration 0009, from MINVALUE). One pass (:func:`run_pass`, beat's ``retention``
task, ``relay retention run``):

1. makes the partitions of today and the next :data:`AHEAD_DAYS` days where missing;
2. drops each partition whose every possible row is older than its table's retention
   (its upper bound plus ``retain_*_days``, or plus the idempotency TTL), whole: data is
   removed by DROP TABLE, never by a bulk DELETE;
3. when ``RELAY_RETAIN_CLOSED_THREADS_DAYS`` is set, deletes completed and cancelled
   threads closed longer ago than that, with everything that hangs off them.

Nothing in flight is lost. A partition is dropped only in a transaction that holds its
table's ACCESS EXCLUSIVE lock and has checked, under that lock, that it holds no delivery
still pending (neither delivered nor given up), no event not yet fanned out, and, for
events, no delivery of the same days at all (a delivery is read with its event); an
attempts partition is kept while a pending delivery has an attempt in it. Otherwise it
is skipped and reported, and a later pass tries again. Every lock is taken with
``SET LOCAL lock_timeout`` (``RELAY_RETENTION_LOCK_TIMEOUT_MS``): a partition busy with
traffic is skipped rather than waited for, so requests never queue behind a drop for
longer than that.

Every step is its own transaction and takes the pass's advisory lock first, so passes
from several workers take turns; nothing outlives a transaction (PgBouncer transaction
mode).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from flask import current_app
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from relay.models import PARTITIONED
from relay.services import unit_of_work
from relay.services.delivery import bounds

log = logging.getLogger("relay.retention")

#: Days of partitions made ahead of today (today's included besides).
AHEAD_DAYS = 3
#: Closed threads deleted per transaction, and the most transactions of them a pass runs.
THREAD_BATCH = 200
THREAD_BATCHES_PER_PASS = 50
# pg_advisory_xact_lock(bigint) key of a retention step: "retain".
_LOCK = 0x72657461696E
_LOCK_NOT_AVAILABLE = "55P03"
_DAY = timedelta(days=1)
# Drop order: a table's partitions go before those of the tables they are read with
# (attempts and deliveries before their events).
DROP_ORDER = ("webhook_attempts", "webhook_deliveries", "events", "idempotency_records", "operator_audit")
_BOUND = re.compile(r"FOR VALUES FROM \((.+?)\) TO \((.+?)\)")


@dataclass(frozen=True)
class Partition:
    """One partition: ``lo``/``hi`` are its bounds (UTC; ``lo`` None for MINVALUE), ``hi`` exclusive."""

    name: str
    lo: datetime | None
    hi: datetime | None


@dataclass
class PassReport:
    """What one pass did: partition names created and dropped, those skipped and why, threads deleted."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    threads_deleted: int = 0
    floors: dict[str, datetime] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """``{"created": [name], "dropped": [name], "skipped": [{"name", "reason"}], "threads_deleted": n,
        "floors": {table: ISO 8601}}`` (the pending floors after the pass, relay/services/delivery/bounds.py)."""
        return {
            "created": self.created,
            "dropped": self.dropped,
            "skipped": self.skipped,
            "threads_deleted": self.threads_deleted,
            "floors": {name: _iso(at) for name, at in self.floors.items()},
        }


def retain_for(table: str, settings=None) -> timedelta:
    """How long ``table``'s rows are kept: raises KeyError for a table that is not partitioned."""
    s = settings or current_app.config["RELAY"]
    return {
        "events": timedelta(days=s.retain_events_days),
        "webhook_deliveries": timedelta(days=s.retain_deliveries_days),
        "webhook_attempts": timedelta(days=s.retain_deliveries_days),
        "idempotency_records": timedelta(seconds=s.idempotency_ttl_seconds),
        "operator_audit": timedelta(days=s.retain_audit_days),
    }[table]


def _bound(raw: str) -> datetime | None:
    raw = raw.strip()
    if raw.upper() in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(raw.strip("'")).astimezone(UTC)


def partitions(conn, table: str) -> list[Partition]:
    """``table``'s partitions, oldest first, read from the catalog on ``conn`` (in its transaction)."""
    # The bounds print in the session's time zone; UTC for this transaction only.
    conn.exec_driver_sql("SET LOCAL TIME ZONE 'UTC'")
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST(:t AS regclass)"
        ),
        {"t": table},
    ).all()
    found = []
    for name, expr in rows:
        match = _BOUND.search(expr or "")
        if match is None:  # a DEFAULT partition: none of ours
            continue
        found.append(Partition(name, _bound(match.group(1)), _bound(match.group(2))))
    found.sort(key=lambda p: (p.lo is not None, p.lo or datetime.min.replace(tzinfo=UTC)))
    return found


def _day(at: datetime) -> datetime:
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, at.day, tzinfo=UTC)


def _literal(at: datetime) -> str:
    return at.strftime("'%Y-%m-%d %H:%M:%S+00'")


def _db_now(conn) -> datetime:
    return conn.exec_driver_sql("SELECT now()").scalar().astimezone(UTC)


def _begin_step(session, settings) -> object:
    conn = session.connection()
    # SET LOCAL only: the setting ends with the transaction (a pooler's next client never sees it).
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(settings.retention_lock_timeout_ms)}ms'")
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK})
    return conn


def _busy(exc: OperationalError) -> bool:
    return getattr(exc.orig, "pgcode", None) == _LOCK_NOT_AVAILABLE


def ensure_ahead(now: datetime | None = None, report: PassReport | None = None) -> PassReport:
    """Create each table's missing daily partitions from today through :data:`AHEAD_DAYS` ahead.

    Every day of that window that no partition overlaps gets one, gaps below the newest
    partition too (a clock that jumped, a partition detached by hand): a day with no
    partition would refuse every write of that day. A day partly covered is left alone,
    so new partitions never overlap one another or the legacy partition. ``now`` (UTC;
    default the database's clock) is for tests and the bench. A table whose lock is not
    granted within the lock timeout is skipped and reported.
    """
    report = report or PassReport()
    settings = current_app.config["RELAY"]
    for table in PARTITIONED:
        try:
            with unit_of_work() as session:
                conn = _begin_step(session, settings)
                at = now or _db_now(conn)
                existing = partitions(conn, table)
                day = _day(at)
                while day <= _day(at) + AHEAD_DAYS * _DAY:
                    end = day + _DAY
                    covered = any((p.lo is None or p.lo < end) and (p.hi is None or p.hi > day) for p in existing)
                    if not covered:
                        name = f"{table}_p{day:%Y%m%d}"
                        conn.exec_driver_sql(
                            f"CREATE TABLE {name} PARTITION OF {table}"
                            f" FOR VALUES FROM ({_literal(day)}) TO ({_literal(end)})"
                        )
                        report.created.append(name)
                    day = end
        except OperationalError as exc:
            if not _busy(exc):
                raise
            report.skipped.append({"name": table, "reason": "lock timeout while creating partitions ahead"})
    return report


# Why a partition may not be dropped yet: each query returns a row when it must stay.
# :lo/:hi are its bounds; the partition itself is named in the FROM where it is read.
_IN_FLIGHT = {
    "webhook_deliveries": [
        ("a delivery not yet delivered or given up", "SELECT 1 FROM {p} WHERE status = 'pending' LIMIT 1"),
        (
            "an event of these days not yet fanned out",
            "SELECT 1 FROM events WHERE fanned_out_at IS NULL AND created_at >= :lo AND created_at < :hi LIMIT 1",
        ),
    ],
    "webhook_attempts": [
        (
            "an attempt of a delivery not yet delivered or given up",
            "SELECT 1 FROM webhook_deliveries d WHERE d.status = 'pending'"
            " AND EXISTS (SELECT 1 FROM {p} a WHERE a.delivery_id = d.id) LIMIT 1",
        ),
    ],
    "events": [
        ("an event not yet fanned out", "SELECT 1 FROM {p} WHERE fanned_out_at IS NULL LIMIT 1"),
        (
            "deliveries of these days (kept longer than their events)",
            "SELECT 1 FROM webhook_deliveries WHERE created_at >= :lo AND created_at < :hi LIMIT 1",
        ),
    ],
    "idempotency_records": [],
    "operator_audit": [],
}


def drop_expired(now: datetime | None = None, report: PassReport | None = None) -> PassReport:
    """Drop every partition past its table's retention that holds nothing in flight.

    Each drop is one transaction: the lock timeout, the pass's advisory lock, ACCESS
    EXCLUSIVE on the parent table (which DROP needs anyway; taken first, so the check and
    the drop see the same rows and nothing can be written into the partition between
    them), the in-flight checks, then DROP TABLE. A partition that fails a check, or whose
    lock is not granted in time, is skipped and reported (``{"name", "reason"}``). The
    newest partitions of a table are never candidates: only those whose upper bound is
    before ``now`` minus the retention. ``now`` defaults to the database's clock.
    """
    report = report or PassReport()
    settings = current_app.config["RELAY"]
    for table in DROP_ORDER:
        keep = retain_for(table, settings)
        with unit_of_work() as session:
            conn = session.connection()
            at = now or _db_now(conn)
            candidates = [p for p in partitions(conn, table) if p.hi is not None and p.hi + keep <= at]
        for part in candidates:
            _drop_one(table, part, settings, report)
    return report


def _drop_one(table: str, part: Partition, settings, report: PassReport) -> None:
    lo = part.lo or datetime(1, 1, 1, tzinfo=UTC)
    try:
        with unit_of_work() as session:
            conn = _begin_step(session, settings)
            # Taken again under the lock: another pass may have dropped it meanwhile.
            if part.name not in {p.name for p in partitions(conn, table)}:
                return
            # ONLY: the parent alone, not every partition (DROP locks this one itself).
            conn.exec_driver_sql(f"LOCK TABLE ONLY {table} IN ACCESS EXCLUSIVE MODE")
            for reason, query in _IN_FLIGHT[table]:
                if conn.execute(text(query.format(p=part.name)), {"lo": lo, "hi": part.hi}).first() is not None:
                    report.skipped.append({"name": part.name, "reason": reason})
                    return
            conn.exec_driver_sql(f"DROP TABLE {part.name}")
            report.dropped.append(part.name)
    except OperationalError as exc:
        if not _busy(exc):
            raise
        report.skipped.append({"name": part.name, "reason": "lock timeout: the table is busy; next pass"})


# Completed and cancelled threads closed before :cutoff, none of whose events is still
# in flight (not fanned out, or with a pending delivery), locked so that no append or
# transition runs into the delete.
_CLOSED_THREADS = text(
    """
    SELECT t.id FROM threads t
    WHERE t.state IN ('completed', 'cancelled') AND coalesce(t.completed_at, t.cancelled_at) < :cutoff
      AND NOT EXISTS (SELECT 1 FROM events e WHERE e.thread_id = t.id AND e.fanned_out_at IS NULL)
      AND NOT EXISTS (
          SELECT 1 FROM events e JOIN webhook_deliveries d ON d.event_id = e.id AND d.created_at = e.created_at
          WHERE e.thread_id = t.id AND d.status = 'pending')
    ORDER BY coalesce(t.completed_at, t.cancelled_at)
    LIMIT :n
    FOR UPDATE OF t SKIP LOCKED
    """
)
_THREAD_DELIVERIES = text(
    "SELECT d.id FROM events e JOIN webhook_deliveries d ON d.event_id = e.id AND d.created_at = e.created_at"
    " WHERE e.thread_id = ANY(CAST(:ids AS uuid[]))"
)


def delete_closed_threads(now: datetime | None = None) -> int:
    """Delete completed and cancelled threads closed more than ``RELAY_RETAIN_CLOSED_THREADS_DAYS`` ago.

    Off (returns 0) when that is 0, the default: the ledger is kept. Deleted with each
    thread: its messages, read positions and audit rows, its events, their deliveries and
    attempts (which have no foreign key to cascade through since migration 0009), and its
    A2A push configs. A thread with an event still in flight is left for a later pass.
    A DELETE, unlike the log's partition drops: closed threads of all ages share the
    ledger's tables. At most :data:`THREAD_BATCH` threads a transaction,
    :data:`THREAD_BATCHES_PER_PASS` transactions a call. Returns how many were deleted.
    """
    settings = current_app.config["RELAY"]
    if settings.retain_closed_threads_days <= 0:
        return 0
    total = 0
    for _ in range(THREAD_BATCHES_PER_PASS):
        with unit_of_work() as session:
            conn = session.connection()
            cutoff = (now or _db_now(conn)) - timedelta(days=settings.retain_closed_threads_days)
            ids = [str(r[0]) for r in conn.execute(_CLOSED_THREADS, {"cutoff": cutoff, "n": THREAD_BATCH})]
            if not ids:
                break
            deliveries = [str(r[0]) for r in conn.execute(_THREAD_DELIVERIES, {"ids": ids})]
            if deliveries:
                conn.execute(
                    text("DELETE FROM webhook_attempts WHERE delivery_id = ANY(CAST(:d AS uuid[]))"), {"d": deliveries}
                )
                conn.execute(
                    text("DELETE FROM webhook_deliveries WHERE id = ANY(CAST(:d AS uuid[]))"), {"d": deliveries}
                )
            # Messages, read positions, audit rows, events and push configs cascade.
            conn.execute(text("DELETE FROM threads WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": ids})
            total += len(ids)
        if len(ids) < THREAD_BATCH:
            break
    return total


#: How long circuit openings are kept: the console charts the last 24 hours of them.
CIRCUIT_KEEP = timedelta(days=7)


def delete_old_openings(now: datetime | None = None) -> int:
    """Delete the circuit openings older than :data:`CIRCUIT_KEEP`; return how many.

    A plain DELETE: at most one opening per endpoint per pause (30 s and doubling), so a
    week of them is small, unlike the logs dropped by partition.
    """
    with unit_of_work() as session:
        conn = session.connection()
        cutoff = (now or _db_now(conn)) - CIRCUIT_KEEP
        return conn.execute(text("DELETE FROM circuit_openings WHERE opened_at < :c"), {"c": cutoff}).rowcount


def run_pass(now: datetime | None = None) -> PassReport:
    """One retention pass: partitions ahead, expired partitions dropped, closed threads (opt-in), floors raised."""
    report = ensure_ahead(now)
    drop_expired(now, report)
    report.threads_deleted = delete_closed_threads(now)
    delete_old_openings(now)
    report.floors = bounds.raise_floors()
    if report.created or report.dropped or report.skipped or report.threads_deleted:
        log.info(
            "retention: %d partitions created, %d dropped, %d skipped, %d closed threads deleted",
            len(report.created),
            len(report.dropped),
            len(report.skipped),
            report.threads_deleted,
            # Not as_dict()'s keys: "created" is a LogRecord attribute.
            extra={
                "sweep": "retention",
                "partitions_created": report.created,
                "partitions_dropped": report.dropped,
                "partitions_skipped": report.skipped,
                "threads_deleted": report.threads_deleted,
            },
        )
    return report


_SIZES = text(
    """
    SELECT c.relname, greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST(:t AS regclass)
    """
)


def status() -> dict:
    """The partitions of every partitioned table, for ``relay retention status``.

    ``{"tables": [{"name", "retain_days", "partitions": [{"name", "from", "to",
    "rows_estimate", "bytes"}]}]}``: partitions oldest first; ``from``/``to`` are ISO 8601
    UTC (``from`` None for the first partition, which starts at MINVALUE; ``to``
    exclusive); ``rows_estimate`` is the planner's (``pg_class.reltuples``, 0 before the
    first ANALYZE); ``bytes`` includes indexes and TOAST. ``retain_days`` is a number of
    days (fractional for idempotency records, whose retention is their TTL).
    """
    settings = current_app.config["RELAY"]
    tables = []
    with unit_of_work() as session:
        conn = session.connection()
        for table in PARTITIONED:
            sizes = {name: (rows, size) for name, rows, size in conn.execute(_SIZES, {"t": table})}
            keep = retain_for(table, settings)
            tables.append(
                {
                    "name": table,
                    "retain_days": keep.days if keep.seconds == 0 else round(keep.total_seconds() / 86400, 3),
                    "partitions": [
                        {
                            "name": p.name,
                            "from": _iso(p.lo),
                            "to": _iso(p.hi),
                            "rows_estimate": int(sizes.get(p.name, (0, 0))[0]),
                            "bytes": int(sizes.get(p.name, (0, 0))[1]),
                        }
                        for p in partitions(conn, table)
                    ],
                }
            )
    return {"tables": tables}


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The first partition starts at MINVALUE: its oldest row is estimated from the planner's
# statistics (the histogram's first bound), never by scanning it.
_OLDEST_IN_FIRST = text(
    """
    SELECT (CAST(CAST(histogram_bounds AS text) AS timestamptz[]))[1] FROM pg_stats
    WHERE schemaname = current_schema() AND tablename = :p AND attname = :k
    """
)


def oldest_ages() -> dict[str, float]:
    """Seconds since the start of each table's oldest partition, by table name (for /metrics).

    For a partition from MINVALUE (the converted legacy table) the start is its oldest
    row as the planner's statistics estimate it, or its upper bound before the first
    ANALYZE. A table with no partition has no entry.
    """
    ages = {}
    with unit_of_work() as session:
        conn = session.connection()
        now = _db_now(conn)
        for table, key in PARTITIONED.items():
            found = partitions(conn, table)
            if not found:
                continue
            first = found[0]
            start = first.lo
            if start is None:
                start = conn.execute(_OLDEST_IN_FIRST, {"p": first.name, "k": key}).scalar() or first.hi
            if start is not None:
                ages[table] = max(0.0, (now - start).total_seconds())
    return ages
