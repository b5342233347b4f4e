"""Endpoint health: consecutive failures, the circuit breaker's pauses, disabling, and the state an endpoint's record shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import text

from relay.ids import iso
from relay.models import WebhookEndpoint
from relay.services.delivery.attempts import Result, _ok
from relay.services.delivery.common import log

MAX_CIRCUIT_OPEN = 3600


def _apply_health(endpoint: SimpleNamespace, results: list[Result], s, now: datetime) -> None:
    """Move an endpoint's health through its attempts, in the order they ended."""
    for r in results:
        o = r.outcome
        endpoint.last_attempt_at, endpoint.last_duration_ms = r.attempted_at, o.duration_ms
        if _ok(o):
            endpoint.consecutive_failures, endpoint.circuit_opens = 0, 0
            endpoint.circuit_open_until = endpoint.circuit_reason = None
            endpoint.failing_since = endpoint.last_error = None
            continue
        if o.status == 410:
            endpoint.enabled, endpoint.disabled_at = False, now
            endpoint.disabled_reason = "the receiver answered 410 Gone"
            endpoint.last_error = "410 Gone"
            continue
        error = o.error or f"HTTP {o.status}"
        endpoint.last_error = error
        endpoint.consecutive_failures += 1
        if endpoint.failing_since is None:
            endpoint.failing_since = r.attempted_at
        pausing = endpoint.circuit_open_until is not None and endpoint.circuit_open_until > now
        if endpoint.consecutive_failures >= s.webhook_circuit_failures and not pausing:
            endpoint.circuit_opens += 1
            pause = min(s.webhook_circuit_open * 2 ** (endpoint.circuit_opens - 1), MAX_CIRCUIT_OPEN)
            endpoint.circuit_open_until = now + timedelta(seconds=pause)
            endpoint.circuit_reason = (
                f"{endpoint.consecutive_failures} failed attempts in a row (last: {error}); "
                f"attempts paused for {pause} s"
            )
            endpoint.__dict__.setdefault("openings", []).append(
                {
                    "endpoint_id": str(endpoint.id),
                    "opened_at": now.isoformat(),
                    "until": endpoint.circuit_open_until.isoformat(),
                    "reason": endpoint.circuit_reason,
                }
            )
            log.warning(
                "webhook circuit opened",
                extra={"endpoint_id": str(endpoint.id), "pause_s": pause, "error": error},
            )
        failing_for = (now - endpoint.failing_since).total_seconds()
        if endpoint.enabled and failing_for >= s.webhook_disable_after:
            endpoint.enabled, endpoint.disabled_at = False, now
            endpoint.disabled_reason = f"every delivery failed for {int(failing_for)} s (last: {error})"


_LOCK_ENDPOINTS = text(
    """
    SELECT id, enabled, failing_since, consecutive_failures, circuit_opens, circuit_open_until, circuit_reason,
           disabled_reason, disabled_at, last_attempt_at, last_duration_ms, last_error
    FROM webhook_endpoints WHERE id = ANY(CAST(:ids AS uuid[])) ORDER BY id FOR UPDATE
    """
)
_HEALTH_COLUMNS = (
    ("enabled", "bool"),
    ("failing_since", "timestamptz"),
    ("consecutive_failures", "int"),
    ("circuit_opens", "int"),
    ("circuit_open_until", "timestamptz"),
    ("circuit_reason", "text"),
    ("disabled_reason", "text"),
    ("disabled_at", "timestamptz"),
    ("last_attempt_at", "timestamptz"),
    ("last_duration_ms", "int"),
    ("last_error", "text"),
)
_UPDATE_ENDPOINTS = text(
    "UPDATE webhook_endpoints e SET "
    + ", ".join(f"{name} = v.{name}" for name, _type in _HEALTH_COLUMNS)
    + ", updated_at = now() FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS v(id uuid, "
    + ", ".join(f"{name} {kind}" for name, kind in _HEALTH_COLUMNS)
    + ") WHERE e.id = v.id"
)


_INSERT_OPENINGS = text(
    "INSERT INTO circuit_openings (endpoint_id, opened_at, until, reason)"
    " SELECT v.endpoint_id, v.opened_at, v.until, v.reason FROM jsonb_to_recordset(CAST(:rows AS jsonb))"
    " AS v(endpoint_id uuid, opened_at timestamptz, until timestamptz, reason text)"
)


def health(endpoint: WebhookEndpoint, slow_ms: int) -> dict[str, Any]:
    """An endpoint's state for its record: ``healthy``, ``slowed``, ``open`` (circuit) or ``disabled``, with the reason."""
    now = datetime.now(UTC)
    if not endpoint.enabled:
        state, reason = "disabled", endpoint.disabled_reason
    elif endpoint.circuit_open_until is not None:
        state = "open"
        if endpoint.circuit_open_until > now:
            reason = endpoint.circuit_reason
        else:
            reason = f"{endpoint.circuit_reason}; the pause is over, the next attempt is a probe"
    elif endpoint.consecutive_failures:
        state = "slowed"
        reason = f"{endpoint.consecutive_failures} failed attempts in a row (last: {endpoint.last_error})"
    elif endpoint.last_duration_ms is not None and endpoint.last_duration_ms >= slow_ms:
        state = "slowed"
        reason = f"the last attempt took {endpoint.last_duration_ms} ms (slow is {slow_ms} ms or more)"
    else:
        state, reason = "healthy", None
    return {
        "state": state,
        "reason": reason,
        "consecutive_failures": endpoint.consecutive_failures or 0,
        "circuit_open_until": iso(endpoint.circuit_open_until),
        "last_attempt_at": iso(endpoint.last_attempt_at),
        "last_duration_ms": endpoint.last_duration_ms,
        "last_error": endpoint.last_error,
    }
