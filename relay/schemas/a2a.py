"""A2A v1.0 shapes: load schemas for its JSON-RPC params and dumps of tasks, messages, cards.

The A2A binding (relay/transport/a2a.py) translates, it does not re-decide: a ``SendMessage`` is
turned into ``message/send`` params of the relay's JSON-RPC dialect (``POST /a2a``,
docs/api.md) and loaded by ``MessageSendParams``, so every bound and artifact rule is that
dialect's own. The mapping (docs/a2a.md):

=================  ==========================================
relay              A2A v1.0
=================  ==========================================
pending            TASK_STATE_SUBMITTED
accepted           TASK_STATE_WORKING
completed          TASK_STATE_COMPLETED
cancelled          TASK_STATE_CANCELED
input_required     TASK_STATE_INPUT_REQUIRED (the question in status.message)
caller message     ROLE_USER
recipient message  ROLE_AGENT
text part          ``{"text": ...}`` part
artifact           ``{"data": {artifact}}`` part; Task.artifacts
intent, proposed   message ``metadata.intent`` /
_action            ``metadata.proposed_action``
=================  ==========================================

Field names are proto3 JSON's: lowerCamelCase or the proto's own snake_case, both
accepted as proto3 JSON parsers do (``pageSize`` or ``page_size``). A member that is
neither, or one field given in both spellings, is invalid_params naming it: nothing a
client sends is silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import uuid
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, pre_load, validate, validates_schema

from relay.errors import RelayError, invalid_fields
from relay.ids import parse_ulid
from relay.schemas.common import AwareDateTime, BoundedList, Cursor, StrictBool, load_or_invalid
from relay.schemas.handoffs import (
    ARTIFACT_SCHEMAS,
    MAX_ARTIFACTS,
    MAX_IDEMPOTENCY_KEY,
    MAX_PARTS,
    RESERVED_KEY_PREFIX,
    MessageSendParams,
)
from relay.services.a2a_view import DIGEST_CHARS, MEDIA_JSON, STATES, message_id_of

PROTOCOL_VERSION = "1.0"
SEED_PROTOCOL_VERSION = "0.3"  # the relay's own dialect at POST /a2a: A2A 0.3's JSON-RPC method names
# A2A state -> the relay states shown as it (CANCELED is cancelled or expired).
RELAY_STATES: dict[str, list[str]] = {}
for _relay, _a2a in STATES.items():
    RELAY_STATES.setdefault(_a2a, []).append(_relay)
del _relay, _a2a
# A2A states the relay never enters: a filter on them is valid and matches nothing.
OTHER_STATES = ("TASK_STATE_AUTH_REQUIRED",)
MAX_PAGE_SIZE = 100
MAX_TOKEN = 1024
MAX_A2A_PARTS = MAX_PARTS + MAX_ARTIFACTS  # text parts plus data/url parts (artifacts)
MAX_LIST = 64  # extensions, referenceTaskIds, acceptedOutputModes: the relay reads none of them
KEY_PREFIX = RESERVED_KEY_PREFIX  # a messageId's idempotency key; JSON-RPC dialect keys may not use it
MAX_MESSAGE_ID = MAX_IDEMPOTENCY_KEY - len(KEY_PREFIX) - DIGEST_CHARS - 1


def camel_name(name: str) -> str:
    """proto3 JSON's lowerCamelCase of a proto field name: ``history_length`` -> ``historyLength``."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


class _A2A(Schema):
    class Meta:
        unknown = RAISE

    # proto3 JSON writes an unset string as "" (a2a-java does): "" means absent here.
    _UNSET_IF_EMPTY: tuple[str, ...] = ()

    @pre_load
    def _proto3_names(self, data, **kwargs):
        """Take each member by its lowerCamelCase name, whichever spelling was sent; drop ``""``
        from the fields where it means unset. A member known in neither spelling keeps the
        name it came with, so the unknown-field error names what the client sent."""
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        sent_as: dict[str, str] = {}
        for key, value in data.items():
            name = key
            if isinstance(key, str) and "_" in key and camel_name(key) in self.fields:
                name = camel_name(key)
            if name in out or name in sent_as:
                raise ValidationError({key: [f"is {sent_as.get(name, name)} again, in the other spelling"]})
            sent_as[name] = key
            if name in self._UNSET_IF_EMPTY and value == "":
                continue
            out[name] = value
        return out


class _Request(_A2A):
    """A request message: every A2A request carries an optional ``tenant``, unused by the relay
    (an agent's endpoint URL already names its tenant)."""

    tenant = fields.String()


