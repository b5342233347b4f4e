"""Claims: leasing due deliveries under the per-endpoint and per-org caps, one claimer at a time."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import text

from relay.extensions import db
from relay.services import unit_of_work
from relay.services.delivery.bounds import Floors, floors
from relay.services.delivery.common import HELD, _settings

# Claims from every worker process take this lock in turn, so the caps hold across them.
_CLAIM_LOCK = 0x72656C6179  # "relay"
_ADVISORY = text("SELECT pg_advisory_xact_lock(:k)")


@dataclass(frozen=True)
class Claimed:
    """A leased delivery: ids and the attempt count before this attempt."""

    delivery_id: uuid.UUID
    endpoint_id: uuid.UUID
    event_id: uuid.UUID
    attempt_count: int
    row: Any = field(default=None, compare=False, repr=False)  # the event and endpoint columns, from the claim


# The caps' inputs: each endpoint's attempts in flight (its leases) and its org's, all of
# them and those of its "unproven" endpoints: never attempted yet, failing, paused, slow
# last time, or with an attempt in flight for RELAY_WEBHOOK_SLOW_MS or more.
_CAPACITY = text(
    """
    WITH leased AS (
        SELECT endpoint_id, count(*) AS n, bool_or(leased_until < now() + CAST(:lingering AS interval)) AS lingering
        FROM webhook_deliveries
        WHERE leased_until IS NOT NULL AND leased_until > now() AND status = 'pending' AND created_at >= :floor
          AND created_at < :ceiling
        GROUP BY endpoint_id
    ), ep AS (
        SELECT e.id, a.org, coalesce(l.n, 0) AS busy,
               (e.last_attempt_at IS NULL OR e.consecutive_failures > 0 OR e.circuit_open_until IS NOT NULL
                OR e.last_duration_ms >= :slow_ms OR coalesce(l.lingering, false)) AS unproven
        FROM webhook_endpoints e JOIN agents a ON a.id = e.agent_id LEFT JOIN leased l ON l.endpoint_id = e.id
        WHERE e.id = ANY(CAST(:ids AS uuid[])) OR l.endpoint_id IS NOT NULL
    ), org_busy AS (
        SELECT org, sum(busy) AS n, coalesce(sum(busy) FILTER (WHERE unproven), 0) AS unproven_n
        FROM ep GROUP BY org
    )
    SELECT e.id, e.enabled, a.org, a.disabled_at IS NOT NULL AS held,
           coalesce(e.circuit_open_until > now(), false) AS open,
           e.circuit_open_until IS NOT NULL AS probing,
           ep.busy, ep.unproven, o.n AS org_busy, o.unproven_n AS org_unproven,
           (SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries d
                WHERE d.endpoint_id = e.id AND d.status = 'pending' AND d.next_attempt_at <= now()
                  AND d.created_at >= :floor AND d.created_at < :ceiling
                LIMIT :cap) due) AS due
    FROM webhook_endpoints e JOIN agents a ON a.id = e.agent_id
    JOIN ep ON ep.id = e.id JOIN org_busy o ON o.org = ep.org
    WHERE e.id = ANY(CAST(:ids AS uuid[]))
    ORDER BY ep.busy, e.id  -- when slots are short, endpoints with the least in flight first
    """
)


def _due(alias: str = "") -> str:
    """Due and pending, within the deliveries' bounds (``:floor``, ``:ceiling``)."""
    return (
        f"{alias}status = 'pending' AND {alias}next_attempt_at <= now()"
        f" AND {alias}created_at >= :floor AND {alias}created_at < :ceiling"
    )


_DUE = _due()

_FAIL_DISABLED = text(
    f"""
    UPDATE webhook_deliveries d
    SET status = 'failed', completed_at = now(), next_attempt_at = NULL, leased_until = NULL,
        last_error = 'endpoint disabled: ' || coalesce(e.disabled_reason, 'disabled')
    FROM webhook_endpoints e
    WHERE e.id = d.endpoint_id AND d.endpoint_id = ANY(CAST(:ids AS uuid[])) AND {_due("d.")}
    """
)

# A disabled agent's key may have leaked: send nothing, lose nothing. The delivery stays
# pending with no due time; enable_agent makes it due again (webhooks.release_held).
_HOLD = text(
    f"""
    UPDATE webhook_deliveries SET next_attempt_at = NULL, leased_until = NULL, last_error = :held
    WHERE endpoint_id = ANY(CAST(:ids AS uuid[])) AND {_DUE}
    """
)

