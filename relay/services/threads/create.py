"""message/send's create: a new handoff, its first message, audit row and event in one statement."""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import partial
from typing import Any

from psycopg2.extras import Json
from sqlalchemy import exists, func, or_, select
from sqlalchemy.orm import Session

from relay.errors import RelayError, invalid
from relay.ids import format_ulid, iso, new_ulid
from relay.models import Agent, Thread
from relay.services import after_commit, dispatch, statement_cursor
from relay.services.agents import check_handle
from relay.services.statements import Statement
from relay.services.threads.common import _body

# message/send's create, one round trip: read the recipient and whether it may receive from the
# caller (r), and only if it may (go): take both participants' feed locks in sorted order
# (the keys of common._serialize_feed_writes, computed here), read the clock after them (the aggregate over
# `locks` makes the clock wait for every lock; see common._serialize_feed_writes), then write the
# thread, its first message, the audit row and the outbox event with that one time. The
# recipient's row comes back either way: no `now` means nothing was written, and why.
_CREATE_SQL = """
WITH r AS (
    SELECT a.id, a.handle, a.disabled_at IS NOT NULL AS disabled,
           EXISTS (SELECT 1 FROM blocks b WHERE b.blocker_id = a.id AND b.blocked_id = %(sender)s) AS blocked
    FROM agents a WHERE a.handle = %(handle)s
),
go AS (SELECT r.id FROM r WHERE NOT r.disabled AND NOT r.blocked AND r.id <> %(sender)s AND %(intent_ok)s),
locks AS (
    SELECT pg_advisory_xact_lock(k.key) FROM go, LATERAL (
        SELECT ('x' || left(replace(p::text, '-', ''), 16))::bit(64)::bigint AS key
        FROM unnest(ARRAY[%(sender)s::uuid, go.id]) AS p ORDER BY p
    ) AS k
),
clock AS (SELECT clock_timestamp() AS now FROM (SELECT count(*) FROM locks) AS taken, go),
t AS (
    INSERT INTO threads (id, context_id, sender_id, recipient_id, intent, summary, proposed_action,
                         state, version, last_sequence_no, created_at, updated_at, priority, expires_at)
    SELECT %(thread_id)s, %(context_id)s, %(sender)s, go.id, %(intent)s, %(summary)s, %(proposed)s,
           'pending', 1, 1, clock.now, clock.now, %(priority)s,
           clock.now + CAST(%(ttl)s AS integer) * interval '1 second' FROM clock, go
    RETURNING id, recipient_id
),
m AS (
    INSERT INTO messages (id, thread_id, sequence_no, author_id, caller_id, target_id, role,
                          body, parts, artifacts, metadata, created_at)
    SELECT %(message_id)s, t.id, 1, %(sender)s, %(sender)s, t.recipient_id, 'caller',
           %(body)s, %(parts)s, %(artifacts)s, %(meta)s, clock.now FROM t, clock
    RETURNING id
),
a AS (
    INSERT INTO audit_events (thread_id, actor_id, action, to_state, message_id, created_at)
    SELECT t.id, %(sender)s, 'create', 'pending', m.id, clock.now FROM t, m, clock
),
e AS (
    INSERT INTO events (id, type, agent_id, thread_id, message_id, payload, created_at)
    SELECT %(event_id)s, 'message.created', t.recipient_id, t.id, m.id, '{}', clock.now FROM t, m, clock
)
SELECT r.id, r.handle, r.disabled, r.blocked, (SELECT now FROM clock) FROM r
"""
# PREPAREd: PostgreSQL parsed and planned the five-part statement on every send, which
# was half of its CPU per create (620 -> 310 us a create, measured one client at a time).
_CREATE = Statement(_CREATE_SQL)

# The recipient of a create and whether it blocks the caller, in one read.
_RECIPIENT_SQL = """
SELECT a.id, a.handle, a.disabled_at IS NOT NULL,
       EXISTS (SELECT 1 FROM blocks b WHERE b.blocker_id = a.id AND b.blocked_id = %(caller)s)
FROM agents a WHERE a.handle = %(handle)s
"""


def _intent_problem(params: dict) -> RelayError | None:
    intent = params.get("intent") or "inform"
    if intent == "propose_action" and params.get("proposed_action") is None:
        return RelayError(
            "invalid_intent_payload", "intent propose_action requires proposed_action", {"field": "proposed_action"}
        )
    if intent != "propose_action" and params.get("proposed_action") is not None:
        return RelayError(
            "invalid_intent_payload",
            f"proposed_action must be null or omitted when intent is {intent}",
            {"field": "proposed_action"},
        )
    return None


