"""relay-mcp against a live relay (gunicorn + Celery from the Procfile, real PostgreSQL and Redis).

The server is the installed ``relay-mcp`` console script, run as a
subprocess, and it is driven only with the official MCP Python SDK's own client
(``ClientSession`` over ``stdio_client`` and ``streamable_http_client``): no
hand-written JSON-RPC. Every wait is bounded (``anyio.fail_after``); nothing asserts
on timing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import requests
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from relay.agent.client import RelayClient
from relay.agent.mcp import MAX_OUTPUT
from relay.ids import parse_ulid
from relay.ops.embedded import free_port
from tests.conftest import sql

pytestmark = pytest.mark.timeout(240)

RELAY_MCP = Path(sys.executable).parent / "relay-mcp"
TOOLS = {
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
    "request_input",
    "search_messages",
    "catch_up",
    "wait_for_messages",
}
BOUND = 90  # seconds: the outer bound of one test's MCP conversation


@pytest.fixture
def keys(make_agent, relay_url, settled) -> dict[str, str]:
    """API keys of alice@acme and bob@acme, agents of the live relay's database."""
    return {name: make_agent(f"{name}@acme", name=name.title())[1] for name in ("alice", "bob")}


def _server_env(relay_url: str | None, key: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RELAY_URL", "RELAY_API_KEY")}
    if relay_url is not None:
        env["RELAY_URL"] = relay_url
    if key is not None:
        env["RELAY_API_KEY"] = key
    return env


@asynccontextmanager
async def stdio_session(relay_url: str, key: str) -> AsyncIterator[ClientSession]:
    """``relay-mcp`` (stdio) as the SDK spawns it for an agent; an initialized session to it."""
    params = StdioServerParameters(command=str(RELAY_MCP), env={"RELAY_URL": relay_url, "RELAY_API_KEY": key})
    with tempfile.TemporaryFile("w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(f"--- relay-mcp stderr ---\n{errlog.read()[-4000:]}\n")
            raise


def ok(result) -> dict[str, Any]:
    """The JSON result of a successful tool call: one text block, the JSON of its structuredContent,
    the whole response under MAX_OUTPUT characters as sent (non-ASCII escaped)."""
    assert not result.is_error, result.content[0].text
    [block] = result.content
    assert json.loads(block.text) == result.structured_content
    response = {"jsonrpc": "2.0", "id": 0, "result": result.model_dump(mode="json", by_alias=True, exclude_none=True)}
    assert len(json.dumps(response)) < MAX_OUTPUT, len(json.dumps(response))
    return result.structured_content


def err(result) -> str:
    """The one-line text of a tool error."""
    assert result.is_error, result
    [block] = result.content
    assert "\n" not in block.text and "Traceback" not in block.text, block.text
    return block.text


def run(test) -> None:
    async def bounded():
        with anyio.fail_after(BOUND):
            await test()

    anyio.run(bounded)


# --------------------------------------------------------------------------- 1. the tool list


def test_stdio_lists_exactly_the_fifteen_tools_with_schemas_and_descriptions(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice:
            assert alice.server_info.name == "relay"
            # Only what is served is advertised: tools, no resources, prompts, logging or subscriptions.
            capabilities = alice.initialize_result.capabilities.model_dump(exclude_none=True)
            assert {k: v for k, v in capabilities.items() if v} == {"tools": {"list_changed": False}}
            tools = {t.name: t for t in (await alice.list_tools()).tools}
            assert set(tools) == TOOLS
            for tool in tools.values():
                assert tool.input_schema["type"] == "object", tool.name
                assert tool.description and "Returns" in tool.description and "Errors" in tool.description, tool.name
                for name, prop in tool.input_schema.get("properties", {}).items():
                    assert prop.get("description"), (tool.name, name)

            send = tools["send_handoff"].input_schema
            assert set(send["required"]) == {"recipient", "text"}
            assert send["properties"]["intent"]["enum"] == ["inform", "ask_question", "propose_action"]
            kinds = {d["properties"]["type"]["const"] for d in send["$defs"].values() if "type" in d["properties"]}
            assert kinds == {"file_diff", "file_ref", "test_command", "api_contract", "link"}
            assert tools["get_thread"].input_schema["required"] == ["task_id"]
            assert set(tools["complete"].input_schema["required"]) == {"task_id", "result_summary"}
            assert tools["list_inbox"].annotations.read_only_hint is True
            assert tools["cancel"].annotations.destructive_hint is True

    run(test)


# --------------------------------------------------------------------------- 2. the round trip


def test_full_round_trip_over_stdio(relay_url, keys):
    brief = "Refactored /users; the new shape is {items, next_cursor}. Please update the zanzibar client."

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            sent = ok(
                await alice.call_tool(
                    "send_handoff",
                    {
                        "recipient": "bob@acme",
                        "text": brief,
                        "intent": "inform",
                        "artifacts": [
                            {"type": "file_diff", "path": "src/api/users.py", "diff": "@@ -1 +1 @@\n-a\n+b"},
                            {"type": "file_ref", "path": "src/api/users.py", "line_start": 3, "line_end": 9},
                            {"type": "test_command", "command": "pytest tests/test_users.py -q"},
                            {"type": "api_contract", "name": "GET /users", "spec": {"type": "object"}},
                            {
                                "type": "link",
                                "url": "https://example.com/issues/9",
                                "title": "ticket 9",
                                "mediaType": "text/html",
                            },
                        ],
                    },
                )
            )
            task_id = sent["task_id"]
            assert sent["status"]["state"] == "pending" and len(task_id) == 26 and sent["idempotency_key"]

            # Bob's inbox shows it, unread; his sent list does not.
            inbox = ok(await bob.call_tool("list_inbox", {}))
            [item] = inbox["items"]
            assert (item["task_id"], item["state"], item["sender"], item["recipient"], item["unread_messages"]) == (
                task_id,
                "pending",
                "alice@acme",
                "bob@acme",
                1,
            )
            assert inbox["next_cursor"] is None
            assert ok(await bob.call_tool("list_inbox", {"sent": True}))["items"] == []
            assert [i["task_id"] for i in ok(await bob.call_tool("list_inbox", {"status": ["pending"]}))["items"]] == [
                task_id
            ]
            assert ok(await bob.call_tool("list_inbox", {"status": ["completed"]}))["items"] == []

            thread = ok(await bob.call_tool("get_thread", {"task_id": task_id}))
            assert thread["summary"] == brief and thread["sender"]["handle"] == "alice@acme"
            [first] = thread["messages"]
            assert first["body"] == brief and first["sequence_no"] == 1
            assert [a["type"] for a in first["artifacts"]] == [
                "file_diff",
                "file_ref",
                "test_command",
                "api_contract",
                "link",
            ]
            assert first["artifacts"][1] == {
                "type": "file_ref",
                "path": "src/api/users.py",
                "line_start": 3,
                "line_end": 9,
            }
            assert first["artifacts"][4] == {
                "type": "link",
                "url": "https://example.com/issues/9",
                "title": "ticket 9",
                "mediaType": "text/html",
            }
            assert ok(await bob.call_tool("list_inbox", {}))["items"][0]["unread_messages"] == 0  # read now

            replied = ok(await bob.call_tool("reply", {"task_id": task_id, "text": "On it: updating the client now."}))
            assert replied["sequence_no"] == 2 and replied["message_id"]
            accepted = ok(await bob.call_tool("accept", {"task_id": task_id, "session_id": "claude-1234"}))
            assert accepted["status"]["state"] == "accepted" and accepted["accepted_at"]
            done = ok(
                await bob.call_tool(
                    "complete", {"task_id": task_id, "result_summary": "Client updated; all tests pass."}
                )
            )
            assert done["status"]["state"] == "completed"

            seen = ok(await alice.call_tool("get_thread", {"task_id": task_id}))
            assert seen["status"]["state"] == "completed" and seen["completed_at"]
            assert seen["result_summary"] == "Client updated; all tests pass."
            assert [(m["sequence_no"], m["from"]) for m in seen["messages"]] == [(1, "alice@acme"), (2, "bob@acme")]
            [mine] = ok(await alice.call_tool("list_inbox", {"sent": True}))["items"]
            assert (mine["task_id"], mine["state"]) == (task_id, "completed")

            # search_messages finds the one message with the word, from either side.
            for session in (alice, bob):
                found = ok(await session.call_tool("search_messages", {"query": "zanzibar"}))
                assert [(r["id"], r["task_id"]) for r in found["items"]] == [(first["id"], task_id)]
                assert found["more"] is False
                row = found["items"][0]
                assert (row["caller"], row["target"], row["task_state"]) == ("alice@acme", "bob@acme", "completed")
                assert "diff" not in row["artifacts"][0] and row["artifacts"][0]["path"] == "src/api/users.py"
            assert ok(await bob.call_tool("search_messages", {"query": "nonexistentword"}))["items"] == []

            # catch_up: every message since the handoff was opened, each once, oldest first.
            ids = [m["id"] for m in seen["messages"]]
            caught = ok(await alice.call_tool("catch_up", {"since": sent["created_at"]}))
            assert [m["id"] for m in caught["messages"]] == ids
            assert caught["count"] == 2 and caught["more"] is False
            # ... a page at a time: since is inclusive, next_seen_ids keeps the boundary message out.
            one = ok(await bob.call_tool("catch_up", {"since": sent["created_at"], "limit": 1}))
            assert [m["id"] for m in one["messages"]] == ids[:1] and one["more"] is True
            rest = ok(await bob.call_tool("catch_up", {"since": one["next_since"], "seen_ids": one["next_seen_ids"]}))
            assert [m["id"] for m in rest["messages"]] == ids[1:] and rest["more"] is False
            inbound_for_alice = ok(
                await alice.call_tool("catch_up", {"since": sent["created_at"], "direction": "inbound"})
            )
            assert inbound_for_alice["messages"] == []

    run(test)


def test_propose_action_and_context_id(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice:
            first = ok(
                await alice.call_tool(
                    "send_handoff", {"recipient": "bob@acme", "text": "Which page size?", "intent": "ask_question"}
                )
            )
            proposal = {
                "description": "Default page size 50",
                "target_files": ["src/api/users.py"],
                "rationale": "Matches the relay's own default",
            }
            second = ok(
                await alice.call_tool(
                    "send_handoff",
                    {
                        "recipient": "bob@acme",
                        "text": "Proposal attached",
                        "intent": "propose_action",
                        "proposed_action": proposal,
                        "context_id": first["context_id"],
                    },
                )
            )
            assert second["context_id"] == first["context_id"] and second["task_id"] != first["task_id"]
            thread = ok(await alice.call_tool("get_thread", {"task_id": second["task_id"]}))
            assert thread["intent"] == "propose_action"
            assert thread["proposed_action"]["target_files"] == ["src/api/users.py"]

            # The same idempotency key with the same arguments: the first result, no second thread.
            args = {"recipient": "bob@acme", "text": "Once only", "idempotency_key": "mcp-test-key-1"}
            again = [ok(await alice.call_tool("send_handoff", args)) for _ in range(2)]
            assert again[0]["task_id"] == again[1]["task_id"]
            assert len(ok(await alice.call_tool("list_inbox", {"sent": True}))["items"]) == 3

    run(test)


# --------------------------------------------------------------------------- 3. errors


def test_relay_errors_are_one_line_tool_errors_and_the_session_goes_on(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            opened = ok(await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "cancel me?"}))
            task_id = opened["task_id"]

            text = err(await bob.call_tool("cancel", {"task_id": task_id}))
            assert text.startswith("not_authorized_transition: ") and "(hint: " in text, text
            # The session keeps working after the error.
            assert ok(await bob.call_tool("list_inbox", {}))["items"][0]["state"] == "pending"

            assert err(await alice.call_tool("accept", {"task_id": task_id})).startswith("not_authorized_transition: ")
            assert err(await bob.call_tool("complete", {"task_id": task_id, "result_summary": "x"})).startswith(
                "invalid_transition: "
            )
            assert err(await alice.call_tool("send_handoff", {"recipient": "nobody@acme", "text": "hi"})).startswith(
                "recipient_not_found: "
            )
            assert err(await alice.call_tool("get_thread", {"task_id": "01HXYZ4K2VNJQP7R8MWDB3CSTF"})).startswith(
                "thread_not_found: "
            )
            bad = err(await alice.call_tool("get_thread", {"task_id": "not-a-ulid"}))
            assert bad.startswith("invalid_params: ") and "task_id" in bad
            assert err(
                await alice.call_tool(
                    "send_handoff", {"recipient": "bob@acme", "text": "x", "intent": "propose_action"}
                )
            ).startswith("invalid_intent_payload: ")
            assert err(await alice.call_tool("catch_up", {"since": "yesterday"})).startswith("invalid_params: ")
            # Arguments that fail the input schema are refused in the same one-line shape.
            schema = err(
                await alice.call_tool(
                    "send_handoff",
                    {"recipient": "bob@acme", "text": "x", "artifacts": [{"type": "file_diff", "path": "a"}]},
                )
            )
            assert schema.startswith("invalid_params: ") and "diff" in schema

            assert ok(await alice.call_tool("cancel", {"task_id": task_id}))["status"]["state"] == "cancelled"
            terminal = err(await bob.call_tool("reply", {"task_id": task_id, "text": "too late"}))
            assert terminal.startswith("thread_terminal: ")
            assert ok(await bob.call_tool("get_thread", {"task_id": task_id}))["status"]["state"] == "cancelled"

    run(test)


def test_unknown_arguments_are_refused_by_name_and_nothing_is_sent(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice:
            text = err(
                await alice.call_tool(
                    "send_handoff",
                    {
                        "recipient": "bob@acme",
                        "text": "typo test",
                        "artifact": [{"type": "link", "url": "https://x.example/"}],
                        "contextid": "whatever",
                    },
                )
            )
            assert text.startswith("invalid_params: ") and "artifact" in text and "contextid" in text, text
            assert ok(await alice.call_tool("list_inbox", {"sent": True}))["items"] == []

    run(test)


def test_field_errors_name_the_tools_own_arguments(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice:
            text = err(await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "   "}))
            assert text.startswith("invalid_params: ") and "text: " in text and "message.parts" not in text, text

    run(test)


# Arguments must have exactly the JSON type the tool's input schema gives: nothing is coerced
# (the JSON-RPC endpoint refuses such values too). One case per kind of wrong value.
WRONG_TYPES = {
    "integer-given-true": ("list_inbox", {"limit": True}, "limit: must be an integer, not a boolean"),
    "integer-given-string": ("list_inbox", {"limit": "2"}, "limit: must be an integer, not a string"),
    "integer-given-float": ("list_inbox", {"limit": 2.0}, "limit: must be an integer, not a float"),
    "boolean-given-string": ("list_inbox", {"sent": "yes"}, "sent: must be a boolean, not a string"),
    "boolean-given-integer": ("list_inbox", {"sent": 1}, "sent: must be a boolean, not an integer"),
    "other-tool-integer-given-true": (
        "search_messages",
        {"query": "x", "limit": True},
        "limit: must be an integer, not a boolean",
    ),
    "nested-integer-given-string": (
        "send_handoff",
        {"recipient": "bob@acme", "text": "x", "artifacts": [{"type": "file_ref", "path": "a.py", "line_start": "3"}]},
        "artifacts.0.line_start: must be an integer, not a string",
    ),
    "array-given-string": ("catch_up", {"since": "2026-01-01T00:00:00Z", "seen_ids": "[]"}, "seen_ids: must be"),
}


@pytest.mark.parametrize("case", list(WRONG_TYPES))
def test_a_wrong_json_type_is_refused_by_name_not_coerced(relay_url, keys, case):
    tool, arguments, reason = WRONG_TYPES[case]

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice:
            text = err(await alice.call_tool(tool, arguments))
            assert text.startswith("invalid_params: ") and reason in text, text
            # Refused before anything reached the relay; the session goes on.
            assert ok(await alice.call_tool("list_inbox", {"sent": True}))["items"] == []

    run(test)


def test_string_arguments_are_taken_as_given(relay_url, keys):
    """A string that looks like JSON ("null", "true") is a string where the schema takes one."""

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            sent = ok(
                await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "x", "idempotency_key": "null"})
            )
            assert sent["idempotency_key"] == "null"
            accepted = ok(await bob.call_tool("accept", {"task_id": sent["task_id"], "session_id": "true"}))
            assert accepted["status"]["state"] == "accepted"

    run(test)


def test_a_bad_key_is_an_unauthenticated_tool_error(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, "ah_live_" + "a" * 32) as nobody:
            text = err(await nobody.call_tool("list_inbox", {}))
            assert text.startswith("unauthenticated: ") and "RELAY_API_KEY" in text
            assert len((await nobody.list_tools()).tools) == len(TOOLS)  # still serving

    run(test)


# --------------------------------------------------------------------------- 4. streamable HTTP


def _printed_url(proc: subprocess.Popen, log: Path, timeout: float = 30) -> str:
    """The URL ``relay-mcp --http`` prints on stderr once it listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving MCP at (http://\S+/mcp)", log.read_text())
        if found:
            return found.group(1)
        if proc.poll() is not None:
            raise AssertionError(f"relay-mcp --http exited with {proc.returncode}")
        time.sleep(0.1)
    raise AssertionError(f"relay-mcp --http printed no URL within {timeout} s")


def test_streamable_http_on_a_free_port_it_prints(relay_url, keys, tmp_path):
    log = tmp_path / "relay-mcp-http.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(RELAY_MCP), "--http"],
            env=_server_env(relay_url, keys["bob"]),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = _printed_url(proc, log)
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])), timeout=5):
            pass

        async def test():
            async with stdio_session(relay_url, keys["alice"]) as alice:
                opened = ok(await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "over HTTP"}))
                task_id = opened["task_id"]
            async with streamable_http_client(url) as (read, write):
                async with ClientSession(read, write) as bob:
                    await bob.initialize()
                    assert {t.name for t in (await bob.list_tools()).tools} == TOOLS
                    [item] = ok(await bob.call_tool("list_inbox", {}))["items"]
                    assert (item["task_id"], item["sender"]) == (task_id, "alice@acme")
                    assert err(await bob.call_tool("cancel", {"task_id": task_id})).startswith(
                        "not_authorized_transition: "
                    )
                    assert ok(await bob.call_tool("accept", {"task_id": task_id}))["status"]["state"] == "accepted"

        run(test)
        assert proc.poll() is None  # still serving after the session closed
    except BaseException:
        sys.stderr.write(f"--- relay-mcp --http log ---\n{log.read_text()[-4000:]}\n")
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# --------------------------------------------------------------------------- 5. configuration


@pytest.mark.parametrize("missing", ["RELAY_API_KEY", "RELAY_URL"])
def test_missing_configuration_exits_3_with_one_line(missing):
    env = _server_env(
        None if missing == "RELAY_URL" else "http://127.0.0.1:9",
        None if missing == "RELAY_API_KEY" else "ah_live_" + "a" * 32,
    )
    done = subprocess.run(
        [str(RELAY_MCP)], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 3
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert missing in line and "not set" in line and line.startswith("relay-mcp: ")
    # --http is refused the same way, before anything listens.
    done = subprocess.run(
        [str(RELAY_MCP), "--http", "--port", str(free_port())],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3 and missing in done.stderr


# --------------------------------------------------------------------------- cancelling a wait


def test_a_cancelled_wait_for_messages_takes_no_message_from_the_next_call(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            # Esc in the client: the SDK cancels the call and sends notifications/cancelled.
            with anyio.move_on_after(3) as scope:
                await alice.call_tool("wait_for_messages", {"timeout_seconds": 60})
            assert scope.cancelled_caught, "the wait answered although nothing was sent"
            ok(await bob.call_tool("send_handoff", {"recipient": "alice@acme", "text": "sent after the cancel"}))
            # Had the cancelled wait gone on, it would have taken this message and dropped it.
            got = ok(await alice.call_tool("wait_for_messages", {"timeout_seconds": 30}))
            assert not got["timed_out"] and [m["body"] for m in got["messages"]] == ["sent after the cancel"], got

    run(test)


def test_a_wait_cancelled_after_it_took_messages_puts_the_position_back():
    from types import SimpleNamespace

    from relay.agent.mcp.server import _Take

    position = SimpleNamespace(after="m2", since="t2", seen=["m2"])
    take = _Take()
    take.moved_from = ("m1", "t1", ["m1"])  # the wait took m2 and its answer was not yet sent
    take.cancel(position)
    assert (position.after, position.since, position.seen) == ("m1", "t1", ["m1"])
    assert take.cancelled


# --------------------------------------------------------------------------- bounded reads


def test_get_thread_is_the_newest_50_and_cuts_a_large_diff_that_read_artifact_returns_whole(relay_url, keys):
    diff = "".join(f"+line {i} of a large change {'x' * 60}\n" for i in range(5000))  # ~340,000 characters
    assert len(diff) > 300_000

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            artifact = {"type": "file_diff", "path": "src/big.py", "diff": diff}
            opened = ok(
                await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "m1", "artifacts": [artifact]})
            )
            task_id = opened["task_id"]
            for n in range(2, 61):
                ok(await alice.call_tool("reply", {"task_id": task_id, "text": f"m{n}"}))

            thread = ok(await bob.call_tool("get_thread", {"task_id": task_id}))
            assert [m["sequence_no"] for m in thread["messages"]] == list(range(11, 61))  # the newest 50
            assert thread["messages_total"] == 60 and thread["messages_next"] is None

            first = ok(
                await bob.call_tool("get_thread", {"task_id": task_id, "messages_after": 0, "messages_limit": 2})
            )
            [m1, m2] = first["messages"]
            assert first["messages_next"] == 2
            [cut] = m1["cut"]
            assert cut["field"] == "artifacts[0].diff" and cut["total"] == len(diff)
            assert diff.startswith(m1["artifacts"][0]["diff"]) and len(m1["artifacts"][0]["diff"]) == cut["shown"]
            assert "read_artifact(" in cut["rest"]

            text, offset = "", 0
            while offset is not None:
                part = ok(
                    await bob.call_tool(
                        "read_artifact", {"task_id": task_id, "sequence_no": 1, "index": 0, "offset": offset}
                    )
                )
                assert part["field"] == "diff" and part["total"] == len(diff)
                text, offset = text + part["text"], part["next_offset"]
            assert text == diff
            body = ok(await bob.call_tool("read_artifact", {"task_id": task_id, "sequence_no": 2}))
            assert (body["field"], body["text"], body["next_offset"]) == ("body", "m2", None)
            assert err(await bob.call_tool("read_artifact", {"task_id": task_id, "sequence_no": 61})).startswith(
                "invalid_params: "
            )
            assert err(
                await bob.call_tool("read_artifact", {"task_id": task_id, "sequence_no": 1, "index": 1})
            ).startswith("invalid_params: ")

    run(test)


# --------------------------------------------------------------------------- every answer bounded
#
# Each thread below passed some member through get_thread whole (a black-box check): the
# answer must stay under 100,000 characters, and read_artifact, called as the cut note
# says, must give back exactly what was cut.

_REST_SEQ = re.compile(r"sequence_no=(\d+)")


def _notes(answer: dict[str, Any]) -> list[tuple[int | None, dict[str, Any]]]:
    """Every cut note of a get_thread answer: (the message's sequence_no or None for the thread's own, note)."""
    found = [(None, n) for n in answer.get("cut", [])]
    return found + [(m["sequence_no"], n) for m in answer["messages"] for n in m.get("cut", [])]


async def _read_whole(session: ClientSession, task_id: str, note: dict[str, Any]) -> str:
    """Page read_artifact from 0, as the note's rest names it, and put the pieces together."""
    args: dict[str, Any] = {"task_id": task_id, "field": note["field"]}
    seq = _REST_SEQ.search(note["rest"])
    if seq:
        args["sequence_no"] = int(seq.group(1))
    assert f"field={json.dumps(note['field'])}" in note["rest"] and note["rest"].startswith("read_artifact(")
    text, offset = "", 0
    while offset is not None:
        part = ok(await session.call_tool("read_artifact", {**args, "offset": offset}))
        assert part["total"] == note["total"] and part["json"] == bool(note.get("json"))
        text, offset = text + part["text"], part["next_offset"]
    assert len(text) == note["total"]
    return text


def _send_raw(relay_url: str, key: str, params: dict[str, Any]) -> str:
    """``message/send`` as given (several parts, metadata...) with the agent's client; the task_id."""
    with RelayClient(relay_url, key) as client:
        return client._rpc("message/send", params)["task_id"]


def _thread_case(relay_url, keys, open_thread, check) -> None:
    """Alice opens a thread (``open_thread(alice_session) -> task_id``); bob's get_thread answers are checked."""

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            task_id = await open_thread(alice)
            answer = ok(await bob.call_tool("get_thread", {"task_id": task_id}))  # ok(): under 100,000
            await check(bob, task_id, answer)

    run(test)


async def _send_handoff(session: ClientSession, **args: Any) -> str:
    return ok(await session.call_tool("send_handoff", {"recipient": "bob@acme", **args}))["task_id"]


def _field_note(answer: dict[str, Any], field: str, seq: int | None) -> dict[str, Any]:
    found = [n for s, n in _notes(answer) if n["field"] == field and s == seq]
    assert found, f"no cut note for {field} (message {seq}): {[n['field'] for _, n in _notes(answer)]}"
    return found[0]


def test_a_long_brief_is_cut_in_the_summary_too(relay_url, keys):
    brief = "word " * 30000

    async def check(bob, task_id, answer):
        for seq, field in ((None, "summary"), (1, "body")):
            note = _field_note(answer, field, seq)
            assert await _read_whole(bob, task_id, note) == brief

    _thread_case(relay_url, keys, lambda alice: _send_handoff(alice, text=brief), check)


def test_a_brief_of_four_long_parts(relay_url, keys):
    parts = [(chr(ord("a") + i) + " part ") * 34_000 for i in range(4)]  # 4 x 238,000 characters

    async def open_thread(alice):
        params = {
            "recipient": "bob@acme",
            "intent": "inform",
            "message": {"role": "user", "parts": [{"type": "text", "text": p} for p in parts]},
        }
        return await anyio.to_thread.run_sync(_send_raw, relay_url, keys["alice"], params)

    async def check(bob, task_id, answer):
        assert "parts" not in answer["messages"][0]
        whole = await _read_whole(bob, task_id, _field_note(answer, "summary", None))
        assert whole == await _read_whole(bob, task_id, _field_note(answer, "body", 1))
        assert all(p in whole for p in parts)

    _thread_case(relay_url, keys, open_thread, check)


def test_an_object_spec_is_cut_as_json_text_and_read_back_whole(relay_url, keys):
    spec = {"type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": i} for i in range(9000)}}
    assert len(json.dumps(spec)) > 400_000

    async def check(bob, task_id, answer):
        [(seq, note)] = [(s, n) for s, n in _notes(answer) if n["field"].startswith("artifacts[0].spec")]
        assert note.get("json") is True
        shown = json.loads(await _read_whole(bob, task_id, note))
        path = note["field"].removeprefix("artifacts[0].spec").lstrip(".")
        assert shown == (spec[path] if path else spec)

    artifact = {"type": "api_contract", "name": "POST /big", "spec": spec, "format": "jsonschema"}
    _thread_case(relay_url, keys, lambda alice: _send_handoff(alice, text="the contract", artifacts=[artifact]), check)


