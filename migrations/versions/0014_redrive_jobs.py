"""bulk redrive jobs: an endpoint's failed deliveries of a window, redriven in batches

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 15:30:00.000000

``redrive_jobs`` holds one row per bulk redrive confirmed in the console (docs/console.md): its
window, how many deliveries were failed then (``total``), how many it has redriven
(``done``), its keyset position, and its state. A few rows per operator click: not a log.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "redrive_jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requested_by", sa.String(length=320), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), server_default="0", nullable=False),
        sa.Column("cursor_created_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cursor_id", sa.Uuid(), nullable=True),
        sa.Column("status", sa.String(length=16), server_default="running", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('running', 'done', 'failed')", name=op.f("ck_redrive_jobs_status_known")),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["webhook_endpoints.id"],
            name=op.f("fk_redrive_jobs_endpoint_id_webhook_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_redrive_jobs")),
    )
    op.create_index(op.f("ix_redrive_jobs_endpoint_id"), "redrive_jobs", ["endpoint_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_redrive_jobs_endpoint_id"), table_name="redrive_jobs")
    op.drop_table("redrive_jobs")
