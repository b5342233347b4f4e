"""Services: one transaction per use case, all business rules; nothing here knows HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2.extensions
from sqlalchemy import func, literal_column
from sqlalchemy.orm import Session

from relay.errors import log_unexpected
from relay.extensions import db
from relay.ids import ISO_SQL_FORMAT

log = logging.getLogger("relay.services")
_AFTER_COMMIT = "relay_after_commit"


def after_commit(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current use case commits; drop it if it rolls back."""
    db.session.info.setdefault(_AFTER_COMMIT, []).append(callback)


@contextmanager
def unit_of_work() -> Iterator[Session]:
    """Yield the session; commit when the block ends cleanly, roll back on any error.

    Callbacks registered with :func:`after_commit` run after a successful commit; a
    failing callback is logged, never raised (the outbox sweep covers what it missed).
    """
    session = db.session
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        session.info.pop(_AFTER_COMMIT, None)
        raise
    for callback in session.info.pop(_AFTER_COMMIT, []):
        try:
            callback()
        except Exception as exc:
            log_unexpected(log, exc, "after-commit callback failed")


@contextmanager
def own_transaction(session: Session) -> Iterator[bool]:
    """Run the block's statements in autocommit if no transaction is open yet; yield whether they do.

    Each statement is then its own transaction: a use case that is one statement (a
    page read, a one-statement write), or reads whose answers need not share one
    snapshot, costs no BEGIN and no COMMIT round trip (psycopg2 sends each apart). A
    block inside an open transaction joins it, committed by :func:`unit_of_work`.
    """
    dbapi = session.connection().connection.dbapi_connection
    alone = dbapi.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    if alone:
        dbapi.autocommit = True
    try:
        yield alone
    finally:
        # A connection cut mid-statement is closed: setting autocommit would raise and
        # hide the outage's own error (a 503) behind an InterfaceError.
        if alone and not dbapi.closed:
            dbapi.autocommit = False


@contextmanager
def statement_cursor(session: Session, *, alone: bool = False) -> Iterator[Any]:
    """Yield a DBAPI cursor on the session's connection, for a hot path's fixed SQL (a
    :class:`relay.services.statements.Statement` run with ``cursor=``, or plain text).

    SQLAlchemy's statement machinery (cache key, compiled lookup, result wrapping) cost
    more per request on these paths than the statements themselves. With ``alone``, see
    :func:`own_transaction`.
    """
    dbapi = session.connection().connection.dbapi_connection
    if alone:
        with own_transaction(session), dbapi.cursor() as cur:
            yield cur
    else:
        with dbapi.cursor() as cur:
            yield cur


def iso_text(column: Any) -> Any:
    """A timestamptz ``column`` as text in the query, formatted as :func:`relay.ids.iso` formats it.

    For pages of rows: psycopg2 building a datetime and Python formatting it cost ten times
    what ``to_char`` costs PostgreSQL. Shape: ``2026-12-01T20:11:07.833036Z``; NULL stays NULL.
    """
    return func.to_char(func.timezone(literal_column("'UTC'"), column), literal_column(f"'{ISO_SQL_FORMAT}'"))
