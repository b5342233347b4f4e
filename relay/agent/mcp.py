"""relay-mcp: the handoff relay as Model Context Protocol tools for a coding agent.

An MCP-capable agent (Claude Code, Cursor, ...) starts ``relay-mcp`` and gets fifteen
tools: ``send_handoff``, ``reply``, ``list_inbox``, ``get_thread``, ``read_artifact``,
``accept``, ``complete``, ``cancel``, ``decline``, ``fail``, ``release``, ``renew`` (the
work lifecycle, issue 29: an accept with ``lease_seconds`` answers a lease token that this
process remembers and sends on complete/fail/release/renew), ``search_messages``,
``catch_up`` and ``wait_for_messages``
(block until the other side writes: an agent with no public URL waits for work with
it; the position is this process's, from the newest message when it started). Each one is a call of
:class:`relay.agent.client.RelayClient` on the relay's public HTTP API, made with the agent's
own key; this module imports nothing of the server (no services, models or Flask).

Configuration, from the environment only:

* ``RELAY_URL``: the relay's base URL (``https://relay.example.com``);
* ``RELAY_API_KEY``: the agent's key (``ah_live_...``, from ``relay agents create``).

Transports (official MCP Python SDK, ``mcp`` 2.x, ``MCPServer``)::

    relay-mcp                                   # stdio (what an agent's mcpServers entry runs)
    relay-mcp --http [--host 127.0.0.1] [--port 8765]   # streamable HTTP at http://HOST:PORT/mcp

Results are JSON objects, as text (once: no ``structuredContent`` copy), each under
MAX_OUTPUT characters. A relay
error is returned as a tool error (``isError: true``) whose text is one line,
``symbol: message (hint: ...)``; the server keeps running. The HTTP transport has no
authentication of its own: whoever reaches it acts as the key's agent, so it listens on
loopback unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import ipaddress
import itertools
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio.to_thread
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relay.agent.client import (
    ConfigurationError,
    FeedRow,
    InvalidParams,
    RelayClient,
    RelayError,
    TaskSummary,
    lease_refused,
    next_position,
)

__all__ = ["build_server", "main", "TOOL_NAMES"]

log = logging.getLogger("relay.mcp")

EXIT_CONFIG = 3
TOOL_NAMES = (
    "send_handoff",
    "reply",
    "list_inbox",
    "get_thread",
    "read_artifact",
    "accept",
    "complete",
    "cancel",
    "decline",
    "fail",
    "release",
    "renew",
    "search_messages",
    "catch_up",
    "wait_for_messages",
)
#: wait_for_messages's bounds on timeout_seconds
WAIT_MIN_SECONDS, WAIT_MAX_SECONDS = 1, 600
#: feed rows (search_messages, catch_up) carry at most this much of each message's text
BODY_PREVIEW = 2000
#: artifact fields left out of feed rows (get_thread cuts them, read_artifact pages them)
_BULKY_ARTIFACT_FIELDS = ("diff", "spec")
#: every tool's answer stays under this many characters (issue 34: Claude Code's default
#: tool-output limit is 25,000 tokens; one 334 KB diff made a 1.37 MB answer)
MAX_OUTPUT = 100_000
#: get_thread's default page: the newest this many messages
THREAD_PAGE = 50
#: no string is shown longer than this, even where the answer has room (a summary repeats the brief)
STRING_CAP = 20_000
#: what the relay's data in an answer may take: MAX_OUTPUT less room for the tool's own members
_BUDGET = MAX_OUTPUT - 2_000
#: a container whose cut members would get less than this each is shown as its JSON text, cut
MIN_SHARE = 400
#: a message or feed row is not cut below this: the oldest messages (newest rows) are left out instead
ITEM_FLOOR = 1_500
#: read_artifact's text stays under this many characters of JSON (escapes included)
ARTIFACT_ROOM = 90_000
#: read_artifact's chunk, in characters
ARTIFACT_CHUNK = 50_000

INSTRUCTIONS = """\
Tools for the handoff relay, where AI agents hand work to each other. You act as the agent whose \
API key this server holds. A handoff (thread, identified by task_id) is opened with send_handoff to \
another agent's handle (local@org); both sides add messages with reply. The recipient accepts a pending \
handoff (accept), does the work, then completes it with a result summary (complete); the sender may \
cancel it while it is still pending (cancel). The recipient may instead decline a pending handoff or, \
once accepted, fail it (both with a reason) or release it (back to pending). accept with lease_seconds \
leases the work: renew extends the lease, and past its end the handoff is pending again; this server \
remembers the lease token and sends it for you. States: pending -> accepted -> completed | failed | \
pending (release), pending -> cancelled | declined | expired; completed, cancelled, declined, failed and \
expired are final. list_inbox filters on priority (low, normal, high, urgent); send_handoff sets it. Check your inbox with list_inbox, read a whole thread with \
get_thread (its newest 50 messages; this marks them read; read_artifact has what it cut), find old messages with search_messages, and after a break fetch \
everything new with catch_up. To wait for the other side (a reply, a new handoff) without polling, call \
wait_for_messages. Errors come back as one line: "symbol: message (hint: ...)"."""


# =========================================================================== tool argument types


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileDiff(_Strict):
    """A change to one file, as a unified diff."""

    type: Literal["file_diff"]
    path: str = Field(description="Repository-relative path of the file, e.g. 'src/api/users.py'.")
    diff: str = Field(description="Unified diff of the change ('@@ -1,5 +1,8 @@ ...').")


class FileRef(_Strict):
    """A pointer to a file (optionally a line range) the recipient should look at."""

    type: Literal["file_ref"]
    path: str = Field(description="Repository-relative path of the file.")
    line_start: int | None = Field(None, ge=1, description="First line of interest (1-based).")
    line_end: int | None = Field(None, ge=1, description="Last line of interest; not before line_start.")
    ref: str | None = Field(None, description="Git ref (branch, tag or commit) the path refers to.")
    description: str | None = Field(None, description="What to look at there.")


class TestCommand(_Strict):
    """A shell command that checks the work, e.g. the test to run."""

    __test__ = False  # not a pytest class
    type: Literal["test_command"]
    command: str = Field(description="The command line, e.g. 'pytest tests/test_users.py -q'.")
    cwd: str | None = Field(None, description="Directory to run it in, relative to the repository root.")
    description: str | None = Field(None, description="What passing means.")


class ApiContract(_Strict):
    """An API shape both sides must agree on."""

    type: Literal["api_contract"]
    name: str = Field(description="Name of the API or endpoint, e.g. 'GET /users'.")
    spec: str | dict[str, Any] = Field(
        description="The contract: text (OpenAPI YAML, a type signature...) "
        "or a JSON object (a JSON Schema, an OpenAPI fragment...)."
    )
    format: str | None = Field(None, description="Format of spec, e.g. 'openapi', 'jsonschema', 'typescript'.")


class Link(_Strict):
    """A URL (issue, pull request, document) relevant to the handoff."""

    type: Literal["link"]
    url: str = Field(description="http(s) URL.")
    title: str | None = Field(None, description="Short title of the page.")


Artifact = Annotated[FileDiff | FileRef | TestCommand | ApiContract | Link, Field(discriminator="type")]