class Part(_A2A):
    """A2A ``Part``: exactly one of ``text``, ``raw``, ``url``, ``data``."""

    text = fields.String()
    raw = fields.String()
    url = fields.String()
    data = fields.Raw(allow_none=True)
    metadata = fields.Dict()
    filename = fields.String()
    mediaType = fields.String()

    @validates_schema
    def _one_content(self, data, **kwargs):
        present = [k for k in ("text", "raw", "url", "data") if k in data]
        if len(present) != 1:
            raise ValidationError("must hold exactly one of text, raw, url, data")


class MessageIn(_A2A):
    """A2A ``Message`` as a client sends it."""

    _UNSET_IF_EMPTY = ("contextId", "taskId")

    messageId = fields.String(
        required=True,
        validate=validate.Length(
            min=1,
            max=MAX_MESSAGE_ID,
            error=f"must be 1-{MAX_MESSAGE_ID} characters",
        ),
    )
    contextId = fields.String(load_default=None)
    taskId = fields.String(load_default=None)
    role = fields.String(
        load_default="ROLE_USER",
        validate=validate.OneOf(
            ("ROLE_USER", "ROLE_UNSPECIFIED"), error="must be ROLE_USER: the caller's messages are the user side"
        ),
    )
    parts = BoundedList(fields.Nested(Part), required=True, min_items=1, max_items=MAX_A2A_PARTS, noun="parts")
    metadata = fields.Dict(load_default=dict)
    extensions = BoundedList(fields.String(), max_items=MAX_LIST, noun="extensions")
    referenceTaskIds = BoundedList(fields.String(), max_items=MAX_LIST, noun="task ids")


# Sent as HTTP header values, so visible ASCII and spaces only: a CR/LF or a non-Latin-1
# character could never be sent (every delivery would fail) or would split the header.
_HEADER_SAFE = validate.Regexp(r"^[\x20-\x7e]*$", error="must be printable ASCII (it is sent as an HTTP header)")


class AuthenticationIn(_A2A):
    scheme = fields.String(
        required=True,
        validate=[
            validate.Length(min=1, max=64),
            validate.Regexp(
                r"^[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*$", error="must be an HTTP auth scheme such as Bearer"
            ),
        ],
    )
    credentials = fields.String(load_default=None, validate=[validate.Length(max=MAX_TOKEN), _HEADER_SAFE])


class PushConfigIn(_Request):
    """A2A ``TaskPushNotificationConfig``: where and how to POST a task's updates."""

    _UNSET_IF_EMPTY = ("id", "taskId", "token")

    id = fields.String(load_default=None, validate=validate.Length(min=1, max=255))
    taskId = fields.String(load_default=None)
    url = fields.String(required=True)
    token = fields.String(load_default=None, validate=[validate.Length(max=MAX_TOKEN), _HEADER_SAFE])
    authentication = fields.Nested(AuthenticationIn, load_default=None)


class CreatePushConfigRequest(PushConfigIn):
    """CreateTaskPushNotificationConfig: a config naming its task."""

    taskId = fields.String(required=True, validate=validate.Length(min=1, error="is required"))


class SendConfiguration(_A2A):
    acceptedOutputModes = BoundedList(fields.String(), max_items=MAX_LIST, noun="media types")
    taskPushNotificationConfig = fields.Nested(PushConfigIn, load_default=None)
    historyLength = fields.Integer(load_default=None, strict=True, validate=validate.Range(min=0))
    returnImmediately = StrictBool()


class SendMessageRequest(_Request):
    message = fields.Nested(MessageIn, required=True)
    configuration = fields.Nested(SendConfiguration, load_default=dict)
    metadata = fields.Dict()


class GetTaskRequest(_Request):
    id = fields.String(required=True)
    historyLength = fields.Integer(load_default=None, strict=True, validate=validate.Range(min=0))


class SubscribeToTaskRequest(_Request):
    """SubscribeToTask: the task's ``id`` (``tenant`` is not used here)."""

    id = fields.String(required=True)


class CancelTaskRequest(_Request):
    id = fields.String(required=True)
    metadata = fields.Dict()


