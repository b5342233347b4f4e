"""key generation guard: a request served from the key cache checks the generation in its first statement

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 10:00:00.000000

Until now each connection checkout read ``relay_generations`` (migration 0006) in the
pool's ping, a round trip of its own on every request. ``relay_check_key_generation(g)``
raises SQLSTATE ``RL001`` when the 'api_keys' generation is no longer ``g``; the web
process sends ``SELECT relay_check_key_generation(g);`` ahead of the first statement a
request served from the key cache runs, in the same query message, so the check costs no
round trip and the statement does not run when it fails (relay/extensions.py,
``GuardedCursor``; docs/decisions.md, "Authenticated keys are cached per process").
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        """
        CREATE FUNCTION relay_check_key_generation(expected bigint) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM relay_generations WHERE name = 'api_keys' AND value = expected) THEN
                RAISE EXCEPTION 'the key generation is no longer %', expected USING ERRCODE = 'RL001';
            END IF;
        END $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION relay_check_key_generation(bigint)")
