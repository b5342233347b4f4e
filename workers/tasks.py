"""Celery tasks: they take ids, not objects, and re-read the rows they need."""
from __future__ import annotations

import uuid

from celery import shared_task

from relay.services import maintenance, search


@shared_task(name="workers.tasks.purge_idempotency_records")
def purge_idempotency_records() -> int:
    """Delete idempotency records past their 24 h lifetime; return how many."""
    return maintenance.purge_expired_idempotency_records()


@shared_task(name="workers.tasks.index_message", acks_late=True)
def index_message(message_id: str) -> bool:
    """Write one message's search vector (re-reads the row; a missing row is a no-op)."""
    return search.index_message(uuid.UUID(message_id))


@shared_task(name="workers.tasks.index_pending_messages")
def index_pending_messages() -> int:
    """Index messages whose task was lost (broker outage, killed worker)."""
    total = 0
    while True:
        done = search.index_pending()
        total += done
        if done == 0:
            return total
