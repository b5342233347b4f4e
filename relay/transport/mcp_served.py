"""The MCP face behind ``/mcp`` (relay/transport/mcp.py routes here): the agent kit's MCP tools for remote MCP hosts.

MCP's streamable HTTP transport, stateless: every POST carries one JSON-RPC message and
gets one JSON answer (``application/json``, never an SSE stream); nothing is kept
between requests, so any web process answers any request, behind any pooler. Both eras
of the protocol the official SDK speaks are served: the ``initialize`` handshake
(2024-11-05 to 2025-11-25; a later request names its revision in ``MCP-Protocol-Version``,
2025-03-26 when absent) and 2026-07-28's per-request envelope (``params._meta``,
``server/discover``). Served: ``initialize``, ``ping``, ``server/discover``,
``tools/list``, ``tools/call``; a notification is acknowledged with 202; GET and
DELETE answer 405 (no server-initiated stream, no session to end).

Authentication is the agent's API key, ``Authorization: Bearer ah_live_...``: a missing
or bad key answers 401 with ``WWW-Authenticate: Bearer``. A request whose ``Origin``
is not the relay's own (``RELAY_PUBLIC_URL``'s; without it, a loopback origin only)
answers 403, against DNS rebinding; a request without ``Origin`` (not from a browser) is served.

The tools are the agent kit's table (``relay.agent.mcp``), run on a RelayClient whose
HTTP goes into this same app in-process (WSGI, no socket) with the caller's key: each
tool call is a call of the public API, with its authentication, rate limits, stream
slots and revocation. A long ``wait_for_messages`` is the feed's long-poll, which holds
no database connection while it sleeps, and ends with ``unauthenticated`` when the key
is revoked mid-wait. This view itself never touches the database. docs/agents.md has
the host setup; docs/decisions.md why the transport reaches the agent kit's table.
"""

from __future__ import annotations

import contextvars
import json
import logging
from typing import Any
from urllib.parse import urlsplit

import mcp_types as types
import requests
from flask import Response, current_app, request
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS, InboundLadderRejection, classify_inbound_request
from mcp_types import methods as mcp_methods
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from requests.structures import CaseInsensitiveDict
from werkzeug.test import EnvironBuilder, run_wsgi_app

from relay.agent.client import RelayClient, RelayError, Unauthenticated
from relay.agent.mcp import INSTRUCTIONS, TOOLS, UnknownTool, call_tool, server_version, tool_definitions
from relay.schemas.common import NotJson, strict_json
from relay.transport.requests import BodyTooLarge, read_body

log = logging.getLogger("relay.transport.mcp")

#: the revision a handshake-era request without MCP-Protocol-Version speaks (the transport spec's default)
DEFAULT_VERSION = "2025-03-26"
#: a tool call runs on an in-process client: its retries would only repeat the same in-process answer
_CLIENT_RETRIES = 0
_CHALLENGE = 'Bearer realm="relay", scope="agent"'
_SERVER_INFO = {"name": "relay", "version": server_version()}


# --------------------------------------------------------------------------- the in-process client


