"""circuit openings: each time an endpoint's circuit opened, until when and why

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 15:40:00.000000

The console charts an endpoint's circuit-open spans over the last 24 hours (docs/console.md);
``webhook_endpoints`` keeps only the current one. One row per opening, written in the
pump's transaction that opens it; retention deletes rows older than a week.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "circuit_openings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_circuit_openings_endpoint_id_webhook_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_circuit_openings")),
    )
    op.create_index("ix_circuit_openings_endpoint", "circuit_openings", ["endpoint_id", "opened_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_circuit_openings_endpoint", table_name="circuit_openings")
    op.drop_table("circuit_openings")
