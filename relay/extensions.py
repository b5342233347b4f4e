"""Extensions, created unbound and bound in ``create_app`` with ``init_app``."""

from __future__ import annotations

import redis
from flask import current_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


# Services return rows after committing; keep their loaded attributes usable.
db = SQLAlchemy(model_class=Base, session_options={"expire_on_commit": False})


def redis_client() -> redis.Redis:
    """The current app's Redis client for the relay's own keys (short timeouts: a request must not hang on it)."""
    client = current_app.extensions.get("relay_redis")
    if client is None:
        client = redis.Redis.from_url(current_app.config["RELAY"].redis_url, socket_connect_timeout=1, socket_timeout=1)
        current_app.extensions["relay_redis"] = client
    return client
