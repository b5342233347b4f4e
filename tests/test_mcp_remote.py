"""The relay's own ``POST /mcp`` against a live relay (gunicorn + Celery from the Procfile).

Driven with the official MCP Python SDK's client (``ClientSession`` over
``streamable_http_client``) with the agent's key as a bearer header, as a remote MCP host
(Claude Code, Cursor) connects; the HTTP-level rules (401, 403, 405) with plain requests.
Every wait is bounded (``anyio.fail_after``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import jsonschema
import pytest
import requests
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from relay.agent.mcp import MAX_OUTPUT, TOOL_NAMES
from tests.conftest import bearer

pytestmark = pytest.mark.timeout(240)

BOUND = 90  # seconds: the outer bound of one test's MCP conversation
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


@pytest.fixture
def keys(make_agent, relay_url, settled) -> dict[str, str]:
    """API keys of alice@acme and bob@acme, agents of the live relay's database."""
    return {name: make_agent(f"{name}@acme", name=name.title())[1] for name in ("alice", "bob")}


@asynccontextmanager
async def remote(relay_url: str, key: str) -> AsyncIterator[ClientSession]:
    """An initialized SDK session to the relay's /mcp with ``key`` as the bearer."""
    async with httpx.AsyncClient(headers=bearer(key), timeout=httpx.Timeout(30, read=120)) as http:
        async with streamable_http_client(f"{relay_url}/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


def run(test) -> None:
    async def bounded():
        with anyio.fail_after(BOUND):
            await test()

    anyio.run(bounded)


def ok(result) -> dict[str, Any]:
    """A tool answer: its text is the JSON of its structuredContent."""
    assert not result.is_error, result.content[0].text
    [block] = result.content
    assert json.loads(block.text) == result.structured_content
    return result.structured_content


def err(result) -> str:
    assert result.is_error, result
    [block] = result.content
    assert "\n" not in block.text, block.text
    return block.text


def post_mcp(relay_url: str, body: Any, **headers: str) -> requests.Response:
    """POST ``body`` as JSON to the relay's ``/mcp`` with ``headers``."""
    return requests.post(f"{relay_url}/mcp", json=body, headers=headers, timeout=30)


# --------------------------------------------------------------------------- the HTTP rules


def test_a_missing_or_bad_key_is_401_with_a_bearer_challenge(relay_url, keys):
    for headers in ({}, bearer("ah_live_" + "a" * 32), {"Authorization": "Basic eDp5"}):
        resp = post_mcp(relay_url, INIT, **headers)
        assert resp.status_code == 401, resp.text
        assert resp.headers["WWW-Authenticate"].startswith("Bearer "), resp.headers
        assert resp.json()["error"]["message"].startswith("Unauthorized")
    assert post_mcp(relay_url, INIT, **bearer(keys["alice"])).status_code == 200


def test_an_origin_that_is_not_the_relays_is_403(relay_url, keys):
    resp = post_mcp(relay_url, INIT, Origin="http://evil.example", **bearer(keys["alice"]))
    assert resp.status_code == 403, resp.text
    assert "evil.example" in resp.json()["error"]["message"]
    # A DNS-rebinding page names itself in Host too: still not the relay's.
    rebound = post_mcp(relay_url, INIT, Origin="http://evil.example", Host="evil.example", **bearer(keys["alice"]))
    assert rebound.status_code == 403, rebound.text
    # Without RELAY_PUBLIC_URL, the relay's own origin is a loopback one (this test's relay).
    assert post_mcp(relay_url, INIT, Origin=relay_url, **bearer(keys["alice"])).status_code == 200


def test_get_is_405_no_server_stream(relay_url, keys):
    resp = requests.get(
        f"{relay_url}/mcp", headers={"Accept": "text/event-stream", **bearer(keys["alice"])}, timeout=30
    )
    assert resp.status_code == 405 and resp.headers["Allow"] == "POST"


def test_initialize_advertises_only_tools_and_a_notification_is_202(relay_url, keys):
    resp = post_mcp(relay_url, INIT, **bearer(keys["alice"]))
    result = resp.json()["result"]
    assert resp.headers["Content-Type"].startswith("application/json")
    assert result["protocolVersion"] == "2025-11-25"
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert "Mcp-Session-Id" not in resp.headers  # stateless: no session to keep
    note = post_mcp(relay_url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, **bearer(keys["alice"]))
    assert note.status_code == 202 and note.content == b"" and "Content-Type" not in note.headers


def test_a_body_not_sent_as_json_is_415(relay_url, keys):
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    resp = requests.post(
        f"{relay_url}/mcp",
        data=ping,
        headers={
            "Content-Type": "text/plain",
            "Accept": "application/json, text/event-stream",
            **bearer(keys["alice"]),
        },
        timeout=30,
    )
    assert resp.status_code == 415 and "application/json" in resp.json()["error"]["message"], resp.text
    charset = requests.post(
        f"{relay_url}/mcp",
        data=ping,
        headers={"Content-Type": "application/json; charset=utf-8", **bearer(keys["alice"])},
        timeout=30,
    )
    assert charset.status_code == 200 and charset.json()["result"] == {}, charset.text


# --------------------------------------------------------------------------- the tools


def test_tools_have_typed_arguments_and_an_output_schema(relay_url, keys):
    async def test():
        async with remote(relay_url, keys["alice"]) as alice:
            tools = {t.name: t for t in (await alice.list_tools()).tools}
            assert set(tools) == set(TOOL_NAMES)
            for tool in tools.values():
                assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
                for name, prop in tool.input_schema["properties"].items():
                    assert "type" in prop, (tool.name, name, prop)
            assert tools["read_artifact"].input_schema["properties"]["sequence_no"]["type"] == "integer"
            assert tools["list_inbox"].input_schema["properties"]["status"]["type"] == "array"

    run(test)


def test_every_tool_over_mcp(relay_url, keys):
    """Each tool, called over /mcp with a bearer key; structuredContent matches outputSchema."""

    async def test():
        async with remote(relay_url, keys["alice"]) as alice, remote(relay_url, keys["bob"]) as bob:
            schemas = {t.name: t.output_schema for t in (await alice.list_tools()).tools}
            called: set[str] = set()

            async def call(session, name, arguments):
                result = await session.call_tool(name, arguments)
                if not result.is_error:
                    jsonschema.validate(result.structured_content, schemas[name])
                called.add(name)
                return result

            sent = ok(await call(alice, "send_handoff", {"recipient": "bob@acme", "text": "remote brief"}))
            tid = sent["task_id"]
            waited = ok(await call(bob, "wait_for_messages", {"timeout_seconds": 1, "after": None}))
            assert waited["timed_out"] and waited["next_after"]  # the brief was there before the wait
            ok(await call(bob, "reply", {"task_id": tid, "text": "on it"}))
            [row] = ok(await call(bob, "list_inbox", {}))["items"]
            assert row["task_id"] == tid
            thread = ok(await call(bob, "get_thread", {"task_id": tid}))
            assert [m["body"] for m in thread["messages"]] == ["remote brief", "on it"]
            chunk = ok(await call(bob, "read_artifact", {"task_id": tid, "sequence_no": 1}))
            assert chunk["text"] == "remote brief"
            accepted = ok(await call(bob, "accept", {"task_id": tid, "lease_seconds": 60}))
            token = accepted["lease_token"]
            ok(await call(bob, "renew", {"task_id": tid, "lease_token": token}))
            ok(await call(bob, "release", {"task_id": tid, "lease_token": token}))
            ok(await call(bob, "accept", {"task_id": tid}))
            done = ok(await call(bob, "complete", {"task_id": tid, "result_summary": "done"}))
            assert done["status"]["state"] == "completed"
            second = ok(await call(alice, "send_handoff", {"recipient": "bob@acme", "text": "second"}))["task_id"]
            ok(await call(bob, "decline", {"task_id": second, "reason": "no time"}))
            third = ok(await call(alice, "send_handoff", {"recipient": "bob@acme", "text": "third"}))["task_id"]
            ok(await call(alice, "cancel", {"task_id": third}))
            fourth = ok(await call(alice, "send_handoff", {"recipient": "bob@acme", "text": "fourth"}))["task_id"]
            ok(await call(bob, "accept", {"task_id": fourth}))
            asked = ok(await call(bob, "request_input", {"task_id": fourth, "question": "which file?"}))
            assert asked["status"]["state"] == "input_required"
            ok(await call(alice, "reply", {"task_id": fourth, "text": "app.py"}))
            ok(await call(bob, "fail", {"task_id": fourth, "reason": "broke"}))
            caught = ok(await call(alice, "catch_up", {"since": "2000-01-01T00:00:00Z"}))
            assert caught["count"] >= 5
            ok(await call(alice, "search_messages", {"query": "brief"}))
            got = ok(await call(bob, "wait_for_messages", {"timeout_seconds": 1, "after": waited["next_after"]}))
            assert not got["timed_out"] and got["messages"][0]["body"] == "second", got
            assert called == set(TOOL_NAMES)

    run(test)


def test_a_revoked_key_ends_a_wait_with_an_error(relay_url, keys):
    async def test():
        async with remote(relay_url, keys["bob"]) as bob:
            async with anyio.create_task_group() as tg:
                answers: list[Any] = []

                async def wait():
                    answers.append(await bob.call_tool("wait_for_messages", {"timeout_seconds": 60}))

                tg.start_soon(wait)
                await anyio.sleep(2)  # the wait is on the relay's long-poll by now
                headers = bearer(keys["bob"])
                listed = await anyio.to_thread.run_sync(
                    lambda: requests.get(f"{relay_url}/api/v1/identities/bob@acme/keys", headers=headers, timeout=30)
                )
                key_id = listed.json()["items"][0]["key_id"]
                revoked = await anyio.to_thread.run_sync(
                    lambda: requests.delete(
                        f"{relay_url}/api/v1/identities/bob@acme/keys/{key_id}", headers=headers, timeout=30
                    )
                )
                assert revoked.status_code == 200, revoked.text
                with anyio.fail_after(20):  # far sooner than the wait's 60 s
                    while not answers:
                        await anyio.sleep(0.1)
            assert err(answers[0]).startswith("unauthenticated: "), answers[0]

    run(test)


def test_an_optional_integer_and_an_array_given_as_the_inspector_converts_them(relay_url, keys):
    """The Inspector CLI converts ``sequence_no=1`` and ``status=["pending"]`` by the schema's type."""

    async def test():
        async with remote(relay_url, keys["alice"]) as alice, remote(relay_url, keys["bob"]) as bob:
            schemas = {t.name: t.input_schema for t in (await bob.list_tools()).tools}
            tid = ok(await alice.call_tool("send_handoff", {"recipient": "bob@acme", "text": "typed"}))["task_id"]

            def convert(tool: str, name: str, text: str) -> Any:  # what the Inspector CLI does with key=value
                kind = schemas[tool]["properties"][name]["type"]
                return int(text) if kind == "integer" else json.loads(text) if kind == "array" else text

            chunk = ok(
                await bob.call_tool(
                    "read_artifact", {"task_id": tid, "sequence_no": convert("read_artifact", "sequence_no", "1")}
                )
            )
            assert chunk["text"] == "typed"
            rows = ok(await bob.call_tool("list_inbox", {"status": convert("list_inbox", "status", '["pending"]')}))
            assert [r["task_id"] for r in rows["items"]] == [tid]
            sent = ok(
                await alice.call_tool(
                    "send_handoff",
                    {
                        "recipient": "bob@acme",
                        "text": "expiring",
                        "expires_in_seconds": convert("send_handoff", "expires_in_seconds", "600"),
                    },
                )
            )
            assert sent["expires_at"]
            # Not coerced on the server: a string where the schema says integer is refused by name.
            text = err(await bob.call_tool("read_artifact", {"task_id": tid, "sequence_no": "1"}))
            assert text.startswith("invalid_params: sequence_no"), text

    run(test)


# --------------------------------------------------------------------------- the budget as sent

CJK = "漢字かな交じり文🙂🚀" * 600  # 6,000 characters, 10 of them non-ASCII in 10


def test_large_non_ascii_answers_stay_under_the_budget_as_sent(relay_url, keys):
    """get_thread and read_artifact over a long CJK/emoji brief and a non-ASCII diff: each
    response as sent (its bytes, and its characters with non-ASCII escaped) is under the
    budget, and read_artifact's pieces put together are exactly the value."""
    brief = CJK * 6  # 36,000 characters: 432,000 as \\u escapes
    diff = "".join(f"@@ -{i},1 +{i},1 @@\n-naïve «{i}» 🙂\n+naïve “{i}” 🚀 漢字\n" for i in range(3000))
    rpc_id = iter(range(100, 10_000))

    def raw_call(key: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": next(rpc_id),
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }
        resp = post_mcp(relay_url, body, **{"MCP-Protocol-Version": "2025-11-25"}, **bearer(key))
        assert resp.status_code == 200, resp.text[:500]
        text = resp.content.decode("utf-8")
        escaped = json.dumps(json.loads(text))  # the same answer with every non-ASCII character escaped
        assert len(text) < MAX_OUTPUT and len(escaped) < MAX_OUTPUT, (name, len(text), len(escaped))
        result = resp.json()["result"]
        assert not result.get("isError"), result["content"][0]["text"]
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
        return result["structuredContent"]

    sent = raw_call(
        keys["alice"],
        "send_handoff",
        {"recipient": "bob@acme", "text": brief, "artifacts": [{"type": "file_diff", "path": "ü.py", "diff": diff}]},
    )
    tid = sent["task_id"]
    thread = raw_call(keys["bob"], "get_thread", {"task_id": tid})
    [message] = thread["messages"]
    notes = {n["field"]: n for n in message["cut"]}
    assert {"body", "artifacts[0].diff"} <= set(notes), notes
    for field, whole in (("body", brief), ("artifacts[0].diff", diff)):
        note = notes[field]
        assert note["total"] == len(whole)
        shown = message["body"] if field == "body" else message["artifacts"][0]["diff"]
        assert whole.startswith(shown) and len(shown) == note["shown"]
        pieces, offset = [shown], note["shown"]
        while offset is not None:
            args = {"task_id": tid, "sequence_no": 1, "field": field, "offset": offset}
            chunk = raw_call(keys["bob"], "read_artifact", args)
            pieces.append(chunk["text"])
            offset = chunk["next_offset"]
        assert "".join(pieces) == whole


def test_the_2026_07_28_envelope_discover_and_a_tool_call(relay_url, keys):
    """2026-07-28's per-request envelope: no initialize, the revision in _meta and in the headers."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }

    def call(method: str, params: dict[str, Any], **headers: str) -> requests.Response:
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": meta}}
        routing = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, **headers}
        return post_mcp(relay_url, body, **routing, **bearer(keys["alice"]))

    found = call("server/discover", {})
    assert found.status_code == 200, found.text
    result = found.json()["result"]
    assert result["supportedVersions"] == ["2026-07-28"] and "tools" in result["capabilities"]
    listed = call("tools/call", {"name": "list_inbox", "arguments": {"sent": True}}, **{"Mcp-Name": "list_inbox"})
    assert listed.status_code == 200, listed.text
    assert listed.json()["result"]["structuredContent"] == {"items": [], "next_cursor": None}
    # A header that disagrees with the body is refused by the SDK's envelope ladder.
    mismatched = call("tools/list", {}, **{"Mcp-Method": "tools/call"})
    assert mismatched.status_code == 400 and "header" in mismatched.json()["error"]["message"]


SLOTS = 10  # RELAY_STREAMS_PER_AGENT in the tests' relays


def test_waits_take_the_agents_stream_slots_and_give_them_back_when_the_client_goes(relay_url, make_agent, settled):
    _, key = make_agent("carol@acme", name="Carol")

    async def test():
        async with remote(relay_url, key) as carol:
            async with anyio.create_task_group() as tg:
                for _ in range(SLOTS):
                    tg.start_soon(carol.call_tool, "wait_for_messages", {"timeout_seconds": 60})
                await anyio.sleep(3)  # every wait is on the feed's long-poll by now
                text = err(await carol.call_tool("wait_for_messages", {"timeout_seconds": 1}))
                assert text.startswith("rate_limited: "), text
                tg.cancel_scope.cancel()  # the client drops its ten connections
        async with remote(relay_url, key) as carol:
            with anyio.fail_after(20):  # the waits notice their client gone, far before their 60 s
                while (answer := await carol.call_tool("wait_for_messages", {"timeout_seconds": 1})).is_error:
                    assert err(answer).startswith("rate_limited: ")
                    await anyio.sleep(0.5)
            assert ok(answer)["timed_out"]

    run(test)


def test_bad_json_and_a_batch_are_clean_json_rpc_errors(relay_url, keys):
    raw = requests.post(
        f"{relay_url}/mcp",
        data=b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"n": NaN}}',
        headers={"Content-Type": "application/json", **bearer(keys["alice"])},
        timeout=30,
    )
    assert raw.status_code == 400 and raw.json()["error"]["code"] == -32700, raw.text
    batch = post_mcp(relay_url, [INIT], **bearer(keys["alice"]))
    assert batch.status_code == 400 and batch.json()["error"]["code"] == -32600, batch.text
    unknown = post_mcp(relay_url, {"jsonrpc": "2.0", "id": 2, "method": "resources/list"}, **bearer(keys["alice"]))
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == -32601, unknown.text


def test_a_web_process_loads_the_mcp_face_on_its_first_mcp_request_only(base_env):
    """The app starts without the MCP SDK or the agent kit; the first POST /mcp loads them."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from relay.factory import create_app\n"
        "app = create_app()\n"
        "heavy = ('mcp', 'mcp_types', 'relay.agent.mcp', 'relay.agent.client')\n"
        "print('loaded', sorted(m for m in heavy if m in sys.modules))\n"
        "app.test_client().post('/mcp', json={'jsonrpc': '2.0', 'id': 1, 'method': 'ping'})\n"
        "print('loaded', sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=base_env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    before, after = [line.removeprefix("loaded ") for line in out if line.startswith("loaded ")]
    assert before == "[]"
    assert after == str(sorted(["mcp", "mcp_types", "relay.agent.mcp", "relay.agent.client"]))