class ProposedAction(_Strict):
    """The change the sender proposes the recipient make (required with intent 'propose_action')."""

    description: str = Field(description="Human-readable summary of the proposed change.")
    target_files: list[str] = Field(min_length=1, description="Paths the recipient's agent will touch.")
    rationale: str = Field(description="Why this change is needed.")
    suggested_diff: str | None = Field(None, description="Optional unified diff; the recipient may draft its own.")


TaskId = Annotated[
    str,
    Field(
        description="The handoff's task_id: the 26-character ULID returned by send_handoff "
        "and shown by list_inbox, e.g. '01HXYZ4K2VNJQP7R8MWDB3CSTF'."
    ),
]
ArtifactList = Annotated[
    list[Artifact] | None,
    Field(
        description="Optional structured attachments (at most 50), each an object with a 'type': "
        "file_diff {path, diff}; file_ref {path, line_start?, line_end?, ref?, description?}; "
        "test_command {command, cwd?, description?}; api_contract {name, spec, format?}; "
        "link {url, title?}."
    ),
]
LeaseSeconds = Annotated[
    int | None,
    Field(
        ge=10,
        le=86_400,
        description="Optional: lease the work for this many seconds (10-86400); past the lease's end "
        "(without renew) the handoff is pending again. Leave it out for no lease.",
    ),
]
LeaseToken = Annotated[
    str | None,
    Field(
        max_length=64,
        description="The lease_token of a leased handoff; leave it out to send the one this server "
        "remembers from its accept (or renew).",
    ),
]
Reason = Annotated[
    str,
    Field(min_length=1, max_length=2000, description="Why, for the sender to read (1-2000 characters)."),
]
IdempotencyKey = Annotated[
    str | None,
    Field(
        description="Optional key (up to 255 characters, e.g. a UUID; not starting with 'a2a:') that makes "
        "the call safe to repeat: "
        "calling again with the same key and the same arguments returns the first result "
        "instead of sending twice. Leave it out and one is generated (returned as idempotency_key)."
    ),
]


# =========================================================================== errors as one line

_HINTS: dict[str, str] = {
    "unauthenticated": "RELAY_API_KEY is missing, malformed or revoked; ask the relay's operator for a key "
    "(relay agents create ...) and restart relay-mcp",
    "forbidden": "this key may only act as its own agent",
    "rate_limited": "too many requests for this agent; wait and call again",
    "recipient_not_found": "check the handle (local@org, lower case); ask the user for the right one",
    "not_a_participant": "only the thread's sender and recipient can read it or reply; check task_id",
    "thread_not_found": "check task_id; list_inbox (sent=true for threads you opened) shows your threads",
    "thread_terminal": "the thread is completed or cancelled; open a new handoff with send_handoff "
    "(pass its context_id to keep the work together)",
    "invalid_transition": "accept, decline and cancel need a pending thread; complete, fail, release and renew "
    "an accepted one; completed, cancelled, declined, failed and expired are final; get_thread shows its state",
    "not_authorized_transition": "accept, decline, complete, fail, release and renew are the recipient's to do; "
    "cancel is the sender's",
    "state_changed": "another call changed the thread first; get_thread, then decide again",
    "duplicate_idempotency_key": "this idempotency_key was already used with other arguments; use a new key "
    "or leave it out",
    "invalid_intent_payload": "give proposed_action with intent 'propose_action', and only then",
    "teammate_blocked": "the recipient has blocked you; do not retry, tell the user",
    "recipient_disabled": "the other agent is disabled; the thread takes no messages until the relay's "
    "operator re-enables it; tell the user",
    "invalid_params": "fix the named argument and call again",
    "payload_too_large": "send less: shorten the text, split it over several replies or drop large artifacts",
    "identity_not_found": "no such agent is visible to you",
    "connection_error": "the relay at RELAY_URL did not answer; try again later",
    "service_unavailable": "the relay is temporarily unavailable; try again later",
    "internal_error": "a relay fault, not your call's; try again later",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# The relay's param paths -> this server's argument names (errors name what the caller sent).
_ARGUMENTS = {
    "message.parts": "text",
    "message": "text",
    "metadata.client_idempotency_key": "idempotency_key",
    "metadata": "idempotency_key",
    "filter.since": "since",
    "filter.status": "status",
    "filter.priority": "priority",
    "page.cursor": "cursor",
    "page.limit": "limit",
    "q": "query",
    "cursor": "cursor",
    "limit": "limit",
}


def _argument_path(line: str) -> str:
    """``"message.parts.0.text: reason"`` -> ``"text: reason"``; other paths are kept."""
    path, sep, reason = line.partition(": ")
    for relay_path in sorted(_ARGUMENTS, key=len, reverse=True):
        if path == relay_path or path.startswith(relay_path + "."):
            tail = path[len(relay_path) :]
            if _ARGUMENTS[relay_path] == "text":
                tail = ""
            return f"{_ARGUMENTS[relay_path]}{tail}{sep}{reason}"
    return line


def error_line(exc: RelayError) -> str:
    """A relay error as the one line a tool error carries: ``symbol: message (hint: ...)``."""
    symbol = exc.symbol or "error"
    message = exc.message or type(exc).__name__
    fields = [_argument_path(f) for f in exc.field_errors()]
    if fields:
        message = f"invalid arguments: {'; '.join(fields)}"
    hint = _HINTS.get(symbol)
    if lease_refused(exc):
        hint = (
            "the handoff is leased and the lease_token is missing or no longer its current one (the lease "
            "lapsed, or the handoff was released or accepted again since); get_thread shows its state: if it "
            "is pending, accept it again (with lease_seconds) for a new token"
        )
    if symbol == "rate_limited" and getattr(exc, "retry_after", None) is not None:
        hint = f"too many requests for this agent; wait {exc.retry_after:g} s and call again"
    if exc.request_id and symbol in ("internal_error", "service_unavailable"):
        hint = f"{hint}; quote request {exc.request_id} when reporting it"
    if exc.idempotency_key and symbol in ("connection_error", "service_unavailable", "internal_error", "bad_response"):
        # The send may have gone through: only a retry with the same key is safe.
        hint = f"{hint}; call again with idempotency_key={exc.idempotency_key!r} so it cannot be sent twice"
    line = f"{symbol}: {message}" + (f" (hint: {hint})" if hint else "")
    return _one_line(line)


def validation_line(exc: ValidationError) -> str:
    """Arguments that failed the tool's input schema, as one line: ``invalid_params: field: why; ...``."""
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in err.get("loc", ()))
        problems.append(f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg", "invalid")))
    return _one_line(
        f"invalid_params: {'; '.join(problems) or 'invalid arguments'} "
        "(hint: the tool's input schema says what each argument takes; fix it and call again)"
    )


# =========================================================================== strict argument types

# The JSON type names of the input schemas, as an error names them.
_A_TYPE = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
    "float": "a float",
}


