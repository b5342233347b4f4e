"""Run the Alembic migrations shipped in the ``migrations`` package."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config


def alembic_config(database_url: str) -> Config:
    """Return an Alembic Config for ``database_url`` (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(files("migrations")))
    cfg.attributes["database_url"] = database_url
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Migrate the database to ``revision``; a no-op when it is already there."""
    command.upgrade(alembic_config(database_url), revision)
