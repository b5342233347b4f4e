"""Hand committed work to the Celery workers, by task name (services never import workers).

A failed enqueue (broker down) is logged and left to the beat sweeps, which find the
unindexed messages and unsent events in PostgreSQL (DESIGN.md, transactional outbox).
"""
from __future__ import annotations

import logging
import uuid

from flask import current_app

log = logging.getLogger("relay.dispatch")


def enqueue(task_name: str, *args: str) -> None:
    """Send a task without retrying; a broker outage costs a log line, not the request."""
    celery = current_app.extensions.get("celery")
    if celery is None:
        return
    try:
        celery.send_task(task_name, args=list(args), retry=False)
    except Exception as exc:
        log.warning("enqueue of %s failed (%s); the beat sweep will pick it up", task_name, type(exc).__name__)


def message_committed(message_id: uuid.UUID, event_id: uuid.UUID) -> None:
    """Index the committed message for search."""
    enqueue("workers.tasks.index_message", str(message_id))
