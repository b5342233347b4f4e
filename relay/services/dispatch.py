"""Hand committed work to the Celery workers, by task name (services never import workers).

A failed enqueue (broker down) is logged and left to the beat sweeps, which find the
unindexed messages and unsent events in PostgreSQL (a transactional outbox: ARCHITECTURE.md).

Wake-ups for waiting requests ride the same batches, as one Redis ``PUBLISH`` each.

Committed messages are published in batches: a Celery publish costs 0.7-0.9 ms of CPU
(kombu builds a Redis client and the message each time), so each process publishes at
most once per ``BATCH_SECONDS``: a message committed when the process has not published
for that long goes out at once, and the messages committed after it wait for the next
publish (or ``MAX_BATCH`` of them), as one ``messages_committed`` task. Wake-ups do not
wait for the batch: they go out ``LINGER_SECONDS`` after they are added. Nothing is kept
that PostgreSQL does not also hold: a batch lost with its process is found by the sweeps,
as a failed publish is.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid
from collections.abc import Iterable

import redis
from flask import Flask, current_app

from relay.services import wakeup

log = logging.getLogger("relay.dispatch")

# How long a publisher waits for more wake-ups after the first: a little latency for fewer
# PUBLISHes under load.
LINGER_SECONDS = 0.002
# The least time between two publishes of one process: at 235 sends/s a worker, publishing
# every 20 ms (a batch of five) was 8% of the web CPU; every 50 ms is a third of that. A
# message waits that long at most (webhooks and indexing start that much later), and not
# at all when the process has not published for that long.
BATCH_SECONDS = 0.05
MAX_BATCH = 500


def enqueue_later(task_name: str, countdown: float, *args, celery=None) -> None:
    """Send a task to run after ``countdown`` seconds, without retrying the publish.

    A broker outage costs a log line, not the request: the sweeps cover it.
    """
    celery = celery or current_app.extensions.get("celery")
    if celery is None:
        return
    try:
        celery.send_task(task_name, args=list(args), countdown=countdown or None, retry=False)
    except Exception as exc:
        log.warning("enqueue of %s failed (%s); the beat sweep will pick it up", task_name, type(exc).__name__)


def enqueue(task_name: str, *args) -> None:
    """Send a task now (see :func:`enqueue_later`)."""
    enqueue_later(task_name, 0, *args)


class _Publisher:
    """One app's batches of committed messages and wake-ups, published by one background thread."""

    def __init__(self, app: Flask):
        self.celery = app.extensions.get("celery")
        settings = app.config["RELAY"]
        self.redis = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=1, socket_timeout=1)
        self.channel = wakeup.channel(settings.database_url)
        self._cond = threading.Condition()
        self._pending: list[list[str]] = []
        self._batch_due = 0.0  # monotonic time the oldest pending message's batch is due
        self._published_at = float("-inf")  # monotonic time of the last batch published
        self._wake: set[uuid.UUID] = set()
        self._thread: threading.Thread | None = None
        atexit.register(self.flush)

    def add(self, message_id: uuid.UUID | None, event_id: uuid.UUID | None, wake: Iterable[uuid.UUID] = ()) -> None:
        with self._cond:
            if message_id is not None:
                if not self._pending:  # due at once, unless a batch went out less than BATCH_SECONDS ago
                    self._batch_due = max(time.monotonic(), self._published_at + BATCH_SECONDS)
                self._pending.append([str(message_id), str(event_id)])
            self._wake.update(wake)
            if self._thread is None or not self._thread.is_alive():  # first use, or after a fork
                self._thread = threading.Thread(target=self._run, name="relay-publisher", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _take(self, batch_too: bool = True) -> tuple[list[list[str]], set[uuid.UUID]]:
        with self._cond:
            batch: list[list[str]] = []
            if batch_too:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                if batch:
                    self._published_at = time.monotonic()
                    self._batch_due = self._published_at + BATCH_SECONDS  # for what is left past MAX_BATCH
            wake, self._wake = self._wake, set()
            return batch, wake

    def _batch_is_due(self) -> bool:
        return bool(self._pending) and (len(self._pending) >= MAX_BATCH or time.monotonic() >= self._batch_due)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wake and not self._batch_is_due():
                    self._cond.wait(max(0.0, self._batch_due - time.monotonic()) if self._pending else None)
            time.sleep(LINGER_SECONDS)
            with self._cond:
                due = self._batch_is_due()
            self._publish(*self._take(batch_too=due))

    def _publish(self, batch: list[list[str]], wake: set[uuid.UUID]) -> None:
        if wake:  # first: a waiting client is the one who sees latency
            try:
                self.redis.publish(self.channel, wakeup.encode(wake))
            except redis.RedisError as exc:
                log.warning("wake-up publish failed (%s); waiters re-check within four ticks", type(exc).__name__)
        if batch:
            enqueue_later("workers.tasks.messages_committed", 0, batch, celery=self.celery)

    def flush(self) -> None:
        """Publish what is gathered now (at exit: a CLI process must not take its batch with it)."""
        while True:
            batch, wake = self._take()
            if not batch and not wake:
                return
            self._publish(batch, wake)


_publishers_lock = threading.Lock()


def _publisher() -> _Publisher:
    app = current_app._get_current_object()
    publisher = app.extensions.get("relay_publisher")
    if publisher is None:
        with _publishers_lock:
            publisher = app.extensions.setdefault("relay_publisher", _Publisher(app))
    return publisher


def message_committed(message_id: uuid.UUID, event_id: uuid.UUID, participants: Iterable[uuid.UUID] = ()) -> None:
    """Index the committed message for search and fan its event out (in the next batch's task),
    and wake the requests waiting on the ``participants``' feeds (services/wakeup.py)."""
    _publisher().add(message_id, event_id, participants)


def wake(agent_ids: Iterable[uuid.UUID]) -> None:
    """Wake the requests waiting on these agents' feeds (after a commit that changes what they may read)."""
    _publisher().add(None, None, agent_ids)


def event_committed(event_id: uuid.UUID, participants: Iterable[uuid.UUID] = ()) -> None:
    """Fan a committed outbox event out to the webhook endpoints; wake the ``participants``' waiters."""
    if participants:
        _publisher().add(None, None, participants)
    enqueue("workers.tasks.fan_out_event", str(event_id))
