"""The tool table: every tool relay-mcp and the relay's ``/mcp`` serve, one entry each.

Each entry is a :class:`~relay.agent.mcp.core.Tool`: name, title, the description the
model reads, the argument and answer models (``models.py``), annotations, and a function
``run(client, arguments)`` that makes the calls of :class:`relay.agent.client.RelayClient`
on the relay's public HTTP API. Adding a tool is one function and one entry in TOOLS.

``wait_for_messages`` goes on from a position: ``after`` when the caller gives it, else
the client's ``wait_position`` if it has one (relay-mcp's process keeps one, see
``server.py``), else the newest message when the call starts.
"""

from __future__ import annotations

import inspect
import itertools
import time
from typing import Any

from relay.agent.client.errors import InvalidParams
from relay.agent.client.feed import next_position
from relay.agent.client.models import FeedRow
from relay.agent.mcp import models as m
from relay.agent.mcp.budget import (
    BULKY_ARTIFACT_FIELDS,
    MAX_OUTPUT,
    as_text,
    bounded_rows,
    bounded_thread,
    dump,
    lookup,
    read_chunk,
    size,
    task_row,
)
from relay.agent.mcp.core import Answer, Tool

#: the feed's oldest possible position: "after nothing", for a feed that is empty
BEGINNING = "1970-01-01T00:00:00+00:00"
#: a wait's rows are fitted to this budget before the position moves past them: the text and
#: structuredContent carry them once each, a quote in the text is two characters
WAIT_BUDGET = (MAX_OUTPUT - 4_000) // 3
#: a wait asks the relay in slices this long (seconds), so a cancelled call stops soon
WAIT_SLICE = 2.0


def _sent(sent: Any) -> dict[str, Any]:
    return {**sent.raw, "idempotency_key": sent.idempotency_key}


def send_handoff(client: Any, a: m.SendHandoffInput) -> Answer:
    return _sent(
        client.send(
            a.recipient,
            a.text,
            intent=a.intent,
            artifacts=dump(a.artifacts),
            proposed_action=a.proposed_action.model_dump() if a.proposed_action else None,
            context_id=a.context_id,
            idempotency_key=a.idempotency_key,
            priority=a.priority,
            expires_in_seconds=a.expires_in_seconds,
        )
    )


def reply(client: Any, a: m.ReplyInput) -> Answer:
    return _sent(client.reply(a.task_id, a.text, artifacts=dump(a.artifacts), idempotency_key=a.idempotency_key))


def list_inbox(client: Any, a: m.ListInboxInput) -> Answer:
    page = (client.sent if a.sent else client.inbox)(
        status=a.status, since=a.since, limit=a.limit, cursor=a.cursor, priority=a.priority
    )
    return {"items": [task_row(t) for t in page.items], "next_cursor": page.next_cursor}


def get_thread(client: Any, a: m.GetThreadInput) -> Answer:
    if a.messages_after is not None:
        raw = client.get(a.task_id, messages_limit=a.messages_limit, messages_after=a.messages_after).raw
    else:
        raw = client.get_newest(a.task_id, a.messages_limit).raw
    return lambda budget: bounded_thread(raw, budget)


def _invalid(message: str) -> InvalidParams:
    return InvalidParams(message, symbol="invalid_params")


