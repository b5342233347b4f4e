"""Services: one transaction per use case, all business rules; nothing here knows HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2.extensions
from sqlalchemy.orm import Session

from relay.extensions import db

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
        except Exception:
            log.exception("after-commit callback failed")


@contextmanager
def statement_cursor(session: Session, *, own_transaction: bool = False) -> Iterator[Any]:
    """Yield a DBAPI cursor on the session's connection, for a hot path's fixed SQL.

    With ``own_transaction`` and no transaction open on the connection yet, each statement
    runs in autocommit: it is its own transaction, so a use case that is one statement (or
    one read and then one statement) costs no BEGIN and no COMMIT round trip. Otherwise
    the statements join the session's transaction, committed by :func:`unit_of_work`.
    SQLAlchemy's statement machinery (cache key, compiled lookup, result wrapping) cost
    more per request on these paths than the statements themselves.
    """
    dbapi = session.connection().connection.dbapi_connection
    alone = own_transaction and dbapi.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    if alone:
        dbapi.autocommit = True
    try:
        with dbapi.cursor() as cur:
            yield cur
    finally:
        if alone:
            dbapi.autocommit = False
