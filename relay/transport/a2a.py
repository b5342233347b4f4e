"""A2A v1.0 binding: agent cards and ``POST /a2a/agents/{handle}``, beside ``POST /a2a``
(the relay's JSON-RPC dialect, docs/api.md).

A stock A2A client (``a2a-sdk``) talks to one relay agent as if it were an A2A server:
the caller (bearer key) is the client and sender, ``{handle}`` the agent and recipient.
Methods are A2A's PascalCase ones over the same JSON-RPC transport (relay/transport/jsonrpc.py)
and the same services as ``POST /a2a``, so blocking, idempotency (``messageId``), the
rate limit and participant rules apply unchanged. What differs is the error shape: A2A's
codes (-32001 TaskNotFound, -32002 TaskNotCancelable, -32004 UnsupportedOperation,
-32009 VersionNotSupported) with a ``data`` array holding a ``google.rpc.ErrorInfo``
whose ``reason`` is the A2A name and ``metadata.symbol`` the relay's symbol, answered
with HTTP 200 (the SDK maps only errors it receives with a 2xx). The mapping is in
relay/schemas/a2a.py and docs/a2a.md.

``SendStreamingMessage`` and ``SubscribeToTask`` answer Server-Sent Events (the stream
itself is relay/services/task_streams.py): every check (params, the task, the per-agent
stream cap) runs before the stream starts, so a refusal is an ordinary JSON-RPC error.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from functools import lru_cache, partial
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from flask import Blueprint, Response, current_app, request
from packaging.version import InvalidVersion, Version

from relay.errors import DATABASE_ERRORS, RelayError, is_connection_error
from relay.models import Agent
from relay.schemas import a2a as shapes
from relay.schemas.a2a import (
    CancelTaskRequest,
    CreatePushConfigRequest,
    GetTaskRequest,
    ListPushConfigsRequest,
    ListTasksRequest,
    NoParams,
    PushConfigRef,
    SendMessageRequest,
    SubscribeToTaskRequest,
)
from relay.services import a2a_view as view
from relay.services import agents, push, signing, task_streams, threads
from relay.services.agents import get_agent, normalize_handle
from relay.transport import disconnect, errors, jsonrpc
from relay.transport.auth import INVALID_KEY, bearer_token
from relay.transport.jsonrpc import Dialect, Method, Streamed

VERSION_HEADER = "A2A-Version"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
DOMAIN = "a2a-protocol.org"

# relay symbol -> A2A JSON-RPC code. A symbol with no A2A meaning (a block, a reused
# messageId, a bad key) answers -32600 InvalidRequest: the SDK raises InvalidRequestError
# and keeps ErrorInfo.metadata (with the symbol), where an unknown code would lose it.
A2A_CODES: dict[str, int] = {
    "thread_not_found": -32001,
    "not_a_participant": -32001,
    "not_found": -32001,
    "invalid_transition": -32002,
    "not_authorized_transition": -32002,
    "state_changed": -32002,
    "unsupported_operation": -32004,
    "thread_terminal": -32004,
    "version_not_supported": -32009,
    "content_type_not_supported": -32005,
    "invalid_params": -32602,
    "invalid_intent_payload": -32602,
    "parse_error": -32700,
    "method_not_found": -32601,
    "internal_error": -32603,
    "service_unavailable": -32603,
}
REASONS: dict[int, str] = {
    -32001: "TASK_NOT_FOUND",
    -32002: "TASK_NOT_CANCELABLE",
    -32004: "UNSUPPORTED_OPERATION",
    -32005: "CONTENT_TYPE_NOT_SUPPORTED",
    -32009: "VERSION_NOT_SUPPORTED",
    -32602: "INVALID_PARAMS",
    -32600: "INVALID_REQUEST",
    -32601: "METHOD_NOT_FOUND",
    -32603: "INTERNAL_ERROR",
    -32700: "PARSE_ERROR",
}


def _a2a_code(symbol: str, code: int) -> int:
    return A2A_CODES.get(symbol, -32600)


def _metadata_value(value: Any) -> str:
    # google.rpc.ErrorInfo.metadata is map<string, string>.
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def _a2a_data(code: int, data: dict) -> list[dict]:
    """``[ErrorInfo, BadRequest?]``: the reason, the relay symbol and details; field errors as violations."""
    metadata = {"symbol": data["symbol"]}
    for key, value in data.items():
        if key == "details" and isinstance(value, dict):
            metadata.update({k: _metadata_value(v) for k, v in value.items()})
        elif key not in ("symbol", "errors"):
            metadata[key] = _metadata_value(value)
    details: list[dict] = [
        {
            "@type": ERROR_INFO,
            "reason": REASONS.get(code, data["symbol"].upper()),
            "domain": DOMAIN,
            "metadata": metadata,
        }
    ]
    violations = data.get("errors")
    if (
        not isinstance(violations, dict)
        and code == -32602
        and isinstance(data.get("details"), dict)
        and "field" in data["details"]
    ):  # invalid_intent_payload names its one field
        violations = {data["details"]["field"]: [str(data["details"].get("reason", "does not match the intent"))]}
    if isinstance(violations, dict):
        details.append(
            {
                "@type": BAD_REQUEST,
                "fieldViolations": [
                    {"field": field, "description": " ".join(reasons) if isinstance(reasons, list) else str(reasons)}
                    for field, reasons in violations.items()
                ],
            }
        )
    return details


ERRORS_ONLY = Dialect(methods={}, code_for=_a2a_code, shape_data=_a2a_data)


@lru_cache(maxsize=1)
def relay_version() -> str:
    """The installed package's version (the cards' ``version``)."""
    try:
        return version("handoff-relay")
    except PackageNotFoundError:
        return "0.0.0"


def base_url() -> str:
    """The public root URL: ``RELAY_PUBLIC_URL`` when set, else what this request reached."""
    return (current_app.config["RELAY"].public_url or request.host_url).rstrip("/")


# --------------------------------------------------------------------------- methods


def _add_push_config(caller: Agent, config: dict, session, result: dict) -> None:
    push.add_config(session, caller, shapes.task_id(result["task_id"], "message.taskId"), config)


def _sender(caller: Agent, peer: Agent, req: dict) -> Callable[[], uuid.UUID]:
    """Translate and check a SendMessageRequest (raising its errors now); return the call that
    sends it, answering the task's id."""
    params, paths = shapes.send_params(req, peer.handle, request.headers.get("Idempotency-Key"))
    push_config = (req.get("configuration") or {}).get("taskPushNotificationConfig")
    then = None
    if push_config is not None:
        paths.update({name: f"configuration.taskPushNotificationConfig.{name}" for name in ("url", "id")})
        try:
            push.check_target(push_config)
        except RelayError as exc:
            raise shapes.renamed(exc, paths) from None
        params["push_config"] = push_config  # part of the idempotency digest: another config is another call
        then = partial(_add_push_config, caller, push_config)

    def send() -> uuid.UUID:
        try:
            sent = threads.send_message(caller, params, peer=peer, adopt_context=True, then=then)
        except RelayError as exc:
            raise shapes.renamed(exc, paths) from None
        return shapes.task_id(sent["task_id"], "id")

    return send


