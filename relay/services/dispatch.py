"""Hand committed work to the Celery workers, by task name (services never import workers).

A failed enqueue (broker down) is logged and left to the beat sweeps, which find the
unindexed messages and unsent events in PostgreSQL (DESIGN.md, transactional outbox).
"""

from __future__ import annotations

import logging
import uuid

from flask import current_app

log = logging.getLogger("relay.dispatch")


def enqueue_later(task_name: str, countdown: float, *args: str) -> None:
    """Send a task to run after ``countdown`` seconds, without retrying the publish.

    A broker outage costs a log line, not the request: the sweeps cover it.
    """
    celery = current_app.extensions.get("celery")
    if celery is None:
        return
    try:
        celery.send_task(task_name, args=list(args), countdown=countdown or None, retry=False)
    except Exception as exc:
        log.warning("enqueue of %s failed (%s); the beat sweep will pick it up", task_name, type(exc).__name__)


def enqueue(task_name: str, *args: str) -> None:
    """Send a task now (see :func:`enqueue_later`)."""
    enqueue_later(task_name, 0, *args)


def message_committed(message_id: uuid.UUID, event_id: uuid.UUID) -> None:
    """Index the committed message for search and fan its event out, in one task (one publish)."""
    enqueue("workers.tasks.message_committed", str(message_id), str(event_id))


def event_committed(event_id: uuid.UUID) -> None:
    """Fan a committed outbox event out to the webhook endpoints."""
    enqueue("workers.tasks.fan_out_event", str(event_id))
