"""Celery tasks: they take ids, not objects, and re-read the rows they need."""

from __future__ import annotations

import logging
import uuid

from celery import shared_task
from flask import current_app

from relay.services import maintenance, search, webhooks
from relay.services import retention as retention_service
from relay.services.delivery import fanout
from relay.services.threads import clock
from workers.delivery import pump_for

# One INFO line per sweep that did something, none for an idle one (celery's own
# per-sweep lines are filtered out: workers.quiet_sweep_logs).
log = logging.getLogger("relay.beat")
PUMP_WAIT_SECONDS = 30


@shared_task(name="workers.tasks.retention")
def retention() -> dict:
    """One retention pass (relay/services/retention.py): partitions ahead, expired ones dropped.

    Returns the pass's report (``PassReport.as_dict()``); the pass logs its own line
    when it did something. Replaces the bulk DELETE of expired idempotency records:
    they go with their partition now.
    """
    report = retention_service.run_pass()
    maintenance.record_sweep("retention")
    return report.as_dict()


@shared_task(name="workers.tasks.index_message", acks_late=True)
def index_message(message_id: str) -> bool:
    """Write one message's search vector (re-reads the row; a missing row is a no-op)."""
    return search.index_message(uuid.UUID(message_id))


@shared_task(name="workers.tasks.message_committed", acks_late=True)
def message_committed(message_id: str, event_id: str) -> None:
    """After a message commits: hand it to this process's webhook pump (fan-out first, then indexing).

    The web does not send this task: relay/services/dispatch.py publishes committed
    messages in batches as :func:`messages_committed` (since commit 663fcb2). It is still
    consumed so that a task published by an older web process during a rolling deploy is
    not lost (docs/decisions.md). Until when: remove it in the first release after the one
    whose deploy has drained every queue of it, i.e. once no web process older than 663fcb2
    runs and the broker holds no ``workers.tasks.message_committed`` task (the package
    carries no release numbers of its own, so the commit names the boundary).

    The pump batches the work of many tasks (workers/delivery.py); if the process dies
    before it is done, the outbox and index sweeps find it in PostgreSQL.
    """
    done = pump_for(current_app).committed(uuid.UUID(message_id), [uuid.UUID(event_id)])
    _wait(done)


@shared_task(name="workers.tasks.messages_committed", acks_late=True)
def messages_committed(pairs: list[list[str]]) -> None:
    """A batch of committed ``[message_id, event_id]`` pairs (relay/services/dispatch.py): as
    :func:`message_committed` for each, acknowledged once the pump has done them all."""
    pump = pump_for(current_app)
    waits = [pump.committed(uuid.UUID(m), [uuid.UUID(e)]) for m, e in pairs]
    for done in waits:
        _wait(done)


def _wait(done) -> None:
    if not done.wait(PUMP_WAIT_SECONDS):
        # The pump is stuck (the database is down): acknowledge anyway; the sweeps redo it.
        logging.getLogger("relay.webhooks.pump").warning(
            "the webhook pump did not finish a task's work in %d s", PUMP_WAIT_SECONDS
        )


@shared_task(name="workers.tasks.index_pending_messages")
def index_pending_messages() -> int:
    """Index messages whose task was lost (broker outage, killed worker); return how many.

    Then rewrite up to ``search.REINDEX_PER_SWEEP`` vectors an older definition of the
    search document wrote, newest first, a batch a transaction (after a migration such as
    0007; none otherwise, and finding none is one read of an empty partial index).
    """
    total = 0
    while True:
        done = search.index_pending()
        total += done
        if done == 0:
            break
    reindexed = 0
    while reindexed < search.REINDEX_PER_SWEEP:
        batch = min(search.REINDEX_BATCH, search.REINDEX_PER_SWEEP - reindexed)
        done = search.reindex_outdated(batch)
        reindexed += done
        if done < batch:  # none left (or some failed and were marked: the next tick goes on)
            break
    if total or reindexed:
        log.info(
            "index sweep: %d messages indexed, %d outdated vectors reindexed",
            total,
            reindexed,
            extra={"sweep": "index", "indexed": total, "reindexed": reindexed},
        )
    maintenance.record_sweep("index_pending_messages")
    return total


@shared_task(name="workers.tasks.fan_out_event", acks_late=True)
def fan_out_event(event_id: str) -> None:
    """Hand one outbox event (a state change, a test event) to this process's webhook pump."""
    _wait(pump_for(current_app).committed(None, [uuid.UUID(event_id)]))


@shared_task(name="workers.tasks.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: str) -> None:
    """Have this process's pump look for due deliveries now, rather than at its next poll.

    relay/services/webhooks.py sends it when deliveries become due outside the pump's own
    schedule (an agent's held deliveries released, a redrive). ``delivery_id`` is not read:
    the pump claims whatever is due, so an empty string is sent when there is no one id.
    It is still sent, so it stays for as long as those callers do.
    """
    pump_for(current_app).poll()


@shared_task(name="workers.tasks.sweep_outbox")
def sweep_outbox() -> dict:
    """Fan out events never fanned out, and have the pump send deliveries whose attempt is due.

    This is what makes the outbox lossless: a broker outage or a killed worker delays a
    webhook until the next sweep, never loses it.
    """
    events = webhooks.pending_events()
    fanned = len(fanout.fan_out_many(events))
    due = webhooks.due_deliveries()
    if fanned or due:
        pump_for(current_app).poll()
    if events or due:
        log.info(
            "outbox sweep: %d events fanned out into %d deliveries, %d due deliveries",
            len(events),
            fanned,
            len(due),
            extra={"sweep": "outbox", "events": len(events), "fanned_out": fanned, "due": len(due)},
        )
    resumed = webhooks.resume_redrives()
    if resumed:
        log.info(
            "outbox sweep: %d bulk redrives queued again", len(resumed), extra={"sweep": "outbox", "redrives": resumed}
        )
    maintenance.record_sweep("sweep_outbox")
    return {"fanned_out": fanned, "due": len(due), "redrives_resumed": len(resumed)}


@shared_task(name="workers.tasks.settle_due")
def settle_due() -> dict:
    """Record lapsed leases (back to pending) and expired handoffs, in batches, until none is due."""
    settled = total = clock.settle_due()
    while settled == clock.SWEEP_BATCH:
        settled = clock.settle_due()
        total += settled
    if total:
        log.info("settle sweep: %d handoffs settled", total, extra={"sweep": "settle_due", "settled": total})
    maintenance.record_sweep("settle_due")
    return {"settled": total}


@shared_task(name="workers.tasks.redrive_job", acks_late=True)
def redrive_job(job_id: str) -> dict | None:
    """Run one bulk redrive to its end (webhooks.run_redrive); its row holds the progress."""
    return webhooks.run_redrive(uuid.UUID(job_id))
