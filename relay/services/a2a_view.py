"""A2A v1.0 objects rendered from the relay's rows: Task, Message, TaskStatus, StreamResponse.

The A2A transport answers with them, its task streams (services/task_streams.py) and A2A
push deliveries carry them, so they live below all three (the mapping table is in
``relay.schemas.a2a`` and docs/a2a.md).
Input: the dicts ``relay.services.threads`` returns (``thread_summary``, ``message_row``).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from relay.ids import parse_ulid
from relay.models import RESERVED_KEY_PREFIX

STATES = {
    "pending": "TASK_STATE_SUBMITTED",
    "accepted": "TASK_STATE_WORKING",
    "completed": "TASK_STATE_COMPLETED",
    "cancelled": "TASK_STATE_CANCELED",
    # The work lifecycle's ends: A2A has REJECTED and FAILED for the first two; a handoff nobody took
    # in time is CANCELED (by the clock), and its status carries the relay's state.
    "declined": "TASK_STATE_REJECTED",
    "failed": "TASK_STATE_FAILED",
    "expired": "TASK_STATE_CANCELED",
    # The worker asked its requester a question (request_input); status.message holds it.
    "input_required": "TASK_STATE_INPUT_REQUIRED",
}
ROLES = {"caller": "ROLE_USER", "agent": "ROLE_AGENT"}
# A SendMessage's idempotency key: RESERVED_KEY_PREFIX, a digest of the message
# (DIGEST_CHARS hex characters) and ":", then the client's messageId (schemas/a2a.py).
DIGEST_CHARS = 16
_MESSAGE_KEY = re.compile(rf"^{re.escape(RESERVED_KEY_PREFIX)}(?:[0-9a-f]{{{DIGEST_CHARS}}}:)?")


def message_id_of(key: str) -> str | None:
    """The client's messageId inside a SendMessage's idempotency key; None for a key of another kind."""
    if not key.startswith(RESERVED_KEY_PREFIX):
        return None
    return _MESSAGE_KEY.sub("", key, count=1)


MEDIA_JSON = "application/json"


def _uuid_text(ulid_text: str) -> str:
    return str(parse_ulid(ulid_text))


def artifact_part(artifact: dict) -> dict:
    """The A2A ``Part`` of one relay artifact: a ``link`` is a url part (its ``title`` the
    ``filename``, and the ``mediaType`` it was sent with), as a client's url part is stored;
    every other artifact a ``data`` part holding it whole."""
    if artifact.get("type") == "link" and isinstance(artifact.get("url"), str):
        part: dict[str, Any] = {"url": artifact["url"]}
        if artifact.get("title"):
            part["filename"] = artifact["title"]
        if isinstance(artifact.get("mediaType"), str):
            part["mediaType"] = artifact["mediaType"]
        return part
    return {"data": artifact, "mediaType": MEDIA_JSON}


def message_out(row: dict, task: dict, *, opening: bool = False) -> dict:
    """A2A ``Message`` from a message row of the JSON-RPC dialect (``tasks/get`` shape) of ``task``."""
    parts: list[dict[str, Any]] = [{"text": p.get("text", "")} for p in row.get("parts") or [] if p.get("text")]
    parts += [artifact_part(a) for a in row.get("artifacts") or []]
    metadata: dict[str, Any] = {
        **(row.get("payload") or {}),
        "sequenceNo": row["sequence_no"],
        "from": row["from"],
        "createdAt": row["created_at"],
    }
    if opening:
        metadata["intent"] = task.get("intent")
        if task.get("proposed_action") is not None:
            metadata["proposed_action"] = task["proposed_action"]
    # A message sent over A2A keeps the messageId its author chose; others show the relay's id.
    message_id = row.get("a2a_message_id") or row["id"]
    if message_id != row["id"]:
        metadata["relayMessageId"] = row["id"]
    return {
        "messageId": message_id,
        "contextId": _uuid_text(task["context_id"]),
        "taskId": task["task_id"],
        "role": ROLES[row["role"]],
        "parts": parts,
        "metadata": metadata,
    }


def _closing_message(task: dict, state: str) -> dict | None:
    """The ROLE_AGENT status message a state carries: the result summary on completion, the
    reason of a decline or fail, the open question of an input_required task
    (``metadata {"question": true}``; its messageId is the same on every surface); None otherwise."""
    if state == "completed" and task.get("result_summary"):
        text, kind, name = task["result_summary"], "resultSummary", "result"
    elif state in ("declined", "failed") and task.get("reason"):
        text, kind, name = task["reason"], "reason", state
    elif state == "input_required" and task.get("question"):
        text, kind, name = task["question"], "question", f"question:{task['question']}"
    else:
        return None
    return {
        "messageId": str(uuid.uuid5(uuid.NAMESPACE_URL, f"relay:{name}:{task['task_id']}")),
        "contextId": _uuid_text(task["context_id"]),
        "taskId": task["task_id"],
        "role": "ROLE_AGENT",
        "parts": [{"text": text}],
        "metadata": {kind: True},
    }


def status_out(task: dict) -> dict:
    """A2A ``TaskStatus``: the state, when it last changed (last activity), and a ROLE_AGENT
    message holding the result summary, why it was declined or failed, or the question an
    input_required task waits on."""
    status: dict[str, Any] = {"state": STATES[task["status"]["state"]], "timestamp": task["updated_at"]}
    closing = _closing_message(task, task["status"]["state"])
    if closing is not None:
        status["message"] = closing
    return status


def artifact_out(row: dict, index: int, artifact: dict) -> dict:
    """A2A ``Artifact``: the ``index``-th relay artifact of message ``row``, as one part (:func:`artifact_part`)."""
    return {
        "artifactId": f"{row['id']}:{index}",
        "name": artifact.get("type", "artifact"),
        "parts": [artifact_part(artifact)],
        "metadata": {"messageId": row["id"], "sequenceNo": row["sequence_no"]},
    }


def artifacts_out(task: dict, messages: list[dict]) -> list[dict]:
    """A2A ``Artifact`` list: each relay artifact as one ``data`` part, in message order."""
    return [artifact_out(m, i, a) for m in messages for i, a in enumerate(m.get("artifacts") or [])]


def task_out(task: dict, *, history_length: int | None = None, include_artifacts: bool = True) -> dict:
    """A2A ``Task`` from a JSON-RPC dialect thread dict with ``messages`` (tasks/get, or a list item with them).

    ``history_length``: None keeps every message, 0 none, N the newest N (A2A GetTask).
    """
    messages = task.get("messages") or []
    out: dict[str, Any] = {
        "id": task["task_id"],
        "contextId": _uuid_text(task["context_id"]),
        "status": status_out(task),
        "metadata": {
            "intent": task.get("intent"),
            "sender": task["sender"],
            "recipient": task.get("recipient"),
            "createdAt": task["created_at"],
        },
    }
    if include_artifacts:  # all of the task's, also when only the newest messages were read
        out["artifacts"] = artifacts_out(task, task.get("artifact_rows", messages))
    if history_length != 0:
        kept = messages if history_length is None else messages[-history_length:]
        out["history"] = [message_out(m, task, opening=m["sequence_no"] == 1) for m in kept]
    return out


def push_config_out(config: dict) -> dict:
    """A2A ``TaskPushNotificationConfig`` (the credentials are never echoed)."""
    out: dict[str, Any] = {"id": config["id"], "taskId": config["task_id"], "url": config["url"]}
    if config.get("token"):
        out["token"] = config["token"]
    if config.get("auth_scheme"):
        out["authentication"] = {"scheme": config["auth_scheme"]}
    return out


def status_event(
    task: dict, state: str, timestamp: str, *, message: dict | None = None, metadata: dict | None = None
) -> dict:
    """A2A ``StreamResponse`` of a task stream: ``{"statusUpdate": TaskStatusUpdateEvent}``.

    ``state`` is the relay state the task is in at ``timestamp``; ``message`` (an A2A
    Message) is the status message: a reply of the agent, or at the end the result summary
    or the reason of a decline or fail (added here when none is given).
    """
    status: dict[str, Any] = {"state": STATES[state], "timestamp": timestamp}
    if message is None:
        message = _closing_message(task, state)
    if message is not None:
        status["message"] = message
    event: dict[str, Any] = {
        "taskId": task["task_id"],
        "contextId": _uuid_text(task["context_id"]),
        "status": status,
    }
    if metadata:
        event["metadata"] = metadata
    return {"statusUpdate": event}


def artifact_event(task: dict, row: dict, index: int, artifact: dict) -> dict:
    """A2A ``StreamResponse`` for one artifact of a new message: ``{"artifactUpdate": TaskArtifactUpdateEvent}``
    (each relay artifact is whole: never appended to, always its last chunk)."""
    return {
        "artifactUpdate": {
            "taskId": task["task_id"],
            "contextId": _uuid_text(task["context_id"]),
            "artifact": artifact_out(row, index, artifact),
            "append": False,
            "lastChunk": True,
        }
    }
