"""Webhooks: subscriptions, fan-out from the outbox, signed delivery with retries.

docs/webhooks.md: one delivery per (event, endpoint); the Standard
Webhooks headers with ``webhook-id`` = the event's id on every endpoint and attempt;
2xx within the timeout is success; redirects are not followed; retries follow
``RELAY_WEBHOOK_SCHEDULE``; 410 disables the endpoint; an endpoint failing for
``RELAY_WEBHOOK_DISABLE_AFTER`` is disabled with the reason recorded.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from flask import current_app
from sqlalchemy import func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert

from relay import crypto
from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.ids import encode_cursor, iso, new_ulid
from relay.models import Agent, Event, RedriveJob, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from relay.services import after_commit, agents, delivery, dispatch, outbound, unit_of_work
from relay.services.delivery.common import TEST_EVENT, event_id_text
from relay.services.outbound import DEFAULT_EVENTS, check_url, new_secret

log = logging.getLogger("relay.webhooks")

ROTATION_OVERLAP = timedelta(hours=24)
MAX_ENDPOINTS_PER_AGENT = 20


def _settings():
    return current_app.config["RELAY"]


def endpoint_view(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """An endpoint's public record (never its secret)."""
    return {
        "id": str(endpoint.id),
        "url": endpoint.url,
        "description": endpoint.description,
        "events": endpoint.events,
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "disabled_at": iso(endpoint.disabled_at),
        "failing_since": iso(endpoint.failing_since),
        "health": delivery.health(endpoint, _settings().webhook_slow_ms),
        "created_at": iso(endpoint.created_at),
        "updated_at": iso(endpoint.updated_at),
    }


def _own_endpoint(session, agent: Agent, endpoint_id: str | uuid.UUID, lock: bool = False) -> WebhookEndpoint:
    try:
        eid = endpoint_id if isinstance(endpoint_id, uuid.UUID) else uuid.UUID(str(endpoint_id))
    except ValueError:
        raise invalid("webhook_id", "must be a UUID") from None
    stmt = select(WebhookEndpoint).where(
        WebhookEndpoint.id == eid, WebhookEndpoint.agent_id == agent.id, WebhookEndpoint.kind == "webhook"
    )
    if lock:
        stmt = stmt.with_for_update()
    endpoint = session.scalar(stmt)
    if endpoint is None:
        raise RelayError("not_found", f"no webhook {eid}")
    return endpoint


def create_endpoint(agent: Agent, url: str, events: list[str] | None, description: str = "") -> dict:
    """Subscribe ``url``; return its record plus the ``secret`` (shown this once)."""
    check_url(url)
    secret = new_secret()
    with unit_of_work() as session:
        # Lock the agent's row before counting: concurrent creates queue here, so two of
        # them cannot both count 19 and both insert. FOR NO KEY UPDATE does not block rows
        # being inserted that reference the agent (their foreign-key checks take KEY SHARE).
        session.execute(select(Agent.id).where(Agent.id == agent.id).with_for_update(key_share=True))
        count = session.scalar(
            select(func.count())
            .select_from(WebhookEndpoint)
            .where(WebhookEndpoint.agent_id == agent.id, WebhookEndpoint.kind == "webhook")
        )
        if count >= MAX_ENDPOINTS_PER_AGENT:
            raise invalid("url", f"an agent may have at most {MAX_ENDPOINTS_PER_AGENT} webhooks")
        endpoint = WebhookEndpoint(
            agent_id=agent.id,
            url=url,
            events=list(events or DEFAULT_EVENTS),
            description=description or "",
            enabled=True,
            secret_encrypted=crypto.encrypt(secret),
        )
        session.add(endpoint)
        session.flush()
        view = endpoint_view(endpoint)
    return {**view, "secret": secret}


def list_endpoints(agent: Agent) -> list[dict]:
    """Return the agent's endpoints, oldest first."""
    rows = db.session.scalars(
        select(WebhookEndpoint)
        .where(WebhookEndpoint.agent_id == agent.id, WebhookEndpoint.kind == "webhook")
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
    )
    return [endpoint_view(e) for e in rows]