class _InProcess(requests.adapters.BaseAdapter):
    """A requests adapter that answers from a WSGI app in this process (werkzeug's test runner), no socket."""

    def __init__(self, app: Any, outer: dict[str, Any]):
        super().__init__()
        self.app = app
        self.overrides = {"REMOTE_ADDR": outer.get("REMOTE_ADDR") or "127.0.0.1"}
        # The MCP client's own connection: a feed wait inside peeks at it, and ends (its
        # stream slot freed) when the client has gone, as it does for a direct long-poll.
        if outer.get("gunicorn.socket") is not None:
            self.overrides["gunicorn.socket"] = outer["gunicorn.socket"]

    def send(self, prepared: requests.PreparedRequest, stream: bool = False, timeout: Any = None, **_: Any):
        url = urlsplit(prepared.url or "/")
        body = prepared.body.encode() if isinstance(prepared.body, str) else (prepared.body or b"")
        environ = EnvironBuilder(
            path=url.path,
            query_string=url.query,
            method=prepared.method or "GET",
            headers=list(prepared.headers.items()),
            data=body,
            base_url=f"{url.scheme}://{url.netloc}",
            environ_overrides=self.overrides,
        ).get_environ()
        # In an empty context: the inner request pushes its own app context (its own g and
        # database session) instead of joining the outer request's.
        content, status, headers = contextvars.Context().run(self._run, environ)
        response = requests.Response()
        code, _, reason = status.partition(" ")
        response.status_code, response.reason = int(code), reason
        response.headers = CaseInsensitiveDict(headers.to_wsgi_list())
        response._content = content
        response.encoding = requests.utils.get_encoding_from_headers(response.headers)
        response.url, response.request = prepared.url or "", prepared
        return response

    def _run(self, environ: dict[str, Any]) -> tuple[bytes, str, Any]:
        app_iter, status, headers = run_wsgi_app(self.app, environ, buffered=True)
        try:
            return b"".join(app_iter), status, headers
        finally:
            close = getattr(app_iter, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        pass


def _client(token: str) -> RelayClient:
    """A RelayClient with the caller's key whose calls go into this app in-process."""
    session = requests.Session()
    adapter = _InProcess(current_app._get_current_object(), request.environ)  # type: ignore[attr-defined]
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    base = request.host_url.rstrip("/")
    return RelayClient(base, token, session=session, max_retries=_CLIENT_RETRIES)


# --------------------------------------------------------------------------- answers


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status=status, mimetype="application/json", headers=headers)


def _error(message_id: Any, code: int, message: str, status: int, data: Any = None, **headers: str) -> Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _json({"jsonrpc": "2.0", "id": message_id, "error": error}, status, headers or None)


def _unauthorized(message: str) -> Response:
    return _error(None, INVALID_REQUEST, message, 401, **{"WWW-Authenticate": _CHALLENGE})


_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def _own_origin(origin: str) -> bool:
    """Whether ``origin`` (an Origin header) is the relay's own.

    With RELAY_PUBLIC_URL, its origin (scheme, host and port) only. Without it, only a
    loopback origin (a relay on this machine): the Host header cannot be trusted for this,
    since a DNS-rebinding page sends its own name as both Host and Origin.
    """
    public = current_app.config["RELAY"].public_url
    seen = urlsplit(origin)
    if public:
        mine = urlsplit(public)
        return (seen.scheme, seen.netloc.lower()) == (mine.scheme, mine.netloc.lower())
    return seen.scheme in ("http", "https") and (seen.hostname or "").lower() in _LOOPBACK


def _bearer() -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


# --------------------------------------------------------------------------- the routes


def not_served():
    """No server-initiated stream and no session: 405, POST only."""
    return _error(None, INVALID_REQUEST, "Method Not Allowed: this server answers POST only", 405, Allow="POST")


def post():
    """One JSON-RPC message in, one JSON answer out (or 202 for a notification)."""
    origin = request.headers.get("Origin")
    if origin is not None and not _own_origin(origin):
        return _error(
            None, INVALID_REQUEST, f"Forbidden: Origin {origin!r} is not this relay's (see RELAY_PUBLIC_URL)", 403
        )
    token = _bearer()
    if token is None:
        return _unauthorized("Unauthorized: send the agent's API key as Authorization: Bearer ah_live_...")
    client = _client(token)
    try:
        client.whoami()
    except Unauthenticated:
        return _unauthorized("Unauthorized: invalid API key")
    except RelayError as exc:
        status = exc.http_status if exc.http_status and exc.http_status >= 400 else 503
        return _error(None, INTERNAL_ERROR, f"{exc.symbol}: {exc.message}", status)
    if request.mimetype != "application/json":
        return _error(
            None,
            INVALID_REQUEST,
            "Unsupported Media Type: send the JSON-RPC message as Content-Type: application/json",
            415,
        )
    try:
        raw = read_body()
    except BodyTooLarge:
        return _error(None, INVALID_REQUEST, "the request body is too large", 413)
    try:
        message = strict_json(raw)
    except NotJson as exc:
        return _error(None, PARSE_ERROR, f"Parse error: {exc}", 400)
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _error(None, INVALID_REQUEST, "Invalid Request: one JSON-RPC 2.0 message per POST", 400)
    if "method" not in message or "id" not in message:
        accepted = Response(status=202)  # a notification or a response: nothing here acts on one
        del accepted.headers["Content-Type"]  # no body, so no media type
        return accepted
    try:
        return _request(client, message)
    finally:
        client.close()