class ListTasksRequest(_Request):
    _UNSET_IF_EMPTY = ("contextId", "pageToken", "status")

    contextId = fields.String(load_default=None)
    status = fields.String(
        load_default=None,
        validate=validate.OneOf(
            ("TASK_STATE_UNSPECIFIED", *STATES.values(), *OTHER_STATES),
            error="must be a TaskState such as TASK_STATE_WORKING",
        ),
    )
    pageSize = fields.Integer(
        load_default=50,
        strict=True,
        validate=validate.Range(min=1, max=MAX_PAGE_SIZE, error=f"must be 1-{MAX_PAGE_SIZE}"),
    )
    pageToken = Cursor(load_default=None)
    historyLength = fields.Integer(load_default=0, strict=True, validate=validate.Range(min=0))
    statusTimestampAfter = AwareDateTime(load_default=None)
    includeArtifacts = StrictBool(load_default=False)


class PushConfigRef(_Request):
    """``{taskId, id}``: Get/DeleteTaskPushNotificationConfig."""

    taskId = fields.String(required=True)
    id = fields.String(required=True, validate=validate.Length(min=1, max=255))


class ListPushConfigsRequest(_Request):
    _UNSET_IF_EMPTY = ("pageToken",)

    taskId = fields.String(required=True)
    pageSize = fields.Integer(load_default=0, strict=True, validate=validate.Range(min=0, max=MAX_PAGE_SIZE))
    pageToken = fields.String(
        load_default=None, validate=validate.Regexp(r"^[0-9]{1,4}$", error="is not a pageToken returned by this API")
    )


class NoParams(_Request):
    """Methods that take nothing the relay reads (their params are ignored)."""


def task_id(value: str, field: str) -> uuid.UUID:
    """Parse an A2A task id (the relay's ULID, either form).

    Ids are opaque to A2A clients: a string the relay never issued, whatever its form,
    names no task, so it raises thread_not_found (TaskNotFoundError) naming ``field``,
    as a well-formed id of no task does.
    """
    try:
        return parse_ulid(value)
    except ValueError:
        raise RelayError("thread_not_found", f"{field}: no task {value[:100]!r}", {"field": field}) from None


def context_id(value: str, field: str = "message.contextId") -> uuid.UUID:
    """Parse a contextId: a UUID (or the relay's 26-character ULID); anything else is invalid_params."""
    try:
        return parse_ulid(value)
    except ValueError:
        raise RelayError("invalid_params", f"{field}: must be a UUID", {field: ["must be a UUID"]}) from None


def _relay_parts(message: dict) -> tuple[list[dict], list[dict], dict[str, str]]:
    """Split A2A parts into the JSON-RPC dialect's text parts and artifacts; return them and a path map back."""
    texts: list[dict] = []
    artifacts: list[dict] = []
    paths: dict[str, str] = {}
    errors: dict[str, list[str]] = {}
    for i, part in enumerate(message["parts"]):
        where = f"message.parts.{i}"
        if "text" in part:
            paths[f"message.parts.{len(texts)}"] = where
            texts.append({"type": "text", "text": part["text"]})
        elif "data" in part:
            data = part["data"]
            if (
                not isinstance(data, dict)
                or not isinstance(data.get("type"), str)
                or data["type"] not in ARTIFACT_SCHEMAS
            ):
                errors[f"{where}.data"] = [
                    f"must be a relay artifact: an object whose type is one of {', '.join(ARTIFACT_SCHEMAS)}"
                ]
                continue
            paths[f"artifacts.{len(artifacts)}"] = f"{where}.data"
            artifacts.append(data)
        elif "url" in part:
            paths.update(
                {
                    f"artifacts.{len(artifacts)}.url": f"{where}.url",
                    f"artifacts.{len(artifacts)}.title": f"{where}.filename",
                    f"artifacts.{len(artifacts)}": where,
                }
            )
            link = {"type": "link", "url": part["url"]}
            if part.get("filename"):
                link["title"] = part["filename"]
            if part.get("mediaType"):
                paths[f"artifacts.{len(artifacts)}.mediaType"] = f"{where}.mediaType"
                link["mediaType"] = part["mediaType"]
            artifacts.append(link)
        else:
            # The relay stores no bytes: a raw part is refused as a content type it does not carry.
            raise RelayError(
                "content_type_not_supported",
                f"{where}.raw: raw (bytes) parts are not carried by the relay; send text, a url, "
                "or a data part holding an artifact",
                {"field": f"{where}.raw", "mediaType": str(part.get("mediaType") or "")},
            )
    if not texts and not errors:
        errors["message.parts"] = ["must hold at least one text part (data and url parts carry artifacts)"]
    if errors:
        raise invalid_fields(errors)
    return texts, artifacts, paths