# Two statements, not one UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED): the tables
# are partitioned by day (migration 0009), and an UPDATE joined to a subquery is planned
# over every partition and hash-joins them whole. The pick locks the rows and returns
# each one's created_at; the lease names them by (id, created_at) with constant arrays,
# so PostgreSQL plans only the days they are in, and finds each event in the same day
# (a delivery's created_at is its event's).
_PICK = """
    SELECT x.id, x.created_at FROM unnest(CAST(:eids AS uuid[]), CAST(:limits AS int[])) AS l(eid, n)
    CROSS JOIN LATERAL (
        SELECT id, created_at FROM webhook_deliveries
        WHERE endpoint_id = l.eid AND {due} {only}
        ORDER BY next_attempt_at, id LIMIT l.n
        FOR UPDATE SKIP LOCKED
    ) x
"""
_PICK_ANY = text(_PICK.format(due=_DUE, only=""))
_PICK_ONLY = text(_PICK.format(due=_DUE, only="AND id = ANY(CAST(:only AS uuid[]))"))
_LEASE = text(
    """
    UPDATE webhook_deliveries d SET leased_until = now() + :lease, next_attempt_at = now() + :lease,
        claimed_by = CAST(:worker AS uuid)
    FROM events ev, webhook_endpoints e, agents a
    WHERE d.id = ANY(CAST(:ids AS uuid[])) AND d.created_at = ANY(CAST(:created AS timestamptz[]))
      AND ev.id = d.event_id AND ev.created_at = d.created_at AND ev.created_at = ANY(CAST(:created AS timestamptz[]))
      AND e.id = d.endpoint_id AND a.id = e.agent_id
    RETURNING d.id, d.endpoint_id, d.event_id, d.attempt_count, d.leased_until,
        ev.type, ev.message_id, ev.thread_id, ev.payload, ev.created_at,
        e.kind, e.url, e.secret_encrypted, e.previous_secret_encrypted, e.previous_secret_expires_at,
        a.handle AS owner
    """
)


def claim(
    endpoint_ids, budget: int, only: list[uuid.UUID] | None = None, worker: uuid.UUID | None = None
) -> list[Claimed]:
    """Lease up to ``budget`` due deliveries of these endpoints, oldest due first per endpoint, within the caps.

    Deliveries of a disabled endpoint are failed, of a disabled agent held; an endpoint
    whose circuit is open gets none, one whose pause has ended gets one (the probe).
    ``only`` restricts the claim to those delivery ids; ``worker`` is the claiming pump's
    id (None: a one-off attempt in this thread, released only by its lease). Returns
    what was leased.
    """
    with unit_of_work() as session:
        return _claim(session, endpoint_ids, budget, only, worker)


def _claim(session, endpoint_ids, budget: int, only=None, worker=None, current: Floors | None = None) -> list[Claimed]:
    ids = [str(i) for i in endpoint_ids]
    if not ids or budget <= 0:
        return []
    s = _settings()
    session.connection().execute(_ADVISORY, {"k": _CLAIM_LOCK})
    bounds = (current or floors(session)).of_deliveries()
    lease = timedelta(seconds=s.webhook_timeout + 30)
    rows = (
        session.connection()
        .execute(
            _CAPACITY,
            {
                "ids": ids,
                "slow_ms": s.webhook_slow_ms,
                "lingering": lease - timedelta(milliseconds=s.webhook_slow_ms),
                "cap": s.webhook_endpoint_concurrency,
                **bounds,
            },
        )
        .all()
    )
    disabled, held, limits = [], [], {}
    org_free: dict[str, int] = {}
    unproven_free: dict[str, int] = {}
    for r in rows:
        if not r.enabled:
            disabled.append(str(r.id))
            continue
        if r.held:
            held.append(str(r.id))
            continue
        if r.open:
            continue
        org_free.setdefault(r.org, s.webhook_org_concurrency - int(r.org_busy))
        unproven_free.setdefault(r.org, s.webhook_org_concurrency // 2 - int(r.org_unproven))
        free = (1 if r.probing else s.webhook_endpoint_concurrency) - r.busy
        # Reserve no more than the endpoint has due: slots it cannot fill are another's.
        take = min(free, int(r.due), org_free[r.org], budget)
        if r.unproven:
            take = min(take, unproven_free[r.org])
            unproven_free[r.org] -= max(take, 0)
        if take > 0:
            limits[str(r.id)] = take
            org_free[r.org] -= take
            budget -= take
    if disabled:
        session.connection().execute(_FAIL_DISABLED, {"ids": disabled, **bounds})
    if held:
        session.connection().execute(_HOLD, {"ids": held, "held": HELD, **bounds})
    if not limits:
        return []
    params: dict[str, Any] = {
        "eids": list(limits),
        "limits": list(limits.values()),
        "lease": lease,
        **bounds,
    }
    if only is not None:
        params["only"] = [str(i) for i in only]
    picked = session.connection().execute(_PICK_ONLY if only is not None else _PICK_ANY, params).all()
    if not picked:
        return []
    rows = (
        session.connection()
        .execute(
            _LEASE,
            {
                "ids": [str(p.id) for p in picked],
                "created": sorted({p.created_at for p in picked}),
                "lease": lease,
                "worker": str(worker) if worker is not None else None,
            },
        )
        .all()
    )
    return [Claimed(r.id, r.endpoint_id, r.event_id, r.attempt_count, r) for r in rows]


_WITH_DUE = text(
    f"SELECT DISTINCT d.endpoint_id FROM webhook_deliveries d JOIN webhook_endpoints e "
    f"ON e.id = d.endpoint_id WHERE {_due('d.')} "
    "AND (e.circuit_open_until IS NULL OR e.circuit_open_until <= now()) LIMIT :n"
)


def endpoints_with_due(limit: int = 1000, current: Floors | None = None) -> list[uuid.UUID]:
    """Endpoints that have a due delivery (retries, expired leases, work beyond a cap).

    ``current``: the bounds read in this transaction (None: read them now).
    """
    params = {"n": limit, **(current or floors(db.session)).of_deliveries()}
    return list(db.session.connection().execute(_WITH_DUE, params).scalars())
