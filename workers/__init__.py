"""Celery bound to the Flask app the way Flask's Celery pattern does it."""

from __future__ import annotations

from celery import Celery, Task
from flask import Flask


def celery_init_app(app: Flask) -> Celery:
    """Create the Celery app whose tasks run inside ``app``'s application context."""

    class FlaskTask(Task):
        def __call__(self, *args, **kwargs):
            with app.app_context():
                return self.run(*args, **kwargs)

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
            "include": ["workers.tasks"],
            # Keep the app's JSON log lines (with their extra fields) in worker processes too.
            "worker_hijack_root_logger": False,
            # ... and keep stdout the real stdout, which that handler writes to.
            "worker_redirect_stdouts": False,
        }
    )
    celery_app.set_default()
    app.extensions["celery"] = celery_app
    return celery_app


def beat_schedule() -> dict:
    """Return the periodic sweeps run by ``celery beat``."""
    return {
        "purge-idempotency-records": {"task": "workers.tasks.purge_idempotency_records", "schedule": 3600.0},
        "index-pending-messages": {"task": "workers.tasks.index_pending_messages", "schedule": 10.0},
        "sweep-outbox": {"task": "workers.tasks.sweep_outbox", "schedule": 3.0},
    }