def _json_kind(value: Any) -> str:
    """The JSON type of a decoded argument; a number with a decimal point (``2.0``) is a float."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _must_be(where: str, wanted: list[str], value: Any) -> str:
    kind = _json_kind(value)
    return f"{where}: must be {' or '.join(_A_TYPE.get(t, t) for t in wanted)}, not {_A_TYPE.get(kind, kind)}"


def _is_type(value: Any, json_type: str) -> bool:
    kind = _json_kind(value)
    return kind in ("integer", "float") if json_type == "number" else kind == json_type


def _resolve(schema: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """``{"$ref": "#/$defs/Name"}`` -> the definition (pydantic's refs are all local)."""
    seen = 0
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and seen < 32:
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
        seen += 1
    return schema if isinstance(schema, dict) else {}


def _types_of(schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """The JSON types a schema admits, alternatives flattened; [] when it does not say."""
    schema = _resolve(schema, defs)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        types: list[str] = []
        for branch in branches:
            sub = _types_of(branch, defs)
            if not sub:
                return []
            types += [t for t in sub if t not in types]
        return types
    declared = schema.get("type")
    return [declared] if isinstance(declared, str) else list(declared or [])


def _type_errors(value: Any, schema: Any, where: str, defs: dict[str, Any]) -> list[str]:
    """Where ``value`` is not of the JSON type ``schema`` gives, as ``"path: must be X, not Y"`` lines.

    Only types are checked here (exactly: ``true`` is no integer, ``"2"`` no integer, ``2.0``
    no integer, ``1`` no boolean); bounds, enums and required members are left to pydantic.
    """
    schema = _resolve(schema, defs)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        discriminator = schema.get("discriminator")
        if isinstance(discriminator, dict) and isinstance(value, dict):
            tag = value.get(discriminator.get("propertyName"))
            target = discriminator.get("mapping", {}).get(tag) if isinstance(tag, str) else None
            # An unknown tag is pydantic's to name; a known one picks the branch to check.
            return _type_errors(value, {"$ref": target}, where, defs) if target else []
        results = [_type_errors(value, branch, where, defs) for branch in branches]
        if any(not errors for errors in results):
            return []
        # The alternative of the value's own type says what is wrong inside it.
        for branch, errors in zip(branches, results):
            if any(_is_type(value, t) for t in _types_of(branch, defs)):
                return errors
        return [_must_be(where, _types_of(schema, defs), value)]
    declared = schema.get("type")
    wanted = [declared] if isinstance(declared, str) else list(declared or [])
    if wanted and not any(_is_type(value, t) for t in wanted):
        return [_must_be(where, wanted, value)]
    errors: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += _type_errors(item, sub, f"{where}.{key}" if where else str(key), defs)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += _type_errors(item, schema["items"], f"{where}.{index}", defs)
    return errors


def argument_type_errors(arguments: dict[str, Any], input_schema: dict[str, Any]) -> list[str]:
    """Every argument whose JSON type is not the one the tool's input schema gives, one line each."""
    return _type_errors(arguments, input_schema, "", input_schema.get("$defs") or {})


class _VerbatimArguments(FuncMetadata):
    """The SDK's argument handling without its JSON-in-a-string rescue.

    ``FuncMetadata.pre_parse_json`` decodes a string argument as JSON when the parameter is
    not plainly ``str``: ``"[1]"`` became a list and ``"null"`` a None even where the schema
    takes a string (``idempotency_key``, ``session_id``). Arguments are checked against the
    schema's JSON types first, so each one is taken exactly as sent.
    """

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return dict(data)


# =========================================================================== results


def _ok(result: dict[str, Any]) -> CallToolResult:
    # The JSON once, as text: structuredContent repeating it doubled every answer (issue 34).
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(result, ensure_ascii=False))])


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))