def _refuse_create(found, caller: Agent, handle: str, params: dict) -> None:
    """Raise the first of the create's checks that ``found`` (the recipient row) fails, in the documented order.

    recipient_not_found (unknown or disabled), invalid_params (yourself),
    invalid_intent_payload, teammate_blocked.
    """
    if found is None or found[2]:
        raise RelayError("recipient_not_found", f"no agent {handle}", {"recipient": handle})
    recipient_id, recipient_handle, _disabled, blocked = found[:4]
    if recipient_id == caller.id:
        raise invalid("recipient", "cannot hand off to yourself")
    problem = _intent_problem(params)
    if problem is not None:
        raise problem
    if blocked:
        raise RelayError("teammate_blocked", f"{recipient_handle} does not accept handoffs from you")


def _create(
    session: Session, caller: Agent, params: dict, adopt_context: bool = False, own_transaction: bool = False
) -> dict:
    """Create a handoff in one statement (_CREATE_SQL), which checks the recipient itself.

    With ``own_transaction`` (nothing else in the use case) the statement is its own
    transaction: no BEGIN/COMMIT round trips. A ``context_id`` needs its checks first,
    after the recipient's (the documented order), so that case reads the recipient before.
    """
    if params.get("recipient") is None:
        raise invalid("recipient", "is required when creating a handoff (task_id is null)")
    handle = check_handle(params["recipient"], "recipient")  # a look-alike of a handle is refused, not delivered
    context_id = params.get("context_id")
    if context_id is not None:
        own_transaction = False
        with statement_cursor(session) as cur:
            cur.execute(_RECIPIENT_SQL, {"caller": caller.id, "handle": handle})
            _refuse_create(cur.fetchone(), caller, handle, params)
        known = session.scalar(
            select(
                exists().where(
                    Thread.context_id == context_id,
                    or_(Thread.sender_id == caller.id, Thread.recipient_id == caller.id),
                )
            )
        )
        if not known and not adopt_context:
            raise invalid("context_id", "names no context in which you already have a thread")
        if not known:
            # Two first uses of one new id must not both see it unused (and share a context).
            session.execute(
                select(func.pg_advisory_xact_lock(int.from_bytes(context_id.bytes[:8], "big", signed=True)))
            )
        if not known and session.scalar(select(exists().where(Thread.context_id == context_id))):
            # Adopting an id other agents already use would put this thread in their context.
            raise invalid("context_id", "names a context of other agents; choose a new UUID")
    else:
        context_id = new_ulid()
    thread_id, message_id, event_id = new_ulid(), uuid.uuid4(), new_ulid()
    parts = params["message"]["parts"]
    body = _body(parts)
    with statement_cursor(session, alone=own_transaction) as cur:
        _CREATE.execute(
            session,
            {
                "handle": handle,
                "intent_ok": _intent_problem(params) is None,
                "thread_id": thread_id,
                "context_id": context_id,
                "sender": caller.id,
                "intent": params.get("intent") or "inform",
                "summary": body,
                "proposed": _json(params.get("proposed_action")),
                "message_id": message_id,
                "body": body,
                "parts": _json(parts),
                "artifacts": _json(params.get("artifacts") or []),
                "meta": _json(params.get("metadata") or {}),
                "event_id": event_id,
                "priority": params.get("priority") or "normal",
                "ttl": params.get("expires_in_seconds"),
            },
            cursor=cur,
        )
        found = cur.fetchone()
    if found is None or found[4] is None:  # nothing written: say why, in the documented order
        _refuse_create(found, caller, handle, params)
        raise RelayError("state_changed", "the recipient changed while the handoff was created; retry")
    after_commit(partial(dispatch.message_committed, message_id, event_id, (caller.id, found[0])))
    return {
        "task_id": format_ulid(thread_id),
        "thread_id": format_ulid(thread_id),
        "context_id": format_ulid(context_id),
        "status": {"state": "pending"},
        "message_id": str(message_id),
        "sequence_no": 1,
        "created_at": iso(found[4]),
        "priority": params.get("priority") or "normal",
        "expires_at": iso(found[4] + timedelta(seconds=ttl)) if (ttl := params.get("expires_in_seconds")) else None,
    }


def _json(value: Any) -> Json | None:
    """A jsonb parameter (the standard library's encoder, as SQLAlchemy's JSONB type uses)."""
    return None if value is None else Json(value)
