"""Services: one transaction per use case, all business rules; nothing here knows HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

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
