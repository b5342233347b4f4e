"""A2A push notification configs: webhook endpoints of kind a2a_push, one thread each

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 02:42:55.319974
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "webhook_endpoints", sa.Column("kind", sa.String(length=16), server_default="webhook", nullable=False)
    )
    op.create_check_constraint("kind_valid", "webhook_endpoints", "kind in ('webhook','a2a_push')")
    op.add_column("webhook_endpoints", sa.Column("thread_id", sa.Uuid(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("push_config_id", sa.Text(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("token_encrypted", sa.Text(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("auth_scheme", sa.Text(), nullable=True))
    op.add_column("webhook_endpoints", sa.Column("auth_credentials_encrypted", sa.Text(), nullable=True))
    op.create_unique_constraint(
        "uq_webhook_endpoints_thread_push_config", "webhook_endpoints", ["thread_id", "push_config_id"]
    )
    op.create_foreign_key(
        op.f("fk_webhook_endpoints_thread_id_threads"),
        "webhook_endpoints",
        "threads",
        ["thread_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_check_constraint(
        "push_config_has_thread",
        "webhook_endpoints",
        "(kind = 'a2a_push') = (thread_id IS NOT NULL AND push_config_id IS NOT NULL)",
    )


def downgrade() -> None:
    # Without kind and thread_id a push config would become a webhook hearing every task of
    # its agent: remove them (their deliveries go with them) before the columns.
    op.execute("DELETE FROM webhook_endpoints WHERE kind = 'a2a_push'")
    op.drop_constraint(op.f("ck_webhook_endpoints_push_config_has_thread"), "webhook_endpoints", type_="check")
    op.drop_constraint(op.f("fk_webhook_endpoints_thread_id_threads"), "webhook_endpoints", type_="foreignkey")
    op.drop_constraint("uq_webhook_endpoints_thread_push_config", "webhook_endpoints", type_="unique")
    op.drop_column("webhook_endpoints", "auth_credentials_encrypted")
    op.drop_column("webhook_endpoints", "auth_scheme")
    op.drop_column("webhook_endpoints", "token_encrypted")
    op.drop_column("webhook_endpoints", "push_config_id")
    op.drop_column("webhook_endpoints", "thread_id")
    op.drop_constraint(op.f("ck_webhook_endpoints_kind_valid"), "webhook_endpoints", type_="check")
    op.drop_column("webhook_endpoints", "kind")
