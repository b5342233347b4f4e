"""relay-mcp: the tool table served by one process for one agent, over stdio or streamable HTTP.

Configuration, from the environment only:

* ``RELAY_URL``: the relay's base URL (``https://relay.example.com``);
* ``RELAY_API_KEY``: the agent's key (``ah_live_...``, from ``relay agents create``).

Transports (the official MCP Python SDK's low-level ``Server``)::

    relay-mcp                                        # stdio (what an agent's mcpServers entry runs)
    relay-mcp --http [--host 127.0.0.1] [--port N]   # streamable HTTP at http://HOST:PORT/mcp

Without ``--port`` the HTTP transport takes a free port and prints its URL on stderr.
The HTTP transport has no authentication of its own: whoever reaches it acts as the
key's agent, so it listens on loopback unless ``--host`` says otherwise (the relay's own
``POST /mcp`` is the authenticated remote server). The process keeps two things between
calls: the lease tokens its accepts got, and wait_for_messages's position.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from relay.agent.client.errors import ConfigurationError, InvalidParams, RelayError
from relay.agent.client.feed import next_position
from relay.agent.client.models import FeedRow
from relay.agent.client.relay_client import RelayClient
from relay.agent.mcp.core import UnknownTool, call_tool, error_line, tool_definitions
from relay.agent.mcp.tools import BEGINNING, TOOLS, WAIT_SLICE, take_theirs

log = logging.getLogger("relay.mcp")

EXIT_CONFIG = 3

INSTRUCTIONS = """\
Tools for the handoff relay, where AI agents hand work to each other. You act as the agent whose \
API key this server holds. A handoff (thread, identified by task_id) is opened with send_handoff to \
another agent's handle (local@org); both sides add messages with reply. The recipient accepts a pending \
handoff (accept), does the work, then completes it with a result summary (complete); the sender may \
cancel it while it is still pending (cancel). The recipient may instead decline a pending handoff or, \
once accepted, fail it (both with a reason) or release it (back to pending). accept with lease_seconds \
leases the work: renew extends the lease, and past its end the handoff is pending again; relay-mcp remembers the lease \
token and sends it for you (over a relay's /mcp, pass the lease_token accept returned). States: pending -> accepted -> completed | failed | \
pending (release), pending -> cancelled | declined | expired; completed, cancelled, declined, failed and \
expired are final. list_inbox filters on priority (low, normal, high, urgent); send_handoff sets it. Check your inbox with list_inbox, read a whole thread with \
get_thread (its newest 50 messages; this marks them read; read_artifact has what it cut), find old messages with search_messages, and after a break fetch \
everything new with catch_up. To wait for the other side (a reply, a new handoff) without polling, call \
wait_for_messages. Errors come back as one line: "symbol: message (hint: ...)"."""


class _PerThreadClient:
    """``client``'s settings, one RelayClient (one requests.Session) per worker thread.

    A requests.Session is not thread-safe, and one lock around a shared client made a
    slow call (retries, a long catch_up) hold up every other tool call.
    """

    def __init__(self, template: RelayClient):
        self._template = template
        self._local = threading.local()

    def _client(self) -> RelayClient:
        client = getattr(self._local, "client", None)
        if client is None:
            t = self._template
            client = self._local.client = RelayClient(
                t.base_url,
                t.api_key,
                timeout=t.timeout,
                max_retries=t.max_retries,
                backoff=t.backoff,
                retry_refused=t.retry_refused,
                on_retry=t.on_retry,
                leases=t.leases,  # one memory of lease tokens for the process, whichever thread accepted
            )
        return client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client(), name)


class _CallClient:
    """The client one tool call runs on: the process's client plus this call's hold on the wait position."""

    def __init__(self, client: _PerThreadClient, position: _WaitPosition, take: _Take):
        self._client = client
        self.wait_position = _PositionForCall(position, take)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class _Take:
    """One wait_for_messages call's hold on the position: cancelled, or what it moved the position from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self.moved_from: tuple | None = None

    def cancel(self, position: _WaitPosition) -> None:
        """The client cancelled the call (``notifications/cancelled``): its messages were never delivered.

        The wait stops at its next slice; if it had already taken messages, the position
        goes back to before them, so the next call returns them (at least once, never lost).
        """
        with self.lock:
            self.cancelled = True
            if self.moved_from is not None:
                position.after, position.since, position.seen = self.moved_from


