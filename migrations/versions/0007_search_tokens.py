"""messages.search_version: which definition of the search document wrote search_vector

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 09:00:00.000000

The search document now also indexes the parts of paths, URLs, dotted names and
identifiers in the body (relay.services.search, version 2). Existing vectors are not
rewritten here: that would update every message in this transaction, holding its row
locks and writing the whole table's WAL at once. Instead the column is added (nullable,
no default: a catalog change only) and the beat sweep reindexes the rows whose vector is
older, a batch per tick, newest first, by the indexing path new rows take. Until a row
is reindexed its old vector still finds it by every whole token, as before.

The partial index that finds those rows is built CONCURRENTLY (outside the migration's
transaction), so writes to messages are not blocked while it is built.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Fixed here as it was when this revision was written (relay.models.SEARCH_VERSION may move on).
STALE = "search_vector IS NOT NULL AND index_error IS NULL AND coalesce(search_version, 1) < 2"


def upgrade() -> None:
    op.add_column("messages", sa.Column("search_version", sa.SmallInteger(), nullable=True))
    with op.get_context().autocommit_block():
        # A build that failed half-way leaves an INVALID index of this name behind.
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_messages_stale_vector")
        op.create_index(
            "ix_messages_stale_vector",
            "messages",
            ["created_at"],
            postgresql_where=sa.text(STALE),
            postgresql_concurrently=True,
        )


def downgrade() -> None:
    # Vectors written by version 2 are a superset of version 1's: the older code searches them as before.
    op.drop_index("ix_messages_stale_vector", table_name="messages")
    op.drop_column("messages", "search_version")
