"""worker heartbeats: a dead worker's claimed deliveries are sent again within seconds

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 23:30:00.000000

``relay_workers`` holds one row per running webhook pump (one per worker process), its
``heartbeat_at`` written every ``RELAY_WORKER_HEARTBEAT`` seconds. A claim records its
pump in ``webhook_deliveries.claimed_by``; a live pump that finds another's heartbeat
older than ``RELAY_WORKER_STALE`` seconds deletes that row and makes the dead pump's
claims due at once (relay/services/delivery/pump.py). The column is added to the
partitioned parent, so every partition (and every one made later) has it; it is NULL on
existing rows, which costs no rewrite. The index is partial (only leased deliveries) and
is built on each partition, which reads each partition once.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "relay_workers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_relay_workers")),
    )
    op.add_column("webhook_deliveries", sa.Column("claimed_by", sa.Uuid(), nullable=True))
    op.create_index(
        "ix_webhook_deliveries_claimed_by",
        "webhook_deliveries",
        ["claimed_by"],
        unique=False,
        postgresql_where=sa.text("leased_until IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_claimed_by", table_name="webhook_deliveries")
    op.drop_column("webhook_deliveries", "claimed_by")
    op.drop_table("relay_workers")