def _send(caller: Agent, peer: Agent, req: dict) -> dict:
    """SendMessage. Blocking unless ``configuration.returnImmediately`` is true: the answer waits
    until the task is terminal or interrupted, at most ``RELAY_A2A_BLOCKING_SECONDS``, then is
    the task as it stands. The wait holds no database connection; with every one of the
    caller's wait slots held (``RELAY_STREAMS_PER_AGENT``) the send answers at once."""
    config = req.get("configuration") or {}
    send = _sender(caller, peer, req)  # bad params are refused before a slot is taken
    bound = current_app.config["RELAY"].a2a_blocking_seconds
    waiting = None
    if bound > 0 and not config.get("returnImmediately"):
        try:  # the waiter is registered before the send: nothing committed after it is missed
            waiting = task_streams.SendWait(caller, peer, client_gone=_client_gone())
        except RelayError as exc:
            if exc.symbol != "rate_limited":
                raise
    try:
        task_id = send()
        if waiting is not None:
            waiting.until_settled(task_id, bound)
    finally:
        if waiting is not None:
            waiting.close()
    task = threads.get_thread(caller, task_id, peer=peer, mark_read=False)
    return {"task": view.task_out(task, history_length=config.get("historyLength"))}


def _still_allowed() -> Callable[[], None]:
    """A check that this request's key still authenticates (raises unauthenticated once it does not),
    for the stream's heartbeat tick: a key revoked since the stream began ends it."""
    token = bearer_token()

    def check() -> None:
        try:
            agents.reauthenticate(token)
        except RelayError as exc:
            if exc.symbol == "unauthenticated":  # every bad key gets the same answer (transport/auth.py)
                raise RelayError("unauthenticated", INVALID_KEY) from None
            raise

    return check