class _PositionForCall:
    def __init__(self, position: _WaitPosition, take: _Take):
        self.position, self.take = position, take

    def wait(self, client: Any, timeout: float) -> dict[str, Any]:
        return self.position.answer(client, timeout, self.take)


class _WaitPosition:
    """Where wait_for_messages goes on from, for the whole relay-mcp process (not saved anywhere).

    It starts at the newest message when the server starts (taken on a thread, so a slow
    or absent relay does not hold the server's start-up; failing that, at the first call),
    and moves past every message a call returns. One call waits at a time, so two calls
    never return the same message. A cancelled call moves it nowhere (:class:`_Take`).
    """

    def __init__(self, client: RelayClient):
        self.client = client
        self.lock = threading.Lock()
        self.after: str | None = None  # the last message taken
        self.since, self.seen = BEGINNING, []  # its time and the ids at that time, should it be gone
        self._started = threading.Event()
        self._starter = threading.Thread(target=self._start, name="relay-mcp-wait-position", daemon=True)
        self._starter.start()

    def _start(self) -> None:
        try:
            self._take()
        except RelayError as exc:  # the first call takes it instead
            log.warning("relay-mcp: wait_for_messages starts at its first call: %s", error_line(exc))
        except Exception:
            log.warning("relay-mcp: wait_for_messages starts at its first call", exc_info=True)

    def _take(self) -> None:
        if self._started.is_set():
            return
        with RelayClient(
            self.client.base_url, self.client.api_key, timeout=self.client.timeout, max_retries=1
        ) as reader:
            newest = next(iter(reader.messages(limit=1)), None)
        if newest is not None:
            self.after = newest.id
            self.since, self.seen = next_position([newest], BEGINNING)
        self._started.set()

    def answer(self, client: Any, timeout: float, take: _Take) -> dict[str, Any]:
        """wait_for_messages's answer from this position: {messages, count, timed_out, next_after}."""
        shown, theirs, timed_out = self.wait(client, timeout, take)
        return {"messages": shown, "count": len(theirs), "timed_out": timed_out, "next_after": self.after}

    def wait(self, client: Any, timeout: float, take: _Take | None = None) -> tuple[list[dict], list[FeedRow], bool]:
        """The other side's next messages (as shown, and the rows) and whether the time ran out first.

        With ``take``, the wait ends within WAIT_SLICE seconds of ``take.cancel`` and moves
        the position only while ``take`` is not cancelled. The position moves only past the
        messages one answer holds: the rest come with the next call.
        """
        take = take or _Take()
        deadline = time.monotonic() + timeout
        if not self.lock.acquire(timeout=timeout):
            return [], [], True
        try:
            self._starter.join(timeout=max(0.0, deadline - time.monotonic()))
            if self._starter.is_alive():
                return [], [], True
            self._take()  # if the start-up read failed: the position is "now" (raises if the relay is away)
            me = client.handle
            while True:
                if take.cancelled:
                    return [], [], True
                remaining = max(0.0, deadline - time.monotonic())
                where = {"after": self.after} if self.after else {"since": self.since, "seen": self.seen}
                try:
                    rows = client.wait(**where, timeout=min(remaining, WAIT_SLICE))
                except InvalidParams as exc:
                    if not (self.after and isinstance(exc.data, dict) and "after" in exc.data):
                        raise
                    self.after = None  # that message is gone (its agent deleted): go on from its time
                    continue
                consumed, theirs, shown = take_theirs(rows, me)
                if consumed:
                    with take.lock:
                        if take.cancelled:
                            return [], [], True  # nobody will read them: the position stays before them
                        if take.moved_from is None:
                            take.moved_from = (self.after, self.since, self.seen)
                        self.after = consumed[-1].id
                        self.since, self.seen = next_position(consumed, self.since, self.seen)
                if theirs:
                    return shown, theirs, False
                if time.monotonic() >= deadline:
                    return [], [], True
        finally:
            self.lock.release()


