"""Webhooks: subscriptions, fan-out from the outbox, signed delivery with retries.

DESIGN.md, "Events, webhooks": one delivery per (event, endpoint); the Standard
Webhooks headers with ``webhook-id`` = the event's id on every endpoint and attempt;
2xx within the timeout is success; redirects are not followed; retries follow
``RELAY_WEBHOOK_SCHEDULE``; 410 disables the endpoint; an endpoint failing for
``RELAY_WEBHOOK_DISABLE_AFTER`` is disabled with the reason recorded.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from flask import current_app
from sqlalchemy import and_, func, or_, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from standardwebhooks import Webhook

from relay import crypto
from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.ids import encode_cursor, format_ulid, iso, new_ulid
from relay.models import Agent, Event, Thread, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from relay.services import after_commit, dispatch, outbound, push, unit_of_work
from relay.services.outbound import EVENT_TYPES, check_url, new_secret

log = logging.getLogger("relay.webhooks")

TEST_EVENT = "webhook.test"
HELD = "held: the agent is disabled; sent when it is re-enabled"
ROTATION_OVERLAP = timedelta(hours=24)
MAX_ENDPOINTS_PER_AGENT = 20


def _settings():
    return current_app.config["RELAY"]


def event_id_text(event_id: uuid.UUID) -> str:
    """The ``webhook-id`` of an event: the same for every endpoint and every attempt."""
    return "evt_" + format_ulid(event_id)


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
            events=list(events or EVENT_TYPES),
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
        if "enabled" in changes:
            endpoint.enabled = changes["enabled"]
            if changes["enabled"]:
                endpoint.disabled_reason = endpoint.disabled_at = endpoint.failing_since = None
            else:
                endpoint.disabled_reason = "disabled by its owner"
                endpoint.disabled_at = func.now()
        endpoint.updated_at = func.now()
        session.flush()
        session.refresh(endpoint)
        return endpoint_view(endpoint)


def delete_endpoint(agent: Agent, endpoint_id: str) -> None:
    """Delete an endpoint and its delivery log."""
    with unit_of_work() as session:
        session.delete(_own_endpoint(session, agent, endpoint_id, lock=True))


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


def list_deliveries(
    agent: Agent, endpoint_id: str, limit: int = 50, cursor: tuple[datetime, uuid.UUID] | None = None
) -> dict:
    """Recent deliveries of an endpoint, newest first, each with its attempts."""
    endpoint = _own_endpoint(db.session, agent, endpoint_id)
    stmt = (
        select(WebhookDelivery, Event)
        .join(Event, Event.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.endpoint_id == endpoint.id)
    )
    if cursor is not None:
        stmt = stmt.where(tuple_(WebhookDelivery.created_at, WebhookDelivery.id) < tuple_(*cursor))
    rows = db.session.execute(
        stmt.order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc()).limit(limit + 1)
    ).all()
    page = rows[:limit]
    attempts: dict[uuid.UUID, list] = {}
    if page:
        for a in db.session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id.in_([d.id for d, _ in page]))
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
    last = page[-1][0] if page else None
    return {
        "items": items,
        "next_cursor": encode_cursor(last.created_at, last.id) if last is not None and len(rows) > limit else None,
    }


# --- fan-out and delivery (run by the Celery workers) ---------------------------------


def fan_out(event_id: uuid.UUID) -> list[uuid.UUID]:
    """Create one delivery per matching enabled endpoint for an event; return the new delivery ids.

    Idempotent: an event already fanned out (or being fanned out by another worker) is skipped.
    """
    with unit_of_work() as session:
        event = session.scalar(
            select(Event).where(Event.id == event_id, Event.fanned_out_at.is_(None)).with_for_update(skip_locked=True)
        )
        if event is None:
            return []
        endpoints = select(WebhookEndpoint.id).where(
            WebhookEndpoint.agent_id == event.agent_id, WebhookEndpoint.enabled.is_(True)
        )
        if event.type == TEST_EVENT:
            endpoints = endpoints.where(WebhookEndpoint.id == uuid.UUID(event.payload["endpoint_id"]))
        else:
            # An A2A push config hears its one task; a webhook every task of its agent.
            endpoints = endpoints.where(
                WebhookEndpoint.events.contains([event.type]),
                or_(
                    WebhookEndpoint.kind == "webhook",
                    and_(WebhookEndpoint.kind == "a2a_push", WebhookEndpoint.thread_id == event.thread_id),
                ),
            )
        ids = list(session.scalars(endpoints))
        created: list[uuid.UUID] = []
        if ids:
            created = list(
                session.scalars(
                    insert(WebhookDelivery)
                    .values(
                        [
                            {
                                "id": uuid.uuid4(),
                                "event_id": event.id,
                                "endpoint_id": eid,
                                "status": "pending",
                                "attempt_count": 0,
                                "next_attempt_at": func.now(),
                            }
                            for eid in ids
                        ]
                    )
                    .on_conflict_do_nothing(constraint="uq_webhook_deliveries_event_endpoint")
                    .returning(WebhookDelivery.id)
                )
            )
        event.fanned_out_at = func.now()
    return created


def pending_events(limit: int = 200, older_than_seconds: float = 2.0) -> list[uuid.UUID]:
    """Events committed but never fanned out (lost enqueue), oldest first."""
    return list(
        db.session.scalars(
            select(Event.id)
            .where(Event.fanned_out_at.is_(None), Event.created_at < func.now() - timedelta(seconds=older_than_seconds))
            .order_by(Event.created_at)
            .limit(limit)
        )
    )


def due_deliveries(limit: int = 200) -> list[uuid.UUID]:
    """Pending deliveries whose next attempt is due (including leases that expired)."""
    return list(
        db.session.scalars(
            select(WebhookDelivery.id)
            .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= func.now())
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit)
        )
    )


def build_payload(event: Event) -> dict[str, Any]:
    """``{"type", "timestamp", "data"}``; data re-read now (DESIGN.md, "Payload")."""
    from relay.services.feed import message_feed_row
    from relay.services.threads import thread_summary

    data: dict[str, Any]
    if event.type == "message.created":
        data = message_feed_row(event.message_id) or {"id": str(event.message_id), "deleted": True}
    elif event.type == "task.updated":
        thread = db.session.get(Thread, event.thread_id)
        data = {
            **(thread_summary(thread) if thread else {"task_id": format_ulid(event.thread_id)}),
            "transition": event.payload.get("transition"),
            "from_state": event.payload.get("from"),
            "to_state": event.payload.get("to"),
        }
    else:
        data = {"endpoint_id": event.payload.get("endpoint_id"), "message": "test event from the handoff relay"}
    return {"type": event.type, "timestamp": iso(event.created_at), "data": data}


def _signature(endpoint: WebhookEndpoint, msg_id: str, when: datetime, body: str) -> str:
    signatures = [Webhook(crypto.decrypt(endpoint.secret_encrypted)).sign(msg_id, when, body)]
    if (
        endpoint.previous_secret_encrypted
        and endpoint.previous_secret_expires_at
        and endpoint.previous_secret_expires_at > datetime.now(UTC)
    ):
        signatures.append(Webhook(crypto.decrypt(endpoint.previous_secret_encrypted)).sign(msg_id, when, body))
    return " ".join(signatures)


def _claim(delivery_id: uuid.UUID) -> tuple[WebhookDelivery, WebhookEndpoint, Event] | None:
    """Lease a due delivery so no other worker sends it meanwhile; None if not ours to send."""
    s = _settings()
    lease = timedelta(seconds=s.webhook_timeout + 30)
    with unit_of_work() as session:
        row = session.execute(
            select(WebhookDelivery, WebhookEndpoint, Event, Agent.disabled_at)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .join(Event, Event.id == WebhookDelivery.event_id)
            .join(Agent, Agent.id == WebhookEndpoint.agent_id)
            .where(
                WebhookDelivery.id == delivery_id,
                WebhookDelivery.status == "pending",
                WebhookDelivery.next_attempt_at <= func.now(),
            )
            .with_for_update(of=WebhookDelivery, skip_locked=True)
        ).first()
        if row is None:
            return None
        delivery, endpoint, event, agent_disabled_at = row
        if agent_disabled_at is not None:
            # A disabled agent's key may have leaked: send nothing, lose nothing. The delivery
            # stays pending with no due time; enable_agent makes it due again.
            delivery.next_attempt_at = None
            delivery.last_error = HELD
            return None
        if not endpoint.enabled:
            delivery.status, delivery.completed_at = "failed", func.now()
            delivery.last_error = f"endpoint disabled: {endpoint.disabled_reason or 'disabled'}"
            delivery.next_attempt_at = None
            return None
        # If this worker dies mid-send, the lease runs out and the sweep sends again.
        delivery.next_attempt_at = func.now() + lease
    return delivery, endpoint, event


def deliver(delivery_id: uuid.UUID) -> str | None:
    """Make one attempt of a due delivery; return its status afterwards, None if not attempted.

    Returns the delay (seconds) of the next attempt through the delivery row's
    ``next_attempt_at``; the caller schedules it.
    """
    claimed = _claim(delivery_id)
    if claimed is None:
        return None
    delivery, endpoint, event = claimed
    s = _settings()
    with unit_of_work():
        payload = push.build_payload(event) if endpoint.kind == "a2a_push" else build_payload(event)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    msg_id = event_id_text(event.id)
    now = datetime.now(UTC)
    attempted_at = now
    try:
        target = outbound.resolve(endpoint.url, allow_private=s.webhook_allow_private, allow_http=s.webhook_allow_http)
        headers = {
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": _signature(endpoint, msg_id, now, body),
        }
        if endpoint.kind == "a2a_push":
            headers.update(push.headers(endpoint))
        outcome = outbound.post(target, body.encode("utf-8"), headers, timeout=s.webhook_timeout)
    except outbound.TargetRefused as exc:
        outcome = outbound.Outcome(None, f"refused: {exc}", None, 0)
    except ValueError as exc:  # undecryptable secret
        outcome = outbound.Outcome(None, str(exc), None, 0)
    return _record(delivery.id, endpoint.id, attempted_at, outcome)


def _record(
    delivery_id: uuid.UUID, endpoint_id: uuid.UUID, attempted_at: datetime, outcome: outbound.Outcome
) -> str | None:
    s = _settings()
    schedule = s.webhook_schedule
    with unit_of_work() as session:
        delivery = session.get(WebhookDelivery, delivery_id, with_for_update=True)
        endpoint = session.get(WebhookEndpoint, endpoint_id, with_for_update=True)
        if delivery is None or endpoint is None:
            return None  # the endpoint (and its delivery log) was deleted during the attempt
        session.add(
            WebhookAttempt(
                delivery_id=delivery_id,
                attempted_at=attempted_at,
                status_code=outcome.status,
                error=outcome.error,
                duration_ms=outcome.duration_ms,
            )
        )
        delivery.attempt_count += 1
        ok = outcome.status is not None and 200 <= outcome.status < 300
        if ok:
            delivery.status, delivery.completed_at, delivery.next_attempt_at = "succeeded", func.now(), None
            delivery.last_error = None
            endpoint.failing_since = None
        elif outcome.status == 410:
            delivery.status, delivery.completed_at, delivery.next_attempt_at = "failed", func.now(), None
            delivery.last_error = "410 Gone: endpoint disabled"
            endpoint.enabled, endpoint.disabled_at = False, func.now()
            endpoint.disabled_reason = "the receiver answered 410 Gone"
        else:
            delivery.last_error = outcome.error or f"HTTP {outcome.status}"
            if endpoint.failing_since is None:
                endpoint.failing_since = attempted_at
            if delivery.attempt_count >= len(schedule):
                delivery.status, delivery.completed_at, delivery.next_attempt_at = "failed", func.now(), None
            else:
                delay = max(schedule[delivery.attempt_count], outcome.retry_after or 0)
                delivery.next_attempt_at = func.now() + timedelta(seconds=min(delay, 7 * 24 * 3600))
            failing_for = (datetime.now(UTC) - endpoint.failing_since).total_seconds()
            if endpoint.enabled and failing_for >= s.webhook_disable_after:
                endpoint.enabled, endpoint.disabled_at = False, func.now()
                endpoint.disabled_reason = (
                    f"every delivery failed for {int(failing_for)} s (last: {delivery.last_error})"
                )
        log.info(
            "webhook attempt",
            extra={
                "delivery_id": str(delivery_id),
                "status": outcome.status,
                "error": outcome.error,
                "duration_ms": outcome.duration_ms,
            },
        )
        session.flush()
        session.refresh(delivery)
        status, next_at = delivery.status, delivery.next_attempt_at
    if status == "pending" and next_at is not None:
        delay = max(0.0, (next_at - datetime.now(UTC)).total_seconds())
        after_delay_retry(delivery_id, delay)
    return status


def after_delay_retry(delivery_id: uuid.UUID, delay: float) -> None:
    """Schedule the next attempt soon when it is near; far ones are left to the beat sweep."""
    if delay <= 600:
        dispatch.enqueue_later("workers.tasks.deliver_webhook", delay, str(delivery_id))


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