def _client_gone() -> Callable[[], bool] | None:
    return disconnect.probe(request.environ)


def _streamed(stream: task_streams.TaskStream, opening: Callable[[], Any]) -> Streamed:
    """Run ``opening`` (the send, the first read) with the stream's slot and waiter held; an
    error it raises gives them back and is the call's answer (no stream starts)."""
    try:
        opening()
    except BaseException:
        stream.close()
        raise
    return Streamed(stream.events(), stream.close)


def _send_streaming(caller: Agent, peer: Agent, req: dict) -> Streamed:
    send = _sender(caller, peer, req)  # bad params are refused before a slot is taken
    history = (req.get("configuration") or {}).get("historyLength")
    # The slot and the waiter come before the send: nothing the recipient does after it is missed.
    stream = task_streams.TaskStream(caller, peer, still_allowed=_still_allowed(), client_gone=_client_gone())
    return _streamed(stream, lambda: stream.open(send(), history_length=history))


def _subscribe(caller: Agent, peer: Agent, req: dict) -> Streamed:
    task_id = shapes.task_id(req["id"], "id")
    stream = task_streams.TaskStream(caller, peer, still_allowed=_still_allowed(), client_gone=_client_gone())
    return _streamed(stream, lambda: stream.open(task_id, subscribing=True))


def _get(caller: Agent, peer: Agent, req: dict) -> dict:
    # historyLength reads only that many messages; without it, every one (docs/decisions.md,
    # "Paged reads and bounded answers").
    task = threads.get_thread(caller, shapes.task_id(req["id"], "id"), peer=peer, messages_last=req["historyLength"])
    return view.task_out(task, history_length=req["historyLength"])


def _list(caller: Agent, peer: Agent, req: dict) -> dict:
    state = req["status"]
    empty = {"tasks": [], "nextPageToken": "", "pageSize": req["pageSize"], "totalSize": 0}
    if state in shapes.OTHER_STATES:  # valid A2A states the relay never enters
        return empty
    context = None
    if req["contextId"]:
        try:
            context = shapes.context_id(req["contextId"], "contextId")
        except RelayError:  # ids are opaque: one the relay never issued is a context with no tasks
            return empty
    since = None
    if req["statusTimestampAfter"] is not None:
        try:  # "after": the service's since is inclusive, and PostgreSQL keeps microseconds
            since = req["statusTimestampAfter"] + timedelta(microseconds=1)
        except OverflowError:  # the last representable instant: nothing is after it
            return empty
    page = threads.list_threads(
        caller,
        role="sender",
        peer=peer,
        status=shapes.RELAY_STATES.get(state),
        context_id=context,
        since=since,
        limit=req["pageSize"],
        cursor=req["pageToken"],
        with_total=True,
        messages="all" if req["includeArtifacts"] else req["historyLength"] or None,
    )
    tasks = [
        view.task_out(item, history_length=req["historyLength"], include_artifacts=req["includeArtifacts"])
        for item in page["items"]
    ]
    return {
        "tasks": tasks,
        "nextPageToken": page["next_cursor"] or "",
        "pageSize": req["pageSize"],
        "totalSize": page["total"],
    }


def _cancel(caller: Agent, peer: Agent, req: dict) -> dict:
    task_id = shapes.task_id(req["id"], "id")
    threads.transition(caller, task_id, "cancel", peer=peer)
    return view.task_out(threads.get_thread(caller, task_id, peer=peer, mark_read=False))


def _create_push(caller: Agent, peer: Agent, req: dict) -> dict:
    config = push.create_config(caller, peer, shapes.task_id(req["taskId"], "taskId"), req)
    return view.push_config_out(config)


def _get_push(caller: Agent, peer: Agent, req: dict) -> dict:
    return view.push_config_out(push.get_config(caller, peer, shapes.task_id(req["taskId"], "taskId"), req["id"]))


def _list_push(caller: Agent, peer: Agent, req: dict) -> dict:
    # A task holds at most push.MAX_CONFIGS_PER_TASK configs, so an offset token is enough.
    configs = push.list_configs(caller, peer, shapes.task_id(req["taskId"], "taskId"))
    start = int(req["pageToken"] or 0)
    end = start + req["pageSize"] if req["pageSize"] else len(configs)
    return {
        "configs": [view.push_config_out(c) for c in configs[start:end]],
        "nextPageToken": str(end) if end < len(configs) else "",
    }