def get_endpoint(agent: Agent, endpoint_id: str) -> dict:
    """Return one of the agent's endpoints; raise not_found."""
    return endpoint_view(_own_endpoint(db.session, agent, endpoint_id))


def update_endpoint(agent: Agent, endpoint_id: str, changes: dict[str, Any]) -> dict:
    """Change url, events, description or enabled; re-enabling clears the disable reason."""
    if "url" in changes:
        check_url(changes["url"])
    with unit_of_work() as session:
        endpoint = _own_endpoint(session, agent, endpoint_id, lock=True)
        for name in ("url", "events", "description"):
            if name in changes:
                setattr(endpoint, name, changes[name])
        if "url" in changes or changes.get("enabled"):
            # A new URL is a new receiver, and re-enabling says try again: a fresh start, circuit closed.
            endpoint.failing_since = None
            endpoint.consecutive_failures, endpoint.circuit_opens = 0, 0
            endpoint.circuit_open_until = endpoint.circuit_reason = endpoint.last_error = None
            endpoint.last_duration_ms = None
        if "enabled" in changes:
            endpoint.enabled = changes["enabled"]
            if changes["enabled"]:
                endpoint.disabled_reason = endpoint.disabled_at = None
            else:
                endpoint.disabled_reason = "disabled by its owner"
                endpoint.disabled_at = func.now()
        endpoint.updated_at = func.now()
        session.flush()
        session.refresh(endpoint)
        return endpoint_view(endpoint)


def delete_endpoint(agent: Agent, endpoint_id: str) -> None:
    """Delete an endpoint and its delivery log (its deliveries cascade; their attempts, which
    have no foreign key since migration 0009, are deleted here, in-flight ones included)."""
    with unit_of_work() as session:
        endpoint = _own_endpoint(session, agent, endpoint_id, lock=True)
        session.execute(_DELETE_ATTEMPTS, {"id": endpoint.id})
        session.delete(endpoint)


_DELETE_ATTEMPTS = text(
    "DELETE FROM webhook_attempts WHERE delivery_id IN (SELECT id FROM webhook_deliveries WHERE endpoint_id = :id)"
)


def rotate_secret(agent: Agent, endpoint_id: str) -> dict:
    """Issue a new secret; the old one keeps signing alongside it for 24 hours."""
    secret = new_secret()
    with unit_of_work() as session:
        endpoint = _own_endpoint(session, agent, endpoint_id, lock=True)
        endpoint.previous_secret_encrypted = endpoint.secret_encrypted
        endpoint.previous_secret_expires_at = datetime.now(UTC) + ROTATION_OVERLAP
        endpoint.secret_encrypted = crypto.encrypt(secret)
        endpoint.updated_at = func.now()
        session.flush()
        session.refresh(endpoint)
        view = endpoint_view(endpoint)
    return {**view, "secret": secret, "previous_secret_expires_at": iso(endpoint.previous_secret_expires_at)}


def send_test(agent: Agent, endpoint_id: str) -> dict:
    """Queue a ``webhook.test`` event for this one endpoint; return its event id."""
    with unit_of_work() as session:
        endpoint = _own_endpoint(session, agent, endpoint_id)
        event = Event(
            id=new_ulid(),
            type=TEST_EVENT,
            agent_id=agent.id,
            payload={"endpoint_id": str(endpoint.id)},
            created_at=func.now(),
        )
        session.add(event)
        session.flush()
        after_commit(partial(dispatch.event_committed, event.id))
    return {"event_id": event_id_text(event.id), "type": TEST_EVENT}


# The first window of a delivery log page: this long before its cursor (or now).
LOG_WINDOW = timedelta(days=1)


