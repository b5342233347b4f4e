"""Alembic environment: the URL comes from the caller's Config or ``DATABASE_URL``."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

import relay.models  # noqa: F401  (registers the tables on Base.metadata)
from relay.config import normalize_database_url
from relay.extensions import Base
from relay.models import is_partition

config = context.config


def include_name(name, type_, parent_names) -> bool:
    """Leave the time partitions out of autogenerate: retention makes and drops them."""
    return not (type_ == "table" and name is not None and is_partition(name))


target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL is not set")
    return normalize_database_url(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, compare_type=True, include_name=include_name
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
