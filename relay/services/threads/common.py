"""What the thread use cases share: the clock read, the feed locks, a caller's thread, audit rows and answer fields."""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from relay.errors import RelayError
from relay.ids import as_sent, iso, new_ulid
from relay.models import Agent, AuditEvent, Event, Thread
from relay.services import after_commit, dispatch, statement_cursor


def _now(session: Session) -> datetime:
    # Read once per use case so every row it writes shares one time; clock_timestamp()
    # rather than now() because it is taken after the thread lock, which keeps the feed's
    # (created_at, id) order close to commit order for catch-up readers.
    return session.scalar(select(func.clock_timestamp()))


def feed_lock_keys_sql(ids: str) -> str:
    """Return SQL of the feed lock key of each identity in ``ids`` (a ``uuid[]`` expression), in locking order.

    One row (``key``) per identity: its UUID's first 8 bytes as a signed bigint, in UUID
    order, so two writers that share participants never deadlock. The create's statement
    (create._CREATE_SQL) and :func:`_serialize_feed_writes` both lock over this one
    definition, so an identity has one feed lock whichever writes to it.
    """
    return (
        "SELECT ('x' || left(replace(p::text, '-', ''), 16))::bit(64)::bigint AS key"
        f" FROM unnest({ids}) AS p ORDER BY p"
    )


_FEED_LOCKS = f"SELECT pg_advisory_xact_lock(k.key) FROM ({feed_lock_keys_sql('%(ids)s::uuid[]')}) AS k"


def _serialize_feed_writes(session: Session, *agent_ids: uuid.UUID) -> None:
    """Take the participants' feed locks so messages commit in ``created_at`` order per identity.

    The feed's catch-up loop (docs/api.md, "The messages feed") pages ``since`` the newest time a client saw. If two
    messages to one identity could commit in the opposite order of their timestamps,
    the later-committing one would carry an older time and be skipped forever. Holding
    a transaction-scoped advisory lock per participant (taken in sorted order, so no
    deadlock) while the timestamp is read and until commit rules that out; writes that
    share no participant still run in parallel. One statement takes them all
    (:func:`feed_lock_keys_sql`).
    """
    with statement_cursor(session) as cur:
        cur.execute(_FEED_LOCKS, {"ids": list(set(agent_ids))})


def _body(parts: list[dict[str, Any]]) -> str:
    return "\n\n".join(p["text"] for p in parts if p.get("text"))


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


load_thread = _load_thread  # for sibling services (push configs) that scope to a thread the same way


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
