"""Services: one transaction per use case, all business rules; nothing here knows HTTP."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from sqlalchemy.orm import Session

from relay.extensions import db


@contextmanager
def unit_of_work() -> Iterator[Session]:
    """Yield the session; commit when the block ends cleanly, roll back on any error."""
    session = db.session
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