# --------------------------------------------------------------------------- the budgeted serializer
#
# One mechanism bounds every answer (issue 34): a value is given a budget in characters of
# its JSON text; a string over it is cut to a prefix, a container shares it among its
# members (each gets what it needs, the largest the rest, equally), and a container whose
# members would get too little each to be worth showing (or a number too long) is shown
# as its JSON text, cut. Every cut leaves a note, {field, shown, total, rest[, json]},
# whose ``rest`` is the read_artifact call with what follows; the note is paid for out of
# the cut value's budget, so what is shown and its notes stay within it.

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def _child_path(path: str, key: Any) -> str:
    """``artifacts`` + 0 -> ``artifacts[0]``; ``payload`` + ``"a b"`` -> ``payload["a b"]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _path_steps(path: str) -> list[str | int]:
    """A path as the cut notes name it (``artifacts[0].spec``, ``payload["a b"]``) as its keys and indexes."""
    steps: list[str | int] = []
    text = path if path.startswith("[") else "." + path
    at = 0
    while at < len(text):
        match = _PATH_STEP.match(text, at)
        if match is None:
            raise InvalidParams(f"field: {path!r} is not a path such as 'artifacts[0].spec'", symbol="invalid_params")
        name, index, quoted = match.groups()
        steps.append(name if name is not None else int(index) if index is not None else json.loads(quoted))
        at = match.end()
    return steps


def _lookup(value: Any, path: str, where: str) -> Any:
    for step in _path_steps(path):
        if isinstance(step, int) and isinstance(value, list) and step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict) and step in value:
            value = value[step]
        else:
            raise InvalidParams(f"field: {where} has no {path}", symbol="invalid_params")
    return value


def _as_text(value: Any) -> tuple[str, bool]:
    """What read_artifact pages: a string as itself, anything else as its JSON text (True)."""
    return (value, False) if isinstance(value, str) else (json.dumps(value, ensure_ascii=False), True)


def _prefix(text: str, room: int) -> str:
    """The longest prefix of ``text`` whose JSON string (quotes and escapes included) is at most ``room`` characters."""
    hi = min(len(text), max(0, room - 2))
    if _size(text[:hi]) <= room:
        return text[:hi]
    lo = max(0, hi - (_size(text[:hi]) - room))  # each character dropped shortens it by one at least
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _size(text[:mid]) <= room:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _fill(demands: list[int], room: int) -> list[int]:
    """Shares of ``room`` for members needing ``demands``: each what it needs, the largest an equal rest."""
    shares = [0] * len(demands)
    left = room
    order = sorted(range(len(demands)), key=demands.__getitem__)
    for k, i in enumerate(order):
        shares[i] = min(demands[i], max(0, left) // (len(order) - k))
        left -= shares[i]
    return shares


class _Cut:
    """Where the cut values of one holder (a thread, a message, a feed row) are read whole, and its bounds."""

    def __init__(self, task_id: Any, sequence_no: Any = None):
        self.task_id = task_id
        self.sequence_no = sequence_no
        self._capped: dict[tuple[int, str], tuple[Any, list[dict], int]] = {}

    def note(self, path: str, shown: int, total: int, as_json: bool) -> dict[str, Any]:
        if self.task_id is None:
            rest = "not available: the answer was over its bound"
        else:
            where = f"task_id={self.task_id!r}"
            if self.sequence_no is not None:
                where += f", sequence_no={self.sequence_no}"
            rest = f"read_artifact({where}, field={json.dumps(path, ensure_ascii=False)}, offset={shown})"
        note: dict[str, Any] = {"field": path, "shown": shown, "total": total, "rest": rest}
        if as_json:
            note["json"] = True
        return note

    def text(
        self, text: str, room: int, path: str, as_json: bool, most: int | None = None
    ) -> tuple[str, list[dict], int]:
        """``text`` cut to fit ``room`` (and ``most`` characters) with its note (over ``room`` only when not even the note fits)."""
        probe = _size(self.note(path, len(text), len(text), as_json)) + 2
        shown = _prefix(text[:most], room - probe) if room - probe >= 2 else ""
        note = self.note(path, len(shown), len(text), as_json)
        return shown, [note], _size(shown) + _size(note) + 2

    def capped(self, value: Any, path: str) -> tuple[Any, list[dict], int]:
        """``value`` with every string over STRING_CAP cut: (value, notes, cost of both)."""
        if isinstance(value, str):
            if len(value) > STRING_CAP:
                return self.text(value, 10**12, path, False, most=STRING_CAP)
            return value, [], _size(value)
        if not isinstance(value, (dict, list)) or not value:
            return value, [], _size(value)
        key = (id(value), path)
        if key not in self._capped:
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
            parts = [(k, self.capped(v, _child_path(path, k))) for k, v in items]
            shown: Any = {k: c[0] for k, c in parts} if isinstance(value, dict) else [c[0] for _, c in parts]
            notes = [n for _, c in parts for n in c[1]]
            self._capped[key] = (shown, notes, _size(shown) + sum(_size(n) + 2 for n in notes))
        return self._capped[key]

    def clip(self, value: Any, budget: int, path: str = "", root: bool = False) -> tuple[Any, list[dict], int]:
        """``value`` within ``budget`` characters, its notes included: (value, notes, cost)."""
        capped = self.capped(value, path)
        if capped[2] <= budget:
            return capped
        if isinstance(value, str):
            return self.text(value, budget, path, False)
        if isinstance(value, (dict, list)) and value:
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
            over = 2 * len(items) + (sum(_size(k) + 2 for k, _ in items) if isinstance(value, dict) else 0)
            demands = [self.capped(v, _child_path(path, k))[2] for k, v in items]
            shares = _fill(demands, budget - over)
            squeezed = [s for s, d in zip(shares, demands) if s < d]
            if root or (squeezed and min(squeezed) >= MIN_SHARE):
                parts = [(k, self.clip(v, s, _child_path(path, k))) for (k, v), s in zip(items, shares)]
                if root or all(c[2] <= s for (_, c), s in zip(parts, shares)):
                    shown: Any = {k: c[0] for k, c in parts} if isinstance(value, dict) else [c[0] for _, c in parts]
                    notes = [n for _, c in parts for n in c[1]]
                    return shown, notes, _size(shown) + sum(_size(n) + 2 for n in notes)
        return self.text(json.dumps(value, ensure_ascii=False), budget, path, True)


def _holder(value: dict[str, Any], budget: int, cut: _Cut) -> tuple[dict[str, Any], int]:
    """A thread, message or feed row within ``budget``, its members cut as needed; notes in its ``cut``."""
    shown, notes, _ = cut.clip(value, budget - 12, root=True)
    if notes:
        shown["cut"] = notes
    return shown, _size(shown)


def _fit_list(items: list[dict[str, Any]], budget: int, cut_of: Callable[[dict], _Cut], keep: str) -> tuple[list, int]:
    """As many of ``items`` (keeping the newest with keep="newest", else the oldest) as fit ``budget``, each cut to its share.

    Items are left out, rather than cut below ITEM_FLOOR characters each; one is always kept.
    Returns (the items shown, how many were left out).
    """
    cuts = [cut_of(item) for item in items]
    demands = [_holder(item, 10**12, c)[1] + 12 for item, c in zip(items, cuts)]

    def window(dropped: int) -> slice:
        return slice(dropped, None) if keep == "newest" else slice(0, len(items) - dropped)

    def shares(dropped: int) -> list[int]:
        kept = demands[window(dropped)]
        return _fill(kept, budget - 2 * len(kept))

    def fits(dropped: int) -> bool:
        kept = demands[window(dropped)]
        squeezed = [s for s, d in zip(shares(dropped), kept) if s < d]
        return not squeezed or min(squeezed) >= ITEM_FLOOR or len(kept) <= 1

    lo, hi = 0, max(0, len(items) - 1)  # fits(hi) always
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    kept = list(zip(items[window(lo)], cuts[window(lo)], shares(lo)))
    return [_holder(item, share, c)[0] for item, c, share in kept], lo


def _bounded_thread(raw: dict[str, Any]) -> dict[str, Any]:
    """A tasks/get page that fits MAX_OUTPUT: every member cut to its share, then the oldest messages left out.

    ``parts`` (each message's body and artifacts again) and the thread's ``artifacts``
    (its messages' again) are left out.
    """
    tid = raw.get("task_id")
    own = {k: v for k, v in raw.items() if k not in ("messages", "artifacts")}
    messages = [
        {k: v for k, v in m.items() if k != "parts"} if isinstance(m, dict) else {"value": m}
        for m in raw.get("messages") or []
    ]
    wanted = sum(_holder(m, 10**12, _Cut(tid, m.get("sequence_no")))[1] + 2 for m in messages)
    # The thread's own members have what they need, up to what leaves the messages half.
    out, used = _holder(own, max(_BUDGET // 2, _BUDGET - wanted), _Cut(tid))
    shown, dropped = _fit_list(messages, _BUDGET - used - 400, lambda m: _Cut(tid, m.get("sequence_no")), keep="newest")
    out["messages"] = shown
    if dropped:
        first = shown[0].get("sequence_no") if shown else None
        out["note"] = (
            f"the {dropped} oldest messages of this page were left out to fit; "
            f"get_thread(task_id={tid!r}, messages_after=N) pages from any point (first shown: {first})"
        )
    return out


def _bounded_rows(rows: list[FeedRow], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Feed rows (oldest first) as they fit ``budget``: the oldest kept, each cut to its share; (rows, left out)."""
    return _fit_list(
        [_feed_row(r) for r in rows], budget, lambda row: _Cut(row.get("task_id"), row.get("sequence_no")), "oldest"
    )


def _bounded_answer(result: dict[str, Any]) -> dict[str, Any]:
    """The last guarantee, for any tool: an answer still over MAX_OUTPUT is cut (nothing here should be)."""
    if _size(result) < MAX_OUTPUT:
        return result
    return _holder(result, _BUDGET, _Cut(None))[0]


def _fail(line: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=line)], is_error=True)


def _handle(ref: Any) -> str | None:
    return ref.handle if ref is not None else None


def _task_row(task: TaskSummary) -> dict[str, Any]:
    """A ``tasks/list`` item, trimmed: the thread without its messages."""
    raw = task.raw
    return {
        "task_id": task.task_id,
        "context_id": task.context_id,
        "state": task.state,
        "intent": task.intent,
        "sender": _handle(task.sender),
        "recipient": _handle(task.recipient),
        "summary_preview": task.summary_preview,
        "priority": task.priority,
        "unread_messages": task.unread_messages,
        "created_at": raw.get("created_at"),
        "updated_at": raw.get("updated_at"),
    }


def _artifact_brief(artifact: Any) -> Any:
    if not isinstance(artifact, dict):
        return artifact
    return {k: v for k, v in artifact.items() if k not in _BULKY_ARTIFACT_FIELDS}


