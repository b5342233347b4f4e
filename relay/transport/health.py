"""``/healthz`` (the process answers) and ``/readyz`` (PostgreSQL and Redis answer; beat's last sweep)."""

from __future__ import annotations

import redis
from flask import Blueprint, current_app, jsonify
from sqlalchemy import text

from relay.extensions import db
from relay.services import maintenance

bp = Blueprint("health", __name__)


_INDEX = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Handoff relay</title></head>
<body>
<h1>Handoff relay</h1>
<p>A relay where AI agents hand work to each other (JSON-RPC 2.0 at <code>POST /a2a</code>, A2A v1.0, REST).</p>
<ul>
<li><a href="/console/">The operator console</a></li>
<li><a href="/api/v1/openapi.json">The REST API's OpenAPI document</a></li>
<li><a href="/.well-known/agent-card.json">The relay's A2A agent card</a></li>
<li><a href="/healthz">Health</a> and <a href="/readyz">readiness</a></li>
</ul>
</body></html>
"""


@bp.get("/")
def index():
    """A small HTML page linking the console, the OpenAPI document, the agent card and the health checks."""
    return _INDEX, 200, {"Content-Type": "text/html; charset=utf-8"}


@bp.get("/healthz")
def healthz():
    """Answer 200 while the process serves requests."""
    return {"status": "ok"}


def _check_database() -> str | None:
    try:
        db.session.execute(text("SELECT 1"))
        return None
    except Exception as exc:  # any driver error means "not ready"
        try:
            db.session.rollback()
        except Exception:  # the connection itself is gone: teardown discards the session
            pass
        return type(exc).__name__


def _check_redis() -> str | None:
    try:
        client = redis.Redis.from_url(current_app.config["RELAY"].redis_url, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
        return None
    except Exception as exc:
        return type(exc).__name__


@bp.get("/readyz")
def readyz():
    """Answer 200 when both servers answer, else 503 naming the one that failed.

    The body also shows when beat's sweeps last ran (recorded in Redis by each sweep):
    ``"beat": {"last_sweep": iso, "age_seconds": N, "sweeps": {name: {...}}}``, with
    None values for a sweep that never ran, and ``"beat": null`` when Redis cannot be
    read. A stale or never-run beat is shown, not failed: it does not change the status
    code, because this web process still serves requests and taking it out of rotation
    would not bring beat back. Alert on ``relay_beat_last_sweep_age_seconds`` in /metrics.
    """
    checks = {"database": _check_database(), "redis": _check_redis()}
    failed = {name: err for name, err in checks.items() if err}
    body = {
        "status": "ok" if not failed else "unavailable",
        "checks": {name: ("ok" if err is None else f"failed: {err}") for name, err in checks.items()},
        "beat": maintenance.beat_status() if checks["redis"] is None else None,
    }
    return jsonify(body), (503 if failed else 200)
