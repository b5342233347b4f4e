"""A2A push notification configs: per-task webhook endpoints of kind ``a2a_push``.

A config is a row of ``webhook_endpoints`` bound to one thread, so its notifications go
through the webhook outbox, deliveries, retries and auto-disable unchanged (relay/services/
webhooks.py). Only the client that sent the task (the caller of the A2A binding) may
configure it; the URL passes the same SSRF checks as a webhook's, at creation and at
every delivery. The token and credentials are stored encrypted.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from relay import crypto
from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.ids import as_sent, format_ulid
from relay.models import Agent, Event, Message, Thread, WebhookEndpoint
from relay.services import a2a_view, unit_of_work
from relay.services.outbound import DEFAULT_EVENTS, check_url, new_secret
from relay.services.threads.common import load_thread
from relay.services.threads.listing import thread_summary
from relay.services.threads.read import message_row

KIND = "a2a_push"
MAX_CONFIGS_PER_TASK = 10


def config_view(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """A config as the transport shows it: id, task_id, url, token, auth_scheme, enabled."""
    return {
        "id": endpoint.push_config_id,
        "task_id": format_ulid(endpoint.thread_id),
        "url": endpoint.url,
        "token": crypto.decrypt(endpoint.token_encrypted) if endpoint.token_encrypted else None,
        "auth_scheme": endpoint.auth_scheme,
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
    }


def check_target(config: dict) -> None:
    """Refuse a config whose URL may not be called (the SSRF rules of webhooks); raise invalid_params.

    A host that does not resolve yet is taken (docs/decisions.md, "A push URL that does
    not resolve"): A2A clients register a config for a receiver they may start later, and
    each delivery checks the host again before it connects. Run before the transaction
    that stores it: it resolves DNS, which must not happen while a send holds its
    participants' locks.
    """
    check_url(config["url"], unresolved_ok=True)


def add_config(session: Session, caller: Agent, thread_id: uuid.UUID, config: dict) -> dict:
    """Store a config for a thread the caller sent, in ``session``'s transaction; return its view.

    The caller has run check_target and holds the thread's row lock (a send's, or
    create_config's), so two creates cannot both pass the count or both insert one id.
    ``config``: ``url``, optional ``id`` (a new UUID when absent), ``token``,
    ``authentication`` ``{scheme, credentials}``. An ``id`` the task already has names
    that config: it is replaced (url, token, authentication) and enabled again, as A2A's
    create was once named "set". Raises invalid_params (a new config past
    MAX_CONFIGS_PER_TASK).
    """
    config_id = config.get("id") or str(uuid.uuid4())
    auth = config.get("authentication") or {}
    fields = {
        "url": config["url"],
        "token_encrypted": crypto.encrypt(config["token"]) if config.get("token") else None,
        "auth_scheme": auth.get("scheme"),
        "auth_credentials_encrypted": crypto.encrypt(auth["credentials"]) if auth.get("credentials") else None,
    }
    endpoint = session.scalar(_configs(thread_id).where(WebhookEndpoint.push_config_id == config_id))
    if endpoint is not None:
        for name, value in fields.items():
            setattr(endpoint, name, value)
        endpoint.enabled, endpoint.disabled_reason = True, None
        session.flush()
        return config_view(endpoint)
    count = session.scalar(select(func.count()).select_from(_configs(thread_id).subquery()))
    if count >= MAX_CONFIGS_PER_TASK:
        raise invalid(
            "taskId",
            f"the task already has {MAX_CONFIGS_PER_TASK} push notification configs, the most "
            "it may have; delete one first",
        )
    endpoint = WebhookEndpoint(
        agent_id=caller.id,
        kind=KIND,
        thread_id=thread_id,
        push_config_id=config_id,
        events=list(DEFAULT_EVENTS),
        description="A2A push notification config",
        enabled=True,
        secret_encrypted=crypto.encrypt(new_secret()),
        **fields,
    )
    session.add(endpoint)
    session.flush()
    return config_view(endpoint)


def _configs(thread_id: uuid.UUID):
    return select(WebhookEndpoint).where(WebhookEndpoint.kind == KIND, WebhookEndpoint.thread_id == thread_id)


def create_config(caller: Agent, peer: Agent, task_id: uuid.UUID, config: dict) -> dict:
    """Add a push notification config to a task the caller sent to ``peer``.

    Raises thread_not_found (not such a task), check_target's and add_config's errors.
    """
    check_target(config)
    with unit_of_work() as session:
        thread, _side = load_thread(session, task_id, caller, peer=peer, lock=True)
        return add_config(session, caller, thread.id, config)


def get_config(caller: Agent, peer: Agent, task_id: uuid.UUID, config_id: str) -> dict:
    """Return one config of the task; raise thread_not_found or not_found."""
    with unit_of_work() as session:
        thread, _side = load_thread(session, task_id, caller, peer=peer)
        endpoint = session.scalar(_configs(thread.id).where(WebhookEndpoint.push_config_id == config_id))
        if endpoint is None:
            raise RelayError("not_found", f"task {as_sent(task_id)} has no push notification config {config_id}")
        return config_view(endpoint)


def list_configs(caller: Agent, peer: Agent, task_id: uuid.UUID) -> list[dict]:
    """Return the task's configs, oldest first (at most MAX_CONFIGS_PER_TASK, so one page)."""
    with unit_of_work() as session:
        thread, _side = load_thread(session, task_id, caller, peer=peer)
        rows = session.scalars(_configs(thread.id).order_by(WebhookEndpoint.created_at, WebhookEndpoint.id))
        return [config_view(e) for e in rows]


def delete_config(caller: Agent, peer: Agent, task_id: uuid.UUID, config_id: str) -> None:
    """Delete one config of the task and its delivery log, if it is there (idempotent); raise thread_not_found."""
    with unit_of_work() as session:
        thread, _side = load_thread(session, task_id, caller, peer=peer)
        endpoint = session.scalar(
            _configs(thread.id).where(WebhookEndpoint.push_config_id == config_id).with_for_update()
        )
        # Deleting is idempotent (A2A): a config already gone is the outcome asked for.
        if endpoint is not None:
            session.delete(endpoint)


def headers(endpoint: WebhookEndpoint) -> dict[str, str]:
    """The A2A headers of a push: ``X-A2A-Notification-Token`` and ``Authorization`` when configured."""
    out: dict[str, str] = {}
    if endpoint.token_encrypted:
        out["X-A2A-Notification-Token"] = crypto.decrypt(endpoint.token_encrypted)
    if endpoint.auth_scheme:
        credentials = crypto.decrypt(endpoint.auth_credentials_encrypted) if endpoint.auth_credentials_encrypted else ""
        out["Authorization"] = f"{endpoint.auth_scheme} {credentials}".strip()
    return out


def build_payload(event: Event) -> dict[str, Any]:
    """An A2A v1.0 ``StreamResponse`` for a push config, shaped as the task stream shapes it.

    Always ``{"statusUpdate": TaskStatusUpdateEvent}`` (re-read now): a state change carries
    ``metadata {"transition", "from", "to"}``; a reply carries the Message (its artifacts
    as ``data`` parts) in ``status.message``, stamped with the message's time, and the
    task's current state. One shape for both surfaces: a2a-sdk stops reading a stream at a
    top-level ``message``, and a client should not see one reply in two forms.
    """
    thread = db.session.get(Thread, event.thread_id)
    task = {
        **thread_summary(thread),
        "result_summary": thread.result_summary,
        "reason": thread.reason,
        "question": thread.question,
    }
    state = task["status"]["state"]
    if event.type == "message.created":
        message = db.session.get(Message, event.message_id)
        if message is not None:
            row = message_row(message)
            reply = a2a_view.message_out(row, task, opening=row["sequence_no"] == 1)
            return a2a_view.status_event(task, state, row["created_at"], message=reply)
    transition = {k: event.payload.get(k) for k in ("transition", "from", "to") if k in event.payload}
    return a2a_view.status_event(task, state, task["updated_at"], metadata=transition)
