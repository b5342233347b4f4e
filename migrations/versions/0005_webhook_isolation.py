"""Webhook isolation: delivery leases, per-endpoint health and circuit breaker

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    # A claimed delivery's lease: counted as in flight for its endpoint's and org's caps.
    op.add_column("webhook_deliveries", sa.Column("leased_until", TZ, nullable=True))
    op.create_index(
        "ix_webhook_deliveries_leased",
        "webhook_deliveries",
        ["endpoint_id", "leased_until"],
        postgresql_where=sa.text("leased_until IS NOT NULL"),
    )
    # Each endpoint drains its own queue, oldest due first.
    op.create_index(
        "ix_webhook_deliveries_endpoint_due",
        "webhook_deliveries",
        ["endpoint_id", "next_attempt_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.add_column(
        "webhook_endpoints", sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("webhook_endpoints", sa.Column("circuit_opens", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("webhook_endpoints", sa.Column("circuit_open_until", TZ, nullable=True))
    op.add_column("webhook_endpoints", sa.Column("circuit_reason", sa.Text(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("last_attempt_at", TZ, nullable=True))
    op.add_column("webhook_endpoints", sa.Column("last_duration_ms", sa.Integer(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("last_error", sa.Text(), nullable=True))


def downgrade() -> None:
    for column in (
        "last_error",
        "last_duration_ms",
        "last_attempt_at",
        "circuit_reason",
        "circuit_open_until",
        "circuit_opens",
        "consecutive_failures",
    ):
        op.drop_column("webhook_endpoints", column)
    op.drop_index("ix_webhook_deliveries_endpoint_due", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_leased", table_name="webhook_deliveries")
    op.drop_column("webhook_deliveries", "leased_until")
