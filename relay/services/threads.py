"""Handoff threads: create, append, read, list and transition (docs/api.md, "JSON-RPC: `POST /a2a`").

Each public function is one use case and one transaction. Callers pass loaded params
(see relay.schemas.handoffs); results are plain dicts ready for any transport.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from psycopg2.extras import Json
from sqlalchemy import ARRAY, String, Text, and_, bindparam, cast, exists, func, literal_column, or_, select, update
from sqlalchemy.orm import Session, aliased

from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.ids import as_sent, encode_cursor, format_ulid, iso, new_ulid, ulid_of_uuid_text
from relay.models import (
    TERMINAL_STATES,
    Agent,
    AuditEvent,
    Event,
    Message,
    ReadPosition,
    Thread,
    effective_state_sql,
    expired_at_sql,
)
from relay.services import (
    Prepared,
    Shapes,
    a2a_view,
    after_commit,
    dispatch,
    idempotency,
    iso_text,
    own_transaction,
    statement_cursor,
    unit_of_work,
)
from relay.services.agents import check_handle

PREVIEW_CHARS = 200


# tasks/update's transitions (docs/api.md, "Transition result"): transition -> (from state,
# to state, who may call it)
TRANSITIONS: dict[str, tuple[str, str, str]] = {
    "accept": ("pending", "accepted", "recipient"),
    "complete": ("accepted", "completed", "recipient"),
    "cancel": ("pending", "cancelled", "sender"),
    "decline": ("pending", "declined", "recipient"),
    "fail": ("accepted", "failed", "recipient"),
    "release": ("accepted", "pending", "recipient"),
    "renew": ("accepted", "accepted", "recipient"),
    "request_input": ("accepted", "input_required", "recipient"),
}
# A worker waiting on its requester may still finish, give up or give the work back, and the
# requester asked a question may withdraw the handoff instead of answering: these also run
# from input_required (the open question is then dropped).
ALSO_FROM: dict[str, tuple[str, ...]] = {
    "cancel": ("input_required",),
    "complete": ("input_required",),
    "fail": ("input_required",),
    "release": ("input_required",),
}
# What the requester's message does to an input_required handoff (audit action and
# task.updated transition): it is the answer, and the work goes on.
INPUT_PROVIDED = "input_provided"
STAMP_COLUMN = {
    "accepted": "accepted_at",
    "completed": "completed_at",
    "cancelled": "cancelled_at",
    "declined": "declined_at",
    "failed": "failed_at",
    "expired": "expired_at",
}
# Transitions whose reason is required (1-2,000 characters), and those a lease fences:
# while leased they must carry its current lease_token, and leased or not a lease_token
# they carry must be the current one.
REASON_REQUIRED = ("decline", "fail")
FENCED = ("complete", "fail", "release", "renew", "request_input")
# The audit actions (and task.updated transitions) of what the clock does, not a caller.
LEASE_EXPIRED, EXPIRED = "lease_expired", "expire"


def _now(session: Session) -> datetime:
    # Read once per use case so every row it writes shares one time; clock_timestamp()
    # rather than now() because it is taken after the thread lock, which keeps the feed's
    # (created_at, id) order close to commit order for catch-up readers.
    return session.scalar(select(func.clock_timestamp()))


def feed_lock_key(agent_id: uuid.UUID) -> int:
    """The advisory lock key of an identity's feed: its UUID's first 8 bytes as a signed bigint.

    _CREATE_SQL computes the same key in SQL; tests/test_hot_paths.py holds them equal.
    """
    return int.from_bytes(agent_id.bytes[:8], "big", signed=True)


def _serialize_feed_writes(session: Session, *agent_ids: uuid.UUID) -> None:
    """Take the participants' feed locks so messages commit in ``created_at`` order per identity.

    The feed's catch-up loop (docs/api.md, "The messages feed") pages ``since`` the newest time a client saw. If two
    messages to one identity could commit in the opposite order of their timestamps,
    the later-committing one would carry an older time and be skipped forever. Holding
    a transaction-scoped advisory lock per participant (taken in sorted order, so no
    deadlock) while the timestamp is read and until commit rules that out; writes that
    share no participant still run in parallel.
    """
    for agent_id in sorted(set(agent_ids)):
        session.execute(select(func.pg_advisory_xact_lock(feed_lock_key(agent_id))))


# message/send's create, one round trip: read the recipient and whether it may receive from the
# caller (r), and only if it may (go): take both participants' feed locks in sorted order
# (the keys of _serialize_feed_writes, computed here), read the clock after them (the aggregate over
# `locks` makes the clock wait for every lock; see _serialize_feed_writes), then write the
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
# Prepared: PostgreSQL parsed and planned the five-part statement on every send, which
# was half of its CPU per create (620 -> 310 us a create, measured one client at a time).
_CREATE = Prepared(_CREATE_SQL)

# The recipient of a create and whether it blocks the caller, in one read.
_RECIPIENT_SQL = """
SELECT a.id, a.handle, a.disabled_at IS NOT NULL,
       EXISTS (SELECT 1 FROM blocks b WHERE b.blocker_id = a.id AND b.blocked_id = %(caller)s)
FROM agents a WHERE a.handle = %(handle)s
"""


def _body(parts: list[dict[str, Any]]) -> str:
    return "\n\n".join(p["text"] for p in parts if p.get("text"))


def _payload(metadata: dict[str, Any]) -> dict[str, Any]:
    """A message's ``payload``: its metadata minus ``client_idempotency_key`` (docs/api.md, "Thread")."""
    return {k: v for k, v in metadata.items() if k != "client_idempotency_key"}


def _participant_role(thread: Thread, agent: Agent) -> str | None:
    if thread.sender_id == agent.id:
        return "sender"
    if thread.recipient_id == agent.id:
        return "recipient"
    return None


