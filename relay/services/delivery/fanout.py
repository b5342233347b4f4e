"""Fan-out: one delivery per (event, subscribed endpoint), and the events no pump was handed."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from relay.services import unit_of_work
from relay.services.delivery.bounds import Floors, floors, lower_floor
from relay.services.delivery.common import TEST_EVENT

_FAN_OUT = text(
    """
    WITH ev AS (
        SELECT id, type, agent_id, thread_id, payload, created_at FROM events
        WHERE id = ANY(CAST(:ids AS uuid[])) AND fanned_out_at IS NULL
        FOR UPDATE SKIP LOCKED
    ), marked AS (
        UPDATE events SET fanned_out_at = now() FROM ev WHERE events.id = ev.id
    )
    INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, attempt_count, next_attempt_at, created_at)
    -- created_at is the event's: the delivery goes in the partition of its event's day,
    -- which retention drops together (relay/services/retention.py).
    SELECT gen_random_uuid(), ev.id, e.id, 'pending', 0, now(), ev.created_at
    FROM ev JOIN webhook_endpoints e ON e.agent_id = ev.agent_id AND e.enabled
    WHERE CASE WHEN ev.type = :test THEN e.id = CAST(ev.payload->>'endpoint_id' AS uuid)
          -- An A2A push config hears its one task; a webhook every task of its agent.
          ELSE e.events @> jsonb_build_array(ev.type)
               AND (e.kind = 'webhook' OR (e.kind = 'a2a_push' AND e.thread_id = ev.thread_id)) END
    ORDER BY ev.id, e.id
    ON CONFLICT ON CONSTRAINT uq_webhook_deliveries_event_endpoint DO NOTHING
    RETURNING id, endpoint_id, created_at
    """
)


def fan_out_many(event_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Create one delivery per matching enabled endpoint for each event, in one statement.

    Returns ``[(delivery_id, endpoint_id)]`` of the new deliveries. Idempotent: an event
    already fanned out, or being fanned out by another worker (locked), is skipped.
    """
    with unit_of_work() as session:
        return _fan_out(session, event_ids)


def _fan_out(session, event_ids, current: Floors | None = None) -> list[tuple[uuid.UUID, uuid.UUID]]:
    if not event_ids:
        return []
    rows = session.connection().execute(_FAN_OUT, {"ids": [str(i) for i in event_ids], "test": TEST_EVENT}).all()
    if rows:  # an event fanned out late (its worker was down) makes old deliveries
        lower_floor(session, min(r.created_at for r in rows), current)
    return [(r.id, r.endpoint_id) for r in rows]


_PENDING_EVENTS = text(
    """
    SELECT id FROM events WHERE fanned_out_at IS NULL AND created_at < now() - make_interval(secs => :age)
      AND created_at >= :floor AND created_at < :ceiling
    ORDER BY created_at LIMIT :limit
    """
)
# A poll fans out events older than this that no pump was handed (younger ones are
# normally on their way in a task), at most this many per poll.
POLL_PENDING_AGE = 1.0
POLL_PENDING_LIMIT = 500


def pending_events(session, limit: int, older_than_seconds: float, current: Floors | None = None) -> list[uuid.UUID]:
    """Events committed at least ``older_than_seconds`` ago and never fanned out, oldest first.

    ``current``: the bounds read in this transaction (None: read them now).
    """
    params = {"age": older_than_seconds, "limit": limit, **(current or floors(session)).of_events()}
    return list(session.connection().execute(_PENDING_EVENTS, params).scalars())
