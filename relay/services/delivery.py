"""The webhook delivery pipeline, in batches: fan out, claim under caps, prepare, attempt, record.

docs/webhooks.md, "Delivery" (per-endpoint concurrency
cap and circuit breaker; a slow or dead endpoint delays only itself). The worker's pump
(``workers/delivery.py``) drives these steps for many deliveries at once; ``webhooks.deliver``
drives them for one.

Rules kept here:

- One delivery per (event, endpoint); ``webhook-id`` is the event's id on every attempt.
- A claim leases the delivery (``leased_until`` and ``next_attempt_at`` = now + timeout
  + 30 s) to the claiming pump (``claimed_by``): nobody else sends it meanwhile. Each pump
  heartbeats (``relay_workers``, every ``RELAY_WORKER_HEARTBEAT`` s); a pump silent for
  ``RELAY_WORKER_STALE`` s is dead, and the first live pump to notice makes its claims due
  at once (:func:`heartbeat`). The lease running out is the backstop when no pump is
  left alive (at least once, never lost).
- Every attempt is in the delivery log, even one whose worker died mid-send: its
  ``webhook_attempts`` row is written when it is prepared (``IN_FLIGHT``), before the POST,
  and completed with the outcome when it is recorded; a dead pump's rows say
  ``OUTCOME_UNKNOWN``.
- Caps, counted over the leases of every process (claims are serialised by one advisory
  lock, so two workers cannot both see a free slot): at most
  ``RELAY_WEBHOOK_ENDPOINT_CONCURRENCY`` attempts in flight per endpoint and
  ``RELAY_WEBHOOK_ORG_CONCURRENCY`` per org (the org of the endpoint's agent), of which at
  most half go to the org's unproven endpoints (never attempted, failing, paused, slow
  last time, or with an attempt out for ``RELAY_WEBHOOK_SLOW_MS``): an org's slow
  endpoints cannot take its fast ones' slots, nor one org all of the pump's. A delivery
  beyond a cap stays due and is claimed when one of its endpoint's attempts ends: an
  endpoint queues only behind itself.
- Circuit breaker: after ``RELAY_WEBHOOK_CIRCUIT_FAILURES`` failed attempts in a row the
  endpoint is paused for ``RELAY_WEBHOOK_CIRCUIT_OPEN`` s, doubling each time it opens
  again (at most an hour). Its deliveries stay pending and due; when the pause ends one
  attempt goes out as a probe, and a success closes the circuit.
- Success is any 2xx; 410 disables the endpoint; other failures retry on
  ``RELAY_WEBHOOK_SCHEDULE`` (or later, if the receiver sent ``Retry-After``); an
  endpoint failing for ``RELAY_WEBHOOK_DISABLE_AFTER`` s is disabled with the reason.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from flask import current_app
from sqlalchemy import select, text
from standardwebhooks import Webhook

from relay import crypto
from relay.extensions import db
from relay.ids import format_ulid, iso
from relay.models import Event, Thread, WebhookEndpoint
from relay.services import outbound, push, unit_of_work

log = logging.getLogger("relay.webhooks")

TEST_EVENT = "webhook.test"
HELD = "held: the agent is disabled; sent when it is re-enabled"
# Claims from every worker process take this lock in turn, so the caps hold across them.
_CLAIM_LOCK = 0x72656C6179  # "relay"
_ADVISORY = text("SELECT pg_advisory_xact_lock(:k)")
MAX_CIRCUIT_OPEN = 3600
# An attempt row's error until its outcome is recorded, and after its pump died unrecorded.
IN_FLIGHT = "in flight: the outcome is not recorded yet"
OUTCOME_UNKNOWN = "outcome unknown: the worker stopped before recording it (the receiver may have it)"


def _settings():
    return current_app.config["RELAY"]


def event_id_text(event_id: uuid.UUID) -> str:
    """The ``webhook-id`` of an event: the same for every endpoint and every attempt."""
    return "evt_" + format_ulid(event_id)


# --- floors -------------------------------------------------------------------------------
#
# A scan for pending rows (deliveries due or leased, events not fanned out) cannot prune
# by day on its own: such a row can be in any day retention keeps, so PostgreSQL planned
# every partition on every pump cycle (37 of them at 30 days: 46 ms a claim against 11 ms
# on plain tables, bench retention). Each scan names its table's floor instead, a
# constant no pending row is older than (``relay_floors``, migration 0011), and only the
# partitions from it on are planned.
#
# The other bound is a ceiling, the database's clock plus CEILING_MARGIN, read with the
# floors: the days retention makes ahead hold nothing yet and are not planned either.
#
# The floor is raised by :func:`raise_floors` (every retention pass, hourly and at each
# worker's start) to the oldest pending row, but never past RAISE_CAP before now. A writer
# that makes a row pending lowers it first, in its own transaction, when the row is
# older than LOWER_HORIZON (a fan-out of an old event, a redrive, a recover): it takes
# the floor's row lock, which the raise takes before it looks, so a raise either sees
# the writer's row or runs after the writer has lowered the floor. A writer of a younger
# row needs no lock: it is above any floor a raise can set while it is in flight.

DELIVERIES, EVENTS = "webhook_deliveries", "events"
LOWER_HORIZON = timedelta(hours=1)
# The newest a floor can be: now minus this. Its lead over LOWER_HORIZON (5 hours) is
# how long a writer that took no lock may stay in flight while a raise runs.
RAISE_CAP = timedelta(hours=6)
NO_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)  # a floor row is missing: prune nothing
# The other bound: no row is newer than the database's clock when it was written, so
# one read now plus this margin (longer than any pump transaction) bounds every row the
# transaction can see, and the days ahead that retention makes in advance are not planned.
CEILING_MARGIN = timedelta(minutes=10)


@dataclass
class Floors:
    """The bounds read at the start of a transaction (``created_at``, aware datetimes)."""

    deliveries: datetime = NO_FLOOR
    events: datetime = NO_FLOOR
    ceiling: datetime = datetime(9999, 1, 1, tzinfo=UTC)

    def of_deliveries(self) -> dict[str, datetime]:
        """The ``:floor`` and ``:ceiling`` parameters of a scan of pending deliveries."""
        return {"floor": self.deliveries, "ceiling": self.ceiling}

    def of_events(self) -> dict[str, datetime]:
        """The ``:floor`` and ``:ceiling`` parameters of a scan of events not fanned out."""
        return {"floor": self.events, "ceiling": self.ceiling}


_FLOORS = text("SELECT name, floor, clock_timestamp() + CAST(:margin AS interval) AS ceiling FROM relay_floors")
_LOWER = text("UPDATE relay_floors SET floor = least(floor, :t) WHERE name = :name RETURNING floor")
_LOCK_FLOORS = text("SELECT name FROM relay_floors ORDER BY name FOR UPDATE")
# A second statement after the lock: in READ COMMITTED it takes a new snapshot, so it sees
# the pending rows of every writer that held the lock before.
_RAISE = text(
    """
    UPDATE relay_floors SET floor = least(coalesce(CASE name
        WHEN 'webhook_deliveries' THEN (SELECT min(created_at) FROM webhook_deliveries WHERE status = 'pending')
        WHEN 'events' THEN (SELECT min(created_at) FROM events WHERE fanned_out_at IS NULL) END, 'infinity'),
        now() - CAST(:cap AS interval))
    RETURNING name, floor
    """
)


def floors(session) -> Floors:
    """The current floors and ceiling, read in ``session``'s transaction."""
    rows = session.connection().execute(_FLOORS, {"margin": CEILING_MARGIN}).all()
    if not rows:
        return Floors()
    found = {r.name: r.floor for r in rows}
    return Floors(found.get(DELIVERIES, NO_FLOOR), found.get(EVENTS, NO_FLOOR), rows[0].ceiling)