def read_artifact(client: Any, a: m.ReadArtifactInput) -> Answer:
    if a.sequence_no is None:
        if a.field is None:
            raise _invalid("field: name a field of the thread, or give sequence_no")
        if a.index is not None:
            raise _invalid("index: give sequence_no with it")
        holder: Any = client.get(a.task_id, messages_limit=1, messages_after=0).raw
        where = "the thread"
    else:
        page = client.get(a.task_id, messages_limit=1, messages_after=a.sequence_no - 1).raw
        found = [x for x in page.get("messages") or [] if x.get("sequence_no") == a.sequence_no]
        if not found:
            raise _invalid(f"sequence_no: this thread has no message {a.sequence_no}")
        holder, where = found[0], f"message {a.sequence_no}"
    name = a.field
    if a.index is not None:
        artifacts = holder.get("artifacts") or []
        if a.index >= len(artifacts):
            raise _invalid(f"index: message {a.sequence_no} has {len(artifacts)} artifacts")
        holder, where = artifacts[a.index], f"artifact {a.index} of message {a.sequence_no}"
        if name is None:
            name = next((f for f in BULKY_ARTIFACT_FIELDS if isinstance(holder.get(f), str)), None)
            value: Any = holder[name] if name else holder
            name = name or "json"
        else:
            value = lookup(holder, name, where)
    elif name is None:
        name, value = "body", holder.get("body") or ""
    else:
        value = lookup(holder, name, where)
    text, as_json = as_text(value)

    def answer(budget: int) -> dict[str, Any]:
        chunk = read_chunk(text, a.offset, budget - 500)
        end = a.offset + len(chunk)
        return {
            "task_id": a.task_id,
            "sequence_no": a.sequence_no,
            "index": a.index,
            "field": name,
            "offset": a.offset,
            "text": chunk,
            "total": len(text),
            "next_offset": end if end < len(text) else None,
            "json": as_json,
        }

    return answer


def accept(client: Any, a: m.AcceptInput) -> Answer:
    return client.accept(a.task_id, session_id=a.session_id, lease_seconds=a.lease_seconds).raw


def complete(client: Any, a: m.CompleteInput) -> Answer:
    return client.complete(a.task_id, a.result_summary, lease_token=a.lease_token).raw


def cancel(client: Any, a: m.TaskInput) -> Answer:
    return client.cancel(a.task_id).raw


def decline(client: Any, a: m.DeclineInput) -> Answer:
    return client.decline(a.task_id, a.reason).raw


def fail(client: Any, a: m.FailInput) -> Answer:
    return client.fail(a.task_id, a.reason, lease_token=a.lease_token).raw


def request_input(client: Any, a: m.RequestInputInput) -> Answer:
    return client.request_input(a.task_id, a.question, lease_token=a.lease_token).raw


def release(client: Any, a: m.ReleaseInput) -> Answer:
    return client.release(a.task_id, reason=a.reason, lease_token=a.lease_token).raw


def renew(client: Any, a: m.RenewInput) -> Answer:
    return client.renew(a.task_id, lease_seconds=a.lease_seconds, lease_token=a.lease_token).raw


def search_messages(client: Any, a: m.SearchMessagesInput) -> Answer:
    rows = list(itertools.islice(client.search(a.query, limit=min(100, a.limit + 1)), a.limit + 1))

    def answer(budget: int) -> dict[str, Any]:
        items, left_out = bounded_rows(rows[: a.limit], budget)
        return {"items": items, "more": len(rows) > a.limit or left_out > 0}

    return answer


def catch_up(client: Any, a: m.CatchUpInput) -> Answer:
    rows = client.catch_up(a.since, seen=a.seen_ids or (), direction=a.direction, limit=100)

    def answer(budget: int) -> dict[str, Any]:
        kept = rows[: a.limit]
        # next_seen_ids may be long (seen_ids is the caller's): the rows get what is left.
        shown, _ = bounded_rows(kept, budget - size(list(a.seen_ids or ())) - 5_000)
        kept = kept[: len(shown)]
        next_since, next_seen = next_position(kept, a.since, a.seen_ids or ())
        return {
            "messages": shown,
            "count": len(kept),
            "more": len(rows) > len(kept),
            "next_since": next_since,
            "next_seen_ids": next_seen,
        }

    return answer


def fit_rows(rows: list[FeedRow]) -> tuple[int, list[dict[str, Any]]]:
    """How many of ``rows`` (at least one) one wait answer holds, and those rows as shown."""
    shown, _ = bounded_rows(rows, WAIT_BUDGET)
    return max(1, len(shown)), shown


def take_theirs(rows: list[FeedRow], me: str) -> tuple[list[FeedRow], list[FeedRow], list[dict[str, Any]]]:
    """Of the feed's ``rows``: (the rows consumed, the other side's among them, those as shown).

    Only as many of the other side's messages as one answer holds are consumed; the
    rest come with the next call.
    """
    theirs = [row for row in rows if row.author != me]
    if not theirs:
        return rows, [], []
    n, shown = fit_rows(theirs)
    last = theirs[n - 1]
    upto = next(i for i, row in enumerate(rows) if row is last) + 1
    return rows[:upto], theirs[:n], shown


