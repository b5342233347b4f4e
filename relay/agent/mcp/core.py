"""The tool table's machinery: one :class:`Tool` per tool, its schemas, and one way to call it.

Both servers of the table (``relay-mcp`` over stdio or HTTP, and the relay's own ``POST
/mcp``) list tools with :func:`tool_definitions` and call them with :func:`call_tool`,
which validates the arguments with the tool's pydantic model (strictly: ``"2"`` is no
integer, ``true`` no integer, an unknown argument is refused by name), runs the tool's
function on a RelayClient-like object and bounds the answer: the serialized JSON-RPC
response carrying it (text and ``structuredContent``, non-ASCII escaped) stays under
MAX_OUTPUT characters. A relay error is a tool error (``isError: true``) whose text is
one line, ``symbol: message (hint: ...)``.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic import BaseModel, ValidationError

from relay.agent.client.errors import RelayError, lease_refused
from relay.agent.mcp.budget import MAX_OUTPUT, bounded_answer, size

log = logging.getLogger("relay.mcp")

#: what a tool function returns: the answer, or a function of a budget (characters) giving it
Answer = dict[str, Any] | Callable[[int], dict[str, Any]]
#: room in a response for everything but the answer's data (the envelope, an id, the text's quotes)
_ENVELOPE = 1_000


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what the model reads, its argument and answer models, and what it does.

    ``run(client, arguments)`` takes a RelayClient-like object and the validated ``input``
    model, and returns the answer (a JSON object matching ``output``) or a function of a
    budget in characters that gives it within that budget (for answers that must be cut to fit).
    """

    name: str
    title: str
    description: str
    input: type[BaseModel]
    output: type[BaseModel]
    run: Callable[[Any, Any], Answer]
    read_only: bool = False
    destructive: bool = False
    idempotent: bool | None = None

    def definition(self) -> types.Tool:
        """The tool as ``tools/list`` shows it."""
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.input),
            output_schema=output_schema(self.output),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.read_only,
                destructive_hint=self.destructive if not self.read_only else None,
                idempotent_hint=self.read_only if self.idempotent is None else self.idempotent,
                open_world_hint=True,
            ),
        )


def _typed(prop: dict[str, Any]) -> dict[str, Any]:
    """A property schema with a top-level ``type``: ``anyOf [X, null]`` becomes X (absence means null)."""
    branches = prop.get("anyOf")
    if isinstance(branches, list):
        rest = [b for b in branches if b != {"type": "null"}]
        if len(rest) == 1 and len(rest) < len(branches):
            merged = {k: v for k, v in prop.items() if k != "anyOf"}
            merged.update(rest[0])
            if merged.get("default", 0) is None:
                del merged["default"]
            prop = merged
    if "type" not in prop and "$ref" in prop:
        prop = {**prop, "type": "object"}
    return prop


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema with every property typed at the top (what clients convert strings by)."""
    schema = copy.deepcopy(model.model_json_schema())
    schema["properties"] = {k: _typed(v) for k, v in (schema.get("properties") or {}).items()}
    return schema


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema as the answers are serialized."""
    return model.model_json_schema(mode="serialization")


def tool_definitions(table: Sequence[Tool]) -> list[types.Tool]:
    """Every tool of ``table`` as ``tools/list`` shows it."""
    return [tool.definition() for tool in table]


class UnknownTool(LookupError):
    """``tools/call`` named no tool of the table (a protocol error, -32602, not a tool error)."""


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


def one_line(text: str) -> str:
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
    return one_line(line)


# The JSON types an argument may be given as, as an error names them.
_A_TYPE = {
    "int_type": "an integer",
    "bool_type": "a boolean",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "float_type": "a number",
    "literal_error": None,
}


def _json_kind(value: Any) -> str:
    """The JSON type of a decoded argument, as an error names it; ``2.0`` is a float."""
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string")):
        if isinstance(value, kind):
            return name
    return "an array" if isinstance(value, list) else "an object"


