"""Structured JSON logs (one line per request) and Prometheus metrics at ``/metrics``.

Never logged: API keys, webhook secrets, message bodies. The request line carries the
request id, the agent's handle, the HTTP and JSON-RPC methods, the status and the
duration. Gauges for the outbox backlog, due deliveries and unindexed messages are read
from PostgreSQL at scrape time, and the age of beat's last sweeps from Redis, so every
process reports the same truth.
"""

from __future__ import annotations

import hmac
import logging
import os
import time

from flask import Blueprint, Flask, Response, current_app, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

log = logging.getLogger("relay.request")

REQUESTS = Counter("relay_http_requests_total", "HTTP requests by route and status", ["route", "method", "status"])
LATENCY = Histogram(
    "relay_http_request_duration_seconds",
    "HTTP request latency by route",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RPC_CALLS = Counter(
    "relay_rpc_calls_total", "JSON-RPC calls by method and outcome (ok or error symbol)", ["method", "outcome"]
)
WEBHOOK_ATTEMPTS = Counter("relay_webhook_attempts_total", "Webhook delivery attempts by outcome", ["outcome"])


class _BacklogCollector:
    """Gauges read from PostgreSQL at scrape time."""

    def __init__(self, app: Flask):
        self.app = app

    def collect(self):
        from relay.extensions import db
        from relay.models import Event, Message, WebhookDelivery

        with self.app.app_context():
            try:
                outbox = db.session.scalar(select(func.count()).select_from(Event).where(Event.fanned_out_at.is_(None)))
                due = db.session.scalar(
                    select(func.count()).select_from(WebhookDelivery).where(WebhookDelivery.status == "pending")
                )
                lag = db.session.scalar(
                    select(
                        func.coalesce(func.extract("epoch", func.now() - func.min(WebhookDelivery.created_at)), 0)
                    ).where(WebhookDelivery.status == "pending")
                )
                unindexed = db.session.scalar(
                    select(func.count()).select_from(Message).where(Message.search_vector.is_(None))
                )
                index_failed = db.session.scalar(  # unindexed (its partial index) and marked
                    select(func.count())
                    .select_from(Message)
                    .where(Message.search_vector.is_(None), Message.index_error.is_not(None))
                )
            except Exception:
                db.session.rollback()
                return
        for name, doc, value in (
            ("relay_outbox_backlog", "Events not yet fanned out to webhooks", outbox),
            ("relay_webhook_deliveries_pending", "Webhook deliveries not yet succeeded or failed", due),
            ("relay_webhook_oldest_pending_seconds", "Age of the oldest pending webhook delivery", float(lag or 0)),
            ("relay_messages_unindexed", "Messages whose search vector is not written yet", unindexed),
            ("relay_messages_index_failed", "Unindexed messages the indexer marked failed", index_failed),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], float(value or 0))
            yield gauge


class _BeatCollector:
    """``relay_beat_last_sweep_age_seconds{sweep}``: seconds since each beat sweep last ran.

    Read from Redis at scrape time (relay.services.maintenance.beat_status); a sweep that
    never ran has no sample, and nothing is reported while Redis cannot be read.
    """

    def __init__(self, app: Flask):
        self.app = app

    def collect(self):
        from relay.services.maintenance import beat_status

        with self.app.app_context():
            status = beat_status()
        gauge = GaugeMetricFamily(
            "relay_beat_last_sweep_age_seconds", "Seconds since the beat sweep last finished", labels=["sweep"]
        )
        for name, sweep in ((status or {}).get("sweeps") or {}).items():
            if sweep["age_seconds"] is not None:
                gauge.add_metric([name], float(sweep["age_seconds"]))
        yield gauge


class _PartitionCollector:
    """``relay_partition_oldest_age_seconds{table}``: how old each partitioned table's oldest partition is.

    Read from the catalog at scrape time (relay.services.retention.oldest_ages); retention
    working keeps it near ``retain_days`` plus a day. Nothing is reported while the
    database cannot be read.
    """

    def __init__(self, app: Flask):
        self.app = app

    def collect(self):
        from relay.extensions import db
        from relay.services.retention import oldest_ages

        with self.app.app_context():
            try:
                ages = oldest_ages()
            except Exception:
                db.session.rollback()
                ages = {}
        gauge = GaugeMetricFamily(
            "relay_partition_oldest_age_seconds",
            "Seconds since the start of the table's oldest time partition",
            labels=["table"],
        )
        for table, age in ages.items():
            gauge.add_metric([table], age)
        yield gauge


bp = Blueprint("observability", __name__)


@bp.get("/metrics")
def metrics():
    """Prometheus metrics; with RELAY_METRICS_TOKEN set, only for ``Authorization: Bearer <token>``."""
    token = current_app.config["RELAY"].metrics_token
    if token:
        supplied = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(supplied.encode(), token.encode()):
            return Response("unauthorized\n", status=401)  # WWW-Authenticate: relay/transport/errors.py
    registry = current_app.extensions["relay_metrics_registry"]
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def init_app(app: Flask) -> None:
    """Install the request log line, the metrics registry and ``/metrics``."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in (REQUESTS, LATENCY, RPC_CALLS, WEBHOOK_ATTEMPTS):
            registry.register(collector)
    registry.register(_BacklogCollector(app))
    registry.register(_BeatCollector(app))
    registry.register(_PartitionCollector(app))
    app.extensions["relay_metrics_registry"] = registry
    app.register_blueprint(bp)

    @app.before_request
    def _start_timer():
        g._relay_started = time.perf_counter()

    @app.after_request
    def _log_request(response):
        started = g.get("_relay_started")
        duration = time.perf_counter() - started if started else 0.0
        route = request.url_rule.rule if request.url_rule is not None else "unmatched"
        REQUESTS.labels(route, request.method, str(response.status_code)).inc()
        LATENCY.labels(route).observe(duration)
        log.info(
            "request",
            extra={
                "request_id": g.get("request_id"),
                "agent": g.get("_relay_agent_handle"),
                "http_method": request.method,
                "route": route,
                "rpc_methods": g.get("rpc_methods"),
                "status": response.status_code,
                "duration_ms": round(duration * 1000, 2),
            },
        )
        return response