def _load_thread(
    session: Session, task_id: uuid.UUID, caller: Agent, *, lock: bool = False, peer: Agent | None = None
) -> tuple[Thread, str]:
    """Return the thread and the caller's side; raise thread_not_found / not_a_participant.

    With ``peer`` (the A2A binding, where the caller talks to one agent), only a thread
    the caller sent to ``peer`` exists; any other is thread_not_found.
    """
    stmt = select(Thread).where(Thread.id == task_id)
    if lock:
        stmt = stmt.with_for_update(of=Thread)
    thread = session.scalar(stmt)
    if thread is None or (peer is not None and (thread.sender_id, thread.recipient_id) != (caller.id, peer.id)):
        raise RelayError("thread_not_found", f"no thread {as_sent(task_id)}")  # the id as the caller sent it
    side = _participant_role(thread, caller)
    if side is None:
        # Say nothing about the thread itself: not its state, not its participants, to a non-participant.
        raise RelayError("not_a_participant", "you are neither the sender nor the recipient of this thread")
    return thread, side


def _add_message(session: Session, thread: Thread, author: Agent, params: dict, now: datetime) -> Message:
    message = Message(
        id=uuid.uuid4(),
        thread_id=thread.id,
        sequence_no=thread.last_sequence_no,
        author_id=author.id,
        caller_id=thread.sender_id,
        target_id=thread.recipient_id,
        role="caller" if author.id == thread.sender_id else "agent",
        body=_body(params["message"]["parts"]),
        parts=params["message"]["parts"],
        artifacts=params.get("artifacts") or [],
        meta=params.get("metadata") or {},
        created_at=now,
    )
    session.add(message)
    other = thread.recipient_id if author.id == thread.sender_id else thread.sender_id
    session.add(
        AuditEvent(
            thread_id=thread.id,
            actor_id=author.id,
            action="create" if thread.last_sequence_no == 1 else "append",
            to_state=thread.state,
            message_id=message.id,
            created_at=now,
        )
    )
    event = Event(
        id=new_ulid(),
        type="message.created",
        agent_id=other,
        thread_id=thread.id,
        message_id=message.id,
        payload={},
        created_at=now,
    )
    session.add(event)
    # No read-position write here: unread counts only the other side's messages, so the
    # author's own message never needs marking (and the upsert was a third of a send).
    after_commit(partial(dispatch.message_committed, message.id, event.id, (thread.sender_id, thread.recipient_id)))
    return message