def _feed_row(row: FeedRow) -> dict[str, Any]:
    """A messages-feed row, trimmed: the text cut at BODY_PREVIEW, artifacts without diff/spec bodies."""
    out: dict[str, Any] = {
        "id": row.id,
        "task_id": row.task_id,
        "context_id": row.context_id,
        "task_state": row.task_state,
        "sequence_no": row.sequence_no,
        "role": row.role,
        "from": row.author,
        "caller": _handle(row.caller),
        "target": _handle(row.target),
        "body": row.body[:BODY_PREVIEW],
        "created_at": row.raw.get("created_at"),
    }
    if len(row.body) > BODY_PREVIEW:
        out["body_truncated"] = True
    if row.artifacts:
        out["artifacts"] = [_artifact_brief(a) for a in row.artifacts]
    return out


def _dump(items: list[Any] | None) -> list[dict] | None:
    if items is None:
        return None
    return [a.model_dump(exclude_none=True) if isinstance(a, BaseModel) else a for a in items]


# =========================================================================== the server


class _RelayMCPServer(MCPServer):
    """MCPServer whose arguments are strict and whose validation failures come back as one line, like relay errors."""

    def add_tool(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        super().add_tool(fn, *args, **kwargs)
        manager = getattr(self, "_tool_manager", None)
        tool = manager.get_tool(kwargs.get("name") or fn.__name__) if manager is not None else None
        if tool is not None and type(tool.fn_metadata) is FuncMetadata:
            meta = tool.fn_metadata
            tool.fn_metadata = _VerbatimArguments(
                **{field: getattr(meta, field) for field in FuncMetadata.model_fields}
            )

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        arguments = arguments or {}
        schemas = {tool.name: tool.input_schema or {} for tool in await self.list_tools()}
        schema = schemas.get(name)
        if schema is not None:
            # Pydantic would drop an unknown (say, misspelled) argument, and the work it carried
            # with it; refuse it by name instead.
            known = set(schema.get("properties", {}))
            unknown = sorted(set(arguments) - known)
            if unknown:
                return _fail(
                    _one_line(
                        f"invalid_params: unknown argument(s) {', '.join(unknown)} (hint: {name} takes "
                        f"{', '.join(sorted(known))})"
                    )
                )
            # ... and it would coerce a wrong type (true or "2" for an integer, "yes" for a
            # boolean): every argument must have the JSON type the schema gives, as at /a2a.
            wrong = argument_type_errors(arguments, schema)
            if wrong:
                return _fail(
                    _one_line(
                        f"invalid_params: {'; '.join(wrong)} "
                        "(hint: the tool's input schema says what each argument takes; fix it and call again)"
                    )
                )
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                return _fail(validation_line(exc.__cause__))
            raise


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


# The feed's oldest possible position: "after nothing", for a feed that was empty at the start.
_BEGINNING = "1970-01-01T00:00:00+00:00"


# A cancelled wait_for_messages notices within this many seconds (it waits in slices).
CANCEL_CHECK_SECONDS = 2.0


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
        self.since, self.seen = _BEGINNING, []  # its time and the ids at that time, should it be gone
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
            self.since, self.seen = next_position([newest], _BEGINNING)
        self._started.set()

    def wait(
        self,
        client: RelayClient,
        timeout: float,
        take: _Take | None = None,
        fit: Callable[[list[FeedRow]], int] | None = None,
    ) -> tuple[list[FeedRow], bool]:
        """The other side's next messages (oldest first) and whether the time ran out first.

        With ``take``, the wait ends (``[], True``) within CANCEL_CHECK_SECONDS of
        ``take.cancel`` and moves the position only while ``take`` is not cancelled. With
        ``fit`` (how many of the messages one answer holds, at least 1), the position moves
        only past those it returns: the rest come with the next call.
        """
        take = take or _Take()
        deadline = time.monotonic() + timeout
        if not self.lock.acquire(timeout=timeout):
            return [], True
        try:
            self._starter.join(timeout=max(0.0, deadline - time.monotonic()))
            if self._starter.is_alive():
                return [], True
            self._take()  # if the start-up read failed: the position is "now" (raises if the relay is away)
            me = client.handle
            while True:
                if take.cancelled:
                    return [], True
                remaining = max(0.0, deadline - time.monotonic())
                where = {"after": self.after} if self.after else {"since": self.since, "seen": self.seen}
                try:
                    rows = client.wait(**where, timeout=min(remaining, CANCEL_CHECK_SECONDS))
                except InvalidParams as exc:
                    if not (self.after and isinstance(exc.data, dict) and "after" in exc.data):
                        raise
                    self.after = None  # that message is gone (its agent deleted): go on from its time
                    continue
                theirs = [row for row in rows if row.author != me]
                if theirs and fit is not None:
                    n = max(1, fit(theirs))
                    if n < len(theirs):
                        last = theirs[n - 1]
                        rows = rows[: next(i for i, row in enumerate(rows) if row is last) + 1]
                        theirs = theirs[:n]
                if rows:
                    with take.lock:
                        if take.cancelled:
                            return [], True  # nobody will read them: the position stays before them
                        if take.moved_from is None:
                            take.moved_from = (self.after, self.since, self.seen)
                        self.after = rows[-1].id
                        self.since, self.seen = next_position(rows, self.since, self.seen)
                if theirs:
                    return theirs, False
                if time.monotonic() >= deadline:
                    return [], True
        finally:
            self.lock.release()


def build_server(client: RelayClient, *, log_level: str = "WARNING") -> MCPServer:
    """An MCPServer whose fifteen tools call ``client`` (one client for the whole process).

    ``RelayClient`` is synchronous and its ``requests.Session`` is not thread-safe, so
    every call runs on a worker thread (``anyio.to_thread.run_sync``, keeping the event
    loop free for other sessions) with that thread's own client (_PerThreadClient).
    """
    server = _RelayMCPServer("relay", instructions=INSTRUCTIONS, version=_version(), log_level=log_level)  # type: ignore[arg-type]
    position = _WaitPosition(client)
    client = _PerThreadClient(client)  # type: ignore[assignment]

    async def run(call: Callable[[], dict[str, Any]], abandon_on_cancel: bool = False) -> CallToolResult:
        try:
            return _ok(_bounded_answer(await anyio.to_thread.run_sync(call, abandon_on_cancel=abandon_on_cancel)))
        except RelayError as exc:
            return _fail(error_line(exc))
        except Exception as exc:  # a bug here, not the caller's: logged with its traceback, answered in one line
            log.exception("relay-mcp tool failed")
            return _fail(
                _one_line(
                    f"internal_error: relay-mcp failed: {type(exc).__name__}: {exc} "
                    "(hint: a fault in relay-mcp, not your call's; tell the user)"
                )
            )

    def tool(
        title: str, *, read_only: bool = False, destructive: bool = False, idempotent: bool | None = None
    ) -> Callable[[Any], Any]:
        # The docstring, dedented, is the description the model reads.
        hints = ToolAnnotations(
            title=title,
            read_only_hint=read_only,
            destructive_hint=destructive if not read_only else None,
            idempotent_hint=read_only if idempotent is None else idempotent,
            open_world_hint=True,
        )

        def register(fn: Any) -> Any:
            server.add_tool(fn, description=inspect.cleandoc(fn.__doc__ or ""), annotations=hints)
            return fn

        return register

    # ------------------------------------------------------------------ send_handoff
    @tool("Send a handoff")
    async def send_handoff(
        recipient: Annotated[
            str, Field(description="Handle of the agent to hand the work to, 'local@org', e.g. 'bob@acme'.")
        ],
        text: Annotated[
            str,
            Field(
                description="The brief: what you did, what you need and anything the recipient "
                "must know (plain text or Markdown)."
            ),
        ],
        intent: Annotated[
            Literal["inform", "ask_question", "propose_action"],
            Field(
                description="'inform' (an FYI or a task to take over), 'ask_question' (you need an "
                "answer) or 'propose_action' (you propose a change; then "
                "proposed_action is required)."
            ),
        ] = "inform",
        artifacts: ArtifactList = None,
        proposed_action: Annotated[
            ProposedAction | None,
            Field(
                description="Required with intent 'propose_action', and must be left out "
                "otherwise: {description, target_files, rationale, "
                "suggested_diff?}."
            ),
        ] = None,
        context_id: Annotated[
            str | None,
            Field(
                description="Optional context_id (ULID) of one of your earlier handoffs, to "
                "group this one with it; leave it out to start a new context."
            ),
        ] = None,
        idempotency_key: IdempotencyKey = None,
        priority: Annotated[
            Literal["low", "normal", "high", "urgent"] | None,
            Field(description="Optional priority: 'low', 'normal' (the default), 'high' or 'urgent'."),
        ] = None,
        expires_in_seconds: Annotated[
            int | None,
            Field(
                ge=10,
                le=2_592_000,
                description="Optional: if still pending after this many seconds (10-2592000), the handoff "
                "becomes expired (final).",
            ),
        ] = None,
    ) -> CallToolResult:
        """Open a new handoff (thread) to another agent: hand over work, ask a question or propose a change.

        Returns {task_id, thread_id, context_id, status: {state: "pending"}, priority, expires_at, created_at,
        idempotency_key, ...};
        keep task_id to follow the thread with get_thread. The recipient sees it in its inbox.
        Errors: recipient_not_found, teammate_blocked, invalid_intent_payload (proposed_action
        without intent 'propose_action' or the reverse), invalid_params (e.g. sending to yourself,
        an unknown context_id, an artifact missing a field), duplicate_idempotency_key.
        """

        def call() -> dict[str, Any]:
            sent = client.send(
                recipient,
                text,
                intent=intent,
                artifacts=_dump(artifacts),
                proposed_action=proposed_action.model_dump() if proposed_action else None,
                context_id=context_id,
                idempotency_key=idempotency_key,
                priority=priority,
                expires_in_seconds=expires_in_seconds,
            )
            return {**sent.raw, "idempotency_key": sent.idempotency_key}

        return await run(call)

    # ------------------------------------------------------------------ reply
    @tool("Reply in a thread")
    async def reply(
        task_id: TaskId,
        text: Annotated[str, Field(description="The message to add to the thread.")],
        artifacts: ArtifactList = None,
        idempotency_key: IdempotencyKey = None,
    ) -> CallToolResult:
        """Add a message to a handoff thread you are part of (sender or recipient), while it is pending or accepted.

        Returns {task_id, thread_id, message_id, sequence_no, created_at, idempotency_key}.
        Errors: thread_not_found, not_a_participant, thread_terminal (the thread is completed or
        cancelled), invalid_params, duplicate_idempotency_key.
        """

        def call() -> dict[str, Any]:
            sent = client.reply(task_id, text, artifacts=_dump(artifacts), idempotency_key=idempotency_key)
            return {**sent.raw, "idempotency_key": sent.idempotency_key}

        return await run(call)

    # ------------------------------------------------------------------ list_inbox
    @tool("List handoffs", read_only=True)
    async def list_inbox(
        status: Annotated[
            list[Literal["pending", "accepted", "completed", "cancelled", "declined", "failed", "expired"]] | None,
            Field(description="Only threads in these states, e.g. ['pending'] for new work; leave it out for all."),
        ] = None,
        priority: Annotated[
            list[Literal["low", "normal", "high", "urgent"]] | None,
            Field(description="Only threads of these priorities, e.g. ['urgent', 'high']; leave it out for all."),
        ] = None,
        sent: Annotated[
            bool,
            Field(description="false (default): handoffs addressed to you (your inbox); true: handoffs you opened."),
        ] = False,
        limit: Annotated[int, Field(ge=1, le=200, description="At most this many threads (1-200).")] = 20,
        since: Annotated[
            str | None,
            Field(
                description="Only threads with activity at or after this ISO 8601 time with a "
                "timezone, e.g. '2026-04-25T10:00:00Z'."
            ),
        ] = None,
        cursor: Annotated[str | None, Field(description="next_cursor from a previous call, for the next page.")] = None,
    ) -> CallToolResult:
        """List your handoff threads, newest activity first, without their messages.

        Returns {items: [{task_id, context_id, state, intent, sender, recipient, summary_preview, priority,
        unread_messages, created_at, updated_at}], next_cursor}; next_cursor is null on the last page.
        unread_messages counts the other side's messages you have not read (get_thread reads them).
        Errors: invalid_params (a bad since or cursor).
        """

        def call() -> dict[str, Any]:
            page = (client.sent if sent else client.inbox)(
                status=status, since=since, limit=limit, cursor=cursor, priority=priority
            )
            return {"items": [_task_row(t) for t in page.items], "next_cursor": page.next_cursor}

        return await run(call)

    # ------------------------------------------------------------------ get_thread
    @tool("Read a thread", read_only=True)
    async def get_thread(
        task_id: TaskId,
        messages_limit: Annotated[
            int, Field(ge=1, le=1000, description="How many messages at most (1-1000; default the newest 50).")
        ] = THREAD_PAGE,
        messages_after: Annotated[
            int | None,
            Field(
                ge=0,
                le=2**31 - 1,
                description="Read the messages after this sequence_no, oldest first (0: from the start); "
                "leave it out for the newest messages_limit.",
            ),
        ] = None,
    ) -> CallToolResult:
        """Read a handoff thread: its state, participants, brief and its newest 50 messages (or a page).

        Marks what it returns read for you. Returns {task_id, context_id, status: {state}, sender,
        recipient, summary, intent, proposed_action, messages: [{id, sequence_no, from, role, body,
        artifacts, payload, created_at, cut?}], messages_total, messages_next, result_summary,
        accepted_at, completed_at, cancelled_at, ...}. messages_next is the messages_after of the next
        page (null at the end); earlier messages: pass a smaller messages_after. The answer stays under
        100,000 characters: anything long (a body, the summary, a diff or spec, a payload) is cut, and
        each cut entry (in its message's or the thread's cut list) names the read_artifact call with
        the rest; if even so the page does not fit, its oldest messages are left out (see note). Errors: thread_not_found, not_a_participant, invalid_params (a malformed task_id).
        """

        def call() -> dict[str, Any]:
            if messages_after is not None:
                raw = client.get(task_id, messages_limit=messages_limit, messages_after=messages_after).raw
            else:
                raw = client.get_newest(task_id, messages_limit).raw
            return _bounded_thread(raw)

        return await run(call)

    @tool("Read a long artifact or body", read_only=True, idempotent=True)
    async def read_artifact(
        task_id: TaskId,
        sequence_no: Annotated[
            int | None,
            Field(
                ge=1,
                le=2**31 - 1,
                description="The message's sequence_no; leave it out for a field of the thread itself (summary...).",
            ),
        ] = None,
        index: Annotated[
            int | None,
            Field(ge=0, le=99, description="Which of the message's artifacts (0 first); leave it out for the body."),
        ] = None,
        field: Annotated[
            str | None,
            Field(
                max_length=2000,
                description="What to read, as a cut note's field names it: 'artifacts[0].spec', "
                "'payload.notes', 'summary' (with no sequence_no); relative to the artifact when index is given.",
            ),
        ] = None,
        offset: Annotated[
            int, Field(ge=0, le=2**31 - 1, description="Where to start, in characters (0: the start).")
        ] = 0,
    ) -> CallToolResult:
        """Read what get_thread (or a feed) cut: a body, an artifact's diff/spec, or any field, 50,000 characters at a time.

        The cut note's rest names the call. Returns {task_id, sequence_no, index, field, offset, text,
        total, next_offset, json}: text is at most 50,000 characters from offset (fewer when they
        are mostly escapes); next_offset is where the next call starts (null at the end). A value
        that is not a string (an object spec, a payload) is read as its JSON text (json: true):
        the pieces put together parse back to it. With index and no field, the artifact's diff or
        spec, else the artifact as JSON. Errors: invalid_params (no such message, artifact or
        field), thread_not_found, not_a_participant.
        """

        def call() -> dict[str, Any]:
            if sequence_no is None:
                if field is None:
                    raise InvalidParams(
                        "field: name a field of the thread, or give sequence_no", symbol="invalid_params"
                    )
                if index is not None:
                    raise InvalidParams("index: give sequence_no with it", symbol="invalid_params")
                holder: Any = client.get(task_id, messages_limit=1, messages_after=0).raw
                where = "the thread"
            else:
                page = client.get(task_id, messages_limit=1, messages_after=sequence_no - 1).raw
                found = [m for m in page.get("messages") or [] if m.get("sequence_no") == sequence_no]
                if not found:
                    raise InvalidParams(
                        f"sequence_no: this thread has no message {sequence_no}", symbol="invalid_params"
                    )
                holder, where = found[0], f"message {sequence_no}"
            name = field
            if index is not None:
                artifacts = holder.get("artifacts") or []
                if index >= len(artifacts):
                    raise InvalidParams(
                        f"index: message {sequence_no} has {len(artifacts)} artifacts", symbol="invalid_params"
                    )
                holder, where = artifacts[index], f"artifact {index} of message {sequence_no}"
                if name is None:
                    name = next((f for f in _BULKY_ARTIFACT_FIELDS if isinstance(holder.get(f), str)), None)
                    value: Any = holder[name] if name else holder
                    name = name or "json"
                else:
                    value = _lookup(holder, name, where)
            elif name is None:
                name, value = "body", holder.get("body") or ""
            else:
                value = _lookup(holder, name, where)
            text, as_json = _as_text(value)
            chunk = _prefix(text[offset : offset + ARTIFACT_CHUNK], ARTIFACT_ROOM)
            if not chunk and offset < len(text):
                chunk = text[offset]  # one character always moves the reader on
            end = offset + len(chunk)
            return {
                "task_id": task_id,
                "sequence_no": sequence_no,
                "index": index,
                "field": name,
                "offset": offset,
                "text": chunk,
                "total": len(text),
                "next_offset": end if end < len(text) else None,
                "json": as_json,
            }

        return await run(call)

    # ------------------------------------------------------------------ transitions
    @tool("Accept a handoff")
    async def accept(
        task_id: TaskId,
        session_id: Annotated[
            str | None,
            Field(
                description="Optional id of your working session, recorded in the audit trail (up to 255 characters)."
            ),
        ] = None,
        lease_seconds: LeaseSeconds = None,
    ) -> CallToolResult:
        """Accept a pending handoff addressed to you (recipient only): you take on the work.

        With lease_seconds the work is leased: if you neither finish nor renew it in time it is pending
        again. This server remembers the lease_token and sends it on complete, fail, release and renew.
        Returns {task_id, status: {state: "accepted"}, accepted_at, lease_token, lease_expires_at, priority,
        updated_at, ...}. Errors: not_authorized_transition (you are the sender), invalid_transition (not
        pending), state_changed (another call got there first), thread_not_found, not_a_participant,
        invalid_params (lease_seconds out of range).
        """
        return await run(lambda: client.accept(task_id, session_id=session_id, lease_seconds=lease_seconds).raw)

    @tool("Complete a handoff")
    async def complete(
        task_id: TaskId,
        result_summary: Annotated[
            str,
            Field(
                description="What was done and where (commits, files, test results), "
                "for the sender to read; up to 8192 characters."
            ),
        ],
        lease_token: LeaseToken = None,
    ) -> CallToolResult:
        """Complete an accepted handoff addressed to you (recipient only), saying what was done.

        The thread becomes completed (final: no more messages). Returns {task_id, status: {state:
        "completed"}, completed_at, result_summary, ...}. Errors: not_authorized_transition (you are the
        sender), invalid_transition (not accepted yet: accept first), state_changed (also: a leased handoff
        and a missing or stale lease_token), thread_not_found, not_a_participant, invalid_params (summary
        too long).
        """
        return await run(lambda: client.complete(task_id, result_summary, lease_token=lease_token).raw)

    @tool("Cancel a handoff", destructive=True)
    async def cancel(task_id: TaskId) -> CallToolResult:
        """Cancel a pending handoff you sent (sender only), e.g. when it is no longer needed.

        The thread becomes cancelled (final). Returns {task_id, status: {state: "cancelled"}, updated_at, ...}.
        Errors: not_authorized_transition (you are the recipient), invalid_transition (already accepted,
        completed or cancelled), state_changed, thread_not_found, not_a_participant.
        """
        return await run(lambda: client.cancel(task_id).raw)

    @tool("Decline a handoff", destructive=True)
    async def decline(task_id: TaskId, reason: Reason) -> CallToolResult:
        """Decline a pending handoff addressed to you (recipient only), telling the sender why.

        The thread becomes declined (final). Returns {task_id, status: {state: "declined"}, declined_at,
        reason, ...}. Errors: not_authorized_transition (you are the sender), invalid_transition (not
        pending), state_changed, thread_not_found, not_a_participant, invalid_params (reason missing or over
        2000 characters).
        """
        return await run(lambda: client.decline(task_id, reason).raw)

    @tool("Fail a handoff", destructive=True)
    async def fail(task_id: TaskId, reason: Reason, lease_token: LeaseToken = None) -> CallToolResult:
        """Give up on an accepted handoff addressed to you (recipient only), telling the sender why.

        The thread becomes failed (final). Returns {task_id, status: {state: "failed"}, failed_at, reason,
        ...}. Errors: not_authorized_transition (you are the sender), invalid_transition (not accepted),
        state_changed (also: a leased handoff and a missing or stale lease_token), thread_not_found,
        not_a_participant, invalid_params (reason missing or over 2000 characters).
        """
        return await run(lambda: client.fail(task_id, reason, lease_token=lease_token).raw)

    @tool("Release a handoff")
    async def release(
        task_id: TaskId,
        reason: Annotated[
            str | None,
            Field(min_length=1, max_length=2000, description="Optional: why you give it back (1-2000 characters)."),
        ] = None,
        lease_token: LeaseToken = None,
    ) -> CallToolResult:
        """Give an accepted handoff addressed to you back (recipient only): it is pending again, its lease ended.

        It can then be accepted again, by you or not at all. Returns {task_id, status: {state: "pending"},
        accepted_at: null, lease_token: null, ...}. Errors: not_authorized_transition (you are the sender),
        invalid_transition (not accepted), state_changed (also: a leased handoff and a missing or stale
        lease_token), thread_not_found, not_a_participant.
        """
        return await run(lambda: client.release(task_id, reason=reason, lease_token=lease_token).raw)

    @tool("Renew a lease")
    async def renew(
        task_id: TaskId,
        lease_seconds: Annotated[
            int | None,
            Field(
                ge=10,
                le=86_400,
                description="The lease runs this many seconds (10-86400) from now; default the accept's length. "
                "Needed for a handoff accepted without a lease (renew then starts one).",
            ),
        ] = None,
        lease_token: LeaseToken = None,
    ) -> CallToolResult:
        """Extend the lease of an accepted handoff addressed to you (recipient only); it stays accepted.

        Renew before lease_expires_at, or the handoff is pending again (a reply of yours renews it too).
        Returns {task_id, status: {state: "accepted"}, lease_token (the same), lease_expires_at, ...}.
        Errors: not_authorized_transition (you are the sender), invalid_transition (not accepted),
        state_changed (a missing or stale lease_token), invalid_params (no lease yet and no lease_seconds),
        thread_not_found, not_a_participant.
        """
        return await run(lambda: client.renew(task_id, lease_seconds=lease_seconds, lease_token=lease_token).raw)

    # ------------------------------------------------------------------ the messages feed
    @tool("Search messages", read_only=True)
    async def search_messages(
        query: Annotated[
            str,
            Field(
                min_length=1,
                max_length=500,
                description="Full-text search (1-500 characters), web-search syntax: words, "
                '"exact phrase", -excluded, a or b.',
            ),
        ],
        limit: Annotated[int, Field(ge=1, le=100, description="At most this many messages (1-100).")] = 20,
    ) -> CallToolResult:
        """Search the text and artifacts of every message in threads you are part of, newest first.

        Returns {items: [{id, task_id, context_id, task_state, sequence_no, role, from, caller, target,
        body, created_at, artifacts?}], more}; each body is cut at 2000 characters (body_truncated: true)
        and artifacts leave out diff/spec bodies: get_thread(task_id) has everything. more is true when
        further matches exist beyond limit. Errors: invalid_params.
        """

        def call() -> dict[str, Any]:
            rows = list(itertools.islice(client.search(query, limit=min(100, limit + 1)), limit + 1))
            items, left_out = _bounded_rows(rows[:limit], _BUDGET)
            return {"items": items, "more": len(rows) > limit or left_out > 0}

        return await run(call)

    @tool("Catch up", read_only=True)
    async def catch_up(
        since: Annotated[
            str,
            Field(
                description="ISO 8601 time with a timezone, e.g. '2026-04-25T10:00:00Z': "
                "every message created at or after it is returned."
            ),
        ],
        limit: Annotated[
            int, Field(ge=1, le=1000, description="At most this many messages (1-1000), the oldest first.")
        ] = 200,
        direction: Annotated[
            Literal["inbound", "outbound", "both"],
            Field(description="'inbound': threads sent to you; 'outbound': threads you opened; 'both' (default)."),
        ] = "both",
        seen_ids: Annotated[
            list[str] | None,
            Field(
                description="Message ids you already processed (since is inclusive, so the "
                "messages at exactly that time come back): they are left out."
            ),
        ] = None,
    ) -> CallToolResult:
        """Every message since a time, each once, oldest first: what happened while you were away.

        Returns {messages: [{id, task_id, context_id, task_state, sequence_no, role, from, caller, target,
        body, created_at, artifacts?}], count, more, next_since, next_seen_ids}. When more is true, call
        again with since=next_since and seen_ids=next_seen_ids for the rest. Bodies are cut at 2000
        characters (body_truncated: true); get_thread(task_id) has everything.
        Errors: invalid_params (an unparseable since, or one without a timezone).
        """

        def call() -> dict[str, Any]:
            rows = client.catch_up(since, seen=seen_ids or (), direction=direction, limit=100)
            kept = rows[:limit]
            # next_seen_ids may be long (seen_ids is the caller's): the rows get what is left.
            shown, left_out = _bounded_rows(kept, _BUDGET - _size(list(seen_ids or ())) - 5_000)
            kept = kept[: len(shown)]
            next_since, next_seen = next_position(kept, since, seen_ids or ())
            return {
                "messages": shown,
                "count": len(kept),
                "more": len(rows) > len(kept),
                "next_since": next_since,
                "next_seen_ids": next_seen,
            }

        return await run(call)

    @tool("Wait for messages", read_only=True, idempotent=False)
    async def wait_for_messages(
        timeout_seconds: Annotated[
            int,
            Field(
                ge=WAIT_MIN_SECONDS,
                le=WAIT_MAX_SECONDS,
                description=f"How long to wait at most, in whole seconds ({WAIT_MIN_SECONDS}-{WAIT_MAX_SECONDS}).",
            ),
        ] = 60,
    ) -> CallToolResult:
        """Wait until another agent writes to you (a new handoff, a reply, a result), then return the new messages.

        Blocks on the relay for up to timeout_seconds (no polling) and returns as soon as something arrives.
        Each call returns only messages after the last one a call returned, each once: this relay-mcp
        process keeps the position (not saved; it starts at the newest message when relay-mcp started,
        so what arrives between calls is not missed). Your own messages are skipped. Returns
        {messages: [{id, task_id, context_id, task_state, sequence_no, role, from, caller, target, body,
        created_at, artifacts?}], count, timed_out}: messages oldest first; timed_out true (messages [])
        when nothing arrived in time; call again to keep waiting. Bodies are cut at 2000 characters;
        get_thread(task_id) has everything. Errors: invalid_params (timeout_seconds not an integer
        from 1 to 600), rate_limited (this agent holds too many waits and streams), connection_error.
        """

        take = _Take()
        fitted: list[dict[str, Any]] = []  # the rows of the answer, as fit cut them

        def fit(rows: list[FeedRow]) -> int:
            fitted[:] = _bounded_rows(rows, _BUDGET)[0]
            return len(fitted)

        def call() -> dict[str, Any]:
            rows, timed_out = position.wait(client, float(timeout_seconds), take, fit=fit)
            return {
                "messages": fitted if rows else [],
                "count": len(rows),
                "timed_out": timed_out,
            }

        try:
            # Abandoned on cancel: the handler ends at once; the thread stops at its next slice.
            return await run(call, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            take.cancel(position)  # notifications/cancelled: whatever it took was never answered
            raise

    return server


# =========================================================================== entry point


def _version() -> str:
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
    parser.add_argument("--port", type=int, default=8765, help="port to listen on with --http (default 8765)")
    return parser.parse_args(argv)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    if not 0 < args.port < 65536:
        _fatal(f"--port must be 1-65535, got {args.port}")
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
            server = build_server(client, log_level="INFO")
            server.run("streamable-http", host=args.host, port=args.port, streamable_http_path="/mcp")
        else:
            # stdout is the protocol channel: nothing else may write to it.
            build_server(client).run("stdio")
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


if __name__ == "__main__":
    main()
