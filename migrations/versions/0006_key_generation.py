"""Key generation: a value that changes whenever any key or agent could stop authenticating

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 15:00:00.000000

Web processes cache authenticated keys (relay/services/agents.py). Each connection
checkout reads ``relay_generations.value`` for 'api_keys' (the same round trip as the
pool's liveness ping), and a cached key is used only while that value is the one it was
cached under. Triggers change it in the same transaction as any revocation, disable,
handle change or deletion, so the change is visible exactly when the revocation is:
no process can serve a revoked key after the revoking transaction commits. Values
come from a sequence, so they never repeat even if the row is deleted and re-created.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "relay_generations",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
    )
    op.execute("CREATE SEQUENCE relay_generation_seq")
    op.execute("INSERT INTO relay_generations (name, value) VALUES ('api_keys', nextval('relay_generation_seq'))")
    op.execute(
        """
        CREATE FUNCTION relay_bump_key_generation() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO relay_generations (name, value) VALUES ('api_keys', nextval('relay_generation_seq'))
            ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
            RETURN NULL;
        END $$
        """
    )
    # last_used_at changes once a minute per key and must not empty every cache: only
    # the columns that decide whether and as whom a key authenticates fire the trigger.
    op.execute(
        "CREATE TRIGGER relay_api_keys_generation AFTER UPDATE OF revoked_at, digest, agent_id ON api_keys "
        "FOR EACH ROW WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at OR OLD.digest IS DISTINCT FROM "
        "NEW.digest OR OLD.agent_id IS DISTINCT FROM NEW.agent_id) EXECUTE FUNCTION relay_bump_key_generation()"
    )
    op.execute(
        "CREATE TRIGGER relay_agents_generation AFTER UPDATE ON agents "
        "FOR EACH ROW WHEN (OLD IS DISTINCT FROM NEW) EXECUTE FUNCTION relay_bump_key_generation()"
    )
    for table in ("api_keys", "agents"):
        op.execute(
            f"CREATE TRIGGER relay_{table}_generation_delete AFTER DELETE OR TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION relay_bump_key_generation()"
        )


def downgrade() -> None:
    for table in ("api_keys", "agents"):
        op.execute(f"DROP TRIGGER relay_{table}_generation_delete ON {table}")
    op.execute("DROP TRIGGER relay_agents_generation ON agents")
    op.execute("DROP TRIGGER relay_api_keys_generation ON api_keys")
    op.execute("DROP FUNCTION relay_bump_key_generation()")
    op.drop_table("relay_generations")
    op.execute("DROP SEQUENCE relay_generation_seq")
