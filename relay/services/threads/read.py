"""tasks/get and the audit trail: one thread, its messages, and the read receipts reading them writes."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from relay.errors import RelayError
from relay.extensions import db
from relay.ids import as_sent, format_ulid, iso, new_ulid
from relay.models import Agent, AuditEvent, Message, effective_state_sql, expired_at_sql
from relay.services import a2a_view, after_commit, dispatch, statement_cursor, unit_of_work
from relay.services.statements import Statement
from relay.services.threads.common import _lifecycle_fields, _load_thread


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


def _payload(metadata: dict[str, Any]) -> dict[str, Any]:
    """A message's ``payload``: its metadata minus ``client_idempotency_key`` (docs/api.md, "Thread")."""
    return {k: v for k, v in metadata.items() if k != "client_idempotency_key"}


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
    doing that). Raises thread_not_found, not_a_participant (``peer``: see common._load_thread).
    """
    paged = messages_limit is not None or messages_after is not None
    with unit_of_work() as session, statement_cursor(session, alone=True) as cur:
        _GET_THREAD.execute(session, {"id": task_id}, cursor=cur)
        t = cur.fetchone()
        if t is None or (peer is not None and (t[2], t[3]) != (caller.id, peer.id)):
            raise RelayError("thread_not_found", f"no thread {as_sent(task_id)}")
        if caller.id not in (t[2], t[3]):
            raise RelayError("not_a_participant", "you are neither the sender nor the recipient of this thread")
        more, artifact_rows = False, None
        if paged:
            limit = messages_limit or MAX_MESSAGES_PAGE
            _GET_PAGE.execute(session, {"id": task_id, "after": messages_after or 0, "n": limit + 1}, cursor=cur)
            rows = cur.fetchall()
            more, rows = len(rows) > limit, rows[:limit]
        elif messages_last is not None:
            _GET_LAST.execute(session, {"id": task_id, "n": min(messages_last, t[21])}, cursor=cur)
            rows = cur.fetchall()[::-1]
            # Every message's artifacts still (an A2A task's artifacts are all of the task's),
            # read without the bodies and parts of the messages left out.
            _GET_ARTIFACTS.execute(session, {"id": task_id}, cursor=cur)
            artifact_rows = [{"id": str(i), "sequence_no": n, "artifacts": a} for i, n, a in cur.fetchall()]
        else:
            _GET_MESSAGES.execute(session, {"id": task_id}, cursor=cur)
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

_GET_THREAD, _GET_MESSAGES = Statement(_GET_THREAD_SQL), Statement(_GET_MESSAGES_SQL)
# One page forward from a sequence number, and the newest n: the (thread_id, sequence_no)
# index either way, so a page of a 1,000-message thread reads only its rows.
_MESSAGES_OF = _GET_MESSAGES_SQL.split("WHERE")[0]
_GET_PAGE = Statement(
    _MESSAGES_OF + "WHERE m.thread_id = %(id)s AND m.sequence_no > %(after)s ORDER BY m.sequence_no LIMIT %(n)s"
)
_GET_LAST = Statement(_MESSAGES_OF + "WHERE m.thread_id = %(id)s ORDER BY m.sequence_no DESC LIMIT %(n)s")
_GET_ARTIFACTS = Statement(
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