def _delete_push(caller: Agent, peer: Agent, req: dict) -> dict:
    push.delete_config(caller, peer, shapes.task_id(req["taskId"], "taskId"), req["id"])
    return {}


def _extended_card(caller: Agent, peer: Agent, req: dict) -> dict:
    raise RelayError(
        "unsupported_operation", "this agent has no extended agent card (capabilities.extendedAgentCard is false)"
    )


# name -> (load schema, handler(caller, peer, params)); STREAMING answer a Streamed.
STREAMING = ("SendStreamingMessage", "SubscribeToTask")
METHODS = {
    "SendMessage": (SendMessageRequest, _send),
    "GetTask": (GetTaskRequest, _get),
    "ListTasks": (ListTasksRequest, _list),
    "CancelTask": (CancelTaskRequest, _cancel),
    "CreateTaskPushNotificationConfig": (CreatePushConfigRequest, _create_push),
    "GetTaskPushNotificationConfig": (PushConfigRef, _get_push),
    "ListTaskPushNotificationConfigs": (ListPushConfigsRequest, _list_push),
    "DeleteTaskPushNotificationConfig": (PushConfigRef, _delete_push),
    "SendStreamingMessage": (SendMessageRequest, _send_streaming),
    "SubscribeToTask": (SubscribeToTaskRequest, _subscribe),
    "GetExtendedAgentCard": (NoParams, _extended_card),
}


def dialect_for(peer: Agent) -> Dialect:
    """The A2A dialect with every method bound to ``peer``, the agent the client talks to."""

    def bind(handler):
        return lambda caller, params: handler(caller, peer, params)

    return Dialect(
        methods={
            name: Method(schema(), bind(handler), streaming=name in STREAMING)
            for name, (schema, handler) in METHODS.items()
        },
        code_for=_a2a_code,
        shape_data=_a2a_data,
    )


def check_version() -> None:
    """Refuse a request whose ``A2A-Version`` is not 1.0 (patch ignored), as the spec asks.

    A missing header means 0.3 in A2A, which is not served here. Raises version_not_supported.
    """
    raw = request.headers.get(VERSION_HEADER, "").strip()
    try:
        ok = bool(raw) and Version(raw).release[:2] == (1, 0)
    except InvalidVersion:
        ok = False
    if not ok:
        got = f"got {raw[:40]!r}" if raw else "it is missing (which means A2A 0.3)"
        raise RelayError(
            "version_not_supported",
            f"this endpoint serves A2A {shapes.PROTOCOL_VERSION} only: send "
            f"'{VERSION_HEADER}: {shapes.PROTOCOL_VERSION}'; {got}",
            {"supported": shapes.PROTOCOL_VERSION},
        )


def peer_for(handle: str, *, disabled_ok: bool = False) -> Agent | None:
    """The agent ``{handle}`` names, or None (no such agent, a malformed handle, or disabled
    unless ``disabled_ok``). Raises the database's errors (an outage) as they come."""
    try:
        agent = get_agent(normalize_handle(handle))
    except RelayError:  # a malformed handle names no agent
        return None
    if agent is None or (agent.disabled_at is not None and not disabled_ok):
        return None
    return agent


def rate_limited(limit) -> Response:
    """429 with a whole-second Retry-After, shaped as an A2A error."""
    return jsonrpc.rate_limited(limit, ERRORS_ONLY)


bp = Blueprint("a2a_v1", __name__)


def _card(card: dict, changed_at=None) -> Response:
    """Serve ``card`` signed, with validators: ``ETag`` and ``Last-Modified``; a conditional GET
    whose ``If-None-Match`` (or, without it, ``If-Modified-Since``) still holds gets 304.

    The ETag is a digest of the card's signed content and the active signing keys (ES256
    signatures differ on every signing, so the served bytes cannot be the tag);
    Last-Modified is the later of ``changed_at`` and the newest active key's creation.
    """
    jku = base_url() + signing.JWKS_PATH
    payload = signing.signed_payload(card)
    # Signed last, over the card exactly as served (relay/services/signing.py, docs/a2a.md);
    # the keys are read after it, which makes the first key when there is none.
    card = signing.sign_card(card, jku)
    kids, keys_at = signing.active_stamp()
    digest = hashlib.sha256(payload + b"\0" + jku.encode() + b"\0" + ",".join(kids).encode())
    resp = Response(json.dumps(card), mimetype="application/json")
    resp.headers["Cache-Control"] = "public, max-age=300"
    # Without RELAY_PUBLIC_URL the card's URLs come from the request's host: a shared cache
    # must not serve one host's card for another.
    resp.headers["Vary"] = "Host, X-Forwarded-Host, X-Forwarded-Proto"
    resp.set_etag(digest.hexdigest()[:32])
    stamps = [at for at in (changed_at, keys_at) if at is not None]
    if stamps:
        resp.last_modified = max(stamps)
    return resp.make_conditional(request)