def list_deliveries(
    agent: Agent, endpoint_id: str, limit: int = 50, cursor: tuple[datetime, uuid.UUID] | None = None
) -> dict:
    """Recent deliveries of an endpoint, newest first, each with its attempts."""
    endpoint = _own_endpoint(db.session, agent, endpoint_id)
    stmt = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id)
    if cursor is not None:
        stmt = stmt.where(tuple_(WebhookDelivery.created_at, WebhookDelivery.id) < tuple_(*cursor))
    stmt = stmt.order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
    # The newest day first, then the rest: a busy endpoint's page is planned over the
    # partitions of that day (and those made ahead), not over every day retention keeps.
    # Every row of the first window is newer than every row of the second, so the order holds.
    anchor = cursor[0] if cursor is not None else datetime.now(UTC)
    try:
        window = anchor - LOG_WINDOW
    except OverflowError:  # a cursor within a day of year 1: no first window
        window = anchor
    rows = list(db.session.scalars(stmt.where(WebhookDelivery.created_at >= window).limit(limit + 1)))
    if len(rows) <= limit:
        older = stmt.where(WebhookDelivery.created_at < window).limit(limit + 1 - len(rows))
        rows += db.session.scalars(older)
    # The events and attempts are read apart, by values PostgreSQL can prune the daily
    # partitions with (migration 0009): a join on the event id alone is planned over every
    # day's partition and hash-joins the whole outbox.
    events = _events_of(rows[:limit])
    page = [(d, events[d.event_id]) for d in rows[:limit] if d.event_id in events]
    attempts: dict[uuid.UUID, list] = {}
    if page:
        for a in db.session.scalars(
            select(WebhookAttempt)
            .where(
                WebhookAttempt.delivery_id.in_([d.id for d, _ in page]),
                # An attempt is never older than its delivery: only those days' partitions.
                WebhookAttempt.attempted_at >= min(d.created_at for d, _ in page),
            )
            .order_by(WebhookAttempt.attempted_at, WebhookAttempt.id)
        ):
            attempts.setdefault(a.delivery_id, []).append(
                {
                    "attempted_at": iso(a.attempted_at),
                    "status_code": a.status_code,
                    "error": a.error,
                    "duration_ms": a.duration_ms,
                }
            )
    items = [
        {
            "id": str(d.id),
            "event_id": event_id_text(e.id),
            "event_type": e.type,
            "status": d.status,
            "attempt_count": d.attempt_count,
            "next_attempt_at": iso(d.next_attempt_at) if d.status == "pending" else None,
            "held": d.status == "pending" and d.next_attempt_at is None,
            "last_error": d.last_error,
            "created_at": iso(d.created_at),
            "completed_at": iso(d.completed_at),
            "attempts": attempts.get(d.id, []),
        }
        for d, e in page
    ]
    last = rows[limit - 1] if len(rows) > limit else None
    return {"items": items, "next_cursor": encode_cursor(last.created_at, last.id) if last is not None else None}


def _events_of(deliveries: list[WebhookDelivery]) -> dict[uuid.UUID, Any]:
    """The ``(id, type)`` of each delivery's event, by event id.

    Looked up by (id, created_at): a delivery's created_at is its event's since 0009, so
    PostgreSQL reads only those days' partitions. A delivery written before 0009 (in the
    legacy partition, made when its event was fanned out) is looked up by id alone.
    """
    if not deliveries:
        return {}
    wanted = {d.event_id for d in deliveries}
    found = {
        r.id: r
        for r in db.session.execute(
            select(Event.id, Event.type).where(
                Event.id.in_(wanted), Event.created_at.in_({d.created_at for d in deliveries})
            )
        )
    }
    if missing := wanted - found.keys():
        found.update({r.id: r for r in db.session.execute(select(Event.id, Event.type).where(Event.id.in_(missing)))})
    return found


# --- fan-out and delivery (run by the Celery workers; the pipeline is relay/services/delivery/) ---


def fan_out(event_id: uuid.UUID) -> list[uuid.UUID]:
    """Create one delivery per matching enabled endpoint for an event; return the new delivery ids.

    Idempotent: an event already fanned out (or being fanned out by another worker) is skipped.
    """
    return [d for d, _endpoint in delivery.fan_out_many([event_id])]


def pending_events(limit: int = 200, older_than_seconds: float = 2.0) -> list[uuid.UUID]:
    """Events committed but never fanned out (lost enqueue), oldest first."""
    return delivery.pending_events(db.session, limit, older_than_seconds)