def _where(loc: tuple[Any, ...], arguments: Any) -> str:
    """A pydantic error location as the caller's argument path (a tagged union's tag left out)."""
    parts: list[str] = []
    value = arguments
    for part in loc:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and part < len(value):
            value = value[part]
        elif isinstance(value, dict) and value.get("type") == part:
            continue  # the discriminator's branch, not a member the caller sent
        else:
            value = None
        parts.append(str(part))
    return ".".join(parts)


def validation_line(exc: ValidationError, arguments: dict[str, Any] | None = None) -> str:
    """Arguments that failed the tool's input schema, as one line: ``invalid_params: field: why; ...``.

    A wrong JSON type reads ``limit: must be an integer, not a string`` (nothing is coerced).
    """
    problems = []
    for err in exc.errors(include_url=False):
        where = _where(tuple(err.get("loc", ())), arguments or {})
        wanted = _A_TYPE.get(err.get("type", ""))
        why = f"must be {wanted}, not {_json_kind(err.get('input'))}" if wanted else err.get("msg", "invalid")
        problems.append(f"{where}: {why}" if where else str(why))
    return one_line(
        f"invalid_params: {'; '.join(problems) or 'invalid arguments'} "
        "(hint: the tool's input schema says what each argument takes; fix it and call again)"
    )


# =========================================================================== calling a tool


def fail(line: str) -> types.CallToolResult:
    """A tool error: the one line as text."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=line)], is_error=True)


def ok(result: dict[str, Any]) -> types.CallToolResult:
    """A tool answer: the JSON as text (for clients that read only text) and as ``structuredContent``."""
    text = json.dumps(result, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=result)


def wire_size(result: types.CallToolResult) -> int:
    """Characters of the JSON-RPC response carrying ``result``, non-ASCII escaped, less its id."""
    body = {"jsonrpc": "2.0", "id": 0, "result": result.model_dump(mode="json", by_alias=True, exclude_none=True)}
    return size(body)


def fitted(answer: Answer) -> types.CallToolResult:
    """``answer`` as a result whose response stays under MAX_OUTPUT characters as sent.

    A budgeted answer is made again with a smaller budget while its response is over; a
    plain one that is over is cut by :func:`bounded_answer` (nothing should be).
    """
    make = answer if callable(answer) else (lambda budget: bounded_answer(answer, budget))
    limit = MAX_OUTPUT - _ENVELOPE
    budget = limit // 2  # the text and structuredContent each carry the answer once
    for _ in range(8):
        result = ok(make(budget))
        over = wire_size(result)
        if over <= limit:
            return result
        budget = max(1_000, budget * limit // over - 500)
    return ok(bounded_answer(make(budget), 1_000))


def unknown_arguments(tool: Tool, arguments: dict[str, Any]) -> str | None:
    """The one line refusing arguments ``tool`` does not take (a misspelled one would drop its work), or None."""
    known = set(tool.input.model_fields)
    unknown = sorted(set(arguments) - known)
    if not unknown:
        return None
    return one_line(
        f"invalid_params: unknown argument(s) {', '.join(unknown)} (hint: {tool.name} takes {', '.join(sorted(known))})"
    )


def call_tool(table: Sequence[Tool], client: Any, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """Validate ``arguments`` for the tool ``name``, run it on ``client`` and bound its answer.

    Raises UnknownTool when ``table`` has no such tool; every other failure (bad arguments,
    a relay error, a fault here) is a tool error, one line.
    """
    tool = next((t for t in table if t.name == name), None)
    if tool is None:
        raise UnknownTool(name)
    arguments = arguments or {}
    refused = unknown_arguments(tool, arguments)
    if refused:
        return fail(refused)
    try:
        # Through JSON, strictly: each argument is taken as its JSON type says, never coerced.
        params = tool.input.model_validate_json(json.dumps(arguments), strict=True)
    except ValidationError as exc:
        return fail(validation_line(exc, arguments))
    try:
        return fitted(tool.run(client, params))
    except RelayError as exc:
        return fail(error_line(exc))
    except Exception as exc:  # a bug here, not the caller's: logged with its traceback, answered in one line
        log.exception("relay-mcp tool %s failed", name)
        return fail(
            one_line(
                f"internal_error: relay-mcp failed: {type(exc).__name__}: {exc} "
                "(hint: a fault in relay-mcp, not your call's; tell the user)"
            )
        )
