"""A2A v1.0 HTTP+JSON binding (spec §11) under ``/a2a/agents/{handle}/http``, beside the JSON-RPC one.

The same agent as ``POST /a2a/agents/{handle}`` (relay/transport/a2a.py), reached by
REST paths instead of a JSON-RPC envelope: every path is turned into the ``req`` dict
that binding's METHODS handler takes (path parameters, then the query string or the
JSON body), loaded by the same schema and run by the same handler, so the params, the
field names in errors, the participant rules, idempotency and the streams are the
JSON-RPC binding's own. Auth (bearer key), the ``A2A-Version`` check and the rate-limit
budget (scope ``a2a``, shared with both JSON-RPC dialects) are the same too.

=========================================================  =================================
path under ``{base}/a2a/agents/{handle}/http``             A2A method
=========================================================  =================================
``POST /message:send``                                     SendMessage
``POST /message:stream``                                   SendStreamingMessage (SSE)
``GET /tasks/{id}``                                        GetTask (``?historyLength=``)
``GET /tasks``                                             ListTasks (query parameters)
``POST /tasks/{id}:cancel``                                CancelTask
``POST|GET /tasks/{id}:subscribe``                         SubscribeToTask (SSE)
``POST /tasks/{id}/pushNotificationConfigs``               CreateTaskPushNotificationConfig
``GET /tasks/{id}/pushNotificationConfigs``                ListTaskPushNotificationConfigs
``GET /tasks/{id}/pushNotificationConfigs/{configId}``     GetTaskPushNotificationConfig
``DELETE /tasks/{id}/pushNotificationConfigs/{configId}``  DeleteTaskPushNotificationConfig
``GET /extendedAgentCard``                                 GetExtendedAgentCard
=========================================================  =================================

Answers are the A2A objects themselves as ``application/json`` (spec §11.1), errors too; a stream's
``data:`` lines are bare ``StreamResponse`` objects. An error is a ``google.rpc.Status``
body, ``{"error": {"code": <HTTP status>, "status": <gRPC name>, "message", "details":
[ErrorInfo, BadRequest?]}}``, whose details are the JSON-RPC binding's ``error.data`` (the
A2A reason, ``metadata.symbol``, field violations by A2A path), with the spec's HTTP
status (§5.4) for A2A errors and the relay's own (401, 403, 409, 429, ...) for the rest.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Response, current_app, g, request
from marshmallow import Schema, fields
from werkzeug.exceptions import HTTPException

from relay.encoding import dumps_bytes
from relay.errors import RelayError
from relay.models import Agent
from relay.schemas.a2a import camel_name
from relay.schemas.common import BoundedList, NotJson, StrictBool, load_or_invalid, strict_json
from relay.transport import a2a, errors, jsonrpc
from relay.transport.auth import current_agent, retry_after_seconds
from relay.transport.jsonrpc import Streamed
from relay.transport.observability import RPC_CALLS
from relay.transport.requests import BodyTooLarge, read_body

log = logging.getLogger("relay.transport.a2a_http")

MEDIA_TYPE = "application/json"  # spec §11.1: "application/json for requests and responses"
BASE = "/a2a/agents/<handle>/http"

# A2A JSON-RPC code -> (HTTP status, google.rpc.Code name), spec §5.4 and the SDK's own table.
# -32600 (InvalidRequest: what A2A has no code for) is absent: those answer the relay's own
# HTTP status for the symbol (relay/errors.py), named by _GRPC_STATUS.
A2A_STATUS: dict[int, tuple[int, str]] = {
    -32001: (404, "NOT_FOUND"),
    -32002: (400, "FAILED_PRECONDITION"),
    -32004: (400, "FAILED_PRECONDITION"),
    -32005: (415, "INVALID_ARGUMENT"),
    -32009: (400, "FAILED_PRECONDITION"),
    -32602: (400, "INVALID_ARGUMENT"),
    -32700: (400, "INVALID_ARGUMENT"),
    -32601: (404, "NOT_FOUND"),
    -32603: (500, "INTERNAL"),
}
# HTTP status -> google.rpc.Code name (google/rpc/code.proto's HTTP mapping).
_GRPC_STATUS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    414: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}
# Symbols whose status is fixed whatever their A2A code (an outage is -32603, but a 503).
_SYMBOL_STATUS: dict[str, int] = {"service_unavailable": 503}


def status_for(exc: RelayError) -> int:
    """The HTTP status of a relay error in this binding (see A2A_STATUS)."""
    if exc.symbol in _SYMBOL_STATUS:
        return _SYMBOL_STATUS[exc.symbol]
    code = a2a.ERRORS_ONLY.code_for(exc.symbol, exc.code)
    return A2A_STATUS[code][0] if code in A2A_STATUS else exc.http_status


def status_body(exc: RelayError, status: int) -> dict:
    """``{"error": {code, status, message, details}}``: google.rpc.Status as spec §11.6 shapes it.

    ``details`` is what the JSON-RPC binding puts in ``error.data``: an ErrorInfo (A2A
    reason, domain, ``metadata.symbol`` and the error's details as strings), then for
    invalid params a BadRequest naming each field.
    """
    code = a2a.ERRORS_ONLY.code_for(exc.symbol, exc.code)
    grpc = A2A_STATUS[code][1] if code in A2A_STATUS and status == A2A_STATUS[code][0] else None
    return {
        "error": {
            "code": status,
            "status": grpc or _GRPC_STATUS.get(status, "UNKNOWN"),
            "message": exc.message,
            "details": a2a.ERRORS_ONLY.shape_data(code, jsonrpc.error_data(exc)),
        }
    }


def _json(doc: Any, status: int = 200, headers: dict | None = None) -> Response:
    resp = Response(dumps_bytes(doc), status=status, mimetype=MEDIA_TYPE)
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def error_response(exc: RelayError, status: int | None = None, headers: dict | None = None) -> Response:
    """A relay error as this binding's HTTP answer: its status, a google.rpc.Status body as
    ``application/json`` (the AIP-193 shape spec §11.6 requires).

    401 carries ``WWW-Authenticate: Bearer``; a ``rate_limited`` error with
    ``details.retry_after`` (seconds) carries ``Retry-After`` (relay/transport/errors.py adds both).
    """
    status = status or status_for(exc)
    if exc.symbol == "rate_limited" and isinstance(exc.details, dict) and "retry_after" in exc.details:
        errors.retry_later(exc.details["retry_after"])
    return _json(status_body(exc, status), status, headers)


def rate_limited(limit) -> Response:
    """429 with a whole-second Retry-After, shaped as this binding's error (the ``a2a`` budget's breach)."""
    retry = retry_after_seconds(limit)
    return error_response(
        RelayError("rate_limited", f"rate limit exceeded: {limit.limit}; retry in {retry} s", {"retry_after": retry}),
        429,
    )


# --------------------------------------------------------------------------- routes


@dataclass(frozen=True)
class Route:
    """One path of the binding: its pattern (named groups are path parameters, by their A2A
    field names), and per HTTP verb the A2A method and where its other params come from
    (``"query"`` or ``"body"``; ``None``: path parameters only)."""

    pattern: re.Pattern[str]
    verbs: dict[str, tuple[str, str | None]]


_ID = r"[^/:]+"
ROUTES: tuple[Route, ...] = (
    Route(re.compile(r"message:send"), {"POST": ("SendMessage", "body")}),
    Route(re.compile(r"message:stream"), {"POST": ("SendStreamingMessage", "body")}),
    Route(re.compile(r"tasks"), {"GET": ("ListTasks", "query")}),
    Route(re.compile(rf"tasks/(?P<id>{_ID})"), {"GET": ("GetTask", "query")}),
    Route(re.compile(rf"tasks/(?P<id>{_ID}):cancel"), {"POST": ("CancelTask", "body")}),
    # GET too, as a2a-sdk's server allows: an EventSource can only GET.
    Route(
        re.compile(rf"tasks/(?P<id>{_ID}):subscribe"),
        {"POST": ("SubscribeToTask", None), "GET": ("SubscribeToTask", None)},
    ),
    Route(
        re.compile(rf"tasks/(?P<taskId>{_ID})/pushNotificationConfigs"),
        {"POST": ("CreateTaskPushNotificationConfig", "body"), "GET": ("ListTaskPushNotificationConfigs", "query")},
    ),
    Route(
        re.compile(rf"tasks/(?P<taskId>{_ID})/pushNotificationConfigs/(?P<id>{_ID})"),
        {"GET": ("GetTaskPushNotificationConfig", None), "DELETE": ("DeleteTaskPushNotificationConfig", None)},
    ),
    Route(re.compile(r"extendedAgentCard"), {"GET": ("GetExtendedAgentCard", None)}),
)
_VERBS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def match(path: str) -> tuple[Route, dict[str, str]] | None:
    """The route ``path`` (below the base, no leading slash) names and its path parameters, or None."""
    for route in ROUTES:
        found = route.pattern.fullmatch(path)
        if found:
            return route, found.groupdict()
    return None


def _query_value(schema: Schema, name: str, raw: list[str]) -> Any:
    """A query parameter as the JSON value its schema field loads (spec §11.5): decimal
    integers and ``true``/``false`` converted; anything else left a string, for the schema
    to refuse naming the field. A repeated scalar keeps its last value, as a2a-sdk's server does."""
    field = schema.fields.get(name) or schema.fields.get(camel_name(name))
    if isinstance(field, (fields.List, BoundedList)):
        return [item for value in raw for item in value.split(",") if item]
    value = raw[-1]
    if isinstance(field, fields.Integer) and re.fullmatch(r"-?[0-9]{1,18}", value):
        return int(value)
    if isinstance(field, (fields.Boolean, StrictBool)) and value in ("true", "false"):
        return value == "true"
    return value