def test_fifty_file_refs_with_long_descriptions(relay_url, keys):
    refs = [{"type": "file_ref", "path": f"src/m{i}.py", "description": f"{i} " + "d" * 8000} for i in range(50)]

    async def check(bob, task_id, answer):
        assert len(answer["messages"][0]["artifacts"]) == 50  # each one still shown, its description cut
        for i in (0, 49):
            note = _field_note(answer, f"artifacts[{i}].description", 1)
            assert await _read_whole(bob, task_id, note) == refs[i]["description"]

    _thread_case(relay_url, keys, lambda alice: _send_handoff(alice, text="look at these", artifacts=refs), check)


def test_an_artifact_member_the_relay_does_not_know(app, relay_url, keys):
    """A member the relay refuses today (docs/api.md, "Unknown members") may be in a row stored
    before members were checked: get_thread still shows it, cut, and reads it whole."""
    mystery = "unknown " * 50_000  # 400,000 characters

    async def open_thread(alice):
        params = {
            "recipient": "bob@acme",
            "intent": "inform",
            "message": {"role": "user", "parts": [{"type": "text", "text": "see the artifact"}]},
            "artifacts": [{"type": "link", "url": "https://example.com/x"}],
        }
        task_id = await anyio.to_thread.run_sync(_send_raw, relay_url, keys["alice"], params)
        sql(
            app,
            "UPDATE messages SET artifacts = jsonb_set(artifacts, '{0,mystery}', to_jsonb(CAST(:m AS text)))"
            " WHERE thread_id = :t",
            m=mystery,
            t=str(parse_ulid(task_id)),
        )
        return task_id

    async def check(bob, task_id, answer):
        assert await _read_whole(bob, task_id, _field_note(answer, "artifacts[0].mystery", 1)) == mystery

    _thread_case(relay_url, keys, open_thread, check)


