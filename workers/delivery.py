"""The worker's webhook pump: many attempts in flight per worker process, apart from Celery's pool.

Celery tasks only hand ids to the pump of their process (``pump_for``) and return; one
pump thread per process runs the database side in batches (fan out, claim within the
caps, prepare, record, index), and a bounded thread pool of ``RELAY_WEBHOOK_MAX_IN_FLIGHT``
threads makes the HTTP attempts over kept-alive connections (relay/services/outbound.py).
So a slow receiver holds one of those threads, within its endpoint's and its org's caps,
never a Celery process, and never another endpoint's first attempt.

Nothing is lost if the process dies: an event not yet fanned out is found by the next
poll of any pump (or the outbox sweep), a delivery it had claimed is made due by the
first live pump that sees its heartbeat stop (``RELAY_WORKER_STALE``; the lease running
out is the backstop), an unindexed message is found by the index sweep. Every second
the pump also claims what has become due (retries, released claims) and fans out events
whose enqueue was lost (Redis down), so no retry needs a Celery countdown.

Each pump has an id (a row of ``relay_workers``) and a heartbeat thread of its own, apart
from the pump thread, so a long cycle never looks like a death.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from celery.signals import worker_process_shutdown, worker_shutdown
from flask import Flask

from relay.errors import describe, is_outage, log_unexpected
from relay.extensions import db
from relay.services import delivery, outbound, search

log = logging.getLogger("relay.webhooks.pump")

POLL_SECONDS = 1.0
# After a failed cycle (database down), wait this long before the next one.
BACKOFF_SECONDS = 1.0

_pumps: dict[int, Pump] = {}
_pumps_lock = threading.Lock()


class Pump:
    """Fan-out, claims, attempts and records of one app's webhooks in this process."""

    def __init__(self, app: Flask):
        s = app.config["RELAY"]
        self.app, self.settings = app, s
        self.max_in_flight = s.webhook_max_in_flight
        # Pools are per (address, host): endpoints sharing a host share one, so keep as many
        # idle connections to it as attempts may be out at once.
        self.sender = outbound.Sender(per_pool=s.webhook_max_in_flight)
        self.targets = outbound.TargetCache()
        self.pool = ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="relay-webhook")
        self._cond = threading.Condition()
        self._events: list[uuid.UUID] = []
        self._messages: list[uuid.UUID] = []
        self._endpoints: set[uuid.UUID] = set()
        self._results: list[delivery.Result] = []
        self._waiters: list[threading.Event] = []
        self._in_flight = 0
        self._poll = True
        self._stopping = False
        self.worker_id = uuid.uuid4()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay-webhook-pump", daemon=True)
        self._thread.start()
        self._beater = threading.Thread(target=self._beat, name="relay-webhook-heartbeat", daemon=True)
        self._beater.start()

    # -- called by tasks (any thread) --

    def committed(self, message_id: uuid.UUID | None, event_ids: list[uuid.UUID]) -> threading.Event:
        """A message and/or events committed: fan the events out, then index the message.

        Returns an Event set once both are written (the deliveries are then in flight or
        queued behind their endpoint's cap). A task waits on it before it returns, so
        its message is acknowledged only when the work is in PostgreSQL, and a pump that
        falls behind slows the intake instead of queueing without bound.
        """
        done = threading.Event()
        with self._cond:
            self._events.extend(event_ids)
            if message_id is not None:
                self._messages.append(message_id)
            self._waiters.append(done)
            self._cond.notify()
        return done

    def poll(self) -> None:
        """Look for due deliveries now rather than at the next tick."""
        with self._cond:
            self._poll = True
            self._cond.notify()

    def idle(self) -> bool:
        """True when nothing is queued or in flight (tests and shutdown)."""
        with self._cond:
            return not (self._waiters or self._results or self._in_flight)

    def stop(self, timeout: float = 15.0) -> None:
        """Let attempts in flight end (at most ``timeout`` s), record them, and stop."""
        deadline = time.monotonic() + timeout
        while not self.idle() and time.monotonic() < deadline:
            with self._cond:
                self._cond.notify()
            time.sleep(0.02)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._stopped.set()
        self._thread.join(max(0.1, deadline - time.monotonic()))
        self._beater.join(max(0.1, deadline - time.monotonic()))
        self._leave()
        with self._cond:  # what is left is in PostgreSQL; the sweeps finish it
            for done in self._waiters:
                done.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.sender.close()

    # -- the heartbeat thread --

    def _beat(self) -> None:
        """Heartbeat every RELAY_WORKER_HEARTBEAT s; reap dead pumps once ours has held for RELAY_WORKER_STALE s."""
        s = self.settings
        hostname, pid = socket.gethostname(), os.getpid()
        healthy_since: float | None = None
        with self.app.app_context():
            while not self._stopped.is_set():
                now = time.monotonic()
                # Only a pump whose own heartbeats have gone through for a whole stale
                # period may call another dead: after an outage every pump's heartbeat
                # is old, and none must reap the others before they have written again.
                reap = s.worker_stale if healthy_since is not None and now - healthy_since >= s.worker_stale else None
                try:
                    released = delivery.heartbeat(self.worker_id, hostname, pid, reap)
                except Exception as exc:
                    healthy_since = None
                    log.warning("worker heartbeat failed (%s)", type(exc).__name__)
                else:
                    if healthy_since is None:
                        healthy_since = now
                    if released:
                        with self._cond:  # claim them now rather than at the next poll
                            self._endpoints |= set(released)
                            self._cond.notify()
                finally:
                    db.session.remove()
                self._stopped.wait(s.worker_heartbeat)

    def _leave(self) -> None:
        with self.app.app_context():
            try:
                delivery.leave(self.worker_id)
            except Exception as exc:  # the database is down: the others reap this pump when it is back
                log.warning("could not remove the worker's heartbeat row (%s)", type(exc).__name__)
            finally:
                db.session.remove()

    # -- the pump thread --

    def _take(self):
        with self._cond:
            deadline = self._next_poll
            while not (self._stopping or self._waiters or self._results or self._poll):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._poll = True
                    break
                self._cond.wait(left)
            work = (self._events, self._messages, self._results, self._poll)
            self._events, self._messages, self._results, self._poll = [], [], [], False
            wanting, self._endpoints = self._endpoints, set()
            waiters, self._waiters = self._waiters, []
            budget = self.max_in_flight - self._in_flight
            return work, wanting, waiters, budget

    def _run(self) -> None:
        self._next_poll = 0.0
        with self.app.app_context():
            while not self._stopping:
                (events, messages, results, poll), wanting, waiters, budget = self._take()
                if self._stopping and not results:
                    break
                try:
                    self._cycle(events, messages, results, poll, wanting, budget)
                except Exception as exc:
                    what = f"webhook pump cycle failed; retrying in {BACKOFF_SECONDS:g} s"
                    if is_outage(exc):  # PostgreSQL or Redis away: expected, not a bug
                        log.warning("%s: %s", what, describe(exc)["error_class"], extra=describe(exc))
                    else:
                        log_unexpected(log, exc, what)
                    with self._cond:  # keep the work: results unrecorded would be sent again
                        self._events[:0], self._messages[:0], self._results[:0] = events, messages, results
                        self._waiters[:0] = waiters
                        self._endpoints |= wanting
                    time.sleep(BACKOFF_SECONDS)
                else:
                    for done in waiters:
                        done.set()
                finally:
                    db.session.remove()

    def _cycle(self, events, messages, results, poll, wanting, budget) -> None:
        if poll:
            self._next_poll = time.monotonic() + POLL_SECONDS
        # One transaction: record what ended (each freed a slot of its endpoint), fan out
        # the new events, claim within the caps and the budget, read the payloads.
        prepared, again = delivery.cycle(results, events, wanting, poll, budget, worker=self.worker_id)
        if again:
            with self._cond:  # the budget ran out before the work did
                self._endpoints |= again
        self._send(prepared)
        if messages:
            search.index_messages(messages)

    def _send(self, prepared: list[delivery.Outgoing]) -> None:
        with self._cond:
            self._in_flight += len(prepared)
        for p in prepared:
            self.pool.submit(self._attempt, p)

    def _attempt(self, prepared: delivery.Outgoing) -> None:
        try:
            result = delivery.attempt(prepared, self.sender, self.targets, self.settings)
        except Exception as exc:  # a bug, not the receiver: record it rather than hold the lease
            facts = log_unexpected(log, exc, "webhook attempt crashed")
            outcome = outbound.Outcome(None, facts["error_class"], None, 0)
            result = delivery.Result(prepared.claimed, datetime.now(UTC), outcome, prepared.attempt)
        with self._cond:
            self._in_flight -= 1
            self._results.append(result)
            self._cond.notify()


def pump_for(app: Flask) -> Pump:
    """The pump of ``app`` in this process, started on first use (after any fork)."""
    app = getattr(app, "_get_current_object", lambda: app)()  # current_app is a proxy
    key = id(app)
    pump = _pumps.get(key)
    if pump is None:
        with _pumps_lock:
            pump = _pumps.get(key)
            if pump is None:
                pump = _pumps[key] = Pump(app)
    return pump


def stop_pumps(celery_app=None, timeout: float = 15.0) -> None:
    """Stop this process's pumps (those of ``celery_app``'s Flask app, or all)."""
    with _pumps_lock:
        chosen = [
            (key, pump)
            for key, pump in _pumps.items()
            if celery_app is None or pump.app.extensions.get("celery") is celery_app
        ]
        for key, _pump in chosen:
            del _pumps[key]
    for _key, pump in chosen:
        pump.stop(timeout)


@worker_shutdown.connect
def _on_worker_shutdown(sender=None, **_kwargs) -> None:
    stop_pumps(getattr(sender, "app", None))


@worker_process_shutdown.connect
def _on_worker_process_shutdown(**_kwargs) -> None:
    # A prefork child: its pumps (started after the fork) end with it.
    stop_pumps(timeout=5.0)