def _query(schema: Schema) -> dict[str, Any]:
    # Every parameter, in either proto3 spelling: the schema refuses one it does not know, naming it.
    return {name: _query_value(schema, name, request.args.getlist(name)) for name in request.args}


def _body() -> dict[str, Any]:
    """The JSON body as an object; an empty body is ``{}``. Raises parse_error, invalid_request
    (not an object) or, from read_body, BodyTooLarge."""
    raw = read_body()
    if not raw.strip():  # a cancel or a subscribe sent with no body: nothing but the path
        return {}
    try:
        doc = strict_json(raw)
    except NotJson as exc:
        reason = str(exc) or "not a JSON document"
        raise RelayError("parse_error", f"the body is not JSON: {reason}", {"reason": reason}) from None
    if not isinstance(doc, dict):
        raise RelayError("invalid_request", "the body must be a JSON object", {"reason": "not an object"})
    return doc


def params_for(source: str | None, path_params: dict[str, str], schema: Schema) -> dict[str, Any]:
    """The ``req`` dict of ``method``: the query string or body, with the path parameters over it
    (the path names the resource; a body's ``id``/``taskId`` does not move it)."""
    if source == "query":
        params = _query(schema)
    elif source == "body":
        params = _body()
    else:
        params = {}
    named = set(path_params)
    return {**{k: v for k, v in params.items() if camel_name(k) not in named}, **path_params}


