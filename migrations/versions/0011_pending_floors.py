"""pending floors: the oldest day a pending delivery or an un-fanned event can be in

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 12:30:00.000000

``relay_floors`` holds one row per partitioned queue: ``webhook_deliveries`` (no pending
delivery has an older ``created_at``) and ``events`` (no event not yet fanned out has an
older ``created_at``). The pump's scans for pending rows name the floor as a constant,
so PostgreSQL plans only the partitions from it on instead of every day retention keeps
(relay/services/delivery/bounds.py; docs/decisions.md, "Pending floors"). Both start
at ``-infinity``, which prunes nothing; the first retention pass (each worker runs one
at its start) raises them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "relay_floors",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("floor", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_relay_floors")),
    )
    op.execute(
        "INSERT INTO relay_floors (name, floor) VALUES ('webhook_deliveries', '-infinity'), ('events', '-infinity')"
    )


def downgrade() -> None:
    op.drop_table("relay_floors")