def build_server(client: RelayClient) -> Server:
    """A low-level MCP Server whose tools (the table in ``tools.py``) call ``client`` (one for the process).

    ``RelayClient`` is synchronous and its ``requests.Session`` is not thread-safe, so
    every call runs on a worker thread (``anyio.to_thread.run_sync``, keeping the event
    loop free for other sessions) with that thread's own client (_PerThreadClient).
    """
    position = _WaitPosition(client)
    shared = _PerThreadClient(client)
    definitions = tool_definitions(TOOLS)

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions)

    async def call(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        take = _Take()
        on = _CallClient(shared, position, take)
        try:
            # Abandoned on cancel: the handler ends at once; a wait stops at its next slice.
            return await anyio.to_thread.run_sync(
                lambda: call_tool(TOOLS, on, params.name, params.arguments), abandon_on_cancel=True
            )
        except UnknownTool as exc:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {exc}") from None
        except anyio.get_cancelled_exc_class():
            take.cancel(position)  # notifications/cancelled: whatever it took was never answered
            raise

    return Server(
        "relay",
        version=server_version(),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call,
    )


# =========================================================================== entry point


def server_version() -> str:
    """This package's version (``0`` when running from a checkout that is not installed)."""
    try:
        from importlib.metadata import version

        return version("handoff-relay")
    except Exception:  # not installed as a distribution (running from a checkout)
        return "0"


def _fatal(message: str) -> None:
    print(f"relay-mcp: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CONFIG)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="relay-mcp",
        description="The handoff relay as MCP tools. Reads RELAY_URL and RELAY_API_KEY from the environment; "
        "serves over stdio unless --http is given.",
    )
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP (at /mcp) instead of stdio")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on with --http (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on with --http (default: a free one, printed on stderr)"
    )
    return parser.parse_args(argv)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve_http(server: Server, host: str, port: int) -> None:
    """Streamable HTTP at ``/mcp`` on ``host:port`` (0: a free port), its URL printed on stderr once bound."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # connections queue from now on, before the server's loop takes them
    except OSError as exc:
        sock.close()
        _fatal(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"relay-mcp: serving MCP at http://{shown}:{bound}/mcp", file=sys.stderr, flush=True)
    app = server.streamable_http_app(streamable_http_path="/mcp", host=host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    """``relay-mcp [--http [--host H] [--port P]]``: exit 3 with one line on stderr if configuration is missing."""
    args = _parse_args(argv)
    url = os.environ.get("RELAY_URL", "").strip()
    key = os.environ.get("RELAY_API_KEY", "").strip()
    missing = [name for name, value in (("RELAY_URL", url), ("RELAY_API_KEY", key)) if not value]
    if missing:
        _fatal(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
            "(RELAY_URL: the relay's base URL, e.g. https://relay.example.com; "
            "RELAY_API_KEY: your agent's ah_live_... key)"
        )
    if not 0 <= args.port < 65536:
        _fatal(f"--port must be 0-65535, got {args.port}")
    try:
        client = RelayClient(url, key)
    except ConfigurationError as exc:
        _fatal(str(exc))
    try:
        if args.http:
            if not _is_loopback(args.host):
                print(
                    f"relay-mcp: warning: listening on {args.host} without authentication: anyone who reaches "
                    "it acts as this key's agent",
                    file=sys.stderr,
                    flush=True,
                )
            _serve_http(build_server(client), args.host, args.port)
        else:
            # stdout is the protocol channel: nothing else may write to it.
            server = build_server(client)

            async def stdio() -> None:
                from mcp.server.stdio import stdio_server

                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())

            anyio.run(stdio)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
