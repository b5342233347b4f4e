"""operator audit log: every sign-in, failed sign-in, sign-out and console action, by day

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 15:20:00.000000

``operator_audit`` is partitioned by day on ``created_at`` like the other logs (0009):
an empty ``operator_audit_legacy`` covers everything before tomorrow (UTC), then daily
partitions to three days ahead; retention makes the next ones and drops those older
than ``RELAY_RETAIN_AUDIT_DAYS`` (relay/services/retention.py). Primary key
``(id, created_at)``, as a partitioned table's must include its key.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AHEAD_DAYS = 3


def _ts(day: datetime) -> str:
    return day.strftime("'%Y-%m-%d 00:00:00+00'")


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE operator_audit (
            id bigserial NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            operator_id uuid,
            operator_email varchar(320) NOT NULL,
            org varchar(255),
            action varchar(64) NOT NULL,
            target text NOT NULL DEFAULT '',
            outcome varchar(64) NOT NULL,
            client_addr varchar(64) NOT NULL DEFAULT '',
            CONSTRAINT pk_operator_audit PRIMARY KEY (id, created_at)
        ) PARTITION BY RANGE (created_at)
        """
    )
    op.execute("CREATE INDEX ix_operator_audit_org ON operator_audit (org, created_at DESC, id DESC)")
    now = datetime.now(UTC)
    bound = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    op.execute(
        f"CREATE TABLE operator_audit_legacy PARTITION OF operator_audit FOR VALUES FROM (MINVALUE) TO ({_ts(bound)})"
    )
    for i in range(AHEAD_DAYS):
        day = bound + timedelta(days=i)
        op.execute(
            f"CREATE TABLE operator_audit_p{day:%Y%m%d} PARTITION OF operator_audit"
            f" FOR VALUES FROM ({_ts(day)}) TO ({_ts(day + timedelta(days=1))})"
        )


def downgrade() -> None:
    op.execute("DROP TABLE operator_audit")
