"""partitioned logs: events, deliveries, attempts and idempotency records in daily time partitions

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 14:30:00.000000

Each table is converted without rewriting its rows: it is renamed ``<table>_legacy``, a
partitioned parent with the same name, columns, defaults and checks is created (PARTITION
BY RANGE on its time column), and the legacy table is ATTACHed as the first partition,
covering (MINVALUE, B). B is the UTC midnight after the newest row of any of the four
tables, at least tomorrow's, and one bound for all four so that deliveries and their
events stay in aligned partitions. A validated CHECK constraint (the partition's bound)
is added before the ATTACH, so the ATTACH itself does not scan. Daily partitions
``<table>_pYYYYMMDD`` follow from B to three days ahead; beat keeps creating them
(relay/services/retention.py).

What it writes: the pending deliveries' created_at, set to their events' (the claim
looks an event up by both). What it does read: the VALIDATE and the bound's max() scan each table once, and the
ATTACH builds the indexes that are new (the composite primary keys, the composite
delivery uniqueness, the idempotency lookup, events by thread). Rows keep their versions.

Schema changes (docs/decisions.md, "Time partitions"):

- Primary keys become ``(id, <time column>)``: a partitioned table's unique constraints
  must include the partition key. The ORM still maps ``id`` alone (relay/models.py).
- ``uq_webhook_deliveries_event_endpoint`` becomes ``(event_id, endpoint_id, created_at)``;
  a delivery's created_at is now its event's (relay/services/delivery/fanout.py), so it is the
  same constraint for every delivery written from now on.
- ``uq_idempotency_agent_key`` is gone (it cannot include created_at and stay unique per
  key); relay/services/idempotency.py serialises a key's calls on a transaction-scoped
  advisory lock instead. ``ix_idempotency_records_expires_at`` (the bulk purge's) is gone.
- The foreign keys deliveries -> events and attempts -> deliveries are dropped: a foreign
  key to a partitioned table must name its whole key, and would make every partition
  drop check (or cascade into) the other table. Retention drops them in aligned order
  instead, and the closed-thread sweep deletes them explicitly.
- ``ix_events_thread_id`` is new: deleting a closed thread (opt-in retention) cascades
  into events by thread_id.

Downgrade copies the rows back into plain tables (a rewrite, unlike the upgrade), first
deleting attempts and deliveries whose delivery or event is gone (the dropped foreign
keys could not have held them) and all but the newest idempotency record of a key.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AHEAD_DAYS = 3

# table -> its partition key
KEYS = {
    "events": "created_at",
    "webhook_deliveries": "created_at",
    "webhook_attempts": "attempted_at",
    "idempotency_records": "created_at",
}

# Indexes of the parents (created on the parent: each partition gets its own). The
# legacy table's indexes of the same definition are renamed and attached, not rebuilt.
INDEXES = {
    "events": [
        ("ix_events_agent_id", "(agent_id)", ""),
        ("ix_events_pending", "(created_at)", "WHERE fanned_out_at IS NULL"),
        ("ix_events_thread_id", "(thread_id)", "WHERE thread_id IS NOT NULL"),
    ],
    "webhook_deliveries": [
        ("ix_webhook_deliveries_due", "(next_attempt_at)", "WHERE status = 'pending'"),
        ("ix_webhook_deliveries_endpoint", "(endpoint_id, created_at DESC, id DESC)", ""),
        ("ix_webhook_deliveries_endpoint_due", "(endpoint_id, next_attempt_at)", "WHERE status = 'pending'"),
        ("ix_webhook_deliveries_leased", "(endpoint_id, leased_until)", "WHERE leased_until IS NOT NULL"),
    ],
    "webhook_attempts": [("ix_webhook_attempts_delivery_id", "(delivery_id)", "")],
    "idempotency_records": [("ix_idempotency_records_agent_key", "(agent_id, key)", "")],
}
# Indexes of the legacy tables that have no place on the parent.
LEGACY_ONLY_INDEXES = {"idempotency_records": ["ix_idempotency_records_expires_at"]}

FKS = {
    "events": [
        ("fk_events_agent_id_agents", "(agent_id) REFERENCES agents (id) ON DELETE CASCADE"),
        ("fk_events_thread_id_threads", "(thread_id) REFERENCES threads (id) ON DELETE CASCADE"),
    ],
    "webhook_deliveries": [
        (
            "fk_webhook_deliveries_endpoint_id_webhook_endpoints",
            "(endpoint_id) REFERENCES webhook_endpoints (id) ON DELETE CASCADE",
        )
    ],
    "webhook_attempts": [],
    "idempotency_records": [
        ("fk_idempotency_records_agent_id_agents", "(agent_id) REFERENCES agents (id) ON DELETE CASCADE")
    ],
}
SEQUENCES = {"webhook_attempts": "webhook_attempts_id_seq", "idempotency_records": "idempotency_records_id_seq"}
DROPPED_FKS = [
    ("webhook_attempts", "fk_webhook_attempts_delivery_id_webhook_deliveries"),
    ("webhook_deliveries", "fk_webhook_deliveries_event_id_events"),
]
DROPPED_UNIQUE = [
    ("webhook_deliveries", "uq_webhook_deliveries_event_endpoint"),
    ("idempotency_records", "uq_idempotency_agent_key"),
]


def _ts(day: datetime) -> str:
    return day.strftime("'%Y-%m-%d 00:00:00+00'")


def _bound() -> datetime:
    """The legacy partitions' upper bound: the UTC midnight after every row, at least tomorrow's."""
    conn = op.get_bind()
    newest = conn.exec_driver_sql(
        "SELECT greatest(" + ", ".join(f"(SELECT max({key}) FROM {table})" for table, key in KEYS.items()) + ")"
    ).scalar()
    now = datetime.now(UTC)
    newest = max(newest, now) if newest is not None else now
    newest = newest.astimezone(UTC)
    return datetime(newest.year, newest.month, newest.day, tzinfo=UTC) + timedelta(days=1)


def upgrade() -> None:
    execute = op.execute
    bound = _bound()
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    for table, name in DROPPED_FKS:
        execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for table, name in DROPPED_UNIQUE:
        execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for table, key in KEYS.items():
        legacy = f"{table}_legacy"
        execute(f"ALTER TABLE {table} RENAME TO {legacy}")
        # Only one primary key per table: the parent's (id, key) replaces it on attach.
        execute(f"ALTER TABLE {legacy} DROP CONSTRAINT pk_{table}")
        for index in LEGACY_ONLY_INDEXES.get(table, []):
            execute(f"DROP INDEX {index}")
        for index, _cols, _where in INDEXES[table]:
            execute(f"ALTER INDEX IF EXISTS {index} RENAME TO {index}_legacy")
        execute(
            f"CREATE TABLE {table} (LIKE {legacy} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE ({key})"
        )
        execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY (id, {key})")
        if table == "webhook_deliveries":
            execute(
                "ALTER TABLE webhook_deliveries ADD CONSTRAINT uq_webhook_deliveries_event_endpoint"
                " UNIQUE (event_id, endpoint_id, created_at)"
            )
        for index, cols, where in INDEXES[table]:
            execute(f"CREATE INDEX {index} ON {table} {cols} {where}")
        for name, definition in FKS[table]:
            execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY {definition}")
        if table in SEQUENCES:
            # Owned by the parent, or dropping the legacy partition would drop the sequence.
            execute(f"ALTER SEQUENCE {SEQUENCES[table]} OWNED BY {table}.id")
        check = f"ck_{legacy}_bound"
        execute(f"ALTER TABLE {legacy} ADD CONSTRAINT {check} CHECK ({key} < {_ts(bound)}) NOT VALID")
        execute(f"ALTER TABLE {legacy} VALIDATE CONSTRAINT {check}")
        execute(f"ALTER TABLE {table} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO ({_ts(bound)})")
        execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {check}")  # the partition bound says it now
        day = bound
        while day <= today + timedelta(days=AHEAD_DAYS):
            execute(
                f"CREATE TABLE {table}_p{day:%Y%m%d} PARTITION OF {table}"
                f" FOR VALUES FROM ({_ts(day)}) TO ({_ts(day + timedelta(days=1))})"
            )
            day += timedelta(days=1)
    # The claim finds a delivery's event by (id, created_at): a pending delivery written
    # before 0009 takes its event's created_at (it stays in the legacy partition: the
    # event is older). Only the pending ones; a failed one is realigned when redriven.
    execute(
        "UPDATE webhook_deliveries d SET created_at = e.created_at FROM events e"
        " WHERE e.id = d.event_id AND d.status = 'pending' AND d.created_at <> e.created_at"
    )


# The tables as 0008 left them, for the downgrade.
PLAIN_PKS = {
    "events": "pk_events PRIMARY KEY (id)",
    "webhook_deliveries": "pk_webhook_deliveries PRIMARY KEY (id)",
    "webhook_attempts": "pk_webhook_attempts PRIMARY KEY (id)",
    "idempotency_records": "pk_idempotency_records PRIMARY KEY (id)",
}


def downgrade() -> None:
    execute = op.execute
    execute(
        "DELETE FROM webhook_attempts a WHERE NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.id = a.delivery_id)"
    )
    execute("DELETE FROM webhook_deliveries d WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = d.event_id)")
    execute(
        "DELETE FROM webhook_deliveries d USING webhook_deliveries o"
        " WHERE o.event_id = d.event_id AND o.endpoint_id = d.endpoint_id AND (o.created_at, o.id) > (d.created_at, d.id)"
    )
    execute(
        "DELETE FROM idempotency_records r USING idempotency_records o"
        " WHERE o.agent_id = r.agent_id AND o.key = r.key AND o.id > r.id"
    )
    for table in KEYS:
        plain = f"{table}_plain"
        execute(f"CREATE TABLE {plain} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        execute(f"INSERT INTO {plain} SELECT * FROM {table}")
        if table in SEQUENCES:
            execute(f"ALTER SEQUENCE {SEQUENCES[table]} OWNED BY {plain}.id")
        execute(f"DROP TABLE {table} CASCADE")  # the parent and every partition
        execute(f"ALTER TABLE {plain} RENAME TO {table}")
        execute(f"ALTER TABLE {table} ADD CONSTRAINT {PLAIN_PKS[table]}")
        for index, cols, where in INDEXES[table]:
            if index in ("ix_idempotency_records_agent_key", "ix_events_thread_id"):
                continue
            execute(f"CREATE INDEX {index} ON {table} {cols} {where}")
        for name, definition in FKS[table]:
            execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY {definition}")
    execute("CREATE INDEX ix_idempotency_records_expires_at ON idempotency_records (expires_at)")
    execute("ALTER TABLE idempotency_records ADD CONSTRAINT uq_idempotency_agent_key UNIQUE (agent_id, key)")
    execute(
        "ALTER TABLE webhook_deliveries ADD CONSTRAINT uq_webhook_deliveries_event_endpoint UNIQUE (event_id, endpoint_id)"
    )
    execute(
        "ALTER TABLE webhook_deliveries ADD CONSTRAINT fk_webhook_deliveries_event_id_events"
        " FOREIGN KEY (event_id) REFERENCES events (id) ON DELETE CASCADE"
    )
    execute(
        "ALTER TABLE webhook_attempts ADD CONSTRAINT fk_webhook_attempts_delivery_id_webhook_deliveries"
        " FOREIGN KEY (delivery_id) REFERENCES webhook_deliveries (id) ON DELETE CASCADE"
    )