def lower_floor(session, oldest: datetime | None, current: Floors | None = None) -> None:
    """Make the deliveries' floor at most ``oldest``: call it when rows that old become pending.

    A no-op for rows younger than LOWER_HORIZON. ``current`` (this transaction's floors)
    is lowered too, so the rest of the transaction scans the new rows.
    """
    if oldest is None or oldest >= datetime.now(UTC) - LOWER_HORIZON:
        return
    new = session.connection().execute(_LOWER, {"t": oldest, "name": DELIVERIES}).scalar()
    if current is not None and new is not None:
        current.deliveries = min(current.deliveries, new)


def raise_floors() -> dict[str, datetime]:
    """Set each floor to its table's oldest pending row, at most RAISE_CAP before now; return them.

    Looks at every partition (no floor): a pending row below a floor, however it got
    there, is scanned again after the next pass.
    """
    with unit_of_work() as session:
        conn = session.connection()
        conn.execute(_LOCK_FLOORS)
        return dict(conn.execute(_RAISE, {"cap": RAISE_CAP}).tuples().all())


# --- fan-out ------------------------------------------------------------------------------

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


# --- claim --------------------------------------------------------------------------------


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


# --- prepare ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """An attempt ready to send: where, what, signed; or ``error`` if it cannot be sent at all."""

    claimed: Claimed
    url: str
    body: bytes
    headers: dict[str, str]
    error: str | None = None
    # The webhook_attempts row written before the POST: (id, attempted_at).
    attempt: tuple[int, datetime] | None = None