@bp.get("/.well-known/agent-card.json")
def relay_card() -> Response:
    """Return the relay's own agent card (where the per-agent cards are)."""
    return _card(shapes.relay_card(base_url(), relay_version()))


@bp.get(signing.JWKS_PATH)
def jwks() -> Response:
    """Return the JWK Set (RFC 7517) of the keys that sign the cards: active ones, and retired ones in their grace."""
    resp = Response(json.dumps(signing.key_set()), mimetype="application/jwk-set+json")
    # Short: a verifier that meets a kid it lacks refetches, and a key past its grace must
    # leave caches soon. The set does not depend on the Host (unlike the cards' URLs).
    resp.headers["Cache-Control"] = "public, max-age=60"
    return resp


@bp.get("/a2a/agents/<handle>/.well-known/agent-card.json")
def agent_card(handle: str) -> Response:
    """Return one agent's A2A card; 404 when no such (enabled) agent."""
    agent = peer_for(handle)
    if agent is None:
        from relay.transport.rest import error_response

        return error_response(404, "recipient_not_found", f"no agent {handle[:320]}")
    org = agent.handle.split("@", 1)[1]
    return _card(
        shapes.agent_card(
            {"handle": agent.handle, "name": agent.name, "role": agent.role, "org": org}, base_url(), relay_version()
        ),
        agent.created_at,
    )


def lookup_peer(handle: str) -> Agent | None:
    """The agent a binding's request talks to (disabled ones too), or None for no such agent.

    A disabled agent takes no new tasks (SendMessage answers recipient_not_found, from the
    service), but its senders still read and cancel the tasks they gave it. Raises
    service_unavailable when the database cannot be reached (rolled back first).
    """
    try:
        return peer_for(handle, disabled_ok=True)
    except DATABASE_ERRORS as exc:
        if not is_connection_error(exc):
            raise
        raise errors.unexpected(exc) from None


def json_content_type() -> bool:
    """True when the request's ``Content-Type`` is JSON (``application/json``, ``application/*+json``)
    or absent; anything else is a body this binding does not read."""
    mimetype = request.mimetype
    return (
        not mimetype
        or mimetype == "application/json"
        or (mimetype.startswith("application/") and mimetype.endswith("+json"))
    )


def content_type_refused() -> RelayError:
    """The content_type_not_supported error for a body that is not declared as JSON."""
    got = (request.content_type or "")[:100]
    return RelayError(
        "content_type_not_supported",
        f"the body must be application/json, got Content-Type {got!r}",
        {"contentType": got},
    )


# The kit's and other clients post to the URL with a trailing slash: both are the endpoint.
@bp.post("/a2a/agents/<handle>", strict_slashes=False)
def agent_rpc(handle: str) -> Response:
    """Serve A2A v1.0 JSON-RPC for one agent as recipient; the caller's key is the sender.

    A body declared as anything but JSON is ContentTypeNotSupportedError (-32005).
    """
    try:
        peer = lookup_peer(handle)
    except RelayError as unavailable:
        # An outage, answered as this endpoint answers everything (a JSON-RPC error), not
        # in the REST shape of the app's catch-all.
        return jsonrpc.relay_error_response(ERRORS_ONLY, unavailable, unavailable.http_status)
    if peer is None:
        return jsonrpc.relay_error_response(
            ERRORS_ONLY, RelayError("recipient_not_found", f"no agent {handle[:320]}", {"recipient": handle[:320]}), 404
        )
    if not json_content_type():
        return jsonrpc.relay_error_response(ERRORS_ONLY, content_type_refused(), 200)
    return jsonrpc.serve(dialect_for(peer), guard=check_version)