def test_a_proposed_action_with_a_long_suggested_diff(relay_url, keys):
    diff = "".join(f"+line {i}\n" for i in range(40_000))  # ~400,000 characters
    action = {"description": "refactor", "target_files": ["src/a.py"], "rationale": "why", "suggested_diff": diff}

    async def check(bob, task_id, answer):
        note = _field_note(answer, "proposed_action.suggested_diff", None)
        assert "sequence_no" not in note["rest"]
        assert await _read_whole(bob, task_id, note) == diff

    _thread_case(
        relay_url,
        keys,
        lambda alice: _send_handoff(alice, text="please", intent="propose_action", proposed_action=action),
        check,
    )


def test_ten_messages_of_fifty_links_with_long_titles(relay_url, keys):
    def links(n):
        return [
            {"type": "link", "url": f"https://example.com/{n}/{i}", "title": f"{n}.{i} " + "t" * 8000}
            for i in range(50)
        ]

    async def open_thread(alice):
        task_id = await _send_handoff(alice, text="m1", artifacts=links(1))
        for n in range(2, 11):
            ok(await alice.call_tool("reply", {"task_id": task_id, "text": f"m{n}", "artifacts": links(n)}))
        return task_id

    async def check(bob, task_id, answer):
        assert [m["sequence_no"] for m in answer["messages"]] == list(range(1, 11))
        notes = [(s, n) for s, n in _notes(answer) if n["field"].startswith("artifacts")]
        assert {s for s, _ in notes} == set(range(1, 11))
        seq, note = notes[-1]
        whole = await _read_whole(bob, task_id, note)
        want = _lookup_path(links(seq), note["field"].removeprefix("artifacts"))
        assert (json.loads(whole) if note.get("json") else whole) == want

    _thread_case(relay_url, keys, open_thread, check)


