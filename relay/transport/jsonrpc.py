"""JSON-RPC 2.0 transport: envelope, batches, notifications and a dispatch table per dialect.

The envelope rules are JSON-RPC 2.0's; the HTTP statuses and error symbols are the
relay's (docs/api.md, "JSON-RPC: `POST /a2a`" and "Errors"). A dialect is a table of methods plus a way to shape
errors, so a second dialect (A2A v1.0) is a new table, not a change to these methods.

A streaming method (A2A's SendStreamingMessage, SubscribeToTask) answers a
:class:`Streamed`: an error raised before it is returned is an ordinary JSON-RPC error
response; after, the answer is Server-Sent Events, each ``data:`` one JSON-RPC response
with the request's id (``event: error`` for the last one when it is an error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from flask import Blueprint, Response, current_app, g, stream_with_context
from marshmallow import Schema

from relay.encoding import dumps_bytes
from relay.errors import RelayError
from relay.models import Agent
from relay.schemas.common import NotJson, load_or_invalid, strict_json
from relay.schemas.handoffs import (
    MessageSendParams,
    TaskGetParams,
    TaskRef,
    TasksListParams,
    TasksUpdateParams,
    transition_args,
)
from relay.services import threads
from relay.transport import errors
from relay.transport.auth import current_agent, retry_after_seconds
from relay.transport.observability import RPC_CALLS
from relay.transport.requests import BodyTooLarge, read_body

log = logging.getLogger("relay.transport.jsonrpc")

MESSAGES = {
    -32700: "Parse error",
    -32600: "Invalid Request",
    -32601: "Method not found",
    -32602: "Invalid params",
    -32603: "Internal error",
}
MAX_BATCH = 100
_MISSING = object()


def _internal_message(failure: RelayError) -> str:
    """A -32603's message: an outage says which server and to retry; a bug says no more than JSON-RPC's text."""
    return failure.message if failure.symbol == "service_unavailable" else MESSAGES[-32603]


@dataclass(frozen=True)
class Method:
    """One JSON-RPC method: a marshmallow load schema and a handler calling a service.

    A ``streaming`` method's handler returns a :class:`Streamed`; it is served only as
    a request of its own (not in a batch).
    """

    schema: Schema
    handler: Callable[[Agent, dict], Any]
    streaming: bool = False


@dataclass
class Streamed:
    """A streaming method's answer, sent as ``text/event-stream``.

    ``events`` yields, in order: a result (one JSON-RPC response each), ``None`` (a
    heartbeat: an SSE comment) or a RelayError (an error response; the stream ends
    there). ``close`` runs once the response is over, however it ended.
    """

    events: Iterator[Any]
    close: Callable[[], None]


@dataclass
class Dialect:
    """A table of methods and the shape of their errors.

    Every error is first built as ``POST /a2a`` (the relay's JSON-RPC dialect) builds it: a code
    and a ``data`` object holding the relay's ``symbol``. ``code_for(symbol, code)`` and
    ``shape_data(code, data)`` let a dialect answer with its own codes and ``data`` shape
    (A2A v1.0: relay/transport/a2a.py).
    """

    methods: dict[str, Method]
    code_for: Callable[[str, int], int] = field(default=lambda symbol, code: code)
    shape_data: Callable[[int, dict], Any] = field(default=lambda code, data: data)


def error_data(exc: RelayError) -> dict:
    """The ``POST /a2a`` dialect's ``error.data`` for a relay error: its symbol, then field errors or details.

    Field errors are capped (relay/errors.py): ``errors`` holds the first MAX_FIELD_ERRORS
    and ``errors_omitted``, present only when some were left out, counts the rest.
    """
    data: dict[str, Any] = {"symbol": exc.symbol}
    if exc.symbol == "invalid_params" and exc.details is not None:
        data["errors"] = exc.details
        if getattr(exc, "omitted", 0):
            data["errors_omitted"] = exc.omitted
    elif exc.details is not None:
        data["details"] = exc.details
    return data


SEED_DIALECT = Dialect(
    methods={
        "message/send": Method(MessageSendParams(), lambda caller, p: threads.send_message(caller, p)),
        "tasks/get": Method(
            TaskGetParams(),
            lambda caller, p: threads.get_thread(
                caller, p["task_id"], messages_limit=p["messages_limit"], messages_after=p["messages_after"]
            ),
        ),
        "tasks/list": Method(
            TasksListParams(),
            lambda caller, p: threads.list_threads(
                caller,
                role=p["filter"]["role"],
                status=p["filter"]["status"],
                since=p["filter"]["since"],
                priority=p["filter"]["priority"],
                limit=p["page"]["limit"],
                cursor=p["page"]["cursor"],
            ),
        ),
        "tasks/update": Method(
            TasksUpdateParams(),
            lambda caller, p: threads.transition(caller, p["task_id"], **transition_args(p)),
        ),
        "tasks/cancel": Method(TaskRef(), lambda caller, p: threads.transition(caller, p["task_id"], "cancel")),
    }
)


def _error(dialect: Dialect, id_: Any, code: int, message: str, data: dict) -> dict:
    """A JSON-RPC error response: ``dialect``'s code for ``data["symbol"]`` (else ``code``) and its ``data`` shape."""
    code = dialect.code_for(data["symbol"], code)
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "error": {"code": code, "message": message, "data": dialect.shape_data(code, data)},
    }


