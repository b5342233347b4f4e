"""Celery bound to the Flask app the way Flask's Celery pattern does it."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from celery import Celery, Task
from celery import current_app as current_celery_app
from celery.beat import PersistentScheduler
from celery.signals import worker_ready
from flask import Flask

from relay.errors import DATABASE_ERRORS, log_unexpected

log = logging.getLogger("relay.beat")
task_log = logging.getLogger("relay.tasks")


class TaskFailed(Exception):
    """A task's database error, as Celery logs it: the class and SQLSTATE, never the error's text."""


#: The periodic sweeps (task names); each logs its own line, and only when it did something.
SWEEP_TASKS = frozenset(
    {
        "workers.tasks.retention",
        "workers.tasks.index_pending_messages",
        "workers.tasks.sweep_outbox",
        "workers.tasks.settle_due",
    }
)
#: Tasks run once per message or event: the worker's "received"/"succeeded" lines for them
#: would be two log lines per message saying nothing the pump's "webhook attempt" line does not.
PER_MESSAGE_TASKS = frozenset(
    {
        "workers.tasks.message_committed",
        "workers.tasks.messages_committed",
        "workers.tasks.fan_out_event",
        "workers.tasks.deliver_webhook",
    }
)


def celery_init_app(app: Flask) -> Celery:
    """Create the Celery app whose tasks run inside ``app``'s application context."""

    class FlaskTask(Task):
        def __call__(self, *args, **kwargs):
            with app.app_context():
                try:
                    return self.run(*args, **kwargs)
                except DATABASE_ERRORS as exc:
                    # Celery logs a failed task with its exception's text, which for a
                    # database error holds the statement's failing row (message bodies):
                    # it sees only the class and SQLSTATE, logged here with the frames.
                    facts = log_unexpected(task_log, exc, f"task {self.name} failed", task_id=self.request.id)
                    raise TaskFailed(" ".join(filter(None, (facts["error_class"], facts.get("pgcode"))))) from None

    settings = app.config["RELAY"]
    celery_app = Celery(app.name, task_cls=FlaskTask)
    celery_app.config_from_object(
        {
            "broker_url": settings.redis_url,
            "task_ignore_result": True,
            "task_acks_late": True,
            "task_reject_on_worker_lost": True,
            "worker_prefetch_multiplier": 1,
            "broker_connection_retry_on_startup": True,
            # A send must not hang when the broker is down: the outbox sweep covers it.
            "broker_transport_options": {
                "socket_connect_timeout": 2,
                "socket_timeout": 5,
                "max_retries": 1,
                "interval_start": 0,
                "interval_step": 0,
            },
            "beat_schedule": beat_schedule(),
            # beat must start whatever --schedule (RELAY_HOME) names: see RelayScheduler.
            "beat_scheduler": "workers:RelayScheduler",
            "include": ["workers.tasks"],
            # Keep the app's JSON log lines (with their extra fields) in worker processes too.
            "worker_hijack_root_logger": False,
            # ... and keep stdout the real stdout, which that handler writes to.
            "worker_redirect_stdouts": False,
        }
    )
    celery_app.set_default()
    worker_ready.connect(queue_retention_pass, sender=None, weak=False, dispatch_uid="relay-retention-at-start")

    def start_pump(sender=None, **_kwargs) -> None:
        # The pump heartbeats, polls and reaps from the worker's start, not from its first
        # task: a worker started while Redis is down still delivers what PostgreSQL holds.
        if sender is None or getattr(sender, "app", None) is celery_app:
            from workers.delivery import pump_for

            pump_for(app)

    worker_ready.connect(start_pump, sender=None, weak=False, dispatch_uid=f"relay-pump-at-start-{id(celery_app)}")
    app.extensions["celery"] = celery_app
    quiet_sweep_logs()
    return celery_app


def beat_schedule() -> dict:
    """Return the periodic sweeps run by ``celery beat``."""
    return {
        # Partitions ahead and expired ones dropped (relay/services/retention.py); each
        # worker also queues one pass when it starts (queue_retention_pass).
        "retention": {"task": "workers.tasks.retention", "schedule": 3600.0},
        "index-pending-messages": {"task": "workers.tasks.index_pending_messages", "schedule": 10.0},
        "sweep-outbox": {"task": "workers.tasks.sweep_outbox", "schedule": 3.0},
        # Lapsed leases and expired handoffs recorded, with their webhooks, within 15 s
        # (docs/decisions.md, "The work lifecycle"); reads and transitions see them at once without it.
        "settle-due": {"task": "workers.tasks.settle_due", "schedule": 5.0},
    }


def queue_retention_pass(sender=None, **_kwargs) -> None:
    """On a worker's start, queue one retention pass, so a fresh deploy has its partitions ahead
    without waiting up to an hour for beat. Only enqueues (beat and web never run it)."""
    try:
        (sender.app if sender is not None else current_celery_app).send_task("workers.tasks.retention")
    except Exception as exc:  # the broker is down: beat's hourly entry still runs it
        log.warning("could not queue the start-up retention pass (%s)", type(exc).__name__)


class _MemorySchedule(dict):
    """Stands in for the shelve file when it cannot be written: same calls, nothing kept."""

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class RelayScheduler(PersistentScheduler):
    """celery beat's file-backed schedule that always starts.

    The Procfile puts the file in ``$RELAY_HOME``, which may not exist yet (celery's own
    scheduler then exits with FileNotFoundError and no sweep ever runs): its folder is
    created first. When it still cannot be written (a read-only disk, a file in the way)
    the schedule is kept in memory, with a warning: the sweeps still run, and a restart
    only restarts their intervals.
    """

    _in_memory = False

    def _open_schedule(self):
        if self._in_memory:
            return _MemorySchedule()
        return super()._open_schedule()

    def setup_schedule(self) -> None:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.schedule_filename)), exist_ok=True)
            super().setup_schedule()
        except OSError as exc:
            log.warning(
                "beat: cannot write the schedule file %s (%s: %s); keeping the schedule in memory",
                self.schedule_filename,
                type(exc).__name__,
                exc,
            )
            self._in_memory = True
            super().setup_schedule()


def _is_routine_sweep_line(record: logging.LogRecord) -> bool:
    """False for celery's INFO lines about a sweep (sent, received, succeeded); True otherwise."""
    if record.levelno > logging.INFO:
        return True  # warnings and errors (a failed send or sweep) always pass
    args = record.args
    if isinstance(args, Mapping):  # the worker's "Task name[id] received" and "... succeeded in"
        return args.get("name") not in SWEEP_TASKS | PER_MESSAGE_TASKS
    # beat's "Scheduler: Sending due task <entry> (<task>)", every 3 s
    sending = isinstance(record.msg, str) and record.msg.startswith("Scheduler: Sending due task")
    return not (sending and isinstance(args, tuple) and len(args) == 2 and args[1] in SWEEP_TASKS)


_QUIETED = ("celery.beat", "celery.app.trace", "celery.worker.strategy")


def quiet_sweep_logs() -> None:
    """Drop celery's routine INFO lines about the sweeps in beat and the worker (idempotent).

    Without this beat logs a line every 3 s and the worker two, even when a sweep found
    nothing; the sweep tasks log one line themselves when they did something. Warnings
    and errors, and the lines about every other task, are untouched.
    """
    for name in _QUIETED:
        logger = logging.getLogger(name)
        if _is_routine_sweep_line not in logger.filters:
            logger.addFilter(_is_routine_sweep_line)
