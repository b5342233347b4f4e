"""Recording outcomes: the attempt rows, each delivery's verdict on the retry schedule, and endpoint health, in one transaction."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import text

from relay.services import unit_of_work
from relay.services.delivery.attempts import Result, _ok
from relay.services.delivery.bounds import Floors, floors
from relay.services.delivery.circuit import (
    _HEALTH_COLUMNS,
    _INSERT_OPENINGS,
    _LOCK_ENDPOINTS,
    _UPDATE_ENDPOINTS,
    _apply_health,
)
from relay.services.delivery.claims import Claimed
from relay.services.delivery.common import _settings, log

_INSERT_ATTEMPTS = text(
    """
    INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, error, duration_ms)
    SELECT v.delivery_id, v.attempted_at, v.status_code, v.error, v.duration_ms
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
         AS v(delivery_id uuid, attempted_at timestamptz, status_code int, error text, duration_ms int)
    WHERE EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.id = v.delivery_id
        AND d.created_at >= :floor AND d.created_at < :ceiling)
    """
)
# The attempted_at list lets the planner prune to the partitions the rows are in.
_FINISH_ATTEMPTS = text(
    """
    UPDATE webhook_attempts a SET status_code = v.status_code, error = v.error, duration_ms = v.duration_ms
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS v(id bigint, status_code int, error text, duration_ms int)
    WHERE a.id = v.id AND a.attempted_at = ANY(CAST(:at AS timestamptz[]))
    """
)
_UPDATE_DELIVERIES = text(
    """
    UPDATE webhook_deliveries d SET
        status = v.status,
        attempt_count = d.attempt_count + 1,
        next_attempt_at = CASE WHEN v.delay IS NULL THEN NULL ELSE now() + make_interval(secs => v.delay) END,
        completed_at = CASE WHEN v.status = 'pending' THEN NULL ELSE now() END,
        last_error = v.error,
        leased_until = NULL,
        claimed_by = NULL
    FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS v(id uuid, lease timestamptz, status text, delay float8, error text)
    -- Only the attempt holding the current lease writes the row: one whose lease ran out
    -- (and was claimed again) must not overwrite its successor's.
    WHERE d.id = v.id AND d.status = 'pending' AND (v.lease IS NULL OR d.leased_until = v.lease)
      AND d.created_at >= :floor AND d.created_at < :ceiling
    RETURNING d.id
    """
)


def _verdict(result: Result, schedule: tuple[int, ...]) -> dict[str, Any]:
    """The delivery's row after this attempt: status, delay of the next one, error."""
    o = result.outcome
    if _ok(o):
        return {"status": "succeeded", "delay": None, "error": None}
    if o.status == 410:
        return {"status": "failed", "delay": None, "error": "410 Gone: endpoint disabled"}
    error = o.error or f"HTTP {o.status}"
    done = result.claimed.attempt_count + 1
    if done >= len(schedule):
        return {"status": "failed", "delay": None, "error": error}
    return {
        "status": "pending",
        # A receiver's Retry-After can put the next attempt later, never past the schedule's longest wait.
        "delay": float(min(max(schedule[done], o.retry_after or 0), max(schedule))),
        "error": error,
    }


def record(results: list[Result]) -> dict[uuid.UUID, str]:
    """Write attempts, delivery rows and endpoint health for many results, in one transaction.

    Returns each delivery's status afterwards (``succeeded``, ``failed`` or ``pending``);
    deliveries deleted meanwhile (their endpoint was deleted) are left out.
    """
    if not results:
        return {}
    by_endpoint, verdicts, s, now = _grouped(results)
    with unit_of_work() as session:
        updated = _record(session, results, by_endpoint, verdicts, s, now)
    _log_attempts(results)
    return {d: verdicts[d]["status"] for d in updated}


def _lease_of(claimed: Claimed) -> str | None:
    lease = getattr(claimed.row, "leased_until", None) if claimed.row is not None else None
    return lease.isoformat() if lease is not None else None


def _json_value(value):
    return value.isoformat() if isinstance(value, datetime) else value


def _record(session, results, by_endpoint, verdicts, s, now, current: Floors | None = None) -> list[uuid.UUID]:
    conn = session.connection()
    bounds = (current or floors(session)).of_deliveries()
    # Lock the endpoints in id order: two recorders never wait on each other in a cycle.
    endpoints = [
        SimpleNamespace(**row._mapping) for row in conn.execute(_LOCK_ENDPOINTS, {"ids": [str(i) for i in by_endpoint]})
    ]
    for endpoint in endpoints:
        _apply_health(endpoint, by_endpoint[endpoint.id], s, now)
    if endpoints:
        health_rows = [
            {"id": str(e.id), **{name: _json_value(getattr(e, name)) for name, _t in _HEALTH_COLUMNS}}
            for e in endpoints
        ]
        conn.execute(_UPDATE_ENDPOINTS, {"rows": json.dumps(health_rows)})
        openings = [o for e in endpoints for o in getattr(e, "openings", [])]
        if openings:
            conn.execute(_INSERT_OPENINGS, {"rows": json.dumps(openings)})
    _write_attempts(conn, results, bounds)
    leases = {r.claimed.delivery_id: _lease_of(r.claimed) for r in results}
    rows = [{"id": str(d), "lease": leases.get(d), **v} for d, v in verdicts.items()]
    return conn.execute(_UPDATE_DELIVERIES, {"rows": json.dumps(rows), **bounds}).scalars().all()


def _write_attempts(conn, results: list[Result], bounds: dict[str, datetime]) -> None:
    """Complete the rows written before sending; insert one for a result that has none."""
    started = [r for r in results if r.attempt is not None]
    if started:
        rows = [
            {
                "id": r.attempt[0],
                "status_code": r.outcome.status,
                "error": r.outcome.error,
                "duration_ms": r.outcome.duration_ms,
            }
            for r in started
        ]
        at = sorted({r.attempt[1] for r in started})
        conn.execute(_FINISH_ATTEMPTS, {"rows": json.dumps(rows), "at": at})
    fresh = [
        {
            "delivery_id": str(r.claimed.delivery_id),
            "attempted_at": r.attempted_at.isoformat(),
            "status_code": r.outcome.status,
            "error": r.outcome.error,
            "duration_ms": r.outcome.duration_ms,
        }
        for r in results
        if r.attempt is None
    ]
    if fresh:
        conn.execute(_INSERT_ATTEMPTS, {"rows": json.dumps(fresh), **bounds})


def _log_attempts(results: list[Result]) -> None:
    for r in results:
        log.info(
            "webhook attempt",
            extra={
                "delivery_id": str(r.claimed.delivery_id),
                "endpoint_id": str(r.claimed.endpoint_id),
                "status": r.outcome.status,
                "error": r.outcome.error,
                "duration_ms": r.outcome.duration_ms,
            },
        )


def _grouped(results: list[Result]):
    s = _settings()
    by_endpoint: dict[uuid.UUID, list[Result]] = defaultdict(list)
    for r in sorted(results, key=lambda r: r.attempted_at):
        by_endpoint[r.claimed.endpoint_id].append(r)
    verdicts = {r.claimed.delivery_id: _verdict(r, s.webhook_schedule) for r in results}
    return by_endpoint, verdicts, s, datetime.now(UTC)