def relay_error_response(dialect: Dialect, exc: RelayError, status: int) -> Response:
    """A whole HTTP answer holding one error, with the request's id when it can be read."""
    try:
        doc = parse_body()
    except BodyTooLarge:
        doc = None
    return _response(_relay_error(dialect, _readable_id(doc), exc), status=status)


error_object = _error  # for the answers built outside a method (relay/transport/errors.py)


def _relay_error(dialect: Dialect, id_: Any, exc: RelayError) -> dict:
    return _error(dialect, id_, exc.code, exc.message, error_data(exc))


def _response(payload: Any, status: int = 200, headers: dict | None = None) -> Response:
    resp = Response(dumps_bytes(payload), status=status, mimetype="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def parse_body() -> Any:
    """Return the decoded JSON document, or _MISSING when the body is not valid JSON."""
    cached = g.get("_rpc_doc", _MISSING)
    if cached is not _MISSING:
        return cached
    try:
        doc = strict_json(read_body())
    except NotJson as exc:
        doc = _MISSING
        g._rpc_parse_error = str(exc) or "not a JSON document"
    g._rpc_doc = doc
    return doc


def max_batch() -> int:
    """Largest batch accepted: MAX_BATCH, and never more than one rate-limit window allows.

    A batch bigger than the whole budget could never succeed, so it is refused as an
    invalid request instead of answering 429 forever.
    """
    from limits import parse

    return min(MAX_BATCH, parse(current_app.config["RELAY"].rate_limit).amount)


def batch_cost() -> int:
    """Rate-limit cost of this request: one per batch element (docs/api.md, "Conventions")."""
    try:
        doc = parse_body()
    except BodyTooLarge:
        return 1
    if isinstance(doc, list) and 0 < len(doc) <= max_batch():
        return len(doc)
    return 1  # a refused batch (empty or too large) costs one request


def _readable_id(doc: Any) -> Any:
    if isinstance(doc, dict):
        id_ = doc.get("id")
        if id_ is None or (isinstance(id_, (str, int, float)) and not isinstance(id_, bool)):
            return id_
    return None


def _call(dialect: Dialect, caller: Agent, obj: Any, *, alone: bool = False) -> dict | None:
    """Answer one request object; None for a notification. ``alone``: not in a batch (a
    streaming method may then answer with a :class:`Streamed` result)."""
    if not isinstance(obj, dict):
        return _error(
            dialect,
            None,
            -32600,
            MESSAGES[-32600],
            {"symbol": "invalid_request", "reason": "a request must be an object"},
        )
    has_id = "id" in obj
    id_ = obj.get("id")
    if has_id and not (id_ is None or (isinstance(id_, (str, int, float)) and not isinstance(id_, bool))):
        return _error(
            dialect,
            None,
            -32600,
            MESSAGES[-32600],
            {"symbol": "invalid_request", "reason": "id must be a string, a number or null"},
        )
    if obj.get("jsonrpc") != "2.0":
        return _error(
            dialect,
            id_,
            -32600,
            MESSAGES[-32600],
            {"symbol": "invalid_request", "reason": 'jsonrpc must be exactly "2.0"'},
        )
    name = obj.get("method")
    if not isinstance(name, str):
        return _error(
            dialect, id_, -32600, MESSAGES[-32600], {"symbol": "invalid_request", "reason": "method must be a string"}
        )
    params = obj.get("params", {})
    if params is not None and not isinstance(params, (dict, list)):
        return _error(
            dialect,
            id_,
            -32600,
            MESSAGES[-32600],
            {"symbol": "invalid_request", "reason": "params must be an object or an array"},
        )
    method = dialect.methods.get(name)
    if method is None:
        answer = _error(dialect, id_, -32601, MESSAGES[-32601], {"symbol": "method_not_found", "method": name[:200]})
        return answer if has_id else None
    if method.streaming and not alone:
        answer = _error(
            dialect,
            id_,
            -32600,
            MESSAGES[-32600],
            {"symbol": "invalid_request", "reason": f"{name} answers with a stream: send it alone, not in a batch"},
        )
        return _count(name, answer, has_id)
    try:
        if isinstance(params, list):
            raise RelayError(
                "invalid_params",
                "params must be an object of named parameters",
                {"params": ["must be an object, not an array"]},
            )
        loaded = load_or_invalid(method.schema, params or {})
        result = method.handler(caller, loaded)
        if isinstance(result, Streamed) and not has_id:
            result.close()  # a notification: the call was made, nobody reads its stream
        answer = {"jsonrpc": "2.0", "id": id_, "result": result}
    except RelayError as exc:
        answer = _relay_error(dialect, id_, exc)
    except Exception as exc:
        failure = errors.unexpected(exc)
        answer = _error(dialect, id_, -32603, _internal_message(failure), {"symbol": failure.symbol, **failure.details})
    return _count(name, answer, has_id)


def _count(name: str, answer: dict, has_id: bool) -> dict | None:
    outcome = "ok" if "result" in answer else _symbol(answer["error"].get("data"))
    RPC_CALLS.labels(name, outcome).inc()
    g.setdefault("rpc_methods", []).append(name)
    return answer if has_id else None


def _symbol(data: Any) -> str:
    """The relay symbol inside an error's ``data``, whichever dialect shaped it."""
    if isinstance(data, dict):
        return data.get("symbol", "error")
    for item in data if isinstance(data, list) else ():
        if isinstance(item, dict) and isinstance(item.get("metadata"), dict) and "symbol" in item["metadata"]:
            return item["metadata"]["symbol"]
    return "error"


def serve(dialect: Dialect, guard: Callable[[], None] | None = None) -> Response:
    """Answer a JSON-RPC HTTP request with ``dialect``: auth, envelope, batch, dispatch.

    ``guard`` runs once the caller is known and the body parsed; a RelayError it raises
    is the answer to the whole request (A2A's ``A2A-Version`` check).
    """
    try:
        doc = parse_body()
    except BodyTooLarge:
        limit = current_app.config["RELAY"].max_body_bytes
        return _response(
            _error(
                dialect,
                None,
                -32600,
                f"request body is larger than {limit} bytes",
                {"symbol": "payload_too_large", "limit_bytes": limit},
            ),
            status=413,
        )
    try:
        caller = current_agent()
    except RelayError as exc:
        if exc.symbol == "service_unavailable":  # PostgreSQL unreachable while authenticating
            return _response(
                _error(
                    dialect,
                    _readable_id(doc),
                    -32603,
                    _internal_message(exc),
                    {"symbol": "service_unavailable", "request_id": g.get("request_id")},
                ),
                status=exc.http_status,
            )
        if exc.symbol == "rate_limited":  # this address spent its failed-authentication budget
            errors.retry_later(exc.details["retry_after"])
            return _response(_relay_error(dialect, _readable_id(doc), exc), status=429)
        return _response(_relay_error(dialect, _readable_id(doc), exc), status=401)
    if doc is _MISSING:
        return _response(
            _error(
                dialect,
                None,
                -32700,
                MESSAGES[-32700],
                {"symbol": "parse_error", "reason": g.get("_rpc_parse_error", "not a JSON document")},
            )
        )
    if guard is not None:
        try:
            guard()
        except RelayError as exc:
            return _response(_relay_error(dialect, _readable_id(doc), exc))
    if isinstance(doc, list):
        if not doc:
            return _response(
                _error(dialect, None, -32600, MESSAGES[-32600], {"symbol": "invalid_request", "reason": "empty batch"})
            )
        if len(doc) > max_batch():
            return _response(
                _error(
                    dialect,
                    None,
                    -32600,
                    f"a batch may hold at most {max_batch()} requests, got {len(doc)}",
                    {"symbol": "batch_too_large", "limit": max_batch()},
                )
            )
        answers = [a for a in (_call(dialect, caller, item) for item in doc) if a is not None]
        if any(_unavailable(a) for a in answers):
            # One element lost the database: the whole batch is a 503 (with every answer
            # in the body), so a client retries it; docs/decisions.md, "Outage answers".
            return _response(answers, status=503)
        return _response(answers) if answers else _no_content()
    answer = _call(dialect, caller, doc, alone=True)
    if answer is not None and isinstance(answer.get("result"), Streamed):
        return _stream_response(dialect, answer["id"], answer["result"])
    if answer is not None and _unavailable(answer):
        # The database went away inside the method (or no pooled connection came free):
        # an HTTP 503 a client or proxy retries, not a 200 carrying the error.
        return _response(answer, status=503)
    return _response(answer) if answer is not None else _no_content()


def _unavailable(answer: dict) -> bool:
    """True if ``answer`` is a -32603 ``service_unavailable`` error (an outage, retryable)."""
    return "error" in answer and _symbol(answer["error"].get("data")) == "service_unavailable"


def _stream_response(dialect: Dialect, id_: Any, streamed: Streamed) -> Response:
    """The Server-Sent Events answer of a streaming method: one ``data:`` line per JSON-RPC response."""
    return sse_response(
        streamed,
        result=lambda item: {"jsonrpc": "2.0", "id": id_, "result": item},
        # As a2a-sdk's own server sends it: the SSE event "error", a JSON-RPC error response.
        error=lambda exc: _relay_error(dialect, id_, exc),
    )


def sse_response(streamed: Streamed, result: Callable[[Any], Any], error: Callable[[RelayError], Any]) -> Response:
    """A :class:`Streamed` answered as ``text/event-stream``, framed by the binding.

    ``result(item)`` is the JSON document of one ``data:`` event; ``error(exc)`` that of the
    last one, sent as ``event: error``, when the stream yields a RelayError or fails
    mid-way (then a ``service_unavailable`` or ``internal_error`` RelayError carrying the
    request id: the 200 is already sent, so the client hears an error event, not a cut
    connection). A heartbeat (``None``) is the comment ``: heartbeat``. ``streamed.close``
    runs once, however the response ended (also when its body never started).
    """

    def body() -> Iterator[bytes]:
        try:
            for item in streamed.events:
                if item is None:
                    yield b": heartbeat\n\n"
                elif isinstance(item, RelayError):
                    yield b"event: error\ndata: " + dumps_bytes(error(item)) + b"\n\n"
                    return
                else:
                    # One line: orjson escapes newlines inside strings, so no data line breaks.
                    yield b"data: " + dumps_bytes(result(item)) + b"\n\n"
        except Exception as exc:
            # The 200 is already sent: the client hears an error event, not a cut connection.
            unexpected = errors.unexpected(exc)
            failure = RelayError(unexpected.symbol, _internal_message(unexpected), unexpected.details)
            yield b"event: error\ndata: " + dumps_bytes(error(failure)) + b"\n\n"
        finally:
            streamed.close()

    response = Response(
        stream_with_context(body()),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    # Also when the body never started (the client left first): the stream's slot and waiter go back.
    response.call_on_close(streamed.close)
    return response


def _no_content() -> Response:
    resp = Response(status=204)
    del resp.headers["Content-Type"]  # no body, so no type (Flask would say text/html)
    return resp


def rate_limited(limit, dialect: Dialect = SEED_DIALECT) -> Response:
    """429 with -32003 and a whole-second Retry-After (docs/api.md, "JSON-RPC: `POST /a2a`")."""
    retry = errors.retry_later(retry_after_seconds(limit))
    try:
        doc = parse_body()
    except BodyTooLarge:
        doc = None
    return _response(
        _error(
            dialect,
            _readable_id(doc),
            -32003,
            f"rate limit exceeded: {limit.limit}; retry in {retry} s",
            {"symbol": "rate_limited", "retry_after": retry},
        ),
        status=429,
    )


bp = Blueprint("a2a", __name__)


@bp.post("/a2a")
def a2a() -> Response:
    """The relay's JSON-RPC dialect (``POST /a2a``, docs/api.md).

    Its methods: message/send, tasks/get, tasks/list, tasks/update, tasks/cancel.
    """
    return serve(SEED_DIALECT)