def due_deliveries(limit: int = 200) -> list[uuid.UUID]:
    """Pending deliveries whose next attempt is due (including leases that expired)."""
    bounds = delivery.floors(db.session)
    return list(
        db.session.scalars(
            select(WebhookDelivery.id)
            .where(
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= func.now(),
                WebhookDelivery.created_at >= bounds.deliveries,
                WebhookDelivery.created_at < bounds.ceiling,
            )
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
        )
    )


def deliver(delivery_id: uuid.UUID) -> str | None:
    """Make one attempt of a due delivery now, in this thread; return its status afterwards.

    For tests and one-off use from a shell: in a running relay the worker's pump
    (workers/delivery.py) sends every delivery. This runs the pump's own steps (claim,
    prepare, attempt, record; relay/services/delivery/) for one delivery, synchronously,
    so a test can assert on the attempt's outcome without a worker.

    None if it was not attempted: not due, leased by someone else, its endpoint at its
    concurrency cap or its circuit open, its endpoint disabled (the delivery is failed)
    or its agent disabled (held). The next attempt, if any, is the row's
    ``next_attempt_at``; the worker's pump sends it when it is due.
    """
    endpoint_id = db.session.scalar(select(WebhookDelivery.endpoint_id).where(WebhookDelivery.id == delivery_id))
    db.session.rollback()
    if endpoint_id is None:
        return None
    prepared = delivery.prepare(delivery.claim([endpoint_id], 1, only=[delivery_id]))
    if not prepared:
        return None
    sender = outbound.Sender(per_pool=1, pools=1)
    try:
        result = delivery.attempt(prepared[0], sender, outbound.TargetCache(ttl=0), _settings())
    finally:
        sender.close()
    return delivery.record([result]).get(delivery_id)


def enable_agent(handle: str) -> tuple[Agent, int]:
    """Re-enable a disabled agent and release its held deliveries; return it and how many.

    One transaction: its keys work again in the commit that makes its held deliveries due.
    Raise identity_not_found.
    """
    with unit_of_work() as session:
        agent = agents.mark_enabled(handle)
        released = release_held(session, agent.id)
    return agent, len(released)


def release_held(session, agent_id: uuid.UUID) -> list[uuid.UUID]:
    """Make an agent's held deliveries due now (it was re-enabled); return their ids.

    Runs inside the caller's unit of work; enqueues them after its commit.
    """
    held = list(
        session.scalars(
            update(WebhookDelivery)
            .where(
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at.is_(None),
                WebhookDelivery.endpoint_id.in_(select(WebhookEndpoint.id).where(WebhookEndpoint.agent_id == agent_id)),
            )
            .values(next_attempt_at=func.now(), last_error=None)
            .returning(WebhookDelivery.id)
        )
    )
    for delivery_id in held:
        after_commit(partial(dispatch.enqueue, "workers.tasks.deliver_webhook", str(delivery_id)))
    return held


# --- redrive and recover (the console: docs/console.md) ------------------------------------------


def _poke_pump() -> None:
    # Any worker's pump looks for due deliveries now rather than at its next one-second poll.
    dispatch.enqueue("workers.tasks.deliver_webhook", "")


def _enabled_endpoint(session, agent: Agent, endpoint_id: str | uuid.UUID) -> WebhookEndpoint:
    return _require_enabled(_own_endpoint(session, agent, endpoint_id, lock=True))


def _require_enabled(endpoint: WebhookEndpoint) -> WebhookEndpoint:
    if not endpoint.enabled:
        # The claim fails a disabled endpoint's due deliveries at once: re-sending would only fail them again.
        raise invalid("webhook_id", "the endpoint is disabled; enable it first, then send again")
    return endpoint