def wait_for_messages(client: Any, a: m.WaitInput) -> Answer:
    position = getattr(client, "wait_position", None)
    if a.after is None and position is not None:
        return position.wait(client, float(a.timeout_seconds))
    return wait_after(client, a.after, float(a.timeout_seconds))


def wait_after(client: Any, after: str | None, timeout: float) -> dict[str, Any]:
    """The other side's next messages after the message ``after`` (None: the newest now), within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    since: str | None = None
    if after is None:
        newest = next(iter(client.messages(limit=1)), None)
        after = newest.id if newest is not None else None
        since = None if newest is not None else BEGINNING
    me = client.handle
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        where = {"after": after} if after else {"since": since}
        # One long-poll for the whole wait (the client splits it in requests of at most 60 s):
        # nothing here needs to look up between slices.
        rows = client.wait(**where, timeout=remaining)
        consumed, theirs, shown = take_theirs(rows, me)
        if consumed:
            after = consumed[-1].id
        if theirs or time.monotonic() >= deadline:
            return {"messages": shown, "count": len(theirs), "timed_out": not theirs, "next_after": after}


def _tool(run: Any, name: str, title: str, input: Any, output: Any, description: str, **hints: Any) -> Tool:
    return Tool(name, title, inspect.cleandoc(description), input, output, run, **hints)


TOOLS: tuple[Tool, ...] = (
    _tool(
        send_handoff,
        "send_handoff",
        "Send a handoff",
        m.SendHandoffInput,
        m.ThreadAnswer,
        """Open a new handoff (thread) to another agent: hand over work, ask a question or propose a change.

        Returns {task_id, thread_id, context_id, status: {state: "pending"}, priority, expires_at, created_at,
        idempotency_key, ...};
        keep task_id to follow the thread with get_thread. The recipient sees it in its inbox.
        Errors: recipient_not_found, teammate_blocked, invalid_intent_payload (proposed_action
        without intent 'propose_action' or the reverse), invalid_params (e.g. sending to yourself,
        an unknown context_id, an artifact missing a field), duplicate_idempotency_key.""",
    ),
    _tool(
        reply,
        "reply",
        "Reply in a thread",
        m.ReplyInput,
        m.ThreadAnswer,
        """Add a message to a handoff thread you are part of (sender or recipient), while it is pending or accepted.

        Returns {task_id, thread_id, message_id, sequence_no, created_at, idempotency_key}.
        Errors: thread_not_found, not_a_participant, thread_terminal (the thread is completed or
        cancelled), invalid_params, duplicate_idempotency_key.""",
    ),
    _tool(
        list_inbox,
        "list_inbox",
        "List handoffs",
        m.ListInboxInput,
        m.InboxAnswer,
        """List your handoff threads, newest activity first, without their messages.

        Returns {items: [{task_id, context_id, state, intent, sender, recipient, summary_preview, priority,
        unread_messages, created_at, updated_at}], next_cursor}; next_cursor is null on the last page.
        unread_messages counts the other side's messages you have not read (get_thread reads them).
        Errors: invalid_params (a bad since or cursor).""",
        read_only=True,
    ),
    _tool(
        get_thread,
        "get_thread",
        "Read a thread",
        m.GetThreadInput,
        m.ThreadPage,
        """Read a handoff thread: its state, participants, brief and its newest 50 messages (or a page).

        Marks what it returns read for you. Returns {task_id, context_id, status: {state}, sender,
        recipient, summary, intent, proposed_action, messages: [{id, sequence_no, from, role, body,
        artifacts, payload, created_at, cut?}], messages_total, messages_next, result_summary,
        accepted_at, completed_at, cancelled_at, ...}. messages_next is the messages_after of the next
        page (null at the end); earlier messages: pass a smaller messages_after. The answer stays under
        100,000 characters: anything long (a body, the summary, a diff or spec, a payload) is cut, and
        each cut entry (in its message's or the thread's cut list) names the read_artifact call with
        the rest; if even so the page does not fit, its oldest messages are left out (see note).
        Errors: thread_not_found, not_a_participant, invalid_params (a malformed task_id).""",
        read_only=True,
    ),
    _tool(
        read_artifact,
        "read_artifact",
        "Read a long artifact or body",
        m.ReadArtifactInput,
        m.ArtifactChunk,
        """Read what get_thread (or a feed) cut: a body, an artifact's diff/spec, or any field, 50,000 characters at a time.

        The cut note's rest names the call. Returns {task_id, sequence_no, index, field, offset, text,
        total, next_offset, json}: text is at most 50,000 characters from offset (fewer when they
        are mostly escapes); next_offset is where the next call starts (null at the end). A value
        that is not a string (an object spec, a payload) is read as its JSON text (json: true):
        the pieces put together parse back to it. With index and no field, the artifact's diff or
        spec, else the artifact as JSON. Errors: invalid_params (no such message, artifact or
        field), thread_not_found, not_a_participant.""",
        read_only=True,
        idempotent=True,
    ),
    _tool(
        accept,
        "accept",
        "Accept a handoff",
        m.AcceptInput,
        m.ThreadAnswer,
        """Accept a pending handoff addressed to you (recipient only): you take on the work.

        With lease_seconds the work is leased: if you neither finish nor renew it in time it is pending
        again. relay-mcp remembers the lease_token and sends it on complete, fail, release and renew
        (the relay's /mcp keeps nothing between calls: pass lease_token there).
        Returns {task_id, status: {state: "accepted"}, accepted_at, lease_token, lease_expires_at, priority,
        updated_at, ...}. Errors: not_authorized_transition (you are the sender), invalid_transition (not
        pending), state_changed (another call got there first), thread_not_found, not_a_participant,
        invalid_params (lease_seconds out of range).""",
    ),
    _tool(
        complete,
        "complete",
        "Complete a handoff",
        m.CompleteInput,
        m.ThreadAnswer,
        """Complete an accepted handoff addressed to you (recipient only), saying what was done.

        The thread becomes completed (final: no more messages). Returns {task_id, status: {state:
        "completed"}, completed_at, result_summary, ...}. Errors: not_authorized_transition (you are the
        sender), invalid_transition (not accepted yet: accept first), state_changed (also: a leased handoff
        and a missing or stale lease_token), thread_not_found, not_a_participant, invalid_params (summary
        too long).""",
    ),
    _tool(
        cancel,
        "cancel",
        "Cancel a handoff",
        m.TaskInput,
        m.ThreadAnswer,
        """Cancel a handoff you sent that is pending or waiting on your answer (sender only), e.g. when it is no longer needed.

        The thread becomes cancelled (final). Returns {task_id, status: {state: "cancelled"}, updated_at, ...}.
        Errors: not_authorized_transition (you are the recipient), invalid_transition (already accepted,
        completed or cancelled), state_changed, thread_not_found, not_a_participant.""",
        destructive=True,
    ),
    _tool(
        decline,
        "decline",
        "Decline a handoff",
        m.DeclineInput,
        m.ThreadAnswer,
        """Decline a pending handoff addressed to you (recipient only), telling the sender why.

        The thread becomes declined (final). Returns {task_id, status: {state: "declined"}, declined_at,
        reason, ...}. Errors: not_authorized_transition (you are the sender), invalid_transition (not
        pending), state_changed, thread_not_found, not_a_participant, invalid_params (reason missing or over
        2000 characters).""",
        destructive=True,
    ),
    _tool(
        fail,
        "fail",
        "Fail a handoff",
        m.FailInput,
        m.ThreadAnswer,
        """Give up on an accepted handoff addressed to you (recipient only), telling the sender why.

        The thread becomes failed (final). Returns {task_id, status: {state: "failed"}, failed_at, reason,
        ...}. Errors: not_authorized_transition (you are the sender), invalid_transition (not accepted),
        state_changed (also: a leased handoff and a missing or stale lease_token), thread_not_found,
        not_a_participant, invalid_params (reason missing or over 2000 characters).""",
        destructive=True,
    ),
    _tool(
        request_input,
        "request_input",
        "Ask the sender a question",
        m.RequestInputInput,
        m.ThreadAnswer,
        """Ask the sender of an accepted handoff addressed to you a question before going on (recipient only).

        The thread becomes input_required (A2A's TASK_STATE_INPUT_REQUIRED, the question its status
        message); the sender's next message answers it and makes it accepted again. A lease stays
        yours, its clock stopped until the answer. Returns {task_id, status: {state: "input_required"},
        question, input_requested_at, ...}. Errors: not_authorized_transition (you are the sender),
        invalid_transition (not accepted), state_changed (also: a missing or stale lease_token),
        thread_not_found, not_a_participant, invalid_params (question missing or over 2000 characters).""",
    ),
    _tool(
        release,
        "release",
        "Release a handoff",
        m.ReleaseInput,
        m.ThreadAnswer,
        """Give an accepted handoff addressed to you back (recipient only): it is pending again, its lease ended.

        It can then be accepted again, by you or not at all. Returns {task_id, status: {state: "pending"},
        accepted_at: null, lease_token: null, ...}. Errors: not_authorized_transition (you are the sender),
        invalid_transition (not accepted), state_changed (also: a leased handoff and a missing or stale
        lease_token), thread_not_found, not_a_participant.""",
    ),
    _tool(
        renew,
        "renew",
        "Renew a lease",
        m.RenewInput,
        m.ThreadAnswer,
        """Extend the lease of an accepted handoff addressed to you (recipient only); it stays accepted.

        Renew before lease_expires_at, or the handoff is pending again (a reply of yours renews it too).
        Returns {task_id, status: {state: "accepted"}, lease_token (the same), lease_expires_at, ...}.
        Errors: not_authorized_transition (you are the sender), invalid_transition (not accepted),
        state_changed (a missing or stale lease_token), invalid_params (no lease yet and no lease_seconds),
        thread_not_found, not_a_participant.""",
    ),
    _tool(
        search_messages,
        "search_messages",
        "Search messages",
        m.SearchMessagesInput,
        m.SearchAnswer,
        """Search the text and artifacts of every message in threads you are part of, newest first.

        Returns {items: [{id, task_id, context_id, task_state, sequence_no, role, from, caller, target,
        body, created_at, artifacts?}], more}; each body is cut at 2000 characters (body_truncated: true)
        and artifacts leave out diff/spec bodies: get_thread(task_id) has everything. more is true when
        further matches exist beyond limit. Errors: invalid_params.""",
        read_only=True,
    ),
    _tool(
        catch_up,
        "catch_up",
        "Catch up",
        m.CatchUpInput,
        m.CatchUpAnswer,
        """Every message since a time, each once, oldest first: what happened while you were away.

        Returns {messages: [{id, task_id, context_id, task_state, sequence_no, role, from, caller, target,
        body, created_at, artifacts?}], count, more, next_since, next_seen_ids}. When more is true, call
        again with since=next_since and seen_ids=next_seen_ids for the rest. Bodies are cut at 2000
        characters (body_truncated: true); get_thread(task_id) has everything.
        Errors: invalid_params (an unparseable since, or one without a timezone).""",
        read_only=True,
    ),
    _tool(
        wait_for_messages,
        "wait_for_messages",
        "Wait for messages",
        m.WaitInput,
        m.WaitAnswer,
        """Wait until another agent writes to you (a new handoff, a reply, a result), then return the new messages.

        Blocks on the relay for up to timeout_seconds (no polling) and returns as soon as something arrives.
        Each call returns only messages after a position, each once: after (the previous answer's next_after)
        when given; otherwise relay-mcp goes on from where its last call stopped (it starts at the newest
        message when relay-mcp started), and the relay's /mcp from the newest message now. Your own messages
        are skipped. Returns {messages: [{id, task_id, context_id, task_state, sequence_no, role, from, caller,
        target, body, created_at, artifacts?}], count, timed_out, next_after}: messages oldest first;
        timed_out true (messages []) when nothing arrived in time; call again (with after=next_after) to keep
        waiting. Bodies are cut at 2000 characters; get_thread(task_id) has everything. Errors:
        invalid_params (timeout_seconds not an integer from 1 to 600), rate_limited (this agent holds too
        many waits and streams), unauthenticated (the key was revoked, even mid-wait), connection_error.""",
        read_only=True,
        idempotent=False,
    ),
)

TOOL_NAMES: tuple[str, ...] = tuple(tool.name for tool in TOOLS)