def _peer_or_error(handle: str) -> Agent | Response:
    try:
        peer = a2a.lookup_peer(handle)
    except RelayError as unavailable:
        return error_response(unavailable)
    if peer is None:
        return error_response(
            RelayError("recipient_not_found", f"no agent {handle[:320]}", {"recipient": handle[:320]}), 404
        )
    return peer


def _not_found(path: str) -> Response:
    return error_response(
        RelayError("method_not_found", f"no A2A HTTP+JSON operation at /{path[:200]}", {"path": "/" + path[:200]})
    )


def _call(name: str, run: Callable[[], Any]) -> Any:
    """Run a method, counting it as JSON-RPC calls are (``relay_rpc_calls_total``, the log line)."""
    outcome = "ok"
    try:
        return run()
    except RelayError as exc:
        outcome = exc.symbol
        raise
    except Exception:
        outcome = "error"
        raise
    finally:
        RPC_CALLS.labels(name, outcome).inc()
        g.setdefault("rpc_methods", []).append(name)


def _internal(exc: Exception, name: str) -> Response:
    failure = errors.unexpected(exc)
    return error_response(RelayError(failure.symbol, "Internal error", failure.details))


def _stream(streamed: Streamed) -> Response:
    # Each data line is the StreamResponse itself, and the last error event a google.rpc.Status
    # body: what a2a-sdk's REST transport parses (its _handle_sse_error reads the ErrorInfo reason).
    return jsonrpc.sse_response(streamed, result=lambda item: item, error=lambda exc: status_body(exc, status_for(exc)))


bp = Blueprint("a2a_http", __name__)


@bp.route(BASE, defaults={"path": ""}, methods=_VERBS, provide_automatic_options=False)
@bp.route(f"{BASE}/", defaults={"path": ""}, methods=_VERBS, provide_automatic_options=False)
@bp.route(f"{BASE}/<path:path>", methods=_VERBS, provide_automatic_options=False)
def serve(handle: str, path: str) -> Response:
    """Serve one A2A HTTP+JSON operation for ``handle`` as recipient; the caller's key is the sender.

    In order: the path and verb (404, 405 with ``Allow``), the agent (404), the key (401;
    429 past the address's failure budget; 503 without the database), ``A2A-Version``
    (400 VERSION_NOT_SUPPORTED), then the method's params and handler, whose errors are
    the JSON-RPC binding's with this binding's statuses. Never a 500 for bad input.
    """
    # A trailing slash names the same operation (clients join base URL and path with one).
    found = match(path[:-1] if path.endswith("/") else path)
    if found is None:
        return _not_found(path)
    route, path_params = found
    if request.method not in route.verbs:
        allow = ", ".join(route.verbs)
        return error_response(
            RelayError(
                "method_not_found",
                f"{request.method} is not allowed on /{path[:200]}; use {allow}",
                {"allow": allow},
            ),
            405,
            headers={"Allow": allow},
        )
    name, source = route.verbs[request.method]
    peer = _peer_or_error(handle)
    if isinstance(peer, Response):
        return peer
    try:
        caller = current_agent()
    except RelayError as exc:
        return error_response(exc, 401 if exc.symbol == "unauthenticated" else None)
    try:
        a2a.check_version()
    except RelayError as exc:
        return error_response(exc)
    if source == "body" and request.content_length and not a2a.json_content_type():
        return error_response(a2a.content_type_refused())
    schema_cls, handler = a2a.METHODS[name]
    schema = schema_cls()
    try:
        result = _call(
            name, lambda: handler(caller, peer, load_or_invalid(schema, params_for(source, path_params, schema)))
        )
    except BodyTooLarge:
        limit = _max_body()
        return error_response(
            RelayError("payload_too_large", f"request body is larger than {limit} bytes", {"limit_bytes": limit})
        )
    except RelayError as exc:
        return error_response(exc)
    except HTTPException:  # the body did not arrive in time (408): the app's answer
        raise
    except Exception as exc:
        return _internal(exc, name)
    if isinstance(result, Streamed):
        return _stream(result)
    return _json(result)


def _max_body() -> int:
    return current_app.config["RELAY"].max_body_bytes