def _feed_rows(message_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict]:
    from relay.services.feed import message_feed_rows

    return message_feed_rows(message_ids)


def _task_rows(thread_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict]:
    from relay.services.threads import thread_summary

    if not thread_ids:
        return {}
    return {t.id: thread_summary(t) for t in db.session.scalars(select(Thread).where(Thread.id.in_(thread_ids)))}


def _webhook_data(event: Event, feed: dict, tasks: dict) -> dict[str, Any]:
    if event.type == "message.created":
        return feed.get(event.message_id) or {"id": str(event.message_id), "deleted": True}
    if event.type == "task.updated":
        return {
            **tasks.get(event.thread_id, {"task_id": format_ulid(event.thread_id)}),
            "transition": event.payload.get("transition"),
            "from_state": event.payload.get("from"),
            "to_state": event.payload.get("to"),
        }
    if event.type == "message.read":
        # A read receipt, to the author: the other participant has read its messages
        # through ``through_sequence_no`` (``messages`` of them newly, the last ``message_id``).
        task = tasks.get(event.thread_id, {"task_id": format_ulid(event.thread_id)})
        reader = task.get("recipient") if task.get("sender", {}).get("handle") == event.owner else task.get("sender")
        return {
            "task_id": task["task_id"],
            "context_id": task.get("context_id"),
            "reader": reader,
            "message_id": str(event.message_id) if event.message_id else None,
            "through_sequence_no": event.payload.get("through_sequence_no"),
            "messages": event.payload.get("messages"),
            "read_at": iso(event.created_at),
        }
    return {"endpoint_id": event.payload.get("endpoint_id"), "message": "test event from the handoff relay"}


def _dumps(payload: dict) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _bounded(event: Event, data: dict[str, Any], recipient: str, limit: int) -> bytes:
    """The webhook body; past ``limit`` bytes a message's content is left out for a feed reference.

    docs/decisions.md, "Webhook body size": the feed row carries a message's text twice
    (``body`` and ``parts``), so a 950 kB message would make a 1.9 MB webhook, past the
    1 MiB many receivers (and this relay) accept.
    """
    payload = {"type": event.type, "timestamp": iso(event.created_at), "data": data}
    body = _dumps(payload)
    if len(body) <= limit or event.type != "message.created" or "task_id" not in data:
        return body
    slim = {k: v for k, v in data.items() if k not in ("body", "parts", "artifacts")}
    slim["content_omitted"] = {
        "reason": f"the webhook would be {len(body)} bytes, more than {limit}",
        "fetch": f"/api/v1/identities/{recipient}/a2a/messages?task_id={data['task_id']}&since={data['created_at']}",
    }
    return _dumps({**payload, "data": slim})


def _signature(endpoint: WebhookEndpoint, secrets: dict, msg_id: str, when: datetime, body: str) -> str:
    def sign(encrypted: str) -> str:
        if encrypted not in secrets:
            secrets[encrypted] = Webhook(crypto.decrypt(encrypted))
        return secrets[encrypted].sign(msg_id, when, body)

    signatures = [sign(endpoint.secret_encrypted)]
    if (
        endpoint.previous_secret_encrypted
        and endpoint.previous_secret_expires_at
        and endpoint.previous_secret_expires_at > datetime.now(UTC)
    ):
        signatures.append(sign(endpoint.previous_secret_encrypted))
    return " ".join(signatures)


def prepare(claims: list[Claimed]) -> list[Prepared]:
    """Build, bound and sign the payloads of claimed deliveries, their data re-read now (one query for all)."""
    with unit_of_work() as session:
        return _prepare(session, claims)


