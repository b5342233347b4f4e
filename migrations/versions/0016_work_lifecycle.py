"""work lifecycle: decline, fail, release, renew; leases; read receipts; priority and expiry

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 18:00:00.000000

Additive to the states of docs/api.md (docs/decisions.md, "The work lifecycle").
``threads`` gains three terminal states (declined, failed, expired), a lease
(``lease_expires_at``, ``lease_token``, ``lease_seconds``), ``priority`` and ``expires_at``,
the new states' times and the reason of a decline or fail. Every new column is nullable or
has a constant default, so PostgreSQL adds it without rewriting the table. Two partial
indexes find what is due for the sweep: only leased accepted rows and pending rows with an
expiry are in them. ``messages.read_at`` is the read receipt (null for messages read before
this migration: when they were read was not recorded). ``audit_events.reason`` holds a
transition's reason.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
OLD_STATES = "state in ('pending','accepted','completed','cancelled')"
NEW_STATES = "state in ('pending','accepted','completed','cancelled','declined','failed','expired')"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_threads_state_valid"), "threads", type_="check")
    op.create_check_constraint(op.f("ck_threads_state_valid"), "threads", NEW_STATES)
    op.add_column("threads", sa.Column("priority", sa.String(length=8), server_default="normal", nullable=False))
    op.create_check_constraint(
        op.f("ck_threads_priority_valid"), "threads", "priority in ('low','normal','high','urgent')"
    )
    for name in ("expires_at", "lease_expires_at", "declined_at", "failed_at", "expired_at"):
        op.add_column("threads", sa.Column(name, TZ, nullable=True))
    op.add_column("threads", sa.Column("lease_token", sa.String(length=64), nullable=True))
    op.add_column("threads", sa.Column("lease_seconds", sa.Integer(), nullable=True))
    op.add_column("threads", sa.Column("reason", sa.Text(), nullable=True))
    op.create_index(
        "ix_threads_lease_due",
        "threads",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'accepted' AND lease_expires_at IS NOT NULL"),
    )
    op.create_index(
        "ix_threads_expiry_due",
        "threads",
        ["expires_at"],
        postgresql_where=sa.text("state = 'pending' AND expires_at IS NOT NULL"),
    )
    op.add_column("messages", sa.Column("read_at", TZ, nullable=True))
    op.add_column("audit_events", sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    # The new terminal states have no equivalent among the earlier ones: those threads end as cancelled.
    op.execute(
        "UPDATE threads SET state = 'cancelled', cancelled_at = coalesce(cancelled_at, updated_at)"
        " WHERE state IN ('declined','failed','expired')"
    )
    op.drop_column("audit_events", "reason")
    op.drop_column("messages", "read_at")
    op.drop_index("ix_threads_expiry_due", table_name="threads")
    op.drop_index("ix_threads_lease_due", table_name="threads")
    for name in (
        "reason",
        "lease_seconds",
        "lease_token",
        "expired_at",
        "failed_at",
        "declined_at",
        "lease_expires_at",
        "expires_at",
    ):
        op.drop_column("threads", name)
    op.drop_constraint(op.f("ck_threads_priority_valid"), "threads", type_="check")
    op.drop_column("threads", "priority")
    op.drop_constraint(op.f("ck_threads_state_valid"), "threads", type_="check")
    op.create_check_constraint(op.f("ck_threads_state_valid"), "threads", OLD_STATES)