# JSON-RPC dialect param path -> A2A path, for the fields the translation moves
_MOVED = {
    "message.parts": "message.parts",
    "artifacts": "message.parts",
    "intent": "message.metadata.intent",
    "proposed_action": "message.metadata.proposed_action",
    "context_id": "message.contextId",
    "task_id": "message.taskId",
    "metadata.client_idempotency_key": "message.messageId",
    "metadata": "message.metadata",
    "recipient": "agent",
    "message": "message",
    "params": "params",
}


def a2a_path(path: str, parts_map: dict[str, str]) -> str:
    """Name a JSON-RPC dialect param path (``artifacts.2.path``) as the A2A field it came from."""
    for seed in sorted(parts_map, key=len, reverse=True):
        if path == seed or path.startswith(seed + "."):
            return parts_map[seed] + path[len(seed) :]
    for seed in sorted(_MOVED, key=len, reverse=True):
        if path == seed or path.startswith(seed + "."):
            return _MOVED[seed] + path[len(seed) :]
    return path


def renamed(exc: RelayError, parts_map: dict[str, str]) -> RelayError:
    """Return an invalid_params error whose field names are A2A's; other errors unchanged.

    invalid_intent_payload keeps its symbol and gains the A2A path of its field
    (``details.field``), which the transport lists as a field violation.
    """
    if exc.symbol == "invalid_intent_payload" and isinstance(exc.details, dict) and "field" in exc.details:
        return RelayError(
            exc.symbol,
            exc.message,
            {**exc.details, "field": a2a_path(exc.details["field"], parts_map), "reason": exc.message},
        )
    if exc.symbol == "duplicate_idempotency_key":
        key = (exc.details or {}).get("client_idempotency_key", "")
        return RelayError(
            exc.symbol,
            "messageId was already used with a different message",
            {"messageId": message_id_of(key) or key},
        )
    if exc.symbol != "invalid_params" or not isinstance(exc.details, dict):
        return exc
    return invalid_fields(((a2a_path(k, parts_map), v) for k, v in exc.details.items()), omitted=exc.omitted)


def message_key(params: dict, request: dict, message_id: str, retry_key: str | None) -> str:
    """The idempotency key of a SendMessage: ``a2a:<digest>:<messageId>``.

    The messageId rides in the key so every read shows the client's id back
    (``a2a_view.message_id_of``). Only a send carrying the ``Idempotency-Key`` header
    (``retry_key``) is answered once: the same header value with the same message (and push
    config) replays the first call's task, however often it is retried; another message is
    another call. Without the header every send is a new message (a fresh nonce in the
    digest), whatever its messageId: A2A makes send idempotency optional, and clients (A2A's
    own TCK among them) send one messageId with many messages that each expect a new task.
    """
    push = (request.get("configuration") or {}).get("taskPushNotificationConfig")
    scope = ["retry", retry_key] if retry_key is not None else ["once", secrets.token_hex(16)]
    canonical = json.dumps([params, push, scope], sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]
    return f"{KEY_PREFIX}{digest}:{message_id}"


def send_params(request: dict, recipient: str, retry_key: str | None = None) -> tuple[dict, dict[str, str]]:
    """Translate a loaded SendMessageRequest into ``message/send`` params of the JSON-RPC dialect.

    ``retry_key``: the request's ``Idempotency-Key`` header, if any (see :func:`message_key`).

    Returns the params (loaded by MessageSendParams, so every rule of that dialect applies) and the
    path map used to name errors by their A2A fields. Raises invalid_params.
    """
    message = request["message"]
    texts, artifacts, paths = _relay_parts(message)
    meta = dict(message.get("metadata") or {})
    intent = meta.pop("intent", None)
    proposed = meta.pop("proposed_action", None)
    creating = message.get("taskId") is None
    seed: dict[str, Any] = {"message": {"role": "user", "parts": texts}, "metadata": meta}
    if artifacts:
        seed["artifacts"] = artifacts
    if creating:
        seed.update(recipient=recipient, intent=intent, proposed_action=proposed)
    elif intent is not None or proposed is not None:
        raise RelayError(
            "invalid_params",
            "message.metadata: intent and proposed_action only open a task",
            {"message.metadata": ["intent and proposed_action are only allowed when opening a task (no taskId)"]},
        )
    if "client_idempotency_key" in meta:
        raise RelayError(
            "invalid_params",
            "message.metadata.client_idempotency_key: messageId is the idempotency key here",
            {"message.metadata.client_idempotency_key": ["is not used here: messageId is the idempotency key"]},
        )
    try:
        params = load_or_invalid(MessageSendParams(), seed)
    except RelayError as exc:
        raise renamed(exc, paths) from None
    # Set after loading: MessageSendParams refuses the reserved prefix from the JSON-RPC dialect's clients.
    params["metadata"]["client_idempotency_key"] = message_key(params, request, message["messageId"], retry_key)
    push_task = ((request.get("configuration") or {}).get("taskPushNotificationConfig") or {}).get("taskId")
    if push_task and (
        creating
        or task_id(push_task, "configuration.taskPushNotificationConfig.taskId")
        != task_id(message["taskId"], "message.taskId")
    ):
        field = "configuration.taskPushNotificationConfig.taskId"
        raise RelayError(
            "invalid_params",
            f"{field}: must be left out (the config is for this message's task)",
            {field: ["must be left out: the config is for this message's task"]},
        )
    if creating:
        params["context_id"] = context_id(message["contextId"]) if message.get("contextId") else None
    else:
        params["task_id"] = task_id(message["taskId"], "message.taskId")
        if message.get("contextId"):
            # Checked against the task by the service (expect_context): A2A rejects a
            # taskId whose task is in another context.
            params["expect_context_id"] = context_id(message["contextId"])
    return params, paths


