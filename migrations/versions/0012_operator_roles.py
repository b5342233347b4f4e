"""operator roles: admin (every action) or viewer (every page, no action)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 15:05:00.000000

``operators.role`` is ``admin`` or ``viewer`` (a CHECK constraint); every operator made
before it is an admin, as every operator could do everything (docs/decisions.md, "Console roles").
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("operators", sa.Column("role", sa.String(length=16), server_default="admin", nullable=False))
    op.create_check_constraint(op.f("ck_operators_role_known"), "operators", "role IN ('admin', 'viewer')")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_operators_role_known"), "operators", type_="check")
    op.drop_column("operators", "role")
