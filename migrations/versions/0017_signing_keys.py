"""signing keys: the keys that sign the A2A agent cards (JWS), published as a JWK Set

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 10:00:00.000000

``signing_keys`` holds one row per card-signing key (relay/services/signing.py): its
``kid``, algorithm (ES256 or EdDSA), public JWK, the private key encrypted under
``RELAY_SECRET_KEY`` (as the webhook secrets are), and when it was retired. Every
unretired key signs every card; a retired one stays in ``/.well-known/jwks.json`` for
``RELAY_SIGNING_KEY_GRACE_DAYS``. A few rows: no index past the primary key.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(length=64), nullable=False),
        sa.Column("alg", sa.String(length=16), nullable=False),
        sa.Column("public_jwk", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("private_key_encrypted", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("alg IN ('ES256', 'EdDSA')", name=op.f("ck_signing_keys_alg_known")),
        sa.PrimaryKeyConstraint("kid", name=op.f("pk_signing_keys")),
    )


def downgrade() -> None:
    op.drop_table("signing_keys")
