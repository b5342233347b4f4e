"""message/send's append: a message on an existing handoff, under its row lock."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy.orm import Session

from relay.errors import RelayError, invalid
from relay.ids import format_ulid, iso, new_ulid
from relay.models import TERMINAL_STATES, Agent, AuditEvent, Event, Message, Thread
from relay.services import after_commit, dispatch
from relay.services.threads.clock import settle
from relay.services.threads.common import _announce, _body, _load_thread, _now, _serialize_feed_writes
from relay.services.threads.rules import INPUT_PROVIDED


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
