"""The pump's round (cycle) in one transaction, and its liveness: heartbeats, and releasing the claims of stopped pumps."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from relay.services import unit_of_work
from relay.services.delivery.attempts import Result
from relay.services.delivery.bounds import floors
from relay.services.delivery.claims import _claim, endpoints_with_due
from relay.services.delivery.common import IN_FLIGHT, OUTCOME_UNKNOWN, log
from relay.services.delivery.fanout import POLL_PENDING_AGE, POLL_PENDING_LIMIT, _fan_out, pending_events
from relay.services.delivery.payloads import Outgoing, _prepare
from relay.services.delivery.records import _grouped, _log_attempts, _record


def cycle(
    results: list[Result],
    event_ids: list[uuid.UUID],
    endpoint_ids: set[uuid.UUID],
    poll: bool,
    budget: int,
    worker: uuid.UUID | None = None,
) -> tuple[list[Outgoing], set[uuid.UUID]]:
    """One round of the pump in one transaction: record ended attempts, fan out events, claim and prepare.

    The endpoints looked at for claims are ``endpoint_ids``, those of the ended attempts
    (each freed a slot), those of the new deliveries and, if ``poll``, every endpoint with
    a due delivery. A ``poll`` also fans out events that were never handed to a pump
    (:func:`pending_events`: their enqueue was lost, e.g. while Redis was down), so they
    go out within a poll of Redis coming back, not at the next outbox sweep. Claims are
    ``worker``'s. Returns the prepared attempts (at most ``budget``) and, when the
    budget ran out, the endpoints to look at again.
    """
    endpoints = set(endpoint_ids)
    with unit_of_work() as session:
        current = floors(session)
        if results:
            by_endpoint, verdicts, s, now = _grouped(results)
            _record(session, results, by_endpoint, verdicts, s, now, current)
            endpoints |= set(by_endpoint)
        if poll:
            pending = pending_events(session, POLL_PENDING_LIMIT, POLL_PENDING_AGE, current)
            event_ids = [*event_ids, *pending]
        endpoints |= {endpoint for _d, endpoint in _fan_out(session, event_ids, current)}
        if poll:
            endpoints |= set(endpoints_with_due(current=current))
        claims = _claim(session, endpoints, budget, worker=worker, current=current) if endpoints else []
        prepared = _prepare(session, claims)
    if results:
        _log_attempts(results)
    return prepared, (endpoints if endpoints and len(claims) >= budget else set())


_HEARTBEAT = text(
    """
    INSERT INTO relay_workers (id, hostname, pid) VALUES (:id, :hostname, :pid)
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
    """
)
_REAP = text(
    """
    DELETE FROM relay_workers WHERE heartbeat_at < now() - make_interval(secs => :stale) AND id <> :id
    RETURNING id
    """
)
_RELEASE = text(
    """
    UPDATE webhook_deliveries SET leased_until = NULL, claimed_by = NULL, next_attempt_at = now(),
        attempt_count = attempt_count + 1, last_error = :unknown
    WHERE claimed_by = ANY(CAST(:ids AS uuid[])) AND leased_until IS NOT NULL AND status = 'pending'
    RETURNING id, endpoint_id
    """
)
_UNKNOWN = text(
    """
    UPDATE webhook_attempts SET error = :unknown
    WHERE delivery_id = ANY(CAST(:ids AS uuid[])) AND status_code IS NULL AND error = :in_flight
    """
)
_LEAVE = text("DELETE FROM relay_workers WHERE id = :id")


def heartbeat(worker: uuid.UUID, hostname: str, pid: int, reap_after: float | None) -> list[uuid.UUID]:
    """Write ``worker``'s heartbeat; with ``reap_after`` (seconds), also release the claims of dead pumps.

    A pump whose heartbeat is older than ``reap_after`` is deleted and each delivery it
    had leased is due at once (its lease and claim cleared, the lost attempt counted);
    its attempt rows still ``IN_FLIGHT`` become ``OUTCOME_UNKNOWN``: the receiver may
    have had them. Concurrent reapers are safe: each dead row is deleted by one of them.
    The caller passes ``reap_after`` only once its own heartbeats have succeeded for that
    long, so pumps that were all cut off together (PostgreSQL down) do not reap each
    other when it returns. Returns the endpoints of the released deliveries.
    """
    with unit_of_work() as session:
        conn = session.connection()
        conn.execute(_HEARTBEAT, {"id": worker, "hostname": hostname[:255], "pid": pid})
        if reap_after is None:
            return []
        dead = [str(d) for d in conn.execute(_REAP, {"id": worker, "stale": reap_after}).scalars()]
        return _release(conn, dead) if dead else []


def leave(worker: uuid.UUID) -> list[uuid.UUID]:
    """Remove a stopping pump's row and make the deliveries it still holds due now (their endpoints)."""
    with unit_of_work() as session:
        conn = session.connection()
        conn.execute(_LEAVE, {"id": worker})
        return _release(conn, [str(worker)])


def _release(conn, workers: list[str]) -> list[uuid.UUID]:
    rows = conn.execute(_RELEASE, {"ids": workers, "unknown": OUTCOME_UNKNOWN}).all()
    if rows:
        conn.execute(_UNKNOWN, {"ids": [str(r.id) for r in rows], "unknown": OUTCOME_UNKNOWN, "in_flight": IN_FLIGHT})
        log.warning("released %d deliveries of stopped workers", len(rows), extra={"workers": workers})
    return sorted({r.endpoint_id for r in rows})
