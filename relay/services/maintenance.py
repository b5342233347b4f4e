"""Housekeeping use cases run by Celery beat."""

from __future__ import annotations

from sqlalchemy import delete, func

from relay.models import IdempotencyRecord
from relay.services import unit_of_work


def purge_expired_idempotency_records() -> int:
    """Delete idempotency records whose ``expires_at`` has passed; return the count.

    Keys are kept 24 hours (DESIGN.md, "Idempotency").
    """
    with unit_of_work() as session:
        result = session.execute(delete(IdempotencyRecord).where(IdempotencyRecord.expires_at < func.now()))
    return result.rowcount or 0
