"""message/send's create: a new handoff, its first message, audit row and event in one statement."""

from __future__ import annotations

import uuid
from collections.abc import Callable
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
from relay.services.threads.common import _body, feed_lock_keys_sql

# A create's checks, in the documented order (the first that fails is the answer): each is
# its name, the SQL that is true when the recipient row `r` (no row: no agent has the handle)
# fails it, and the error it raises, given the handle as sent, the recipient's own handle and
# the params. Both statements below compute the failed check's name from this one table.
_CHECKS: tuple[tuple[str, str, Callable[[str, str, dict], RelayError]], ...] = (
    (
        "recipient_not_found",  # unknown or disabled
        "r.id IS NULL OR r.disabled",
        lambda handle, _recipient, _params: RelayError(
            "recipient_not_found", f"no agent {handle}", {"recipient": handle}
        ),
    ),
    (
        "recipient_is_caller",
        "r.id = %(sender)s",
        lambda _handle, _recipient, _params: invalid("recipient", "cannot hand off to yourself"),
    ),
    (
        "invalid_intent_payload",  # judged in Python (_intent_problem), sent as intent_ok
        "NOT %(intent_ok)s",
        lambda _handle, _recipient, params: _intent_problem(params),
    ),
    (
        "teammate_blocked",
        "r.blocked",
        lambda _handle, recipient, _params: RelayError(
            "teammate_blocked", f"{recipient} does not accept handoffs from you"
        ),
    ),
)
_REFUSALS = {name: error for name, _sql, error in _CHECKS}

# The recipient (r) and the name of the first check it fails, NULL when it passes them all
# (checked: one row, found or not).
_CHECKED = f"""
r AS (
    SELECT a.id, a.handle, a.disabled_at IS NOT NULL AS disabled,
           EXISTS (SELECT 1 FROM blocks b WHERE b.blocker_id = a.id AND b.blocked_id = %(sender)s) AS blocked
    FROM agents a WHERE a.handle = %(handle)s
),
checked AS (
    SELECT r.id, r.handle,
           CASE {" ".join(f"WHEN {sql} THEN '{name}'" for name, sql, _error in _CHECKS)} END AS refused
    FROM (VALUES (1)) AS one LEFT JOIN r ON true
)"""

# message/send's create, one round trip: read the recipient and the check it fails (checked),
# and only if it fails none (go): take both participants' feed locks (common.feed_lock_keys_sql,
# as common._serialize_feed_writes takes them), read the clock after them (the aggregate over
# `locks` makes the clock wait for every lock; see common._serialize_feed_writes), then write the
# thread, its first message, the audit row and the outbox event with that one time. The
# recipient's row and the failed check come back either way: no `now` means nothing was written.
_CREATE_SQL = f"""
WITH {_CHECKED},
go AS (SELECT checked.id FROM checked WHERE checked.refused IS NULL),
locks AS (
    SELECT pg_advisory_xact_lock(k.key)
    FROM go, LATERAL ({feed_lock_keys_sql("ARRAY[%(sender)s::uuid, go.id]")}) AS k
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
    SELECT %(event_id)s, 'message.created', t.recipient_id, t.id, m.id, '{{}}', clock.now FROM t, m, clock
)
SELECT checked.id, checked.handle, checked.refused, (SELECT now FROM clock) FROM checked
"""  # noqa: S608  (built from this module's constants, no input)
# PREPAREd: PostgreSQL parsed and planned the five-part statement on every send, which
# was half of its CPU per create (620 -> 310 us a create, measured one client at a time).
_CREATE = Statement(_CREATE_SQL)

# The recipient's checks alone, in one read: the same table, for a create that checks its
# context_id (after them) before it writes.
_RECIPIENT_SQL = f"WITH {_CHECKED}\nSELECT checked.refused, checked.handle FROM checked"  # noqa: S608


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


def _create(
    session: Session, caller: Agent, params: dict, adopt_context: bool = False, own_transaction: bool = False
) -> dict:
    """Create a handoff in one statement (_CREATE_SQL), which makes the checks (_CHECKS) itself.

    With ``own_transaction`` (nothing else in the use case) the statement is its own
    transaction: no BEGIN/COMMIT round trips. A ``context_id`` needs its checks first,
    after the recipient's (the documented order), so that case reads the recipient before.
    """
    if params.get("recipient") is None:
        raise invalid("recipient", "is required when creating a handoff (task_id is null)")
    handle = check_handle(params["recipient"], "recipient")  # a look-alike of a handle is refused, not delivered
    context_id = params.get("context_id")
    intent_ok = _intent_problem(params) is None
    if context_id is not None:
        own_transaction = False
        with statement_cursor(session) as cur:
            cur.execute(_RECIPIENT_SQL, {"sender": caller.id, "handle": handle, "intent_ok": intent_ok})
            refused, recipient = cur.fetchone()
        if refused is not None:
            raise _REFUSALS[refused](handle, recipient, params)
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
                "intent_ok": intent_ok,
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
        recipient_id, recipient, refused, now = cur.fetchone()
    if refused is not None:  # nothing written: the first check that failed says why
        raise _REFUSALS[refused](handle, recipient, params)
    if now is None:
        raise RelayError("state_changed", "the recipient changed while the handoff was created; retry")
    after_commit(partial(dispatch.message_committed, message_id, event_id, (caller.id, recipient_id)))
    return {
        "task_id": format_ulid(thread_id),
        "thread_id": format_ulid(thread_id),
        "context_id": format_ulid(context_id),
        "status": {"state": "pending"},
        "message_id": str(message_id),
        "sequence_no": 1,
        "created_at": iso(now),
        "priority": params.get("priority") or "normal",
        "expires_at": iso(now + timedelta(seconds=ttl)) if (ttl := params.get("expires_in_seconds")) else None,
    }


def _json(value: Any) -> Json | None:
    """A jsonb parameter (the standard library's encoder, as SQLAlchemy's JSONB type uses)."""
    return None if value is None else Json(value)