def _lookup_path(value: Any, path: str) -> Any:
    for index, name in re.findall(r"\[(\d+)\]|\.(\w+)", path):
        value = value[int(index)] if index else value[name]
    return value


def test_message_metadata_is_cut_and_read_back(relay_url, keys):
    metadata = {f"k{i:04d}": f"v{i}" for i in range(900)}  # just under 16 KB of JSON
    assert 14_000 < len(json.dumps(metadata)) < 16_384

    async def open_thread(alice):
        with RelayClient(relay_url, keys["alice"]) as client:
            sent = await anyio.to_thread.run_sync(lambda: client.send("bob@acme", "m1", metadata=metadata))
            for n in range(2, 61):
                await anyio.to_thread.run_sync(lambda: client.reply(sent.task_id, f"m{n}", metadata=metadata))
        return sent.task_id

    async def check(bob, task_id, answer):
        # The newest messages, as many as fit (the answer goes twice: text and structuredContent).
        assert answer["messages"][-1]["sequence_no"] == 60
        assert len(answer["messages"]) == 50 or "messages_after" in answer["note"]
        seq, note = next((s, n) for s, n in _notes(answer) if n["field"].startswith("payload"))
        whole = await _read_whole(bob, task_id, note)
        assert json.loads(whole) if note.get("json") else whole
        assert (json.loads(whole) if note.get("json") else whole) == _lookup_path(
            metadata, note["field"].removeprefix("payload")
        )
        # All 60 asked for: each is cut to its share, or the oldest are left out with a note on paging.
        many = ok(await bob.call_tool("get_thread", {"task_id": task_id, "messages_limit": 1000, "messages_after": 0}))
        assert many["messages"][-1]["sequence_no"] == 60
        assert len(many["messages"]) == 60 or "messages_after" in many["note"]

    _thread_case(relay_url, keys, open_thread, check)


