"""Celery tasks: they take ids, not objects, and re-read the rows they need."""

from __future__ import annotations

import logging
import uuid

from celery import shared_task

from relay.services import dispatch, maintenance, search, webhooks

# One INFO line per sweep that did something, none for an idle one (celery's own
# per-sweep lines are filtered out: workers.quiet_sweep_logs).
log = logging.getLogger("relay.beat")


@shared_task(name="workers.tasks.purge_idempotency_records")
def purge_idempotency_records() -> int:
    """Delete idempotency records past their 24 h lifetime; return how many."""
    purged = maintenance.purge_expired_idempotency_records()
    if purged:
        log.info("idempotency sweep: %d expired records purged", purged, extra={"sweep": "purge", "purged": purged})
    maintenance.record_sweep("purge_idempotency_records")
    return purged


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
            break
    if total:
        log.info("index sweep: %d messages indexed", total, extra={"sweep": "index", "indexed": total})
    maintenance.record_sweep("index_pending_messages")
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
    events = webhooks.pending_events()
    fanned = 0
    for event_id in events:
        for delivery_id in webhooks.fan_out(event_id):
            dispatch.enqueue("workers.tasks.deliver_webhook", str(delivery_id))
            fanned += 1
    due = webhooks.due_deliveries()
    for delivery_id in due:
        dispatch.enqueue("workers.tasks.deliver_webhook", str(delivery_id))
    if events or due:
        log.info(
            "outbox sweep: %d events fanned out into %d deliveries, %d due deliveries enqueued",
            len(events),
            fanned,
            len(due),
            extra={"sweep": "outbox", "events": len(events), "fanned_out": fanned, "due": len(due)},
        )
    maintenance.record_sweep("sweep_outbox")
    return {"fanned_out": fanned, "due": len(due)}
