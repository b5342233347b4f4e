"""input required: a worker asks its requester a question; every accept has a fencing token

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 11:40:00.000000

Additive. ``threads.state`` may be ``input_required`` (an accepted handoff whose recipient
asked the sender a question; the sender's next message returns it to ``accepted``).
``threads.question`` and ``threads.input_requested_at`` hold the open question and when it
was asked; ``audit_events.question`` the question of each ``request_input`` row. The new
columns are nullable, so PostgreSQL adds them without rewriting the tables.

Every accept now issues a ``lease_token``, leased or not (docs/api.md, "Leases"): accepted
rows that have none get one here, so a token from before the migration is stale too.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
OLD_STATES = "state in ('pending','accepted','completed','cancelled','declined','failed','expired')"
NEW_STATES = "state in ('pending','accepted','completed','cancelled','declined','failed','expired','input_required')"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_threads_state_valid"), "threads", type_="check")
    op.create_check_constraint(op.f("ck_threads_state_valid"), "threads", NEW_STATES)
    op.add_column("threads", sa.Column("question", sa.Text(), nullable=True))
    op.add_column("threads", sa.Column("input_requested_at", TZ, nullable=True))
    op.add_column("audit_events", sa.Column("question", sa.Text(), nullable=True))
    op.execute(
        "UPDATE threads SET lease_token = replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')"
        " WHERE state = 'accepted' AND lease_token IS NULL"
    )


def downgrade() -> None:
    # A question nobody answered has no older equivalent: the work is accepted again.
    op.execute(
        "UPDATE threads SET state = 'accepted',"
        " lease_expires_at = CASE WHEN lease_seconds IS NULL THEN NULL"
        " ELSE now() + lease_seconds * interval '1 second' END"
        " WHERE state = 'input_required'"
    )
    op.execute("UPDATE threads SET lease_token = NULL WHERE state = 'accepted' AND lease_seconds IS NULL")
    op.drop_column("audit_events", "question")
    op.drop_column("threads", "input_requested_at")
    op.drop_column("threads", "question")
    op.drop_constraint(op.f("ck_threads_state_valid"), "threads", type_="check")
    op.create_check_constraint(op.f("ck_threads_state_valid"), "threads", OLD_STATES)
