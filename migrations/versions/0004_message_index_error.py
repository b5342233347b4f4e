"""messages.index_error: a message the search indexer could not index, and why

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("index_error", sa.Text(), nullable=True))


def downgrade() -> None:
    # Without the mark the sweep would retry those rows (and fail on them again, row by row).
    op.drop_column("messages", "index_error")
