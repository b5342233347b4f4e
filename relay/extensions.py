"""Extensions, created unbound and bound in ``create_app`` with ``init_app``."""

from __future__ import annotations

import logging
import select

import psycopg2
import psycopg2.extras
import redis
from flask import current_app, g, has_request_context
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Engine, MetaData, event, exc
from sqlalchemy.orm import DeclarativeBase

from relay.encoding import loads
from relay.errors import describe

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
    error handler, and gunicorn would answer its own 500 after the app's 503 (a ``/readyz``
    during a crash). The session is discarded either way and the pool
    replaces the connection (checkout ping), so the error is only logged.
    """

    def _teardown_session(self, exc: BaseException | None) -> None:
        try:
            super()._teardown_session(exc)
        except Exception as exc:
            facts = describe(exc)  # the class only: a failed statement's text may quote a row
            logging.getLogger("relay.db").warning(
                "session teardown failed; connection discarded: %s", facts["error_class"], extra=facts
            )
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


# The pool's liveness check, with no round trip: an idle PostgreSQL connection has nothing
# to read, so a socket that polls readable has been closed by the server (a restart, a
# terminated backend, a pooler that went away) or holds its FATAL goodbye. That is the
# pessimistic disconnect handling SQLAlchemy documents for a custom ping: a "checkout"
# listener that raises DisconnectionError, so the pool discards the connection and
# retries with a new one. It reads nothing from the server, so a checkout costs no round
# trip: the key generation is checked in the request's first statement instead
# (GuardedCursor below; docs/decisions.md, "The pool's liveness check is the socket").
try:
    from gevent.monkey import get_original

    _select = get_original("select", "select")  # a zero timeout never yields: the unpatched call
except ImportError:  # pragma: no cover - gevent is a dependency
    _select = select.select


def _check_alive(dbapi_connection, record, proxy) -> None:
    try:
        closed = dbapi_connection.closed or bool(_select([dbapi_connection.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg2.InterfaceError) as e:
        raise exc.DisconnectionError() from e
    if closed:
        raise exc.DisconnectionError("the server closed the connection while it was idle in the pool")


def _use_guarded_cursors(dbapi_connection, record) -> None:
    dbapi_connection.cursor_factory = GuardedCursor


def install_checkout_ping(engine: Engine) -> None:
    """Check every connection's socket on checkout, and give every cursor the key guard (once per engine)."""
    if not event.contains(engine, "checkout", _check_alive):
        event.listen(engine, "checkout", _check_alive)
        event.listen(engine, "connect", _use_guarded_cursors)


# --- the key generation guard (migration 0018) ---------------------------------------

_GUARD = "_relay_key_guard"
KEY_GENERATION_MOVED = "RL001"  # relay_check_key_generation's SQLSTATE


class KeyGenerationMoved(BaseException):
    """The key generation a cached key was trusted under moved before the request's first statement.

    Raised in place of the statement's result (the statement did not run). A
    BaseException, like GreenletExit, so that no ``except Exception`` between the
    statement and the view turns it into an answer: the view wrapper
    (relay.transport.auth) forgets the cached key and runs the view once more.
    """


def expect_key_generation(generation: int) -> None:
    """Have this request's first statement check that the 'api_keys' generation is still ``generation``."""
    setattr(g, _GUARD, int(generation))


def take_key_guard() -> str | None:
    """The guard statement this request still owes (and forget it), or None.

    Shape: ``"SELECT relay_check_key_generation(42); "``, sent ahead of a statement in the
    same query message. None outside a request or once a statement carried it.
    """
    if not has_request_context():
        return None
    generation = g.pop(_GUARD, None)
    return None if generation is None else f"SELECT relay_check_key_generation({generation}); "


def key_guard_pending() -> bool:
    """True while this request was served from the key cache and has run no statement yet."""
    return has_request_context() and _GUARD in g


class GuardedCursor(psycopg2.extensions.cursor):
    """A psycopg2 cursor that prefixes the request's owed key guard to its first statement.

    psycopg2 sends a query with its parameters merged in, as one simple-protocol message;
    two statements in one message run in one implicit transaction, so when the guard
    raises (SQLSTATE RL001) the statement after it never runs, and
    :class:`KeyGenerationMoved` is raised instead.
    """

    def execute(self, query, vars=None):
        guard = take_key_guard()
        if guard is None:
            return super().execute(query, vars)
        if isinstance(query, bytes):
            query = guard.encode() + query
        else:
            query = guard + (query if isinstance(query, str) else query.as_string(self))
        return _moved_is_raised(super().execute, query, vars)

    def executemany(self, query, vars_list):
        guard = take_key_guard()
        if guard is not None:
            _moved_is_raised(super().execute, guard)
        return super().executemany(query, vars_list)


def _moved_is_raised(execute, *args):
    try:
        return execute(*args)
    except psycopg2.Error as e:
        if e.pgcode == KEY_GENERATION_MOVED:
            raise KeyGenerationMoved() from None
        raise