_SCHEME_SAFE = re.compile(r"[^a-z0-9]+")


def agent_card(agent: dict, base_url: str, version: str) -> dict:
    """A2A ``AgentCard`` of one relay agent (``agent``: handle, name, role, org)."""
    url = f"{base_url}/a2a/agents/{agent['handle']}"
    role = agent.get("role") or "general"
    return {
        "name": agent["name"] or agent["handle"],
        "description": (
            f"{agent['name'] or agent['handle']} ({agent['handle']}), a {role} agent on the handoff relay. "
            "Send it a message to open a handoff; it accepts, replies and completes it."
        ),
        "version": version,
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
            {"url": f"{url}/http", "protocolBinding": "HTTP+JSON", "protocolVersion": PROTOCOL_VERSION},
        ],
        "provider": {"organization": agent.get("org") or agent["handle"].split("@", 1)[1], "url": base_url},
        "documentationUrl": f"{base_url}/api/v1/openapi.json",
        "capabilities": {"streaming": True, "pushNotifications": True, "extendedAgentCard": False},
        "securitySchemes": {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "bearerFormat": "ah_live_ API key",
                    "description": "An API key of the calling agent, issued by `relay agents create` or `relay keys create`.",
                }
            }
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", MEDIA_JSON],
        "defaultOutputModes": ["text/plain", MEDIA_JSON],
        "skills": [
            {
                "id": "handoff-" + _SCHEME_SAFE.sub("-", role.lower()).strip("-") if role else "handoff",
                "name": f"Take on {role} work",
                "description": (
                    f"Takes handoffs of {role} work: a text brief plus artifacts (file_diff, file_ref, "
                    "test_command, api_contract, link as data parts). The task is SUBMITTED until the agent "
                    "accepts it (WORKING) and COMPLETED with a result summary in the status message."
                ),
                "tags": ["handoff", role],
                "examples": ["Refactored /users API; please update the client to the paginated shape."],
                "inputModes": ["text/plain", MEDIA_JSON],
                "outputModes": ["text/plain", MEDIA_JSON],
            }
        ],
    }


def relay_card(base_url: str, version: str) -> dict:
    """A2A ``AgentCard`` of the relay itself: where the per-agent cards are."""
    return {
        "name": "Handoff relay",
        "description": (
            "A relay that lets AI agents hand work to each other. Each agent has its own card at "
            f"{base_url}/a2a/agents/{{handle}}/.well-known/agent-card.json and its own A2A v1.0 "
            "JSON-RPC endpoint; the relay's own JSON-RPC dialect is POST /a2a."
        ),
        "version": version,
        # The relay's own endpoint: its JSON-RPC dialect, whose methods are A2A 0.3's
        # (message/send, tasks/get, ...). Each agent's v1.0 interfaces are on its own card.
        "supportedInterfaces": [
            {"url": f"{base_url}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": SEED_PROTOCOL_VERSION}
        ],
        "provider": {"organization": "handoff relay", "url": base_url},
        "documentationUrl": f"{base_url}/api/v1/openapi.json",
        "capabilities": {"streaming": True, "pushNotifications": True, "extendedAgentCard": False},
        "securitySchemes": {
            "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "bearerFormat": "ah_live_ API key"}}
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", MEDIA_JSON],
        "defaultOutputModes": ["text/plain", MEDIA_JSON],
        "skills": [],
    }
