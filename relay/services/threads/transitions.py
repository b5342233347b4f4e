"""tasks/update and tasks/cancel: a checked compare-and-set move along the state machine, leases included."""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update

from relay.errors import RelayError, invalid
from relay.ids import format_ulid, iso
from relay.models import TERMINAL_STATES, Agent, Thread
from relay.services import unit_of_work
from relay.services.threads.clock import _due, settle
from relay.services.threads.common import _announce, _lifecycle_fields, _load_thread, _now
from relay.services.threads.rules import ALSO_FROM, FENCED, REASON_REQUIRED, STAMP_COLUMN, TRANSITIONS


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
    next message (:func:`append._provide_input`). Writes a ``task.updated`` outbox event to the
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
        # token stay); the answer starts it again (append._provide_input).
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


def _status(thread: Thread) -> dict[str, Any]:
    return {"state": thread.state}
