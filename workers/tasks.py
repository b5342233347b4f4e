"""Celery tasks: they take ids, not objects, and re-read the rows they need."""

from __future__ import annotations

import uuid

from celery import shared_task

from relay.services import dispatch, maintenance, search, webhooks


@shared_task(name="workers.tasks.purge_idempotency_records")
def purge_idempotency_records() -> int:
    """Delete idempotency records past their 24 h lifetime; return how many."""
    return maintenance.purge_expired_idempotency_records()


@shared_task(name="workers.tasks.index_message", acks_late=True)
def index_message(message_id: str) -> bool:
    """Write one message's search vector (re-reads the row; a missing row is a no-op)."""
    return search.index_message(uuid.UUID(message_id))


@shared_task(name="workers.tasks.message_committed", acks_late=True)
def message_committed(message_id: str, event_id: str) -> int:
    """After a message commits: fan its event out to webhooks first (latency), then index it."""
    created = _fan_out(event_id)
    search.index_message(uuid.UUID(message_id))
    return created


@shared_task(name="workers.tasks.index_pending_messages")
def index_pending_messages() -> int:
    """Index messages whose task was lost (broker outage, killed worker)."""
    total = 0
    while True:
        done = search.index_pending()
        total += done
        if done == 0:
            return total


@shared_task(name="workers.tasks.fan_out_event", acks_late=True)
def fan_out_event(event_id: str) -> int:
    """Create the deliveries of one outbox event and send each."""
    return _fan_out(event_id)


def _fan_out(event_id: str) -> int:
    created = webhooks.fan_out(uuid.UUID(event_id))
    if len(created) == 1:
        # The common case, one endpoint: attempt it here and save a broker round trip
        # (a slow receiver can only delay its own event; retries go through the queue).
        webhooks.deliver(created[0])
        return 1
    for delivery_id in created:
        dispatch.enqueue("workers.tasks.deliver_webhook", str(delivery_id))
    return len(created)


@shared_task(name="workers.tasks.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: str) -> str | None:
    """Make one attempt of a delivery (a no-op unless it is due and unclaimed)."""
    return webhooks.deliver(uuid.UUID(delivery_id))


@shared_task(name="workers.tasks.sweep_outbox")
def sweep_outbox() -> dict:
    """Fan out events never fanned out and send deliveries whose attempt is due.

    This is what makes the outbox lossless: a broker outage or a killed worker delays a
    webhook until the next sweep, never loses it.
    """
    fanned = 0
    for event_id in webhooks.pending_events():
        for delivery_id in webhooks.fan_out(event_id):
            dispatch.enqueue("workers.tasks.deliver_webhook", str(delivery_id))
            fanned += 1
    due = webhooks.due_deliveries()
    for delivery_id in due:
        dispatch.enqueue("workers.tasks.deliver_webhook", str(delivery_id))
    return {"fanned_out": fanned, "due": len(due)}