load_thread = _load_thread  # for sibling services (push configs) that scope to a thread the same way


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
        cur.execute(
            _CREATE.ready(session),
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


CREATE_ONLY = ("recipient", "intent", "proposed_action", "context_id", "priority", "expires_in_seconds")


def _append(session: Session, caller: Agent, params: dict, peer: Agent | None = None) -> dict:
    for name in CREATE_ONLY:
        if params.get(name) is not None:
            raise invalid(name, "is only allowed when creating a handoff (task_id is null)")
    # Lock the thread row: concurrent appends queue here, so sequence_no stays gapless.
    thread, _side = _load_thread(session, params["task_id"], caller, lock=True, peer=peer)
    expected = params.get("expect_context_id")
    if expected is not None and expected != thread.context_id:
        raise invalid("context_id", "does not match the task's context")
    settle(session, thread, _now(session))  # an expired handoff takes no message, at once
    if thread.state in TERMINAL_STATES:
        raise RelayError(
            "thread_terminal", f"the thread is {thread.state}; no more messages can be added", {"state": thread.state}
        )
    other = thread.recipient if caller.id == thread.sender_id else thread.sender
    if other.disabled_at is not None:
        # Its key may have leaked: nothing more is stored for it until an operator re-enables it.
        raise RelayError(
            "recipient_disabled",
            f"{other.handle} is disabled; the thread takes no new messages until it is re-enabled",
            {"handle": other.handle},
        )
    _serialize_feed_writes(session, thread.sender_id, thread.recipient_id)
    now = _now(session)
    thread.last_sequence_no += 1
    thread.updated_at = now
    if caller.id == thread.recipient_id and thread.state == "accepted" and thread.lease_seconds is not None:
        # The worker is working: its message renews the lease, as renew does (docs/decisions.md, "The work lifecycle").
        thread.lease_expires_at = now + timedelta(seconds=thread.lease_seconds)
    if caller.id == thread.sender_id and thread.state == "input_required":
        _provide_input(session, thread, now)
    message = _add_message(session, thread, caller, params, now)
    return {
        "task_id": format_ulid(thread.id),
        "thread_id": format_ulid(thread.id),
        "context_id": format_ulid(thread.context_id),
        "status": {"state": thread.state},
        "message_id": str(message.id),
        "sequence_no": message.sequence_no,
        "created_at": iso(now),
    }


def _provide_input(session: Session, thread: Thread, now: datetime) -> None:
    """The requester's message answers an input_required handoff: it is accepted again.

    The lease (if any) keeps its token and starts again for its full length: its clock
    stood still while the worker waited. Writes the ``input_provided`` audit row and a
    ``task.updated`` event to the recipient, in the append's transaction.
    """
    thread.state = "accepted"
    thread.version += 1
    thread.question = thread.input_requested_at = None
    if thread.lease_seconds is not None:
        thread.lease_expires_at = now + timedelta(seconds=thread.lease_seconds)
    _announce(session, thread, thread.sender_id, INPUT_PROVIDED, "input_required", "accepted", now,
              to=(thread.recipient_id,))  # fmt: skip


def send_message(
    caller: Agent,
    params: dict,
    *,
    peer: Agent | None = None,
    adopt_context: bool = False,
    then: Callable[[Session, dict], None] | None = None,
) -> dict:
    """Create a handoff (``task_id`` null) or append to one (``message/send``, docs/api.md).

    Create raises invalid_params (recipient missing, yourself, unknown context_id),
    recipient_not_found, invalid_intent_payload, teammate_blocked. Append raises
    thread_not_found, not_a_participant, thread_terminal. Either raises
    duplicate_idempotency_key when ``metadata.client_idempotency_key`` was used with
    other params.

    The A2A binding passes ``peer`` (appends only to threads the caller sent to that
    agent), ``adopt_context`` (a ``context_id`` nobody uses yet starts a new context with
    that id, A2A's client-chosen contextId), ``params["expect_context_id"]`` (an append
    whose thread is in another context is invalid_params) and ``then(session, result)``,
    run in the same transaction after a first (not replayed) send.
    """
    key = (params.get("metadata") or {}).get("client_idempotency_key")

    def work(session: Session) -> dict:
        if params.get("task_id") is None:
            # Alone in its use case (no key to record, nothing run after it): no BEGIN/COMMIT.
            alone = key is None and then is None
            result = _create(session, caller, params, adopt_context=adopt_context, own_transaction=alone)
        else:
            result = _append(session, caller, params, peer=peer)
        if then is not None:
            then(session, result)
        return result

    return idempotency.run_once(caller, key, "message/send", params, work)


def message_row(message: Message) -> dict[str, Any]:
    """A message as ``tasks/get`` lists it (docs/api.md, "Thread"): id, sequence_no, from, body, payload...

    A message sent over the A2A binding also carries ``a2a_message_id``, the messageId
    its author chose (its idempotency key, minus the reserved prefix).
    """
    m = message
    return _message_row(
        m.id, m.sequence_no, m.author.handle, m.role, m.body, m.parts, m.artifacts, m.meta, m.created_at, m.read_at
    )


def _message_row(id_, sequence_no, author, role, body, parts, artifacts, meta, created_at, read_at) -> dict[str, Any]:
    row = {
        "id": str(id_),
        "sequence_no": sequence_no,
        "from": author,
        "role": role,
        "body": body,
        "parts": parts,
        "artifacts": artifacts,
        "payload": _payload(meta),
        "created_at": iso(created_at),
        "read_at": iso(read_at),
    }
    key = meta.get("client_idempotency_key")
    if isinstance(key, str) and (message_id := a2a_view.message_id_of(key)) is not None:
        row["a2a_message_id"] = message_id
    return row


def _status(thread: Thread) -> dict[str, Any]:
    return {"state": thread.state}


def get_thread(
    caller: Agent,
    task_id: uuid.UUID,
    *,
    peer: Agent | None = None,
    mark_read: bool = True,
    messages_limit: int | None = None,
    messages_after: int | None = None,
    messages_last: int | None = None,
) -> dict:
    """Return the thread with its messages and mark them read for the caller (``tasks/get``, docs/api.md).

    Without paging, every message. ``messages_limit`` (1-1000) and/or
    ``messages_after`` (a ``sequence_no``; 0 is the start) return one page: the messages
    after it, oldest first, at most ``messages_limit`` (default 1000), and the answer has
    ``messages_next``, the ``messages_after`` of the next page (None when none remain).
    A page also has ``messages_total``, the thread's message count (its last
    ``sequence_no``; messages are gapless). ``messages_last=N`` returns only the newest N (A2A ``historyLength``), with
    ``artifact_rows`` (``[{id, sequence_no, artifacts}]``) of every message that has any.
    ``artifacts`` is the returned messages' artifacts. Read marks go up to the newest message
    returned, never back. ``mark_read=False`` only reads (the A2A binding answering a
    send or a cancel with the task: the caller has not read the other side's messages by
    doing that). Raises thread_not_found, not_a_participant (``peer``: see _load_thread).
    """
    paged = messages_limit is not None or messages_after is not None
    with unit_of_work() as session, statement_cursor(session, alone=True) as cur:
        cur.execute(_GET_THREAD.ready(session), {"id": task_id})
        t = cur.fetchone()
        if t is None or (peer is not None and (t[2], t[3]) != (caller.id, peer.id)):
            raise RelayError("thread_not_found", f"no thread {as_sent(task_id)}")
        if caller.id not in (t[2], t[3]):
            raise RelayError("not_a_participant", "you are neither the sender nor the recipient of this thread")
        more, artifact_rows = False, None
        if paged:
            limit = messages_limit or MAX_MESSAGES_PAGE
            cur.execute(_GET_PAGE.ready(session), {"id": task_id, "after": messages_after or 0, "n": limit + 1})
            rows = cur.fetchall()
            more, rows = len(rows) > limit, rows[:limit]
        elif messages_last is not None:
            cur.execute(_GET_LAST.ready(session), {"id": task_id, "n": min(messages_last, t[21])})
            rows = cur.fetchall()[::-1]
            # Every message's artifacts still (an A2A task's artifacts are all of the task's),
            # read without the bodies and parts of the messages left out.
            cur.execute(_GET_ARTIFACTS.ready(session), {"id": task_id})
            artifact_rows = [{"id": str(i), "sequence_no": n, "artifacts": a} for i, n, a in cur.fetchall()]
        else:
            cur.execute(_GET_MESSAGES.ready(session), {"id": task_id})
            rows = cur.fetchall()
        messages = [_message_row(*m) for m in rows]
        if mark_read and messages:
            # Read up to what this answer holds (not the thread's counter, which a later
            # append may have moved on): a message is marked read only once it was shown.
            other = t[3] if caller.id == t[2] else t[2]
            read_at = _mark_read(session, task_id, caller.id, messages[-1]["sequence_no"], author=other)
            for m in messages:  # the receipts this read wrote, in its own answer too
                if read_at is not None and m["read_at"] is None and m["from"] != caller.handle:
                    m["read_at"] = read_at
    state = t[22]
    # A lease that lapsed is shown as none, as the state is pending; an unleased accept's
    # token is never shown; a paused lease (input_required) keeps its token.
    leased = state in ("accepted", "input_required") and t[33] is not None
    return {
        "thread_id": (tid := format_ulid(t[0])),
        "task_id": tid,
        "context_id": format_ulid(t[1]),
        "status": {"state": state},
        "sender": {"handle": t[15], "name": t[16], "role": t[17]},
        "recipient": {"handle": t[18], "name": t[19], "role": t[20]},
        "recipient_id": str(t[3]),
        "summary": t[5],
        "intent": t[6],
        "artifacts": [a for m in messages for a in m["artifacts"]],
        "proposed_action": t[7],
        "messages": messages,
        "result_summary": t[8],
        "version": t[9],
        # A lease lapsed but not yet recorded: pending shows no accept time, as after the sweep.
        "accepted_at": None if (state, t[4]) == ("pending", "accepted") else iso(t[10]),
        "completed_at": iso(t[11]),
        "cancelled_at": iso(t[12]),
        "created_at": iso(t[13]),
        "updated_at": iso(t[14]),
        **_lifecycle_fields(
            t[23],
            t[24],
            t[25] if leased else None,
            t[26] if leased and caller.id == t[3] else None,
            t[27],
            t[28],
            t[29],
            t[30],
            t[31],
            t[32],
        ),
        **({"messages_next": messages[-1]["sequence_no"] if more else None, "messages_total": t[21]} if paged else {}),
        **({"artifact_rows": artifact_rows} if artifact_rows is not None else {}),
    }


# tasks/get as three fixed statements, each its own transaction (own_transaction): the
# thread with both agents, its messages with their authors, and the read position.
_GET_THREAD_SQL = (
    """
SELECT t.id, t.context_id, t.sender_id, t.recipient_id, t.state, t.summary, t.intent, t.proposed_action,
       t.result_summary, t.version, t.accepted_at, t.completed_at, t.cancelled_at, t.created_at, t.updated_at,
       s.handle, s.name, s.role, r.handle, r.name, r.role, t.last_sequence_no,
       """
    + effective_state_sql("t")
    + """, t.priority, t.expires_at, t.lease_expires_at, t.lease_token,
       t.declined_at, t.failed_at, """
    + expired_at_sql("t")
    + """, t.reason, t.question, t.input_requested_at, t.lease_seconds
FROM threads t JOIN agents s ON s.id = t.sender_id JOIN agents r ON r.id = t.recipient_id
WHERE t.id = %(id)s
"""
)
_GET_MESSAGES_SQL = """
SELECT m.id, m.sequence_no, a.handle, m.role, m.body, m.parts, m.artifacts, m.metadata, m.created_at, m.read_at
FROM messages m JOIN agents a ON a.id = m.author_id
WHERE m.thread_id = %(id)s ORDER BY m.sequence_no
"""

_GET_THREAD, _GET_MESSAGES = Prepared(_GET_THREAD_SQL), Prepared(_GET_MESSAGES_SQL)
# One page forward from a sequence number, and the newest n: the (thread_id, sequence_no)
# index either way, so a page of a 1,000-message thread reads only its rows.
_MESSAGES_OF = _GET_MESSAGES_SQL.split("WHERE")[0]
_GET_PAGE = Prepared(
    _MESSAGES_OF + "WHERE m.thread_id = %(id)s AND m.sequence_no > %(after)s ORDER BY m.sequence_no LIMIT %(n)s"
)
_GET_LAST = Prepared(_MESSAGES_OF + "WHERE m.thread_id = %(id)s ORDER BY m.sequence_no DESC LIMIT %(n)s")
_GET_ARTIFACTS = Prepared(
    "SELECT m.id, m.sequence_no, m.artifacts FROM messages m"
    " WHERE m.thread_id = %(id)s AND m.artifacts <> '[]'::jsonb ORDER BY m.sequence_no"
)
MAX_MESSAGES_PAGE = 1000


def _mark_read(
    session: Session, thread_id: uuid.UUID, agent_id: uuid.UUID, seq: int, *, author: uuid.UUID
) -> str | None:
    """Move the agent's read position forward to ``seq`` (never backwards) and write the receipts.

    Each of ``author``'s messages the position passes for the first time gets ``read_at``
    (docs/decisions.md, "The work lifecycle"), and one ``message.read`` outbox event goes to ``author`` for the read.
    Returns the receipts' time (ISO 8601), or None when no message was newly read.
    """
    with statement_cursor(session) as cur:
        cur.execute(
            _MARK_READ_SQL,
            {"thread_id": thread_id, "agent_id": agent_id, "seq": seq, "author": author, "event_id": new_ulid()},
        )
        event_id, read_at = cur.fetchone()
    if event_id is None:
        return None
    after_commit(partial(dispatch.event_committed, event_id, ()))
    return iso(read_at)


# One statement: the position's upsert, the receipts of the messages it newly passes (the
# old position read first, in the same snapshot), and the message.read event when any.
_MARK_READ_SQL = """
WITH old AS (
    SELECT last_read_sequence_no AS n FROM read_positions WHERE thread_id = %(thread_id)s AND agent_id = %(agent_id)s
),
pos AS (
    INSERT INTO read_positions (thread_id, agent_id, last_read_sequence_no, updated_at)
    VALUES (%(thread_id)s, %(agent_id)s, %(seq)s, clock_timestamp())
    ON CONFLICT (thread_id, agent_id) DO UPDATE
    SET last_read_sequence_no = greatest(read_positions.last_read_sequence_no, EXCLUDED.last_read_sequence_no),
        updated_at = EXCLUDED.updated_at
),
at AS (SELECT clock_timestamp() AS t),
read AS (
    UPDATE messages SET read_at = (SELECT t FROM at)
    WHERE thread_id = %(thread_id)s AND author_id = %(author)s AND read_at IS NULL
      AND sequence_no > coalesce((SELECT n FROM old), 0) AND sequence_no <= %(seq)s
    RETURNING id, sequence_no, read_at
),
summary AS (
    SELECT max(sequence_no) AS through, count(*) AS n, max(read_at) AS at,
           (array_agg(id ORDER BY sequence_no DESC))[1] AS last_id FROM read
),
event AS (
    INSERT INTO events (id, type, agent_id, thread_id, message_id, payload, created_at)
    SELECT %(event_id)s, 'message.read', %(author)s, %(thread_id)s, summary.last_id,
           jsonb_build_object('through_sequence_no', summary.through, 'messages', summary.n), summary.at
    FROM summary WHERE summary.n > 0
    RETURNING id
)
SELECT (SELECT id FROM event), (SELECT at FROM summary)
"""


def thread_summary(t: Thread) -> dict[str, Any]:
    """A thread as lists and ``task.updated`` webhooks show it (a tasks/list item: docs/api.md, "Thread list")."""
    s, r = t.sender, t.recipient
    return _summary(
        (str(t.id), str(t.context_id), t.state, s.handle, s.name, s.role, r.handle, r.name, r.role, t.summary, t.intent,
         t.result_summary, iso(t.created_at), iso(t.updated_at), t.priority)
    )  # fmt: skip


def _summary(r: Any) -> dict[str, Any]:
    """thread_summary's shape from ``_LIST_COLUMNS``' values (ids and times as text, see iso_text).

    Built from the row as it comes: a page is fifty of these, and building each from
    objects, helpers and merged dicts was a fifth of tasks/list's request.
    """
    return {
        "thread_id": (tid := ulid_of_uuid_text(r[0])),
        "task_id": tid,
        "context_id": ulid_of_uuid_text(r[1]),
        "status": {"state": r[2]},
        "sender": {"handle": r[3], "name": r[4], "role": r[5]},
        "recipient": {"handle": r[6], "name": r[7], "role": r[8]},
        "summary_preview": r[9][:PREVIEW_CHARS],
        "intent": r[10],
        "result_summary": r[11],
        "created_at": r[12],
        "updated_at": r[13],
        "priority": r[14],
    }


_SENDER, _RECIPIENT = aliased(Agent), aliased(Agent)
# The state a list shows and filters on: as of now, recorded by the sweep or not
# (docs/decisions.md, "The work lifecycle").
_EFFECTIVE_STATE = literal_column(effective_state_sql("threads"), String)
# A page of tasks/list as plain columns (_summary's order, then the unread count): 50
# Thread entities with two joined agents each cost more to build as ORM objects than the
# query took to run.
_LIST_COLUMNS = (
    cast(Thread.id, Text),
    cast(Thread.context_id, Text),
    _EFFECTIVE_STATE,
    _SENDER.handle,
    _SENDER.name,
    _SENDER.role,
    _RECIPIENT.handle,
    _RECIPIENT.name,
    _RECIPIENT.role,
    Thread.summary,
    Thread.intent,
    Thread.result_summary,
    iso_text(Thread.created_at),
    iso_text(Thread.updated_at),
    Thread.priority,
)


def _page_messages(thread_ids: list[uuid.UUID], messages: int | str):
    """Messages of a page of threads, oldest first per thread: all, or the newest N of each."""
    stmt = select(Message).where(Message.thread_id.in_(thread_ids))
    if messages != "all":
        rank = (
            select(
                Message.id,
                func.row_number()
                .over(partition_by=Message.thread_id, order_by=Message.sequence_no.desc())
                .label("rank"),
            )
            .where(Message.thread_id.in_(thread_ids))
            .subquery()
        )
        stmt = stmt.join(rank, rank.c.id == Message.id).where(rank.c.rank <= int(messages))
    return stmt.order_by(Message.thread_id, Message.sequence_no).options(db.joinedload(Message.author))


def _list_filters(role: str, present: set[str]) -> list:
    """The filters of a tasks/list page (named parameters), besides the keyset cursor."""
    column = Thread.recipient_id if role == "recipient" else Thread.sender_id
    filters = [column == bindparam("caller")]
    if "peer" in present:
        filters.append((Thread.sender_id if role == "recipient" else Thread.recipient_id) == bindparam("peer"))
    if "context_id" in present:
        filters.append(Thread.context_id == bindparam("context_id"))
    if "status" in present:
        filters.append(_EFFECTIVE_STATE == func.any(bindparam("status", type_=ARRAY(String))))
    if "priority" in present:
        filters.append(Thread.priority == func.any(bindparam("priority", type_=ARRAY(String))))
    if "since" in present:
        filters.append(Thread.updated_at >= bindparam("since"))
    return filters


def _list_statement(role: str, rows: int, present: set[str]):
    """One tasks/list page with named parameters: newest activity first, and each thread's unread count.

    ``rows`` is written into the statement (see feed._page_statement: a generic plan's
    unknown LIMIT).
    """
    caller = bindparam("caller")
    unread = (
        select(func.count(Message.id))
        .where(
            Message.thread_id == Thread.id,
            Message.author_id != caller,
            Message.sequence_no
            > func.coalesce(
                select(ReadPosition.last_read_sequence_no)
                .where(ReadPosition.thread_id == Thread.id, ReadPosition.agent_id == caller)
                # Correlate to the outer threads row, not to a second copy of threads.
                .correlate(Thread)
                .scalar_subquery(),
                0,
            ),
        )
        .correlate(Thread)
        .scalar_subquery()
    )
    stmt = (
        select(*_LIST_COLUMNS, unread, Thread.question)
        .join(_SENDER, _SENDER.id == Thread.sender_id)
        .join(_RECIPIENT, _RECIPIENT.id == Thread.recipient_id)
        .where(*_list_filters(role, present))
    )
    if "cursor_at" in present:
        at, ident = bindparam("cursor_at"), bindparam("cursor_id")
        stmt = stmt.where(or_(Thread.updated_at < at, and_(Thread.updated_at == at, Thread.id < ident)))
    return stmt.order_by(Thread.updated_at.desc(), Thread.id.desc()).limit(literal_column(str(int(rows))))


# The tasks/list page statement of each shape (role, which filters are present), compiled once,
# and planned on each call, as the feed's page is (services.Prepared).
_LIST_PAGES = Shapes(
    ("peer", "context_id", "status", "priority", "since", "cursor_at"),
    _list_statement,
    prepared=lambda present: True,
    custom_plan=True,
)


def _count_threads(session: Session, role, caller, peer, context_id, status, since, priority=None) -> int:
    """Rows matching tasks/list's filters on all pages (the A2A binding's ListTasks ``total``)."""
    params = {"caller": caller.id, "peer": peer.id if peer else None, "context_id": context_id}
    params |= {"status": list(status) if status else None, "since": since}
    params |= {"priority": list(priority) if priority else None}
    present = {k for k, v in params.items() if v is not None and k != "caller"}
    stmt = select(func.count()).select_from(Thread).where(*_list_filters(role, present))
    return session.scalar(stmt, params)


def list_threads(
    caller: Agent,
    role: str = "recipient",
    status: list[str] | None = None,
    since: datetime | None = None,
    limit: int = 50,
    cursor: tuple[datetime, uuid.UUID] | None = None,
    *,
    peer: Agent | None = None,
    context_id: uuid.UUID | None = None,
    with_total: bool = False,
    messages: int | str | None = None,
    priority: list[str] | None = None,
) -> dict:
    """Return one page of the caller's inbox or sent threads (``tasks/list``, docs/api.md).

    Newest activity first; keyset cursor on (updated_at, id); ``since`` is inclusive on
    the last activity; ``unread_messages`` counts the other side's messages after the
    caller's read position. Shape: ``{"items": [...], "next_cursor": str | None}``.

    For the A2A binding's ListTasks: ``peer`` keeps the threads whose other side is that
    agent, ``context_id`` one context; ``with_total`` adds ``total`` (rows matching the
    filters, all pages) and ``messages`` each item's ``messages`` (oldest first): ``"all"``,
    or the newest N of each thread (one window query for the page, not every message).
    """
    params = {
        "caller": caller.id,
        "peer": peer.id if peer is not None else None,
        "context_id": context_id,
        "status": list(status) if status else None,
        "priority": list(priority) if priority else None,
        "since": since,
        "cursor_at": cursor[0] if cursor else None,
        "cursor_id": cursor[1] if cursor else None,
        "limit": limit + 1,
    }
    statement = _LIST_PAGES.get(params, role, limit + 1)
    with unit_of_work() as session, own_transaction(session):
        rows = statement.execute(session, **params).all()
        page = rows[:limit]
        items = []
        for r in page:
            item = _summary(r)
            item["unread_messages"] = r[15]
            if with_total:  # the A2A binding's status message of an input_required task
                item["question"] = r[16]
            items.append(item)
        if messages and page:
            by_thread: dict[uuid.UUID, list[dict]] = {}
            for m in session.scalars(_page_messages([uuid.UUID(r[0]) for r in page], messages)):
                by_thread.setdefault(str(m.thread_id), []).append(message_row(m))
            for item, r in zip(items, page):
                item["messages"] = by_thread.get(r[0], [])
        total = _count_threads(session, role, caller, peer, context_id, status, since, priority) if with_total else None
    last = page[-1] if page else None
    next_cursor = None
    if len(rows) > limit and last is not None:
        next_cursor = encode_cursor(datetime.fromisoformat(last[13]), uuid.UUID(last[0]))
    result: dict[str, Any] = {"items": items, "next_cursor": next_cursor}
    if with_total:
        result["total"] = total
    return result


def _announce(
    session: Session,
    thread: Thread,
    actor_id: uuid.UUID,
    action: str,
    source: str,
    target: str,
    now: datetime,
    *,
    to: tuple[uuid.UUID, ...],
    **audit: Any,
) -> None:
    """Write a transition's audit row and one ``task.updated`` outbox event per agent in ``to``,
    fanned out and waking both participants after commit."""
    session.add(
        AuditEvent(
            thread_id=thread.id, actor_id=actor_id, action=action, from_state=source, to_state=target,
            created_at=now, **audit,
        )
    )  # fmt: skip
    for agent_id in to:
        event = Event(
            id=new_ulid(),
            type="task.updated",
            agent_id=agent_id,
            thread_id=thread.id,
            payload={"transition": action, "from": source, "to": target},
            created_at=now,
        )
        session.add(event)
        after_commit(partial(dispatch.event_committed, event.id, (thread.sender_id, thread.recipient_id)))


def settle(session: Session, thread: Thread, now: datetime) -> bool:
    """Record what the clock did to a locked ``thread`` by ``now``; return whether it changed.

    A leased ``accepted`` handoff past ``lease_expires_at`` goes back to ``pending``
    (audit ``lease_expired``); a ``pending`` one past ``expires_at`` is ``expired``
    (audit ``expire``). Each writes a ``task.updated`` event to both participants. The
    reads compute the same rule (relay.models.effective_state_sql) before it is recorded.

    ``expired_at`` is the moment the handoff expired (relay.models.expired_at_sql): its
    ``expires_at``, or the later moment it was pending again. ``updated_at``, the audit
    rows and the events carry ``now``, when the change is recorded (docs/decisions.md,
    "When a handoff expired").
    """
    changed = False
    # When the handoff was pending again: a lease that lapses is pending from its end.
    pending_since = thread.updated_at
    if thread.state == "accepted" and thread.lease_expires_at is not None and thread.lease_expires_at <= now:
        pending_since = thread.lease_expires_at
        _return_to_pending(thread, now)
        _announce(session, thread, thread.recipient_id, LEASE_EXPIRED, "accepted", "pending", now,
                  to=(thread.sender_id, thread.recipient_id))  # fmt: skip
        changed = True
    if thread.state == "pending" and thread.expires_at is not None and thread.expires_at <= now:
        # expired_at is the moment it expired, not the moment it is recorded; updated_at
        # is when the relay recorded the change, which `since=` catch-up relies on.
        thread.state, thread.expired_at = "expired", max(thread.expires_at, pending_since)
        thread.version += 1
        thread.updated_at = now
        _announce(session, thread, thread.sender_id, EXPIRED, "pending", "expired", now,
                  to=(thread.sender_id, thread.recipient_id))  # fmt: skip
        changed = True
    if changed:
        session.flush()
    return changed


def _return_to_pending(thread: Thread, now: datetime) -> None:
    """Give the work back: no lease, no accept time (a release, or a lease that lapsed)."""
    thread.state = "pending"
    thread.version += 1
    thread.updated_at = now
    thread.accepted_at = None
    thread.lease_expires_at = thread.lease_token = thread.lease_seconds = None


SWEEP_BATCH = 500


def settle_due(limit: int = SWEEP_BATCH) -> int:
    """Record up to ``limit`` lapsed leases and expiries (beat's ``settle_due``); return how many.

    Rows another transaction holds are skipped (SKIP LOCKED): that one settles them itself.
    """
    with unit_of_work() as session:
        now = _now(session)
        due = session.scalars(
            select(Thread)
            .where(
                or_(
                    and_(Thread.state == "accepted", Thread.lease_expires_at <= now),
                    and_(Thread.state == "pending", Thread.expires_at <= now),
                )
            )
            .order_by(Thread.id)
            .limit(limit)
            .with_for_update(of=Thread, skip_locked=True)
        ).all()
        return sum(settle(session, thread, now) for thread in due)


def _refuse(name: str, thread: Thread, side: str, lease_token: str | None) -> None:
    """Raise why ``side`` may not ``name`` ``thread`` now, in docs/api.md's order ("Errors"), else nothing.

    not_authorized_transition (wrong side) -> invalid_transition (wrong state) ->
    state_changed (a ``lease_token`` that is not the thread's current one, leased or not;
    or a leased handoff and no ``lease_token``).
    """
    source, _target, who = TRANSITIONS[name]
    sources = (source, *ALSO_FROM.get(name, ()))
    if side != who:
        raise RelayError(
            "not_authorized_transition",
            f"only the {who} may {name} a handoff",
            {"transition": name, "required_role": who},
        )
    if thread.state not in sources:
        raise RelayError(
            "invalid_transition",
            f"cannot {name} a handoff that is {thread.state} (only from {' or '.join(sources)})",
            {"transition": name, "state": thread.state},
        )
    if name not in FENCED:
        return
    # Every accept issues a new token, so a token from before the latest accept is stale
    # whether or not that accept took a lease: the session holding it lost the work.
    if lease_token is not None and lease_token != thread.lease_token:
        raise RelayError(
            "state_changed",
            "the call carries a lease_token that is not the current one (another accept took the work,"
            " or the lease lapsed); read the handoff, and accept it again if it is pending",
            {"transition": name, "field": "lease_token"},
        )
    if lease_token is None and thread.lease_seconds is not None:
        raise RelayError(
            "state_changed",
            "this handoff is leased and the call carries no lease_token; accept it again or read it",
            {"transition": name, "field": "lease_token"},
        )


def transition(
    caller: Agent,
    task_id: uuid.UUID,
    name: str,
    session_id: str | None = None,
    result_summary: str | None = None,
    *,
    peer: Agent | None = None,
    reason: str | None = None,
    lease_seconds: int | None = None,
    lease_token: str | None = None,
    question: str | None = None,
) -> dict:
    """Move a thread along the state machine (``tasks/update``, ``tasks/cancel``; docs/api.md, "Transition result").

    Checks, in order: thread_not_found -> not_a_participant -> not_authorized_transition
    (wrong side) -> invalid_transition (not valid from the current state) -> state_changed
    (a ``lease_token`` that is not the current one, a leased handoff without one, or a
    compare-and-set on state and version lost a race). A lapsed lease or expiry is
    recorded first (:func:`settle`), under the thread's row lock, so a ``complete`` and
    its lease's end have one winner.

    ``reason`` (decline, fail, release), ``session_id`` (accept) and ``question``
    (request_input) go on the audit row, with ``result_summary`` on complete. Every
    accept issues a new ``lease_token``; ``lease_seconds`` on accept starts a lease (the
    token is shown only then); on renew it sets the lease's length (else the accept's),
    and renew of an unleased handoff starts one. ``request_input`` (accepted ->
    input_required) keeps the question and stops the lease's clock until the sender's
    next message (:func:`_provide_input`). Writes a ``task.updated`` outbox event to the
    other side in the same transaction. Returns the thread's state fields (:func:`_state_fields`).
    """
    if name not in TRANSITIONS:
        raise invalid("transition", f"must be one of {', '.join(TRANSITIONS)}")
    _source, target, _who = TRANSITIONS[name]
    with unit_of_work() as session:
        thread, side = _load_thread(session, task_id, caller, peer=peer)
        now = _now(session)
        if _due(thread, now):
            # Record it first, under the row lock the sweep also takes: one of them writes it.
            thread = session.scalar(
                select(Thread).where(Thread.id == thread.id).with_for_update(of=Thread)
                .execution_options(populate_existing=True)
            )  # fmt: skip
            settle(session, thread, now)
        _refuse(name, thread, side, lease_token)
        if name == "renew" and thread.lease_seconds is None and lease_seconds is None:
            raise invalid("lease_seconds", "is required to renew a handoff that has no lease (it starts one)")
        source = thread.state  # the state _refuse allowed: the compare-and-set's
        values = _transition_values(thread, name, now, result_summary, reason, lease_seconds, question)
        # A compare-and-set on the state and version read above: a loser answers
        # state_changed. A lease that lapses meanwhile loses it too, so a complete at the
        # lease's last instant and the lease's end have one winner (the sweep, or a later
        # call, records the end).
        won = session.execute(
            update(Thread)
            .where(
                Thread.id == thread.id,
                Thread.state == source,
                Thread.version == thread.version,
                or_(Thread.lease_expires_at.is_(None), Thread.lease_expires_at > func.clock_timestamp()),
            )
            .values(**values)
            .returning(Thread.version)
            .execution_options(synchronize_session=False)
        ).scalar()
        if won is None:
            raise RelayError(
                "state_changed", "another call changed this handoff first; read it again", {"transition": name}
            )
        session.refresh(thread)
        other = thread.recipient_id if side == "sender" else thread.sender_id
        _announce(
            session, thread, caller.id, name, source, target, now, to=(other,),
            session_id=session_id if name == "accept" else None,
            result_summary=result_summary if name == "complete" else None,
            reason=reason if name in ("decline", "fail", "release") else None,
            question=question if name == "request_input" else None,
        )  # fmt: skip
        return _state_fields(thread, side)


def _due(thread: Thread, now: datetime) -> bool:
    """Whether :func:`settle` would change ``thread`` at ``now``."""
    lapsed = thread.state == "accepted" and thread.lease_expires_at is not None and thread.lease_expires_at <= now
    expired = thread.state == "pending" and thread.expires_at is not None and thread.expires_at <= now
    return lapsed or expired


def _transition_values(
    thread: Thread, name: str, now: datetime, result_summary, reason, lease_seconds, question=None
) -> dict:
    """The columns transition ``name`` writes (the caller checked that it may run)."""
    _source, target, _who = TRANSITIONS[name]
    values: dict[str, Any] = {"state": target, "version": Thread.version + 1, "updated_at": now}
    if target in STAMP_COLUMN and name != "renew":
        values[STAMP_COLUMN[target]] = now
    if name == "complete":
        values["result_summary"] = result_summary
    if name in REASON_REQUIRED:
        values["reason"] = reason
    if name == "release" or target in TERMINAL_STATES:
        values |= {"lease_expires_at": None, "lease_token": None, "lease_seconds": None}
    if name == "release":
        values["accepted_at"] = None
    if name == "accept":
        # A new token at every accept, leased or not: it makes every earlier token stale.
        values |= {"lease_token": secrets.token_urlsafe(24), "lease_seconds": lease_seconds}
    if name == "request_input":
        # The lease's clock stands still while the requester answers (lease_seconds and the
        # token stay); the answer starts it again (_provide_input).
        values |= {"question": question, "input_requested_at": now, "lease_expires_at": None}
    elif thread.state == "input_required":  # leaving it (complete, fail, release): the question is moot
        values |= {"question": None, "input_requested_at": None}
    if name == "renew":
        values |= {"lease_token": thread.lease_token or secrets.token_urlsafe(24)}
        values["lease_seconds"] = lease_seconds or thread.lease_seconds
    if "lease_seconds" in values and values["lease_seconds"] is not None:
        values["lease_expires_at"] = now + timedelta(seconds=values["lease_seconds"])
    return values


def _state_fields(thread: Thread, side: str) -> dict:
    """A transition's answer: docs/api.md's "Transition result" (state, then lease, priority, expiry, reason).

    ``lease_token`` is the recipient's alone (the sender cannot use it), and shown only
    while leased (an unleased accept's token only makes earlier ones stale); both see when
    the lease ends. Times are ISO 8601 UTC, or None.
    """
    return {
        "thread_id": format_ulid(thread.id),
        "task_id": format_ulid(thread.id),
        "context_id": format_ulid(thread.context_id),
        "status": _status(thread),
        "version": thread.version,
        "result_summary": thread.result_summary,
        "accepted_at": iso(thread.accepted_at),
        "completed_at": iso(thread.completed_at),
        "cancelled_at": iso(thread.cancelled_at),
        "updated_at": iso(thread.updated_at),
        **_lifecycle_fields(
            thread.priority, thread.expires_at, thread.lease_expires_at,
            thread.lease_token if side == "recipient" and thread.lease_seconds is not None else None,
            thread.declined_at, thread.failed_at, thread.expired_at, thread.reason,
            thread.question, thread.input_requested_at,
        ),
    }  # fmt: skip


def _lifecycle_fields(
    priority, expires_at, lease_expires_at, lease_token, declined_at, failed_at, expired_at, reason,
    question, input_requested_at,
):  # fmt: skip
    """The lifecycle's answer fields, the same in tasks/get and every transition's answer.

    ``question`` and ``input_requested_at`` (ISO 8601) are the open request_input's,
    null unless the handoff is input_required.
    """
    return {
        "priority": priority,
        "expires_at": iso(expires_at),
        "lease_expires_at": iso(lease_expires_at),
        "lease_token": lease_token,
        "declined_at": iso(declined_at),
        "failed_at": iso(failed_at),
        "expired_at": iso(expired_at),
        "reason": reason,
        "question": question,
        "input_requested_at": iso(input_requested_at),
    }


def audit_trail(caller: Agent, task_id: uuid.UUID) -> list[dict]:
    """Return a thread's audit rows, oldest first; raise thread_not_found / not_a_participant."""
    with unit_of_work() as session:
        thread, _side = _load_thread(session, task_id, caller)
        rows = session.scalars(
            select(AuditEvent)
            .where(AuditEvent.thread_id == thread.id)
            .order_by(AuditEvent.created_at, AuditEvent.id)
            .options(db.joinedload(AuditEvent.actor))
        ).all()
        return [
            {
                "action": r.action,
                "actor": r.actor.handle,
                "from_state": r.from_state,
                "to_state": r.to_state,
                "session_id": r.session_id,
                "result_summary": r.result_summary,
                "reason": r.reason,
                "question": r.question,
                "message_id": str(r.message_id) if r.message_id else None,
                "created_at": iso(r.created_at),
            }
            for r in rows
        ]
