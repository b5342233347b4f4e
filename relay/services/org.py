"""What an operator of one org may see and do (docs/console.md): the console's org-scoped use cases.

An operator of org ``acme`` sees the agents ``*@acme`` and the threads in which one of
them takes part; nothing else exists for it: every lookup outside that answers the same
not-found error as a thing that does not exist at all (``identity_not_found``,
``thread_not_found``), so the console's 404 never tells another org's names apart from
names nobody has. Actions go through the services the API uses (threads.transition,
blocks, agents' keys, webhooks), with the org's agent as the caller, so every rule of
those services holds.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from flask import current_app
from sqlalchemy import String, literal_column, or_, select, text, tuple_
from sqlalchemy.orm import aliased

from relay.errors import RelayError
from relay.extensions import db
from relay.ids import as_sent, encode_cursor, format_ulid, iso
from relay.models import Agent, Message, Thread, WebhookEndpoint, effective_state_sql, expired_at_sql
from relay.services import search, unit_of_work
from relay.services.agents import LEGACY_HANDLE_RE, MAX_HANDLE
from relay.services.delivery import circuit
from relay.services.threads import listing, read, transitions

SNIPPET_CHARS = 300
# Worst first: an agent's webhook health on the overview is that of its worst endpoint.
HEALTH_ORDER = ("disabled", "open", "slowed", "healthy")


def agent_in_org(org: str, handle: str) -> Agent:
    """The agent ``handle`` names if it is one of ``org``'s; raise identity_not_found otherwise.

    A malformed handle is not-found too: in a URL it names nothing.
    """
    normal = handle.strip().lower() if isinstance(handle, str) else ""
    agent = None
    if len(normal) <= MAX_HANDLE and LEGACY_HANDLE_RE.fullmatch(normal):
        agent = db.session.scalar(select(Agent).where(Agent.handle == normal, Agent.org == org))
    if agent is None:
        raise RelayError("identity_not_found", f"no agent {handle!r} in your org")
    return agent


# Open handoffs by their state as of now (relay.models.effective_state_sql): a lapsed lease
# counts as pending, a passed expiry not at all, whether or not the sweep recorded it yet;
# work waiting on its sender's answer (input_required) counts as accepted: it is taken.
_EFFECTIVE = effective_state_sql("threads")
_OVERVIEW = text(
    f"""
    SELECT a.id, a.handle, a.name, a.role, a.disabled_at,
           i.pending AS pending_in, i.accepted AS accepted_in, o.pending AS pending_out, o.accepted AS accepted_out,
           greatest(li.at, lo.at) AS last_activity
    FROM agents a
    LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE s = 'pending') AS pending, count(*) FILTER (WHERE s IN ('accepted', 'input_required')) AS accepted
        FROM (SELECT {_EFFECTIVE} AS s FROM threads WHERE recipient_id = a.id AND state IN ('pending', 'accepted', 'input_required')) e
    ) i ON true
    LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE s = 'pending') AS pending, count(*) FILTER (WHERE s IN ('accepted', 'input_required')) AS accepted
        FROM (SELECT {_EFFECTIVE} AS s FROM threads WHERE sender_id = a.id AND state IN ('pending', 'accepted', 'input_required')) e
    ) o ON true
    LEFT JOIN LATERAL (SELECT max(updated_at) AS at FROM threads WHERE recipient_id = a.id) li ON true
    LEFT JOIN LATERAL (SELECT max(updated_at) AS at FROM threads WHERE sender_id = a.id) lo ON true
    WHERE a.org = :org
    ORDER BY a.handle
    """  # noqa: S608  (effective_state_sql is a constant of relay.models, no input)
)


def overview(org: str) -> list[dict[str, Any]]:
    """The org's agents, by handle, each with its open handoffs and webhook health.

    Shape per agent: ``handle, name, role, disabled, pending_in, accepted_in, pending_out,
    accepted_out, last_activity`` (ISO time or None: the newest ``updated_at`` of its
    threads) and ``webhooks`` ``{"count", "state", "reason"}``, the state of its worst
    endpoint (``HEALTH_ORDER``; ``state`` None without endpoints).
    """
    with unit_of_work() as session:
        rows = session.execute(_OVERVIEW, {"org": org}).all()
        endpoints = session.scalars(
            select(WebhookEndpoint)
            .join(Agent, Agent.id == WebhookEndpoint.agent_id)
            .where(Agent.org == org, WebhookEndpoint.kind == "webhook")
        ).all()
    slow_ms = current_app.config["RELAY"].webhook_slow_ms
    worst: dict[uuid.UUID, dict[str, Any]] = {}
    for endpoint in endpoints:
        health = circuit.health(endpoint, slow_ms)
        seen = worst.setdefault(endpoint.agent_id, {"count": 0, "state": None, "reason": None})
        seen["count"] += 1
        if seen["state"] is None or HEALTH_ORDER.index(health["state"]) < HEALTH_ORDER.index(seen["state"]):
            seen["state"], seen["reason"] = health["state"], health["reason"]
    return [
        {
            "handle": r.handle,
            "name": r.name,
            "role": r.role,
            "disabled": r.disabled_at is not None,
            "pending_in": r.pending_in or 0,
            "accepted_in": r.accepted_in or 0,
            "pending_out": r.pending_out or 0,
            "accepted_out": r.accepted_out or 0,
            "last_activity": iso(r.last_activity),
            "webhooks": worst.get(r.id, {"count": 0, "state": None, "reason": None}),
        }
        for r in rows
    ]


def _thread_sides(org: str, task_id: uuid.UUID) -> tuple[Thread, Agent | None, Agent | None]:
    """The thread and those of its sender and recipient who are in ``org``; thread_not_found if neither is."""
    thread = db.session.scalar(select(Thread).where(Thread.id == task_id))
    if thread is None or org not in (thread.sender.org, thread.recipient.org):
        raise RelayError("thread_not_found", f"no thread {as_sent(task_id)}")
    sender = thread.sender if thread.sender.org == org else None
    recipient = thread.recipient if thread.recipient.org == org else None
    return thread, sender, recipient


def thread_view(org: str, task_id: uuid.UUID) -> dict[str, Any]:
    """A thread of the org as ``tasks/get`` returns it, plus ``audit`` (threads.audit_trail)
    and ``can_cancel`` (pending, and sent by an agent of the org), without ``lease_token``:
    the lease's secret is its worker's, never an operator's page's (when the lease ends is).

    Read as one of the org's participants, without marking anything read: an operator
    reading a thread is not the agent reading it. Raises thread_not_found.
    """
    with unit_of_work():
        thread, sender, recipient = _thread_sides(org, task_id)
    reader = sender or recipient
    view = read.get_thread(reader, task_id, mark_read=False)
    view.pop("lease_token", None)
    view["audit"] = read.audit_trail(reader, task_id)
    view["can_cancel"] = sender is not None and view["status"]["state"] == "pending"
    return view


def thread_marker(org: str, task_id: uuid.UUID) -> tuple[int, int, str]:
    """``(last_sequence_no, version, state)`` of a thread of the org: what changes when a message
    or a transition is written, or when the clock moves its state (a lease that lapsed, an
    expiry that passed: ``state`` is the effective one, before the sweep records it). A page
    polls it. Raises thread_not_found."""
    with unit_of_work() as session:
        thread, _sender, _recipient = _thread_sides(org, task_id)
        state = session.scalar(
            select(literal_column(_EFFECTIVE, String)).select_from(Thread).where(Thread.id == task_id)
        )
        return thread.last_sequence_no, thread.version, state


def cancel(org: str, task_id: uuid.UUID) -> dict[str, Any]:
    """Cancel a pending handoff that an agent of the org sent, as that agent (threads.transition).

    Raises thread_not_found (not the org's), not_authorized_transition (the org's agent is
    only its recipient), invalid_transition / state_changed (threads.transition's rules).
    """
    # Read in the transaction the transition commits (no commit of its own): a console
    # action's audit row, flushed before this, must commit only with the cancel.
    _thread, sender, _recipient = _thread_sides(org, task_id)
    if sender is None:
        raise RelayError(
            "not_authorized_transition",
            "only the sender may cancel a handoff, and its sender is not in your org",
            {"transition": "cancel", "required_role": "sender"},
        )
    return transitions.transition(sender, task_id, "cancel")


def search_feed(org: str, q: str, limit: int = 50, cursor: tuple[datetime, uuid.UUID] | None = None) -> dict[str, Any]:
    """Messages of the org's threads matching ``q`` (full text, as the feed's ``q``), newest first.

    A message counts when its sender or recipient side is an agent of the org. Shape:
    ``{"items": [{id, sequence_no, created_at, from, role, snippet, task_id, task_state, caller,
    target, summary_preview}], "next_cursor": str | None}``; the cursor is
    ``(created_at, id)`` of the last row.
    """
    members = select(Agent.id).where(Agent.org == org).scalar_subquery()
    author, caller, target = aliased(Agent), aliased(Agent), aliased(Agent)
    stmt = (
        select(
            Message.id,
            Message.sequence_no,
            Message.created_at,
            Message.role,
            Message.body,
            Message.thread_id,
            literal_column(_EFFECTIVE, String).label("state"),
            Thread.summary,
            author.handle.label("author"),
            caller.handle.label("caller"),
            target.handle.label("target"),
        )
        .join(Thread, Thread.id == Message.thread_id)
        .join(author, author.id == Message.author_id)
        .join(caller, caller.id == Message.caller_id)
        .join(target, target.id == Message.target_id)
        .where(or_(Message.caller_id.in_(members), Message.target_id.in_(members)), search.matches(q))
    )
    if cursor is not None:
        stmt = stmt.where(tuple_(Message.created_at, Message.id) < tuple_(*cursor))
    stmt = stmt.order_by(Message.created_at.desc(), Message.id.desc()).limit(limit + 1)
    with unit_of_work() as session:
        rows = session.execute(stmt).all()
    page = rows[:limit]
    items = [
        {
            "id": str(r.id),
            "sequence_no": r.sequence_no,
            "created_at": iso(r.created_at),
            "from": r.author,
            "role": r.role,
            "snippet": r.body[:SNIPPET_CHARS],
            "task_id": format_ulid(r.thread_id),
            "task_state": r.state,
            "caller": r.caller,
            "target": r.target,
            "summary_preview": r.summary[: listing.PREVIEW_CHARS],
        }
        for r in page
    ]
    last = page[-1] if page else None
    more = last is not None and len(rows) > limit
    return {"items": items, "next_cursor": encode_cursor(last.created_at, last.id) if more else None}


# Handoffs of the org opened and closed in each of the last 24 hours (the DB's clock); a
# thread counts for the org when one of its sides is the org's. Closed: any terminal
# state's time; an expiry the sweep has not recorded yet counts at its moment (the
# effective state, as every read shows it).
_CLOSED_AT = f"coalesce(t.completed_at, t.cancelled_at, t.declined_at, t.failed_at, {expired_at_sql('t')})"
_ACTIVITY = text(
    f"""
    WITH hours AS (
        SELECT h FROM generate_series(date_trunc('hour', now()) - interval '23 hours', date_trunc('hour', now()),
                                      interval '1 hour') AS h
    ), mine AS (
        SELECT t.created_at, {_CLOSED_AT} AS closed_at
        FROM threads t
        WHERE (t.sender_id IN (SELECT id FROM agents WHERE org = :org)
               OR t.recipient_id IN (SELECT id FROM agents WHERE org = :org))
          AND (t.created_at >= date_trunc('hour', now()) - interval '23 hours'
               OR {_CLOSED_AT} >= date_trunc('hour', now()) - interval '23 hours')
    )
    SELECT h.h,
           (SELECT count(*) FROM mine WHERE created_at >= h.h AND created_at < h.h + interval '1 hour') AS opened,
           (SELECT count(*) FROM mine WHERE closed_at >= h.h AND closed_at < h.h + interval '1 hour') AS closed
    FROM hours h ORDER BY h.h
    """  # noqa: S608  (constant SQL of relay.models, no input)
)


def activity(org: str) -> list[dict[str, Any]]:
    """The org's handoffs opened and closed (any terminal state: completed, cancelled, declined,
    failed, expired) per hour, oldest hour first.

    24 rows ``{"hour": ISO start of the hour (UTC), "opened": n, "closed": n}``, the last
    one the current hour.
    """
    rows = db.session.execute(_ACTIVITY, {"org": org}).all()
    return [{"hour": iso(r.h), "opened": r.opened, "closed": r.closed} for r in rows]
