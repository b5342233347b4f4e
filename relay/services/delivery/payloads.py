"""Preparing claimed deliveries: their bodies re-read, bounded and signed, and each attempt's row written before it is sent."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, text
from standardwebhooks import Webhook

from relay import crypto
from relay.extensions import db
from relay.ids import format_ulid, iso
from relay.models import Event, Thread, WebhookEndpoint
from relay.services import push, unit_of_work
from relay.services.delivery.claims import Claimed
from relay.services.delivery.common import IN_FLIGHT, _settings, event_id_text


@dataclass(frozen=True)
class Outgoing:
    """A claimed delivery prepared to send: where, what, signed; or ``error`` if it cannot be sent at all."""

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
    from relay.services.threads.listing import thread_summary

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


def prepare(claims: list[Claimed]) -> list[Outgoing]:
    """Build, bound and sign the payloads of claimed deliveries, their data re-read now (one query for all)."""
    with unit_of_work() as session:
        return _prepare(session, claims)


def _prepare(session, claims: list[Claimed]) -> list[Outgoing]:
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
            out.append(Outgoing(c, row.url, b"", {}, error=str(exc)))
            continue
        out.append(Outgoing(c, row.url, body, headers))
    return _started(session, out, now)


_START_ATTEMPTS = text(
    """
    INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, error, duration_ms)
    SELECT d, CAST(:at AS timestamptz), NULL, :in_flight, 0 FROM unnest(CAST(:ids AS uuid[])) AS d
    RETURNING id, delivery_id
    """
)


def _started(session, prepared: list[Outgoing], now: datetime) -> list[Outgoing]:
    """Write each attempt's row before it is sent (its outcome ``IN_FLIGHT``), in the claim's transaction."""
    if not prepared:
        return prepared
    rows = session.connection().execute(
        _START_ATTEMPTS,
        {"ids": [str(p.claimed.delivery_id) for p in prepared], "at": now, "in_flight": IN_FLIGHT},
    )
    ids = {r.delivery_id: r.id for r in rows}
    return [replace(p, attempt=(ids[p.claimed.delivery_id], now)) for p in prepared]