def test_feed_tools_stay_bounded(relay_url, keys):
    refs = [{"type": "file_ref", "path": f"src/m{i}.py", "description": "needle " + "d" * 8000} for i in range(50)]

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            task_id = await _send_handoff(alice, text="needle m1", artifacts=refs)
            for n in range(2, 6):
                ok(await alice.call_tool("reply", {"task_id": task_id, "text": f"needle m{n}", "artifacts": refs}))
            waited = ok(await bob.call_tool("wait_for_messages", {"timeout_seconds": 5}))  # ok(): under 100,000
            assert waited["count"] >= 1
            caught = ok(await bob.call_tool("catch_up", {"since": "2000-01-01T00:00:00Z"}))
            assert caught["count"] >= 1
            found = ok(await bob.call_tool("search_messages", {"query": "needle", "limit": 100}))
            assert found["items"]
            row = caught["messages"][0]
            note = next(n for n in row.get("cut", []) if n["field"].startswith("artifacts"))
            whole = await _read_whole(bob, task_id, note)
            want = _lookup_path(refs, note["field"].removeprefix("artifacts"))
            assert (json.loads(whole) if note.get("json") else whole) == want

    run(test)


def test_a_huge_integer_is_a_clean_parse_error_that_leaks_no_python_internals(relay_url, keys):
    digits = "9" * 5000
    resp = requests.post(
        f"{relay_url}/a2a",
        data='{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"task_id": "x", "messages_after": '
        + digits
        + "}}",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {keys['bob']}"},
        timeout=30,
    )
    error = resp.json()["error"]
    assert "set_int_max_str_digits" not in json.dumps(error) and "sys." not in error["message"]
    assert error["code"] == -32700 and "5000 digits" in error["data"]["reason"], error