def redrive(agent: Agent, endpoint_id: str | uuid.UUID, delivery_id: str | uuid.UUID) -> dict[str, Any]:
    """Send a failed delivery again: the same row, so the same event and the same ``webhook-id``.

    The delivery becomes pending and due now with a fresh retry schedule
    (``attempt_count`` 0); its earlier attempts stay in its log. The pump sends it within
    the endpoint's caps and circuit, like any due delivery. Returns ``{"delivery_id",
    "event_id"}``. Raises invalid_params (a malformed id, the endpoint disabled, the
    delivery not failed) or not_found (not this endpoint's).
    """
    try:
        did = delivery_id if isinstance(delivery_id, uuid.UUID) else uuid.UUID(str(delivery_id))
    except ValueError:
        raise invalid("delivery_id", "must be a UUID") from None
    with unit_of_work() as session:
        endpoint = _enabled_endpoint(session, agent, endpoint_id)
        row = session.scalar(
            select(WebhookDelivery)
            .where(WebhookDelivery.id == did, WebhookDelivery.endpoint_id == endpoint.id)
            .with_for_update()
        )
        if row is None:
            raise RelayError("not_found", f"no delivery {did} of webhook {endpoint.id}")
        if row.status != "failed":
            state = "held" if row.status == "pending" and row.next_attempt_at is None else row.status
            raise invalid("delivery_id", f"only a failed delivery can be redriven; this one is {state}")
        _requeue(session, [row.id])
        after_commit(_poke_pump)
        return {"delivery_id": str(row.id), "event_id": event_id_text(row.event_id)}


def _requeue(session, delivery_ids) -> None:
    created = session.scalars(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(delivery_ids))
        .values(
            # Its event's (a no-op for deliveries written since 0009; one from before
            # moves within the legacy partition): the claim finds the event by it.
            created_at=select(Event.created_at).where(Event.id == WebhookDelivery.event_id).scalar_subquery(),
            status="pending",
            attempt_count=0,
            next_attempt_at=func.now(),
            completed_at=None,
            leased_until=None,
            last_error=None,
        )
        .returning(WebhookDelivery.created_at)
        .execution_options(synchronize_session=False)
    ).all()
    delivery.lower_floor(session, min(created, default=None))  # an old failed delivery is pending again


# The events since T addressed to the endpoint's agent, of a type it subscribes to, that
# it has no delivery of (the endpoint was disabled, or created later, when they were
# fanned out). Test events are per endpoint: each already has its delivery.
_RECOVER_MISSING = text(
    """
    INSERT INTO webhook_deliveries (id, event_id, endpoint_id, status, attempt_count, next_attempt_at, created_at)
    SELECT gen_random_uuid(), ev.id, :endpoint, 'pending', 0, now(), ev.created_at
    FROM events ev
    -- :floor: events older than the delivery log's retention may have lost their
    -- deliveries' partition (relay/services/retention.py); they are not recovered.
    WHERE ev.agent_id = :agent AND ev.created_at >= greatest(:since, :floor)
      AND ev.type = ANY(CAST(:types AS text[]))
      AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = ev.id AND d.endpoint_id = :endpoint)
    ORDER BY ev.created_at, ev.id
    ON CONFLICT ON CONSTRAINT uq_webhook_deliveries_event_endpoint DO NOTHING
    RETURNING id, created_at
    """
)


def recover(agent: Agent, endpoint_id: str | uuid.UUID, since: datetime) -> dict[str, Any]:
    """Re-send to one endpoint every event since ``since`` (inclusive) that it did not receive, as Svix's recover.

    Its failed deliveries of events since then are redriven (same rows, same
    ``webhook-id``, a fresh schedule), and the events since then that it subscribes to but
    never got a delivery of (it was disabled, or did not exist yet) get one now. Succeeded
    and pending deliveries are left as they are. Returns ``{"requeued", "created"}``
    (counts). Raises invalid_params (a malformed id, the endpoint disabled, ``since`` in
    the future) or not_found.
    """
    if since > datetime.now(UTC):
        raise invalid("since", "is in the future; nothing was sent after it")
    with unit_of_work() as session:
        endpoint = _enabled_endpoint(session, agent, endpoint_id)
        failed = list(
            session.scalars(
                select(WebhookDelivery.id)
                .join(Event, Event.id == WebhookDelivery.event_id)
                .where(
                    WebhookDelivery.endpoint_id == endpoint.id,
                    WebhookDelivery.status == "failed",
                    Event.created_at >= since,
                )
                .with_for_update(of=WebhookDelivery)
            )
        )
        if failed:
            _requeue(session, failed)
        types = [t for t in endpoint.events if t != TEST_EVENT]
        created = session.execute(
            _RECOVER_MISSING,
            {
                "endpoint": endpoint.id,
                "agent": agent.id,
                "since": since,
                "floor": datetime.now(UTC) - timedelta(days=current_app.config["RELAY"].retain_deliveries_days),
                "types": types,
            },
        ).all()
        delivery.lower_floor(session, min((r.created_at for r in created), default=None))
        if failed or created:
            after_commit(_poke_pump)
    return {"requeued": len(failed), "created": len(created)}