def _request(client: RelayClient, message: dict[str, Any]) -> Response:
    message_id, method = message["id"], message.get("method")
    params = message.get("params")
    if not isinstance(method, str) or not (params is None or isinstance(params, dict)):
        return _error(message_id, INVALID_REQUEST, "Invalid Request: method must be a string, params an object", 400)
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and types.PROTOCOL_VERSION_META_KEY in meta:
        headers = {k.lower(): v for k, v in request.headers.items()}
        route = classify_inbound_request(message, headers=headers, supported_modern_versions=MODERN_PROTOCOL_VERSIONS)
        if isinstance(route, InboundLadderRejection):
            status = ERROR_CODE_HTTP_STATUS.get(route.code, 400)
            return _error(message_id, route.code, route.message, status, route.data)
        version = route.protocol_version
    elif method == "initialize":
        asked = params.get("protocolVersion") if params else None
        version = asked if asked in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
    else:
        version = request.headers.get("MCP-Protocol-Version") or DEFAULT_VERSION
        if version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return _error(
                message_id,
                INVALID_REQUEST,
                f"Bad Request: unsupported MCP-Protocol-Version {version!r}; "
                f"served: {', '.join(HANDSHAKE_PROTOCOL_VERSIONS + MODERN_PROTOCOL_VERSIONS)}",
                400,
            )
    try:
        parsed = mcp_methods.parse_client_request(method, version, params)
    except KeyError:
        return _error(message_id, METHOD_NOT_FOUND, f"Method not found: {method}", 404)
    except ValidationError as exc:
        return _error(message_id, INVALID_PARAMS, f"Invalid params: {exc.errors(include_url=False)[0]['msg']}", 400)
    try:
        result = _handle(client, parsed, version)
    except UnknownTool as exc:
        return _error(message_id, INVALID_PARAMS, f"Unknown tool: {exc}", 400)
    if result is None:
        return _error(message_id, METHOD_NOT_FOUND, f"Method not found: {method}", 404)
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    body = mcp_methods.serialize_server_result(method, version, dumped)
    if version in MODERN_PROTOCOL_VERSIONS:
        body["_meta"] = {**(body.get("_meta") or {}), types.SERVER_INFO_META_KEY: dict(_SERVER_INFO)}
    return _json({"jsonrpc": "2.0", "id": message_id, "result": body})


def _capabilities() -> types.ServerCapabilities:
    # Tools only: no resources, prompts, logging or list-changed notifications are served.
    return types.ServerCapabilities(tools=types.ToolsCapability(list_changed=False))


def _handle(client: RelayClient, parsed: Any, version: str) -> Any:
    """The result model for one parsed request, or None for a method not served here."""
    if isinstance(parsed, types.InitializeRequest):
        return types.InitializeResult(
            protocol_version=version,
            capabilities=_capabilities(),
            server_info=types.Implementation(**_SERVER_INFO),
            instructions=INSTRUCTIONS,
        )
    if isinstance(parsed, types.DiscoverRequest):
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS), capabilities=_capabilities(), instructions=INSTRUCTIONS
        )
    if isinstance(parsed, types.PingRequest):
        return types.EmptyResult(result_type="complete" if version in MODERN_PROTOCOL_VERSIONS else None)
    if isinstance(parsed, types.ListToolsRequest):
        return types.ListToolsResult(tools=tool_definitions(TOOLS))
    if isinstance(parsed, types.CallToolRequest):
        return call_tool(TOOLS, client, parsed.params.name, parsed.params.arguments)
    return None
