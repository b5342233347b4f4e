"""Celery tasks: they take ids, not objects, and re-read the rows they need."""
from __future__ import annotations

from celery import shared_task

from relay.services import maintenance


@shared_task(name="workers.tasks.purge_idempotency_records")
def purge_idempotency_records() -> int:
    """Delete idempotency records past their 24 h lifetime; return how many."""
    return maintenance.purge_expired_idempotency_records()