# --- bulk redrive (the console: docs/console.md) ----------------------------------------------

REDRIVE_BATCH = 200
# A running job whose row has not moved for this long lost its task (a killed worker, a
# broker outage): the outbox sweep queues it again.
REDRIVE_STALE = timedelta(seconds=60)


def _failed_in(endpoint_id: uuid.UUID, since: datetime, until: datetime):
    return select(WebhookDelivery).where(
        WebhookDelivery.endpoint_id == endpoint_id,
        WebhookDelivery.status == "failed",
        WebhookDelivery.created_at >= since,
        WebhookDelivery.created_at < until,
    )


def _window(since: datetime, until: datetime | None) -> tuple[datetime, datetime]:
    until = until or datetime.now(UTC)
    if since >= until:
        raise invalid("until", "must be after since")
    return since, until


def redrive_preview(agent: Agent, endpoint_id: str | uuid.UUID, since: datetime, until: datetime | None) -> dict:
    """How many of the endpoint's deliveries of events in ``[since, until)`` are failed now.

    ``until`` defaults to now. Returns ``{"count", "since", "until"}`` (times as datetimes).
    Raises invalid_params (a malformed id, ``until`` not after ``since``) or not_found.
    """
    since, until = _window(since, until)
    endpoint = _own_endpoint(db.session, agent, endpoint_id)
    count = db.session.scalar(select(func.count()).select_from(_failed_in(endpoint.id, since, until).subquery()))
    return {"count": count, "since": since, "until": until}


def start_redrive(
    agent: Agent, endpoint_id: str | uuid.UUID, job_id: uuid.UUID, since: datetime, until: datetime, requested_by: str
) -> tuple[dict, bool]:
    """Confirm a bulk redrive: make job ``job_id`` (the preview's) and queue it; return it and whether it is new.

    Idempotent on ``job_id``: a second confirm (a double click, a resent form) returns the
    job it made, and queues nothing. Raises invalid_params (the endpoint disabled, a bad
    window, ``job_id`` another endpoint's) or not_found.
    """
    since, until = _window(since, until)
    with unit_of_work() as session:
        # Not locked (unlike a redrive's): a second confirm waits for the running job's
        # batch to commit, and that batch must not wait for this transaction (a deadlock).
        # Each batch checks that the endpoint is still enabled.
        endpoint = _require_enabled(_own_endpoint(session, agent, endpoint_id))
        made = session.execute(
            insert(RedriveJob)
            .values(
                id=job_id,
                endpoint_id=endpoint.id,
                since=since,
                until=until,
                requested_by=requested_by,
                total=select(func.count())
                .select_from(_failed_in(endpoint.id, since, until).subquery())
                .scalar_subquery(),
            )
            .on_conflict_do_nothing(index_elements=["id"])
            .returning(RedriveJob.id)
        ).first()
        job = session.get(RedriveJob, job_id)
        if job.endpoint_id != endpoint.id:
            raise invalid("job_id", "names a redrive of another endpoint")
        if made is not None:
            after_commit(partial(dispatch.enqueue, "workers.tasks.redrive_job", str(job_id)))
        view = redrive_view(job)
    return view, made is not None