# --------------------------------------------------------------------------- the work lifecycle


async def _open(alice: ClientSession, **extra: Any) -> dict[str, Any]:
    return ok(await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "please do it", **extra}))


def test_the_lifecycle_tools_schemas_bound_their_arguments(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["bob"]) as bob:
            tools = {t.name: t.input_schema for t in (await bob.list_tools()).tools}
            assert set(tools["decline"]["required"]) == set(tools["fail"]["required"]) == {"task_id", "reason"}
            assert tools["release"]["required"] == tools["renew"]["required"] == ["task_id"]
            assert {"lease_seconds"} <= set(tools["accept"]["properties"])
            assert {"lease_token"} <= set(tools["complete"]["properties"])
            assert {"priority", "expires_in_seconds"} <= set(tools["send_handoff"]["properties"])
            task = "01HXYZ4K2VNJQP7R8MWDB3CSTF"
            assert err(await bob.call_tool("decline", {"task_id": task})).startswith("invalid_params: reason")
            assert "reason" in err(await bob.call_tool("decline", {"task_id": task, "reason": ""}))
            assert "lease_seconds" in err(await bob.call_tool("accept", {"task_id": task, "lease_seconds": 5}))
            assert "lease_seconds" in err(await bob.call_tool("renew", {"task_id": task, "lease_seconds": "60"}))
            wrong = err(await bob.call_tool("list_inbox", {"priority": ["soon"]}))
            assert wrong.startswith("invalid_params: priority"), wrong

    run(test)


