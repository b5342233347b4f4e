"""Extensions, created unbound and bound in ``create_app`` with ``init_app``."""

from __future__ import annotations

import logging

import psycopg2
import psycopg2.extras
import redis
from flask import current_app
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Engine, MetaData, event, exc
from sqlalchemy.orm import DeclarativeBase

from relay.encoding import loads

# json and jsonb columns (message parts, artifacts, metadata) parsed with orjson where it
# reads the same value: parsing them with json was a tenth of a feed page's CPU. Global:
# every connection of every process (web, worker, tools) reads them alike.
psycopg2.extras.register_default_json(globally=True, loads=loads)
psycopg2.extras.register_default_jsonb(globally=True, loads=loads)

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class RelaySQLAlchemy(SQLAlchemy):
    """Flask-SQLAlchemy whose end-of-request teardown never raises.

    ``session.remove()`` rolls back the request's transaction; when PostgreSQL went away
    mid-request that rollback raises (OperationalError on a dead socket) outside every
    error handler, and gunicorn answered its own 500 after the app's 503 (issue 28: a
    ``/readyz`` during a crash). The session is discarded either way and the pool
    replaces the connection (checkout ping), so the error is only logged.
    """

    def _teardown_session(self, exc: BaseException | None) -> None:
        try:
            super()._teardown_session(exc)
        except Exception:
            logging.getLogger("relay.db").warning("session teardown failed; connection discarded", exc_info=True)
            try:
                self.session.registry.clear()  # drop the broken session so the next request gets a new one
            except Exception:
                pass


# Services return rows after committing; keep their loaded attributes usable.
db = RelaySQLAlchemy(model_class=Base, session_options={"expire_on_commit": False})


def redis_client() -> redis.Redis:
    """The current app's Redis client for the relay's own keys (short timeouts: a request must not hang on it)."""
    client = current_app.extensions.get("relay_redis")
    if client is None:
        client = redis.Redis.from_url(current_app.config["RELAY"].redis_url, socket_connect_timeout=1, socket_timeout=1)
        current_app.extensions["relay_redis"] = client
    return client


# The pool's liveness ping, and the key generation read in the same round trip
# (migration 0006): the pessimistic disconnect handling SQLAlchemy documents for a
# custom ping, a "checkout" listener that raises DisconnectionError so the pool
# discards the connection and retries with a new one.
_GENERATION_SQL = "SELECT value FROM relay_generations WHERE name = 'api_keys'"
KEY_GENERATION = "relay_key_generation"


def _ping_and_read_generation(dbapi_connection, record, proxy) -> None:
    try:
        # In autocommit: one round trip, and no transaction left open (psycopg2 would
        # send BEGIN first, and the request's own statements may not want one).
        dbapi_connection.autocommit = True
        try:
            with dbapi_connection.cursor() as cur:
                cur.execute(_GENERATION_SQL)
                row = cur.fetchone()
        finally:
            dbapi_connection.autocommit = False
        record.info[KEY_GENERATION] = row[0] if row else None
    except (psycopg2.OperationalError, psycopg2.InterfaceError) as e:
        raise exc.DisconnectionError() from e
    except psycopg2.Error:
        # No such table yet (a database before migration 0006): no generation, so no
        # key is served from a cache.
        record.info[KEY_GENERATION] = None


def install_checkout_ping(engine: Engine) -> None:
    """Ping every connection on checkout and note the key generation on it (once per engine)."""
    if not event.contains(engine, "checkout", _ping_and_read_generation):
        event.listen(engine, "checkout", _ping_and_read_generation)


def key_generation() -> int | None:
    """The key generation read when the current session's connection was checked out, or None."""
    return db.session.connection().connection.info.get(KEY_GENERATION)