def redrive_view(job: RedriveJob) -> dict:
    """A job's public record: ``id, since, until, requested_by, total, done, status, error,
    created_at, finished_at`` (times ISO 8601)."""
    return {
        "id": str(job.id),
        "since": iso(job.since),
        "until": iso(job.until),
        "requested_by": job.requested_by,
        "total": job.total,
        "done": job.done,
        "status": job.status,
        "error": job.error,
        "created_at": iso(job.created_at),
        "finished_at": iso(job.finished_at),
    }


def list_redrives(agent: Agent, endpoint_id: str | uuid.UUID, limit: int = 5) -> list[dict]:
    """The endpoint's newest bulk redrives, newest first. Raises not_found."""
    endpoint = _own_endpoint(db.session, agent, endpoint_id)
    jobs = db.session.scalars(
        select(RedriveJob)
        .where(RedriveJob.endpoint_id == endpoint.id)
        .order_by(RedriveJob.created_at.desc())
        .limit(limit)
    )
    return [redrive_view(j) for j in jobs]


def run_redrive(job_id: str | uuid.UUID, batch: int = REDRIVE_BATCH) -> dict | None:
    """Run a bulk redrive to its end, one transaction per batch; return its record (None: no such job).

    Each batch locks the job row (a second task for the same job waits, then goes on from
    where the first stopped), takes the next failed deliveries of the window after the job's
    keyset position, redrives them as :func:`redrive` does (same rows, same ``webhook-id``,
    a fresh schedule), and moves the position and ``done`` in the same commit: a delivery is
    taken at most once per job, whatever dies when. A disabled endpoint ends the job
    ``failed``.
    """
    jid = job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
    while True:
        with unit_of_work() as session:
            # populate_existing: the session keeps objects across commits (expire_on_commit off),
            # and each batch must see the row as it is now (another task's progress, a disable).
            job = session.scalar(
                select(RedriveJob)
                .where(RedriveJob.id == jid)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
            if job is None:
                return None
            if job.status != "running":
                return redrive_view(job)
            # The endpoint before its deliveries, as a single redrive and a disable lock them:
            # a batch's updates check the deliveries' foreign key (KEY SHARE on the endpoint),
            # which would otherwise wait on a redrive that waits on this batch's rows.
            endpoint = session.scalar(
                select(WebhookEndpoint)
                .where(WebhookEndpoint.id == job.endpoint_id)
                .with_for_update()
                .execution_options(populate_existing=True)
            )
            if not endpoint.enabled:
                job.status, job.error, job.finished_at = "failed", "the endpoint was disabled", func.now()
                continue
            stmt = _failed_in(job.endpoint_id, job.since, job.until)
            if job.cursor_id is not None:
                stmt = stmt.where(
                    tuple_(WebhookDelivery.created_at, WebhookDelivery.id)
                    > tuple_(job.cursor_created_at, job.cursor_id)
                )
            rows = session.execute(
                stmt.with_only_columns(WebhookDelivery.id, WebhookDelivery.created_at)
                .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
                .limit(batch)
                .with_for_update(skip_locked=True)
            ).all()
            job.updated_at = func.now()
            if not rows:
                job.status, job.finished_at = "done", func.now()
                continue
            _requeue(session, [r.id for r in rows])
            job.done += len(rows)
            job.cursor_created_at, job.cursor_id = rows[-1].created_at, rows[-1].id
            after_commit(_poke_pump)


def resume_redrives() -> list[str]:
    """Queue again every running job whose row has not moved for :data:`REDRIVE_STALE`; return their ids."""
    stale = list(
        db.session.scalars(
            select(RedriveJob.id).where(
                RedriveJob.status == "running", RedriveJob.updated_at < func.now() - REDRIVE_STALE
            )
        )
    )
    db.session.rollback()
    for jid in stale:
        dispatch.enqueue("workers.tasks.redrive_job", str(jid))
    return [str(j) for j in stale]


# --- delivery health by the hour (the console: docs/console.md) -----------------------------

# One endpoint's last 24 hours (the DB's clock), by hour: deliveries delivered and given
# up (by completed_at), attempts that failed (each retried unless it was the last), and
# the commit-to-delivered latency of those delivered (created_at is the event's commit).
# :oldest bounds created_at, so only the partitions that can hold such deliveries are read.
_HOURS = text(
    """
    WITH hours AS (
        SELECT h FROM generate_series(date_trunc('hour', now()) - interval '23 hours', date_trunc('hour', now()),
                                      interval '1 hour') AS h
    ), d AS (
        SELECT id, status, created_at, completed_at FROM webhook_deliveries
        WHERE endpoint_id = :endpoint AND created_at >= :oldest
          AND completed_at >= date_trunc('hour', now()) - interval '23 hours'
    ), a AS (
        SELECT a.attempted_at FROM webhook_attempts a JOIN webhook_deliveries wd ON wd.id = a.delivery_id
        WHERE wd.endpoint_id = :endpoint AND wd.created_at >= :oldest
          AND a.attempted_at >= date_trunc('hour', now()) - interval '23 hours'
          AND (a.status_code IS NULL OR a.status_code NOT BETWEEN 200 AND 299)
    )
    SELECT h.h,
        (SELECT count(*) FROM d WHERE status = 'succeeded' AND completed_at >= h.h AND completed_at < h.h + interval '1 hour') AS delivered,
        (SELECT count(*) FROM a WHERE attempted_at >= h.h AND attempted_at < h.h + interval '1 hour') AS retried,
        (SELECT count(*) FROM d WHERE status = 'failed' AND completed_at >= h.h AND completed_at < h.h + interval '1 hour') AS failed,
        (SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at) * 1000)
         FROM d WHERE status = 'succeeded' AND completed_at >= h.h AND completed_at < h.h + interval '1 hour') AS latency
    FROM hours h ORDER BY h.h
    """
)
_LATENCY_24H = text(
    """
    SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at) * 1000)
    FROM webhook_deliveries
    WHERE endpoint_id = :endpoint AND created_at >= :oldest AND status = 'succeeded'
      AND completed_at >= date_trunc('hour', now()) - interval '23 hours'
    """
)


# The circuit's openings that overlap the last 24 hours, oldest first.
_OPENINGS = text(
    "SELECT opened_at, until, reason FROM circuit_openings WHERE endpoint_id = :endpoint"
    " AND until > date_trunc('hour', now()) - interval '23 hours' ORDER BY opened_at"
)


def endpoint_hours(agent: Agent, endpoint_id: str) -> dict[str, Any]:
    """An endpoint's delivery health over the last 24 hours, oldest hour first.

    ``{"hours": [{"hour": ISO, "delivered", "retried", "failed", "p50_ms", "p95_ms"}] (24),
    "p50_ms", "p95_ms" (over the 24 hours; None without deliveries), "circuit_open_until"
    (ISO or None), "circuit_spans": [{"from", "until", "reason"}] (openings overlapping the
    24 hours, oldest first)}``. ``retried`` counts failed attempts. Raises not_found.
    """
    endpoint = _own_endpoint(db.session, agent, endpoint_id)
    # The oldest delivery that can complete in the window was created the whole retry
    # schedule before it.
    oldest = datetime.now(UTC) - timedelta(hours=24, seconds=sum(_settings().webhook_schedule) + 3600)
    params = {"endpoint": endpoint.id, "oldest": oldest}
    rows = db.session.execute(_HOURS, params).all()
    overall = db.session.execute(_LATENCY_24H, params).scalar()
    spans = db.session.execute(_OPENINGS, params).all()

    def ms(pair, i):
        return round(pair[i]) if pair is not None and pair[i] is not None else None

    return {
        "hours": [
            {
                "hour": iso(r.h),
                "delivered": r.delivered,
                "retried": r.retried,
                "failed": r.failed,
                "p50_ms": ms(r.latency, 0),
                "p95_ms": ms(r.latency, 1),
            }
            for r in rows
        ],
        "p50_ms": ms(overall, 0),
        "p95_ms": ms(overall, 1),
        "circuit_open_until": iso(endpoint.circuit_open_until),
        "circuit_spans": [{"from": iso(s.opened_at), "until": iso(s.until), "reason": s.reason} for s in spans],
    }
