"""REST tasks and the messages feed under ``/api/v1/identities/{handle}/a2a``; same services as JSON-RPC."""

from __future__ import annotations

from flask import request

from relay.errors import invalid
from relay.ids import parse_ulid
from relay.schemas.handoffs import transition_args
from relay.schemas.rest import FeedQuery, ReplyBody, TaskGetQuery, TaskListQuery, TransitionBody
from relay.services import feed, streams, threads
from relay.transport import disconnect
from relay.transport.rest import bp, identity, load_json, load_query, still_allowed

# Schemas hold no request state: built once, not per request.
_FEED_QUERY, _TASK_LIST_QUERY, _TASK_GET_QUERY = FeedQuery(), TaskListQuery(), TaskGetQuery()


def _task_id(raw: str):
    try:
        return parse_ulid(raw)
    except ValueError as exc:
        raise invalid("task_id", str(exc)) from None


@bp.get("/identities/<handle>/a2a/messages")
def list_messages(handle: str):
    """List the identity's messages newest first; with ``wait``, wait for one (docs/api.md)."""
    caller = identity(handle)
    params = load_query(_FEED_QUERY)
    wait = params.pop("wait", None)
    if wait is None:
        return feed.list_messages(caller, **params)
    return streams.wait_for_messages(
        caller, wait=wait, still_allowed=still_allowed(handle), client_gone=disconnect.probe(request.environ), **params
    )


@bp.get("/identities/<handle>/a2a/tasks")
def list_tasks(handle: str):
    """List the inbox (role=recipient) or sent threads (role=sender)."""
    caller = identity(handle)
    p = load_query(_TASK_LIST_QUERY)
    return threads.list_threads(
        caller,
        role=p["role"],
        status=p.get("status"),
        priority=p.get("priority"),
        since=p.get("since"),
        limit=p["limit"],
        cursor=p.get("cursor"),
    )


@bp.get("/identities/<handle>/a2a/tasks/<task_id>")
def get_task(handle: str, task_id: str):
    """Return a thread with its history; marks it read."""
    caller = identity(handle)
    p = load_query(_TASK_GET_QUERY)
    return threads.get_thread(
        caller, _task_id(task_id), messages_limit=p["messages_limit"], messages_after=p["messages_after"]
    )


@bp.post("/identities/<handle>/a2a/tasks/<task_id>/messages")
def reply(handle: str, task_id: str):
    """Append a message (reply) to a thread."""
    caller = identity(handle)
    body = load_json(ReplyBody())
    return threads.send_message(caller, {**body, "task_id": _task_id(task_id)}), 201


@bp.post("/identities/<handle>/a2a/tasks/<task_id>/transitions")
def transition(handle: str, task_id: str):
    """Move a thread: accept, complete, cancel, decline, fail, release, renew (docs/api.md)."""
    caller = identity(handle)
    body = load_json(TransitionBody())
    return threads.transition(caller, _task_id(task_id), **transition_args(body))


@bp.get("/identities/<handle>/a2a/tasks/<task_id>/audit")
def audit(handle: str, task_id: str):
    """Return the thread's audit trail, oldest first."""
    caller = identity(handle)
    return {"items": threads.audit_trail(caller, _task_id(task_id))}