def test_decline_with_a_reason(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            task = (await _open(alice))["task_id"]
            declined = ok(await bob.call_tool("decline", {"task_id": task, "reason": "not my area"}))
            assert (declined["status"]["state"], declined["reason"]) == ("declined", "not my area")
            assert declined["declined_at"]

    run(test)


def test_request_input_asks_the_sender_and_their_reply_answers_it(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            task = (await _open(alice))["task_id"]
            ok(await bob.call_tool("accept", {"task_id": task, "lease_seconds": 600}))
            asked = ok(await bob.call_tool("request_input", {"task_id": task, "question": "which branch?"}))
            assert (asked["status"]["state"], asked["question"]) == ("input_required", "which branch?")
            assert asked["input_requested_at"]
            assert "question" in err(await bob.call_tool("request_input", {"task_id": task}))
            ok(await alice.call_tool("reply", {"task_id": task, "text": "main"}))
            seen = ok(await bob.call_tool("get_thread", {"task_id": task}))
            assert (seen["status"]["state"], seen["question"]) == ("accepted", None)
            # The remembered lease token still fences the work after the answer.
            done = ok(await bob.call_tool("complete", {"task_id": task, "result_summary": "done"}))
            assert done["status"]["state"] == "completed"

    run(test)


def test_accept_with_a_lease_then_complete_fail_release_and_renew_send_the_remembered_token(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            task = (await _open(alice))["task_id"]
            accepted = ok(await bob.call_tool("accept", {"task_id": task, "lease_seconds": 30}))
            assert accepted["lease_token"] and accepted["lease_expires_at"]
            renewed = ok(await bob.call_tool("renew", {"task_id": task, "lease_seconds": 3600}))
            assert renewed["lease_token"] == accepted["lease_token"]
            assert renewed["lease_expires_at"] > accepted["lease_expires_at"]
            released = ok(await bob.call_tool("release", {"task_id": task, "reason": "out of time"}))
            assert (released["status"]["state"], released["lease_token"]) == ("pending", None)
            ok(await bob.call_tool("accept", {"task_id": task, "lease_seconds": 60}))
            failed = ok(await bob.call_tool("fail", {"task_id": task, "reason": "tests will not pass"}))
            assert (failed["status"]["state"], failed["reason"]) == ("failed", "tests will not pass")

            other = (await _open(alice))["task_id"]
            ok(await bob.call_tool("accept", {"task_id": other, "lease_seconds": 60}))
            done = ok(await bob.call_tool("complete", {"task_id": other, "result_summary": "done"}))
            assert done["status"]["state"] == "completed"

    run(test)


def test_a_stale_token_after_another_accept_is_state_changed_saying_to_accept_again(relay_url, keys):
    from relay.agent.client import RelayClient

    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            task = (await _open(alice))["task_id"]
            first = ok(await bob.call_tool("accept", {"task_id": task, "lease_seconds": 60}))
            with RelayClient(relay_url, keys["bob"]) as session:  # bob's other session takes it over
                session.release(task, lease_token=first["lease_token"])
                second = session.accept(task, lease_seconds=60)
            line = err(await bob.call_tool("complete", {"task_id": task, "result_summary": "done"}))
            assert line.startswith("state_changed: "), line
            assert "(hint: the handoff is leased and the lease_token is missing or no longer its current one" in line
            given = {"task_id": task, "result_summary": "done", "lease_token": second.lease_token}
            assert ok(await bob.call_tool("complete", given))["status"]["state"] == "completed"

    run(test)


def test_send_handoff_priority_and_expiry_and_list_inbox_filters_on_priority(relay_url, keys):
    async def test():
        async with stdio_session(relay_url, keys["alice"]) as alice, stdio_session(relay_url, keys["bob"]) as bob:
            urgent = await _open(alice, priority="urgent", expires_in_seconds=3600)
            await _open(alice)
            assert urgent["priority"] == "urgent" and urgent["expires_at"]
            listed = ok(await bob.call_tool("list_inbox", {"priority": ["urgent"]}))["items"]
            assert [(i["task_id"], i["priority"]) for i in listed] == [(urgent["task_id"], "urgent")]
            both = ok(await bob.call_tool("list_inbox", {"priority": ["urgent", "normal"]}))["items"]
            assert len(both) == 2

    run(test)


def test_one_memory_of_lease_tokens_for_every_worker_thread():
    import threading as _threading

    from relay.agent.client import RelayClient
    from relay.agent.mcp.server import _PerThreadClient

    shared = _PerThreadClient(RelayClient("http://127.0.0.1:1", "ah_live_x"))
    shared.leases["t1"] = "token"
    seen = []
    worker = _threading.Thread(target=lambda: seen.append(shared.leases.get("t1")))
    worker.start()
    worker.join()
    assert seen == ["token"]
