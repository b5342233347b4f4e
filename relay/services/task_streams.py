"""A2A task streams: one task's updates for its sender (``SendStreamingMessage``, ``SubscribeToTask``).

A stream is the task first (an A2A ``Task``), then, as the recipient works it, one
``statusUpdate`` per transition (accept, complete, cancel), one ``statusUpdate`` whose
``status.message`` is each message the recipient adds (the state unchanged), and one
``artifactUpdate`` per artifact that message carries; it ends after the terminal
transition. The caller's own messages are not echoed: the client sent them (they are in
the first Task's history, and in GetTask).

Like the feed's stream (services/streams.py) it waits on this process's wake-up listener
(services/wakeup.py) for the caller's agent id, which every committed message and
transition of the caller's threads names, and on a slow tick (``RELAY_STREAM_HEARTBEAT``)
when a wake-up may have been missed (services/streams.py's ``Held.rounds``); it
re-authenticates the caller before every read. Between reads it holds no
database connection. It counts against ``RELAY_STREAMS_PER_AGENT`` with the feed's waits
and streams (one ``wakeup.Slot`` set per agent).

Its position is the task's state and the newest message sequence number it has seen.
Both only move forward (states along the state machine, ``sequence_no`` gapless), so a
re-read names exactly what is new: the transitions between the two states and the
messages after that number. The thread row is read before the messages: a message is
committed before any transition that follows it (an append locks the row a transition
updates, and nothing is appended to a terminal thread), so once the row reads terminal,
every message is visible to the read after it, and the stream ends with nothing missed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import select

from relay.errors import RelayError
from relay.extensions import db
from relay.ids import as_sent, format_ulid, iso
from relay.models import TERMINAL_STATES, Agent, AuditEvent, Message, Thread
from relay.services import a2a_view as view
from relay.services import own_transaction, streams, unit_of_work
from relay.services.threads import read, rules

# One event of a stream: a StreamResponse (dict), a heartbeat (None), or the error that ends it.
Event = dict | RelayError | None

_ROW = (
    Thread.state,
    Thread.last_sequence_no,
    Thread.context_id,
    Thread.result_summary,
    Thread.updated_at,
    Thread.accepted_at,
    Thread.completed_at,
    Thread.cancelled_at,
    Thread.declined_at,
    Thread.failed_at,
    Thread.expired_at,
    Thread.reason,
    Thread.question,
)


def path(source: str, target: str) -> list[tuple[str, str, str]]:
    """The fewest transitions ``(name, from, to)`` that lead from state ``source`` to ``target`` (none if equal).

    The state machine is not a tree: a release and a lapsed lease (docs/decisions.md, "The work
    lifecycle") lead back from accepted to pending, so a stream that re-reads a task sees only the shortest way
    between the two states it read (a round trip between two reads is not shown). A
    state a re-read can never reach from ``source`` is an error.
    """
    found = _path(source, target)
    if found is None:
        raise ValueError(f"no transition path from {source} to {target}")
    return found


# Steps no transition call takes: a lease that lapsed and an expiry (the clock's), and the
# requester's answer to an input_required handoff (a message).
_CLOCK_STEPS = (
    (rules.LEASE_EXPIRED, "accepted", "pending"),
    (rules.EXPIRED, "pending", "expired"),
    (rules.INPUT_PROVIDED, "input_required", "accepted"),
)


def _path(source: str, target: str) -> list[tuple[str, str, str]] | None:
    steps = [(name, src, dst) for name, (src, dst, _who) in rules.TRANSITIONS.items() if src != dst]
    steps += [(name, src, rules.TRANSITIONS[name][1]) for name, more in rules.ALSO_FROM.items() for src in more]
    steps += [step for step in _CLOCK_STEPS if step[0] not in rules.TRANSITIONS]
    frontier, seen = [(source, [])], {source}
    while frontier:  # breadth first: the shortest path, and no loop through a cycle
        following = []
        for state, taken in frontier:
            if state == target:
                return taken
            for name, src, dst in steps:
                if src == state and dst not in seen:
                    seen.add(dst)
                    following.append((dst, [*taken, (name, src, dst)]))
        frontier = following
    return None


class TaskStream(streams.Held):
    """An open stream of one task for its sender; create it before the response starts.

    Creating it takes one of the caller's ``RELAY_STREAMS_PER_AGENT`` slots (rate_limited
    past it) and registers its waiter, so nothing committed after that is missed;
    :meth:`open` reads the task (the first event), :meth:`events` yields until the task
    ends, the caller is no longer allowed or the client goes away, and :meth:`close`
    (always call it; calling it twice is harmless) gives the slot and the waiter back.
    """

    def __init__(
        self,
        caller: Agent,
        peer: Agent,
        *,
        still_allowed: Callable[[], Any],
        client_gone: Callable[[], bool] | None = None,
    ):
        super().__init__(caller, still_allowed, client_gone=client_gone)
        self.caller, self.peer = caller, peer
        self.task_id: uuid.UUID | None = None
        self.first: dict | None = None
        self.state, self.seen = "pending", 0

    def open(self, task_id: uuid.UUID, *, history_length: int | None = None, subscribing: bool = False) -> dict:
        """Read the task: its A2A ``Task`` is the stream's first event, and its state the position.

        Raises thread_not_found (not a task the caller sent to the peer) and, when
        ``subscribing``, unsupported_operation for a task already terminal (A2A's
        SubscribeToTask serves only tasks that can still change).
        """
        try:
            task = read.get_thread(self.caller, task_id, peer=self.peer, mark_read=False)
        finally:
            db.session.close()  # no connection held while the stream waits
        state = task["status"]["state"]
        if subscribing and state in TERMINAL_STATES:
            raise RelayError(
                "unsupported_operation",
                f"task {as_sent(task_id)} is {view.STATES[state]}: SubscribeToTask needs a task that "
                "is not in a terminal state (GetTask reads it)",
                {"state": view.STATES[state]},
            )
        self.task_id, self.state = task_id, state
        self.seen = max((m["sequence_no"] for m in task["messages"]), default=0)
        self.first = {"task": view.task_out(task, history_length=history_length)}
        return self.first

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL_STATES

    def events(self) -> Iterator[Event]:
        """Yield the first Task, then each update oldest first, a ``None`` heartbeat every tick,
        and at most one RelayError (the caller's key stopped being valid, the task is gone),
        which ends the stream. Ends after the update that makes the task terminal."""
        assert self.first is not None, "open() the stream first"
        yield self.first
        if self.ended:
            return
        yield from self.rounds(lambda: (self._updates(), False))

    def finished(self) -> bool:
        return self.ended

    def _updates(self) -> list[dict]:
        """What changed since the position, as StreamResponses in order; moves the position."""
        with unit_of_work() as session, own_transaction(session):
            row = session.execute(
                select(*_ROW).where(
                    Thread.id == self.task_id,
                    Thread.sender_id == self.caller.id,
                    Thread.recipient_id == self.peer.id,
                )
            ).first()
            if row is None:
                raise RelayError("thread_not_found", f"no thread {as_sent(self.task_id)}")
            if (row.state, row.last_sequence_no) == (self.state, self.seen):
                return []
            new: list[Message] = []
            if row.last_sequence_no > self.seen:
                # Read after the row (see the module docstring), and only up to the row's count: a
                # message committed since belongs after transitions the row does not show yet.
                new = list(
                    session.scalars(
                        select(Message)
                        .where(
                            Message.thread_id == self.task_id,
                            Message.sequence_no > self.seen,
                            Message.sequence_no <= row.last_sequence_no,
                        )
                        .order_by(Message.sequence_no)
                        .options(db.joinedload(Message.author))
                    )
                )
            task = {
                "task_id": format_ulid(self.task_id),
                "context_id": format_ulid(row.context_id),
                "status": {"state": row.state},
                "result_summary": row.result_summary,
                "reason": row.reason,
                "question": row.question,
                "updated_at": iso(row.updated_at),
            }
            stamps = {state: getattr(row, column) for state, column in rules.STAMP_COLUMN.items()}
            # (terminal last, time, order): a transition's time is read before it waits for the
            # row lock an append holds, so it can be older than a message committed before it.
            taken = path(self.state, row.state)
            if any((src, dst) == ("accepted", "pending") for _name, src, dst in taken):
                # Two ways back to pending: a release or a lapsed lease; the audit trail says which.
                back = session.scalar(
                    select(AuditEvent.action)
                    .where(
                        AuditEvent.thread_id == self.task_id,
                        AuditEvent.from_state == "accepted",
                        AuditEvent.to_state == "pending",
                    )
                    .order_by(AuditEvent.id.desc())
                    .limit(1)
                )
                taken = [(back or n, s_, d) if (s_, d) == ("accepted", "pending") else (n, s_, d) for n, s_, d in taken]
            # An answer's way back to accepted happens now, not at the accept that stamped accepted_at.
            steps: list[tuple[tuple[bool, datetime, int], str, Any]] = [
                (
                    (
                        dst in TERMINAL_STATES,
                        (stamps.get(dst) if name != rules.INPUT_PROVIDED else None) or row.updated_at,
                        1,
                    ),
                    "transition",
                    (name, src, dst),
                )
                for name, src, dst in taken
            ]
            steps += [((False, m.created_at, 0), "message", m) for m in new]
            steps.sort(key=lambda step: step[0])
            out: list[dict] = []
            state = self.state
            for (_terminal, at, _order), kind, item in steps:
                if kind == "transition":
                    name, src, dst = item
                    state = dst
                    out.append(
                        view.status_event(task, dst, iso(at), metadata={"transition": name, "from": src, "to": dst})
                    )
                    continue
                self.seen = max(self.seen, item.sequence_no)
                if item.role == "caller":
                    continue  # the client's own message (the caller is the thread's sender): not echoed
                message = read.message_row(item)
                out.append(
                    view.status_event(
                        task, state, message["created_at"], message=view.message_out(message, task, opening=False)
                    )
                )
                out += [view.artifact_event(task, message, i, a) for i, a in enumerate(message["artifacts"])]
            self.state = row.state
            return out


# Relay states A2A calls interrupted (the task waits on its client): a blocking send ends on
# them as on a terminal state. Named, so a state the relay adds later counts once it exists.
INTERRUPTED_STATES = ("input_required", "auth_required")
SETTLED_STATES = (*TERMINAL_STATES, *INTERRUPTED_STATES)


class SendWait(streams.Held):
    """A blocking ``SendMessage``'s wait for its task to settle (terminal or interrupted).

    Create it before the send: it takes one of the caller's ``RELAY_STREAMS_PER_AGENT``
    slots (rate_limited past them) and registers the waiter for the caller's wake-ups, so a
    transition committed between the send and the first read still wakes it. Between reads
    it holds no database connection. :meth:`close` gives the slot and the waiter back.
    """

    def __init__(self, caller: Agent, peer: Agent, *, client_gone: Callable[[], bool] | None = None):
        # The wait is bounded well under a heartbeat, so the key is not re-checked during it.
        super().__init__(caller, lambda: None, client_gone=client_gone)
        self.caller, self.peer = caller, peer

    def until_settled(self, task_id: uuid.UUID, seconds: float) -> str | None:
        """Wait up to ``seconds`` for task ``task_id`` to reach a state of :data:`SETTLED_STATES`;
        return the state last read (None if the task is gone). Reads the task's state once at
        once, then after every wake-up; returns early when the client has gone."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                with unit_of_work() as session, own_transaction(session):
                    state = session.scalar(
                        select(Thread.state).where(
                            Thread.id == task_id,
                            Thread.sender_id == self.caller.id,
                            Thread.recipient_id == self.peer.id,
                        )
                    )
            finally:
                db.session.close()  # no connection held while it waits
            remaining = deadline - time.monotonic()
            if state is None or state in SETTLED_STATES or remaining <= 0:
                return state
            self.wait(remaining)
            if self.gone:
                return state