def _prepare(session, claims: list[Claimed]) -> list[Prepared]:
    if not claims:
        return []
    s = _settings()
    hooks = [c.row for c in claims if c.row.kind != push.KIND]
    feed = _feed_rows([e.message_id for e in hooks if e.type == "message.created" and e.message_id])
    tasks = _task_rows([e.thread_id for e in hooks if e.type in ("task.updated", "message.read") and e.thread_id])
    secrets: dict[str, Webhook] = {}
    out = []
    now = datetime.now(UTC)
    for c in claims:
        row = c.row
        msg_id = event_id_text(c.event_id)
        try:
            if row.kind == push.KIND:
                event, endpoint = session.get(Event, c.event_id), session.get(WebhookEndpoint, c.endpoint_id)
                if event is None or endpoint is None:
                    continue  # deleted since the claim: nothing to send, nothing to record
                body = _dumps(push.build_payload(event))
                extra = push.headers(endpoint)
            else:
                body = _bounded(row, _webhook_data(row, feed, tasks), row.owner, s.webhook_max_payload_bytes)
                extra = {}
            headers = {
                "webhook-id": msg_id,
                "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": _signature(row, secrets, msg_id, now, body.decode("utf-8")),
                **extra,
            }
        except ValueError as exc:  # an undecryptable secret or token
            out.append(Prepared(c, row.url, b"", {}, error=str(exc)))
            continue
        out.append(Prepared(c, row.url, body, headers))
    return _started(session, out, now)


_START_ATTEMPTS = text(
    """
    INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, error, duration_ms)
    SELECT d, CAST(:at AS timestamptz), NULL, :in_flight, 0 FROM unnest(CAST(:ids AS uuid[])) AS d
    RETURNING id, delivery_id
    """
)


def _started(session, prepared: list[Prepared], now: datetime) -> list[Prepared]:
    """Write each attempt's row before it is sent (its outcome ``IN_FLIGHT``), in the claim's transaction."""
    if not prepared:
        return prepared
    rows = session.connection().execute(
        _START_ATTEMPTS,
        {"ids": [str(p.claimed.delivery_id) for p in prepared], "at": now, "in_flight": IN_FLIGHT},
    )
    ids = {r.delivery_id: r.id for r in rows}
    return [replace(p, attempt=(ids[p.claimed.delivery_id], now)) for p in prepared]


# --- attempt ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One attempt's outcome, to record."""

    claimed: Claimed
    attempted_at: datetime
    outcome: outbound.Outcome
    attempt: tuple[int, datetime] | None = None  # its row written before sending; None: insert one


def attempt(prepared: Prepared, sender: outbound.Sender, targets: outbound.TargetCache, settings) -> Result:
    """Resolve, check and POST one prepared delivery (no database); thread-safe."""
    attempted_at = datetime.now(UTC)
    if prepared.error is not None:
        return Result(prepared.claimed, attempted_at, outbound.Outcome(None, prepared.error, None, 0), prepared.attempt)
    started = datetime.now(UTC)
    try:
        target = targets.resolve(
            prepared.url, allow_private=settings.webhook_allow_private, allow_http=settings.webhook_allow_http
        )
    except outbound.TargetRefused as exc:
        ms = int((datetime.now(UTC) - started).total_seconds() * 1000)
        reason = f"DNS failure: {exc}" if exc.kind == "dns" else f"refused: {exc}"
        return Result(prepared.claimed, attempted_at, outbound.Outcome(None, reason, None, ms), prepared.attempt)
    outcome = sender.post(target, prepared.body, prepared.headers, timeout=settings.webhook_timeout)
    return Result(prepared.claimed, attempted_at, outcome, prepared.attempt)


# --- record -------------------------------------------------------------------------------

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


def _ok(outcome: outbound.Outcome) -> bool:
    return outcome.status is not None and 200 <= outcome.status < 300


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


def cycle(
    results: list[Result],
    event_ids: list[uuid.UUID],
    endpoint_ids: set[uuid.UUID],
    poll: bool,
    budget: int,
    worker: uuid.UUID | None = None,
) -> tuple[list[Prepared], set[uuid.UUID]]:
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


# --- workers ------------------------------------------------------------------------------

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
