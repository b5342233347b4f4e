"""The A2A v1.0 binding: agent cards and ``POST /a2a/agents/{handle}`` (relay/transport/a2a.py).

The caller (bearer key) is the A2A client and the handoff's sender; ``{handle}`` is the
agent and the recipient. Every request goes through the Flask test client against the
real PostgreSQL and Redis of tests/conftest.py; the push notification delivery test
runs a real Celery worker and a real loopback receiver (tests/receiver.py).

Each test checks one rule of the binding: cards, the ``A2A-Version`` check, auth,
the JSON-RPC envelope, the A2A error shape (``google.rpc.ErrorInfo`` / ``BadRequest``
in ``error.data``), SendMessage / GetTask / ListTasks / CancelTask, push notification
configs, the unsupported extended card (streaming: tests/test_a2a_stream.py), the rate-limit budget shared with
the relay's JSON-RPC dialect, and that dialect (``POST /a2a``) left unchanged.
"""

from __future__ import annotations

import copy
import json
import uuid

import pytest

from relay.ids import format_ulid, parse_ulid
from tests.conftest import bearer, extra_app, rpc, sql, wait_until
from tests.receiver import Receiver

VERSION = {"A2A-Version": "1.0"}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
DOMAIN = "a2a-protocol.org"
UNKNOWN_ULID = "01HXYZ4K2VNJQP7R8MWDB3CSTF"
BRIEF = "Refactored /users API; please update the client to the paginated shape."
PROPOSED = {
    "description": "Switch the client to cursor paging",
    "target_files": ["web/src/api/users.ts"],
    "rationale": "the API now pages",
}
FILE_DIFF = {"type": "file_diff", "path": "src/api/users.py", "diff": "@@ -1,5 +1,8 @@\n-a\n+b"}


# --------------------------------------------------------------------------- helpers


def agent_url(handle: str) -> str:
    return f"/a2a/agents/{handle}"


def message(text: str = BRIEF, message_id: str | None = None, **extra) -> dict:
    """An A2A ``Message`` from the client (ROLE_USER, one text part)."""
    return {"messageId": message_id or str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}


class A2A:
    """Calls one agent's A2A endpoint as one caller."""

    def __init__(self, client, key: str, handle: str):
        self.client = client
        self.key = key
        self.handle = handle
        self._n = 0

    def post(self, doc, headers=None):
        hdrs = {**bearer(self.key), **VERSION} if headers is None else headers
        return self.client.post(
            agent_url(self.handle), data=json.dumps(doc), headers={**hdrs, "Content-Type": "application/json"}
        )

    def raw(self, method: str, params=None, headers=None):
        """One request; assert HTTP 200 and the echoed id; return the JSON-RPC response."""
        self._n += 1
        doc = {"jsonrpc": "2.0", "id": f"req-{self._n}", "method": method}
        if params is not None:
            doc["params"] = params
        resp = self.post(doc, headers)
        assert resp.status_code == 200, (resp.status_code, resp.get_data(as_text=True))
        body = resp.get_json()
        assert body["jsonrpc"] == "2.0" and body["id"] == doc["id"], body
        return body

    def ok(self, method: str, params=None):
        body = self.raw(method, params)
        assert "error" not in body, body
        return body["result"]

    def err(self, method: str, params, code: int, symbol: str, headers=None) -> dict:
        """Assert an A2A error (code, ErrorInfo with symbol); return the error object."""
        body = self.raw(method, params, headers)
        assert "result" not in body, body
        return assert_a2a_error(body["error"], code, symbol)

    def invalid(self, method: str, params, field: str, symbol: str = "invalid_params") -> dict:
        """Assert -32602 with a BadRequest violation on ``field``; return {field: description}."""
        error = self.err(method, params, -32602, symbol)
        return violations(error, field)

    # shortcuts
    def send(self, text: str = BRIEF, **extra) -> dict:
        """SendMessage opening (or, with taskId in extra, appending to) a task; return the Task."""
        return self.ok("SendMessage", {"message": message(text, **extra)})["task"]

    def get(self, task_id: str, **extra) -> dict:
        return self.ok("GetTask", {"id": task_id, **extra})

    def list(self, **params) -> dict:
        return self.ok("ListTasks", params)


REASON = {
    -32001: "TASK_NOT_FOUND",
    -32002: "TASK_NOT_CANCELABLE",
    -32004: "UNSUPPORTED_OPERATION",
    -32009: "VERSION_NOT_SUPPORTED",
    -32602: "INVALID_PARAMS",
    -32600: "INVALID_REQUEST",
    -32601: "METHOD_NOT_FOUND",
    -32700: "PARSE_ERROR",
}


def assert_a2a_error(error: dict, code: int, symbol: str) -> dict:
    """Check the A2A error shape: ``data`` a list led by a google.rpc.ErrorInfo."""
    assert error["code"] == code, error
    assert isinstance(error["message"], str) and error["message"], error
    data = error["data"]
    assert isinstance(data, list) and data, error
    info = data[0]
    assert info["@type"] == ERROR_INFO, error
    assert info["reason"] == REASON[code], error
    assert info["domain"] == DOMAIN, error
    assert info["metadata"]["symbol"] == symbol, error
    assert all(isinstance(v, str) for v in info["metadata"].values()), error  # map<string, string>
    return error


def violations(error: dict, field: str | None = None) -> dict:
    """The BadRequest item's field violations as {field: description}; assert ``field`` is one."""
    bad = [d for d in error["data"] if d.get("@type") == BAD_REQUEST]
    assert len(bad) == 1, error
    found = {v["field"]: v["description"] for v in bad[0]["fieldViolations"]}
    assert all(isinstance(d, str) and d for d in found.values()), error
    if field is not None:
        assert field in found, error
    return found


def count(app, table: str) -> int:
    return sql(app, f"select count(*) from {table}")[0][0]


def seed_msg(text: str) -> dict:
    return {"role": "user", "parts": [{"type": "text", "text": text}]}


def seed_update(client, key, task_id, transition, **extra):
    return rpc(client, key, "tasks/update", {"task_id": task_id, "transition": transition, **extra})


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def carol(make_agent):
    """``carol@other`` (qa), a third agent in another org."""
    return make_agent("carol@other", name="Carol", role="qa")


@pytest.fixture
def to_bob(client, alice, bob):
    """alice (client) talking to bob's A2A endpoint."""
    return A2A(client, alice[1], bob[0])


@pytest.fixture
def to_carol(client, alice, carol):
    """alice (client) talking to carol's A2A endpoint."""
    return A2A(client, alice[1], carol[0])


# --------------------------------------------------------------------------- agent cards


def test_relay_card_is_public_and_points_to_per_agent_cards(client):
    resp = client.get("/.well-known/agent-card.json")
    assert resp.status_code == 200
    assert resp.mimetype == "application/json"
    card = resp.get_json()
    assert card["capabilities"]["streaming"] is True
    assert card["capabilities"]["pushNotifications"] is True
    assert "http://localhost/a2a/agents/{handle}/.well-known/agent-card.json" in card["description"]
    assert "bearer" in card["securitySchemes"]


def test_agent_card_parses_with_the_sdk_and_names_the_agent_endpoint(client, bob):
    from a2a.client.card_resolver import parse_agent_card

    resp = client.get(f"/a2a/agents/{bob[0]}/.well-known/agent-card.json")  # no Authorization: public
    assert resp.status_code == 200, resp.get_data(as_text=True)
    raw = resp.get_json()
    # JSON-RPC first (a client that takes the card's order keeps it), then HTTP+JSON (relay/transport/a2a_http.py).
    assert raw["supportedInterfaces"] == [
        {"url": f"http://localhost/a2a/agents/{bob[0]}", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": f"http://localhost/a2a/agents/{bob[0]}/http", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ]
    card = parse_agent_card(copy.deepcopy(raw))
    assert card.name == "Bob"
    assert card.supported_interfaces[0].url == "http://localhost/a2a/agents/bob@acme"
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
    assert card.supported_interfaces[0].protocol_version == "1.0"
    assert card.supported_interfaces[1].url == "http://localhost/a2a/agents/bob@acme/http"
    assert card.supported_interfaces[1].protocol_binding == "HTTP+JSON"
    assert card.supported_interfaces[1].protocol_version == "1.0"
    assert card.capabilities.streaming is True
    assert card.capabilities.push_notifications is True
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert len(card.skills) >= 1 and card.skills[0].id and card.skills[0].name
    assert "backend" in card.skills[0].tags


def test_agent_card_is_404_for_an_unknown_or_disabled_handle(app, client, bob):
    from relay.services.agents import disable_agent

    assert client.get("/a2a/agents/nobody@acme/.well-known/agent-card.json").status_code == 404
    url = f"/a2a/agents/{bob[0]}/.well-known/agent-card.json"
    assert client.get(url).status_code == 200
    with app.app_context():
        disable_agent(bob[0])
    assert client.get(url).status_code == 404


# --------------------------------------------------------------------------- version, auth, routing


@pytest.mark.parametrize(
    "version", [None, "0.3", "0.3.0", "1.1", "2.0", "garbage"], ids=["missing", "0.3", "0.3.0", "1.1", "2.0", "garbage"]
)
def test_unsupported_a2a_version_is_32009_and_does_nothing(app, to_bob, version):
    headers = bearer(to_bob.key) if version is None else {**bearer(to_bob.key), "A2A-Version": version}
    error = to_bob.err("SendMessage", {"message": message()}, -32009, "version_not_supported", headers=headers)
    assert error["data"][0]["metadata"]["supported"] == "1.0"
    assert count(app, "threads") == 0


@pytest.mark.parametrize("version", ["1.0", "1.0.0", " 1.0 "])
def test_a2a_version_1_0_with_or_without_patch_is_served(to_bob, version):
    body = to_bob.raw("SendMessage", {"message": message()}, headers={**bearer(to_bob.key), "A2A-Version": version})
    assert body["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED", body


@pytest.mark.parametrize(
    "auth", [None, "Bearer ah_live_" + "a" * 32, "Basic Zm9vOmJhcg=="], ids=["missing", "unknown-key", "basic"]
)
def test_missing_or_bad_key_is_401_with_www_authenticate(app, client, bob, auth):
    headers = {**VERSION, **({"Authorization": auth} if auth else {})}
    resp = client.post(
        agent_url(bob[0]),
        json={"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": message()}},
        headers=headers,
    )
    assert resp.status_code == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    body = resp.get_json()
    assert body["id"] == 7
    assert body["error"]["data"][0]["@type"] == ERROR_INFO
    assert body["error"]["data"][0]["metadata"]["symbol"] == "unauthenticated"
    assert count(app, "threads") == 0


def test_unknown_agent_endpoint_is_http_404(app, client, alice):
    doc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message()}}
    resp = client.post(agent_url("nobody@acme"), json=doc, headers={**bearer(alice[1]), **VERSION})
    assert resp.status_code == 404
    info = resp.get_json()["error"]["data"][0]
    assert info["@type"] == ERROR_INFO and info["metadata"]["symbol"] == "recipient_not_found"
    assert count(app, "threads") == 0


def test_disabled_agent_takes_no_new_task_but_its_senders_keep_theirs(app, to_bob, bob):
    from relay.services.agents import disable_agent

    task = to_bob.send("before the agent was disabled")
    with app.app_context():
        disable_agent(bob[0])
    to_bob.err("SendMessage", {"message": message("after")}, -32600, "recipient_not_found")
    assert to_bob.get(task["id"])["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert [t["id"] for t in to_bob.list()["tasks"]] == [task["id"]]
    assert to_bob.ok("CancelTask", {"id": task["id"]})["status"]["state"] == "TASK_STATE_CANCELED"
    assert count(app, "threads") == 1


def test_unknown_agent_endpoint_404_echoes_the_request_id(client, alice):
    resp = client.post(
        agent_url("nobody@acme"),
        json={"jsonrpc": "2.0", "id": 42, "method": "GetTask", "params": {"id": UNKNOWN_ULID}},
        headers={**bearer(alice[1]), **VERSION},
    )
    assert resp.status_code == 404
    assert resp.get_json()["id"] == 42


# --------------------------------------------------------------------------- JSON-RPC envelope


def test_body_that_is_not_json_is_32700(to_bob):
    resp = to_bob.client.post(
        agent_url(to_bob.handle),
        data=b'{"jsonrpc": "2.0", "id": 1,',
        headers={**bearer(to_bob.key), **VERSION, "Content-Type": "application/json"},
    )
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["id"] is None
    assert_a2a_error(body["error"], -32700, "parse_error")


def test_unknown_method_is_32601_even_a_seed_method_name(app, to_bob):
    error = to_bob.err("message/send", {"recipient": "bob@acme", "message": seed_msg("hi")}, -32601, "method_not_found")
    assert error["data"][0]["metadata"]["method"] == "message/send"
    to_bob.err("tasks/get", {"task_id": UNKNOWN_ULID}, -32601, "method_not_found")
    assert count(app, "threads") == 0


@pytest.mark.parametrize(
    "doc",
    [
        [],
        {"jsonrpc": "1.0", "id": 1, "method": "GetTask", "params": {"id": UNKNOWN_ULID}},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": "id"},
    ],
    ids=["empty-batch", "jsonrpc-1.0", "method-not-string", "params-not-object"],
)
def test_malformed_envelope_is_32600(to_bob, doc):
    resp = to_bob.post(doc)
    assert resp.status_code == 200
    assert_a2a_error(resp.get_json()["error"], -32600, "invalid_request")


def test_params_as_an_array_are_32602(to_bob):
    error = to_bob.err("GetTask", [UNKNOWN_ULID], -32602, "invalid_params")
    violations(error, "params")


def test_batch_answers_each_request_in_its_own_shape(app, to_bob):
    resp = to_bob.post(
        [
            {"jsonrpc": "2.0", "id": "a", "method": "SendMessage", "params": {"message": message("batched")}},
            {"jsonrpc": "2.0", "id": "b", "method": "GetTask", "params": {"id": UNKNOWN_ULID}},
            {"jsonrpc": "2.0", "method": "SendMessage", "params": {"message": message("notified")}},  # notification
        ]
    )
    assert resp.status_code == 200
    answers = {a["id"]: a for a in resp.get_json()}
    assert set(answers) == {"a", "b"}
    assert answers["a"]["result"]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert_a2a_error(answers["b"]["error"], -32001, "thread_not_found")
    assert count(app, "threads") == 2


def test_notification_is_carried_out_and_answered_204(app, to_bob):
    resp = to_bob.post({"jsonrpc": "2.0", "method": "SendMessage", "params": {"message": message("fire and forget")}})
    assert resp.status_code == 204
    assert resp.get_data() == b""
    assert sql(app, "select summary from threads") == [("fire and forget",)]


# --------------------------------------------------------------------------- SendMessage: create


def test_send_message_opens_a_submitted_task_addressed_to_the_agent(client, to_bob, bob):
    result = to_bob.ok("SendMessage", {"message": message(BRIEF, message_id="m-open")})
    assert set(result) == {"task"}
    task = result["task"]
    assert parse_ulid(task["id"]) and len(task["id"]) == 26
    assert str(uuid.UUID(task["contextId"])) == task["contextId"]  # the UUID form
    assert task["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert task["status"]["timestamp"].endswith("Z")
    assert "message" not in task["status"]
    assert task["metadata"]["sender"]["handle"] == "alice@acme"
    assert task["metadata"]["recipient"]["handle"] == "bob@acme"
    assert task["metadata"]["intent"] == "inform"
    [first] = task["history"]
    assert first["role"] == "ROLE_USER"
    assert first["parts"] == [{"text": BRIEF}]
    assert first["taskId"] == task["id"] and first["contextId"] == task["contextId"]
    assert task["artifacts"] == []
    # The recipient sees it in its ``POST /a2a`` inbox, with the same ids.
    seen = rpc(client, bob[1], "tasks/get", {"task_id": task["id"]})
    assert seen["status"] == {"state": "pending"}
    assert seen["sender"]["handle"] == "alice@acme" and seen["summary"] == BRIEF
    assert str(parse_ulid(seen["context_id"])) == task["contextId"]
    assert seen["messages"][0]["role"] == "caller"


def test_send_message_with_task_id_appends_to_that_task(app, to_bob):
    task = to_bob.send("first")
    again = to_bob.send("second", taskId=task["id"])
    assert again["id"] == task["id"] and again["contextId"] == task["contextId"]
    assert [m["parts"] for m in again["history"]] == [[{"text": "first"}], [{"text": "second"}]]
    assert [m["metadata"]["sequenceNo"] for m in again["history"]] == [1, 2]
    assert count(app, "threads") == 1 and count(app, "messages") == 2


def test_append_accepts_the_task_id_in_its_uuid_form(to_bob):
    task = to_bob.send("first")
    again = to_bob.send("second", taskId=str(parse_ulid(task["id"])))
    assert again["id"] == task["id"] and len(again["history"]) == 2


def test_client_chosen_context_id_starts_a_context_and_a_second_send_joins_it(app, client, alice, to_bob):
    ctx = str(uuid.uuid4())
    first = to_bob.send("one", contextId=ctx)
    second = to_bob.send("two", contextId=ctx.upper())
    assert first["contextId"] == ctx and second["contextId"] == ctx
    assert first["id"] != second["id"]
    assert sql(app, "select count(distinct context_id) from threads") == [(1,)]
    assert sql(app, "select context_id::text from threads limit 1") == [(ctx,)]
    # ``POST /a2a`` shows the same context as a ULID.
    assert rpc(client, alice[1], "tasks/get", {"task_id": first["id"]})["context_id"] == format_ulid(uuid.UUID(ctx))


def test_context_id_of_other_agents_threads_is_not_joined(app, client, alice, carol, make_agent):
    dave = make_agent("dave@other", name="Dave")
    theirs = A2A(client, carol[1], dave[0]).send("carol to dave")
    body = A2A(client, alice[1], dave[0]).raw(
        "SendMessage", {"message": message("alice to dave", contextId=theirs["contextId"])}
    )
    assert "error" in body, body
    assert sql(app, "select count(*) from threads where context_id = :c", c=uuid.UUID(theirs["contextId"])) == [(1,)]


@pytest.mark.parametrize("ctx", ["not-a-uuid", "1234", "g" * 36])
def test_non_uuid_context_id_is_32602_naming_message_context_id(app, to_bob, ctx):
    to_bob.invalid("SendMessage", {"message": message(contextId=ctx)}, "message.contextId")
    assert count(app, "threads") == 0


def test_append_with_a_context_id_that_is_not_the_tasks_is_refused(app, to_bob):
    task = to_bob.send("first")
    body = to_bob.raw("SendMessage", {"message": message("second", taskId=task["id"], contextId=str(uuid.uuid4()))})
    assert "error" in body, body
    assert count(app, "messages") == 1


def test_empty_task_id_opens_a_new_task_like_an_absent_one(to_bob):
    body = to_bob.raw("SendMessage", {"message": message("hi", taskId="", contextId="")})
    assert "result" in body, body


def test_an_idempotency_key_header_answers_a_retried_send_once(app, to_bob):
    params = {"message": message("only once", message_id="m-1")}
    headers = {**bearer(to_bob.key), **VERSION, "Idempotency-Key": "retry-1"}
    first = to_bob.raw("SendMessage", params, headers)["result"]["task"]
    second = to_bob.raw("SendMessage", params, headers)["result"]["task"]
    assert second["id"] == first["id"]
    assert count(app, "threads") == 1 and count(app, "messages") == 1 and count(app, "events") == 1
    # The same key with another message is another call.
    other = to_bob.raw("SendMessage", {"message": message("another", message_id="m-1")}, headers)["result"]["task"]
    assert other["id"] != first["id"] and count(app, "threads") == 2


def test_without_the_header_a_reused_message_id_is_a_new_message_each_time(app, to_bob):
    """A2A clients (the TCK among them) send one messageId with many messages, each expecting a new task."""
    first = to_bob.send("same text", message_id="m-dup")
    again = to_bob.send("same text", message_id="m-dup")
    other = to_bob.send("other text", message_id="m-dup")
    assert len({first["id"], again["id"], other["id"]}) == 3
    assert [t["history"][0]["messageId"] for t in (first, again, other)] == ["m-dup"] * 3
    assert count(app, "threads") == 3


def test_message_ids_are_scoped_to_the_caller(client, to_bob, carol, bob):
    mine = to_bob.send("alice's", message_id="shared-id")
    theirs = A2A(client, carol[1], bob[0]).send("carol's", message_id="shared-id")
    assert theirs["id"] != mine["id"]


def test_seed_keys_may_not_use_the_a2a_prefix_so_they_never_replay_a_message_id(app, client, alice, bob, to_bob):
    refused = client.post(
        "/a2a",
        headers=bearer(alice[1]),
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {
                "recipient": bob[0],
                "message": seed_msg("same words"),
                "metadata": {"client_idempotency_key": "a2a:m-collide"},
            },
        },
    ).get_json()
    assert refused["error"]["code"] == -32602
    assert "metadata.client_idempotency_key" in refused["error"]["data"]["errors"]
    headers = {**bearer(to_bob.key), **VERSION, "Idempotency-Key": "m-collide"}
    to_bob.raw("SendMessage", {"message": message("same words", message_id="m-collide")}, headers)
    assert count(app, "threads") == 1


def test_history_keeps_the_clients_message_id(to_bob):
    task = to_bob.send("mine", message_id="client-msg-1")
    assert task["history"][0]["messageId"] == "client-msg-1"


@pytest.mark.parametrize(
    "msg, field",
    [
        ({"role": "ROLE_USER", "parts": [{"text": "x"}]}, "message.messageId"),
        ({"messageId": "", "parts": [{"text": "x"}]}, "message.messageId"),
        ({"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}, "message.role"),
        ({"messageId": "m", "parts": []}, "message.parts"),
        ({"messageId": "m", "parts": [{"text": "x", "url": "https://example.com"}]}, "message.parts.0"),
        ({"messageId": "m", "parts": [{"text": "x"}], "metadata": {"intent": "shout"}}, "message.metadata.intent"),
    ],
    ids=[
        "no-message-id",
        "empty-message-id",
        "role-agent",
        "no-parts",
        "two-contents",
        "unknown-intent",
    ],
)
def test_malformed_message_is_32602_naming_the_a2a_field(app, to_bob, msg, field):
    to_bob.invalid("SendMessage", {"message": msg}, field)
    assert count(app, "threads") == 0


def test_missing_message_is_32602(app, to_bob):
    to_bob.invalid("SendMessage", {}, "message")
    assert count(app, "threads") == 0


def test_sending_to_yourself_is_32602(app, client, alice):
    A2A(client, alice[1], alice[0]).invalid("SendMessage", {"message": message()}, "agent")
    assert count(app, "threads") == 0


def test_data_and_url_parts_become_relay_artifacts(client, to_bob, bob):
    link_url = "https://example.com/pr/42"
    task = to_bob.ok(
        "SendMessage",
        {
            "message": {
                "messageId": "m-art",
                "role": "ROLE_USER",
                "parts": [
                    {"text": "see the diff"},
                    {"data": FILE_DIFF, "mediaType": "application/json"},
                    {"url": link_url, "filename": "PR 42", "mediaType": "text/html"},
                ],
            }
        },
    )["task"]
    link = {"type": "link", "url": link_url, "title": "PR 42", "mediaType": "text/html"}
    seen = rpc(client, bob[1], "tasks/get", {"task_id": task["id"]})
    assert seen["artifacts"] == [FILE_DIFF, link]
    assert seen["messages"][0]["parts"] == [{"type": "text", "text": "see the diff"}]
    url_part = {"url": link_url, "filename": "PR 42", "mediaType": "text/html"}  # a link goes back out as a url part
    assert [a["parts"] for a in task["artifacts"]] == [
        [{"data": FILE_DIFF, "mediaType": "application/json"}],
        [url_part],
    ]
    assert [a["name"] for a in task["artifacts"]] == ["file_diff", "link"]
    assert len({a["artifactId"] for a in task["artifacts"]}) == 2
    assert task["history"][0]["parts"] == [
        {"text": "see the diff"},
        {"data": FILE_DIFF, "mediaType": "application/json"},
        url_part,
    ]


@pytest.mark.parametrize(
    "data, field",
    [
        ({"type": "file_diff", "path": "a.py"}, "message.parts.1.data.diff"),
        ({"type": "image", "url": "x"}, "message.parts.1.data"),
        ("just a string", "message.parts.1.data"),
    ],
    ids=["artifact-missing-field", "unknown-artifact-type", "not-an-object"],
)
def test_bad_data_part_is_32602_naming_its_a2a_path(app, to_bob, data, field):
    msg = {"messageId": "m", "parts": [{"text": "x"}, {"data": data}]}
    to_bob.invalid("SendMessage", {"message": msg}, field)
    assert count(app, "threads") == 0


def test_metadata_intent_and_proposed_action_open_a_relay_proposal(client, to_bob, bob):
    task = to_bob.send(
        "please switch to cursors",
        metadata={"intent": "propose_action", "proposed_action": PROPOSED, "ticket": "WEB-7"},
    )
    assert task["metadata"]["intent"] == "propose_action"
    opening = task["history"][0]["metadata"]
    stored = {**PROPOSED, "suggested_diff": None}  # MessageSendParams' default
    assert opening["intent"] == "propose_action" and opening["proposed_action"] == stored
    assert opening["ticket"] == "WEB-7"  # other metadata is kept as the message payload
    seen = rpc(client, bob[1], "tasks/get", {"task_id": task["id"]})
    assert seen["intent"] == "propose_action" and seen["proposed_action"] == stored
    assert seen["messages"][0]["payload"] == {"ticket": "WEB-7"}


def test_propose_action_without_proposed_action_is_32602_invalid_intent_payload(app, to_bob):
    error = to_bob.err(
        "SendMessage", {"message": message(metadata={"intent": "propose_action"})}, -32602, "invalid_intent_payload"
    )
    assert error["data"][0]["reason"] == "INVALID_PARAMS"
    assert count(app, "threads") == 0


def test_invalid_intent_payload_names_the_a2a_field_as_a_violation(to_bob):
    error = to_bob.err(
        "SendMessage", {"message": message(metadata={"intent": "propose_action"})}, -32602, "invalid_intent_payload"
    )
    violations(error, "message.metadata.proposed_action")


def test_intent_on_an_append_is_32602(app, to_bob):
    task = to_bob.send("first")
    to_bob.invalid(
        "SendMessage",
        {"message": message("x", taskId=task["id"], metadata={"intent": "ask_question"})},
        "message.metadata",
    )
    assert count(app, "messages") == 1


def test_blocked_sender_is_32600_teammate_blocked(app, client, to_bob, alice, bob):
    resp = client.put(f"/api/v1/identities/{bob[0]}/blocks/{alice[0]}", headers=bearer(bob[1]))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    error = to_bob.err("SendMessage", {"message": message()}, -32600, "teammate_blocked")
    assert error["data"][0]["reason"] == "INVALID_REQUEST"
    assert count(app, "threads") == 0


@pytest.mark.parametrize("end", ["complete", "cancel"])
def test_append_to_a_completed_or_cancelled_task_is_32004_thread_terminal(app, client, to_bob, bob, end):
    task = to_bob.send("first")
    if end == "complete":
        seed_update(client, bob[1], task["id"], "accept")
        seed_update(client, bob[1], task["id"], "complete", result_summary="done")
    else:
        to_bob.ok("CancelTask", {"id": task["id"]})
    error = to_bob.err("SendMessage", {"message": message("too late", taskId=task["id"])}, -32004, "thread_terminal")
    assert error["data"][0]["reason"] == "UNSUPPORTED_OPERATION"
    assert count(app, "messages") == 1


# --------------------------------------------------------------------------- task visibility


def test_unknown_task_id_is_32001_for_every_task_method(to_bob):
    to_bob.err("GetTask", {"id": UNKNOWN_ULID}, -32001, "thread_not_found")
    to_bob.err("CancelTask", {"id": UNKNOWN_ULID}, -32001, "thread_not_found")
    to_bob.err("SendMessage", {"message": message(taskId=UNKNOWN_ULID)}, -32001, "thread_not_found")
    to_bob.err(
        "CreateTaskPushNotificationConfig",
        {"taskId": UNKNOWN_ULID, "url": "http://127.0.0.1:9/h"},
        -32001,
        "thread_not_found",
    )
    to_bob.err("ListTaskPushNotificationConfigs", {"taskId": UNKNOWN_ULID}, -32001, "thread_not_found")


def test_task_of_another_pair_of_agents_is_32001(app, client, to_bob, to_carol, carol, bob):
    task = to_bob.send("alice to bob")
    carol_to_bob = A2A(client, carol[1], bob[0])
    for caller in (to_carol, carol_to_bob):  # alice at carol's endpoint; carol at bob's endpoint
        caller.err("GetTask", {"id": task["id"]}, -32001, "thread_not_found")
        caller.err("CancelTask", {"id": task["id"]}, -32001, "thread_not_found")
        caller.err("SendMessage", {"message": message("intrude", taskId=task["id"])}, -32001, "thread_not_found")
        caller.err("ListTaskPushNotificationConfigs", {"taskId": task["id"]}, -32001, "thread_not_found")
    assert count(app, "messages") == 1
    assert sql(app, "select state from threads") == [("pending",)]


def test_task_the_agent_sent_to_the_caller_is_32001_at_the_agents_endpoint(client, alice, bob, to_bob):
    created = rpc(client, bob[1], "message/send", {"recipient": alice[0], "message": seed_msg("bob to alice")})
    to_bob.err("GetTask", {"id": created["task_id"]}, -32001, "thread_not_found")
    to_bob.err("CancelTask", {"id": created["task_id"]}, -32001, "thread_not_found")
    to_bob.err("SendMessage", {"message": message("reply?", taskId=created["task_id"])}, -32001, "thread_not_found")
    assert to_bob.list()["tasks"] == []


@pytest.mark.parametrize(
    "method, params, field",
    [
        ("GetTask", {}, "id"),
        ("GetTask", {"id": UNKNOWN_ULID, "historyLength": -1}, "historyLength"),
        ("GetTask", {"id": UNKNOWN_ULID, "historyLength": "2"}, "historyLength"),
    ],
    ids=["get-no-id", "negative-history", "string-history"],
)
def test_malformed_task_id_or_history_length_is_32602(to_bob, method, params, field):
    to_bob.invalid(method, params, field)


# --------------------------------------------------------------------------- GetTask and the shared state machine


def test_get_task_history_length_keeps_the_newest_messages(to_bob):
    task = to_bob.send("one")
    to_bob.send("two", taskId=task["id"])
    to_bob.send("three", taskId=task["id"])
    texts = lambda t: [m["parts"][0]["text"] for m in t["history"]]  # noqa: E731
    assert texts(to_bob.get(task["id"])) == ["one", "two", "three"]
    assert texts(to_bob.get(task["id"], historyLength=2)) == ["two", "three"]
    assert texts(to_bob.get(task["id"], historyLength=10)) == ["one", "two", "three"]
    assert "history" not in to_bob.get(task["id"], historyLength=0)


def test_get_task_history_length_keeps_every_artifact_of_the_task(to_bob):
    task = to_bob.send("one")
    first = {
        "message": {
            "messageId": "m-art-1",
            "role": "ROLE_USER",
            "taskId": task["id"],
            "parts": [{"text": "with a diff"}, {"data": FILE_DIFF, "mediaType": "application/json"}],
        }
    }
    to_bob.ok("SendMessage", first)
    to_bob.send("three", taskId=task["id"])
    whole, newest = to_bob.get(task["id"]), to_bob.get(task["id"], historyLength=1)
    assert [m["parts"][0]["text"] for m in newest["history"]] == ["three"]
    # Only the newest message was read, but the task's artifacts are all of its messages'.
    assert newest["artifacts"] == whole["artifacts"] and len(whole["artifacts"]) == 1
    assert to_bob.get(task["id"], historyLength=2**40)["history"] == whole["history"]  # past the count: all


def test_send_message_configuration_history_length_limits_the_returned_task(to_bob):
    task = to_bob.send("one")
    result = to_bob.ok(
        "SendMessage", {"message": message("two", taskId=task["id"]), "configuration": {"historyLength": 1}}
    )
    assert [m["parts"] for m in result["task"]["history"]] == [[{"text": "two"}]]


def test_recipient_accepting_through_the_seed_dialect_is_working(client, to_bob, bob):
    task = to_bob.send()
    seed_update(client, bob[1], task["id"], "accept", session_id="sess-1")
    got = to_bob.get(task["id"])
    assert got["status"]["state"] == "TASK_STATE_WORKING"
    assert "message" not in got["status"]


def test_recipient_completing_is_completed_with_the_result_summary_as_agent_message(client, to_bob, bob):
    task = to_bob.send()
    seed_update(client, bob[1], task["id"], "accept")
    seed_update(client, bob[1], task["id"], "complete", result_summary="Client switched to cursors; tests pass.")
    status = to_bob.get(task["id"])["status"]
    assert status["state"] == "TASK_STATE_COMPLETED"
    assert status["message"]["role"] == "ROLE_AGENT"
    assert status["message"]["parts"] == [{"text": "Client switched to cursors; tests pass."}]
    assert status["message"]["taskId"] == task["id"] and status["message"]["contextId"] == task["contextId"]


def test_recipient_reply_is_role_agent_in_history(client, to_bob, bob):
    task = to_bob.send("question?")
    rpc(
        client,
        bob[1],
        "message/send",
        {"task_id": task["id"], "message": seed_msg("answer!"), "artifacts": [FILE_DIFF]},
    )
    to_bob.send("thanks", taskId=task["id"])
    history = to_bob.get(task["id"])["history"]
    assert [(m["role"], m["parts"][0]["text"]) for m in history] == [
        ("ROLE_USER", "question?"),
        ("ROLE_AGENT", "answer!"),
        ("ROLE_USER", "thanks"),
    ]
    assert history[1]["metadata"]["from"] == "bob@acme"
    assert history[1]["parts"][1] == {"data": FILE_DIFF, "mediaType": "application/json"}
    assert [a["parts"][0]["data"] for a in to_bob.get(task["id"])["artifacts"]] == [FILE_DIFF]


# --------------------------------------------------------------------------- CancelTask


def test_cancel_task_cancels_a_submitted_task(client, to_bob, alice):
    task = to_bob.send()
    cancelled = to_bob.ok("CancelTask", {"id": task["id"]})
    assert cancelled["id"] == task["id"]
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    assert to_bob.get(task["id"])["status"]["state"] == "TASK_STATE_CANCELED"
    assert rpc(client, alice[1], "tasks/get", {"task_id": task["id"]})["status"] == {"state": "cancelled"}


@pytest.mark.parametrize(
    "steps", [["accept"], ["accept", "complete"], ["cancel"]], ids=["accepted", "completed", "cancelled"]
)
def test_cancel_task_that_is_not_pending_is_32002(app, client, to_bob, bob, steps):
    task = to_bob.send()
    for step in steps:
        if step == "cancel":
            to_bob.ok("CancelTask", {"id": task["id"]})
        else:
            seed_update(client, bob[1], task["id"], step, **({"result_summary": "done"} if step == "complete" else {}))
    before = sql(app, "select state, version from threads")
    error = to_bob.err("CancelTask", {"id": task["id"]}, -32002, "invalid_transition")
    assert error["data"][0]["reason"] == "TASK_NOT_CANCELABLE"
    assert sql(app, "select state, version from threads") == before


# --------------------------------------------------------------------------- ListTasks


def test_list_tasks_shows_only_the_callers_tasks_sent_to_the_agent(client, alice, bob, carol, to_bob, to_carol):
    mine = {to_bob.send("a->b 1")["id"], to_bob.send("a->b 2")["id"]}
    to_carol.send("a->c")
    A2A(client, carol[1], bob[0]).send("c->b")
    rpc(client, bob[1], "message/send", {"recipient": alice[0], "message": seed_msg("b->a")})
    page = to_bob.list()
    assert {t["id"] for t in page["tasks"]} == mine
    assert page["totalSize"] == 2 and page["nextPageToken"] == "" and page["pageSize"] == 50
    assert all(t["metadata"]["recipient"]["handle"] == "bob@acme" for t in page["tasks"])


def test_list_tasks_is_newest_activity_first(to_bob):
    t1 = to_bob.send("one")["id"]
    t2 = to_bob.send("two")["id"]
    t3 = to_bob.send("three")["id"]
    assert [t["id"] for t in to_bob.list()["tasks"]] == [t3, t2, t1]
    to_bob.send("one again", taskId=t1)
    assert [t["id"] for t in to_bob.list()["tasks"]] == [t1, t3, t2]


def test_list_tasks_pages_return_each_task_exactly_once(to_bob):
    created = [to_bob.send(f"task {i}")["id"] for i in range(5)]
    seen, sizes, token = [], [], None
    while True:
        page = to_bob.list(pageSize=2, **({"pageToken": token} if token else {}))
        assert page["totalSize"] == 5 and page["pageSize"] == 2
        seen += [t["id"] for t in page["tasks"]]
        sizes.append(len(page["tasks"]))
        token = page["nextPageToken"]
        if not token:
            break
        assert len(sizes) < 5, "paging does not end"
    assert sizes == [2, 2, 1]
    assert seen == list(reversed(created))


def test_list_tasks_status_filter(client, to_bob, bob):
    pending = to_bob.send("stays pending")["id"]
    working = to_bob.send("gets accepted")["id"]
    done = to_bob.send("gets completed")["id"]
    cancelled = to_bob.send("gets cancelled")["id"]
    seed_update(client, bob[1], working, "accept")
    seed_update(client, bob[1], done, "accept")
    seed_update(client, bob[1], done, "complete", result_summary="ok")
    to_bob.ok("CancelTask", {"id": cancelled})
    ids = lambda state: [t["id"] for t in to_bob.list(status=state)["tasks"]]  # noqa: E731
    assert ids("TASK_STATE_SUBMITTED") == [pending]
    assert ids("TASK_STATE_WORKING") == [working]
    assert ids("TASK_STATE_COMPLETED") == [done]
    assert ids("TASK_STATE_CANCELED") == [cancelled]
    assert ids("TASK_STATE_FAILED") == []
    assert len(ids("TASK_STATE_UNSPECIFIED")) == 4
    assert to_bob.list(status="TASK_STATE_WORKING")["totalSize"] == 1
    to_bob.invalid("ListTasks", {"status": "working"}, "status")


def test_list_tasks_context_filter(to_bob):
    ctx = str(uuid.uuid4())
    in_ctx = {to_bob.send("in 1", contextId=ctx)["id"], to_bob.send("in 2", contextId=ctx)["id"]}
    other = to_bob.send("elsewhere")
    page = to_bob.list(contextId=ctx)
    assert {t["id"] for t in page["tasks"]} == in_ctx and page["totalSize"] == 2
    assert [t["id"] for t in to_bob.list(contextId=other["contextId"])["tasks"]] == [other["id"]]
    assert to_bob.list(contextId=str(uuid.uuid4()))["tasks"] == []
    assert to_bob.list(contextId="nope")["tasks"] == []  # ids are opaque: no context has that id


def test_list_tasks_omits_history_and_artifacts_unless_asked(to_bob):
    task = to_bob.ok("SendMessage", {"message": {"messageId": "m", "parts": [{"text": "one"}, {"data": FILE_DIFF}]}})[
        "task"
    ]
    to_bob.send("two", taskId=task["id"])
    [plain] = to_bob.list()["tasks"]
    assert "history" not in plain and "artifacts" not in plain
    assert plain["status"]["state"] == "TASK_STATE_SUBMITTED" and plain["contextId"] == task["contextId"]
    [full] = to_bob.list(historyLength=1, includeArtifacts=True)["tasks"]
    assert [m["parts"] for m in full["history"]] == [[{"text": "two"}]]
    assert [a["parts"][0]["data"] for a in full["artifacts"]] == [FILE_DIFF]


def test_list_tasks_status_timestamp_after(to_bob):
    to_bob.send("one")
    assert to_bob.list(statusTimestampAfter="2000-01-01T00:00:00Z")["totalSize"] == 1
    assert to_bob.list(statusTimestampAfter="2999-01-01T00:00:00Z") == {
        "tasks": [],
        "nextPageToken": "",
        "pageSize": 50,
        "totalSize": 0,
    }
    to_bob.invalid("ListTasks", {"statusTimestampAfter": "2000-01-01T00:00:00"}, "statusTimestampAfter")


def test_list_tasks_status_timestamp_after_excludes_the_boundary(to_bob):
    first = to_bob.send("first")
    second = to_bob.send("second")
    listed = to_bob.list(statusTimestampAfter=first["status"]["timestamp"])
    assert [t["id"] for t in listed["tasks"]] == [second["id"]]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"pageSize": 0}, "pageSize"),
        ({"pageSize": 101}, "pageSize"),
        ({"pageSize": "10"}, "pageSize"),
        ({"pageToken": "not-a-token"}, "pageToken"),
        ({"historyLength": -1}, "historyLength"),
        ({"includeArtifacts": "yes"}, "includeArtifacts"),
    ],
    ids=["page-size-0", "page-size-101", "page-size-string", "bad-token", "negative-history", "bool-string"],
)
def test_list_tasks_bad_params_are_32602(to_bob, params, field):
    to_bob.invalid("ListTasks", params, field)


def test_list_tasks_page_size_bounds_1_and_100_are_served(to_bob):
    to_bob.send()
    assert len(to_bob.list(pageSize=1)["tasks"]) == 1
    assert to_bob.list(pageSize=100)["pageSize"] == 100


def test_empty_page_token_means_the_first_page(to_bob):
    to_bob.send()
    assert len(to_bob.list(pageToken="")["tasks"]) == 1


# --------------------------------------------------------------------------- push notification configs


def test_push_config_create_get_list_delete(app, client, to_bob, alice):
    task = to_bob.send()
    created = to_bob.ok(
        "CreateTaskPushNotificationConfig",
        {
            "taskId": task["id"],
            "id": "cfg-1",
            "url": "http://127.0.0.1:9/a2a/push",
            "token": "tok-1",
            "authentication": {"scheme": "Bearer", "credentials": "secret-cred-42"},
        },
    )
    assert created == {
        "id": "cfg-1",
        "taskId": task["id"],
        "url": "http://127.0.0.1:9/a2a/push",
        "token": "tok-1",
        "authentication": {"scheme": "Bearer"},
    }
    assert to_bob.ok("GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "cfg-1"}) == created
    listed = to_bob.ok("ListTaskPushNotificationConfigs", {"taskId": task["id"]})
    assert listed == {"configs": [created], "nextPageToken": ""}
    assert sql(app, "select kind, push_config_id from webhook_endpoints") == [("a2a_push", "cfg-1")]
    # A push config is not one of the agent's REST webhooks.
    assert client.get(f"/api/v1/identities/{alice[0]}/webhooks", headers=bearer(alice[1])).get_json() == {"items": []}

    assert to_bob.ok("DeleteTaskPushNotificationConfig", {"taskId": task["id"], "id": "cfg-1"}) == {}
    to_bob.err("GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "cfg-1"}, -32001, "not_found")
    # Deleting is idempotent: the config is gone either way.
    assert to_bob.ok("DeleteTaskPushNotificationConfig", {"taskId": task["id"], "id": "cfg-1"}) == {}
    assert to_bob.ok("ListTaskPushNotificationConfigs", {"taskId": task["id"]})["configs"] == []
    assert count(app, "webhook_endpoints") == 0


def test_push_credentials_are_never_echoed_nor_stored_in_clear(app, to_bob):
    task = to_bob.send()
    params = {
        "taskId": task["id"],
        "url": "http://127.0.0.1:9/h",
        "token": "tok-plain-77",
        "authentication": {"scheme": "Bearer", "credentials": "cred-plain-99"},
    }
    answers = [to_bob.raw("CreateTaskPushNotificationConfig", params)]
    config_id = answers[0]["result"]["id"]
    answers.append(to_bob.raw("GetTaskPushNotificationConfig", {"taskId": task["id"], "id": config_id}))
    answers.append(to_bob.raw("ListTaskPushNotificationConfigs", {"taskId": task["id"]}))
    assert all("cred-plain-99" not in json.dumps(a) for a in answers)
    stored = sql(app, "select row_to_json(w)::text from webhook_endpoints w")[0][0]
    assert "cred-plain-99" not in stored and "tok-plain-77" not in stored


def test_push_config_without_id_gets_a_uuid(to_bob):
    task = to_bob.send()
    one = to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": "http://127.0.0.1:9/1"})
    two = to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": "http://127.0.0.1:9/2"})
    assert str(uuid.UUID(one["id"])) == one["id"] and one["id"] != two["id"]
    assert "token" not in one and "authentication" not in one
    listed = to_bob.ok("ListTaskPushNotificationConfigs", {"taskId": task["id"]})["configs"]
    assert [c["id"] for c in listed] == [one["id"], two["id"]]


def test_a_create_naming_an_id_the_task_has_replaces_that_config(app, to_bob):
    task = to_bob.send()
    other = to_bob.send("another task")
    params = {"taskId": task["id"], "id": "same", "url": "http://127.0.0.1:9/h", "token": "t-1"}
    to_bob.ok("CreateTaskPushNotificationConfig", params)
    sql(app, "UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'gone (410)'")
    replaced = to_bob.ok(
        "CreateTaskPushNotificationConfig",
        {"taskId": task["id"], "id": "same", "url": "http://127.0.0.1:9/h2", "authentication": {"scheme": "Bearer"}},
    )
    assert replaced == {
        "taskId": task["id"],
        "id": "same",
        "url": "http://127.0.0.1:9/h2",
        "authentication": {"scheme": "Bearer"},
    }
    assert to_bob.ok("ListTaskPushNotificationConfigs", {"taskId": task["id"]})["configs"] == [replaced]
    assert sql(app, "SELECT enabled, disabled_reason, token_encrypted FROM webhook_endpoints") == [(True, None, None)]
    # The id is scoped to its task.
    to_bob.ok("CreateTaskPushNotificationConfig", {**params, "taskId": other["id"]})
    assert count(app, "webhook_endpoints") == 2


@pytest.mark.parametrize(
    "params, field",
    [
        ({"url": "http://127.0.0.1:9/h"}, "taskId"),
        ({"taskId": "TASK"}, "url"),
        ({"taskId": "TASK", "url": "ftp://example.com/h"}, "url"),
        (
            {"taskId": "TASK", "url": "http://127.0.0.1:9/h", "authentication": {"credentials": "c"}},
            "authentication.scheme",
        ),
        (
            {"taskId": "TASK", "url": "http://127.0.0.1:9/h", "authentication": {"scheme": "Bad Scheme"}},
            "authentication.scheme",
        ),
    ],
    ids=["no-task-id", "no-url", "ftp-url", "no-scheme", "bad-scheme"],
)
def test_bad_push_config_is_32602(app, to_bob, params, field):
    task = to_bob.send()
    params = {k: (task["id"] if v == "TASK" else v) for k, v in params.items()}
    to_bob.invalid("CreateTaskPushNotificationConfig", params, field)
    assert count(app, "webhook_endpoints") == 0


def test_push_config_url_to_a_private_address_is_refused_unless_allowed(
    app, base_env, celery_app, redis_url, client, alice, bob
):
    task = A2A(client, alice[1], bob[0]).send()
    params = {"taskId": task["id"], "url": "http://127.0.0.1:9/hook"}
    with extra_app(
        base_env, celery_app, redis_url, RELAY_WEBHOOK_ALLOW_PRIVATE="0", RELAY_WEBHOOK_ALLOW_HTTP="1"
    ) as strict:
        error = A2A(strict.test_client(), alice[1], bob[0]).err(
            "CreateTaskPushNotificationConfig", params, -32602, "invalid_params"
        )
        assert "private" in violations(error, "url")["url"] or "loopback" in violations(error, "url")["url"]
        assert count(app, "webhook_endpoints") == 0
    # The test environment allows private targets (RELAY_WEBHOOK_ALLOW_PRIVATE=1).
    A2A(client, alice[1], bob[0]).ok("CreateTaskPushNotificationConfig", params)
    assert count(app, "webhook_endpoints") == 1


def test_a_push_url_that_does_not_resolve_is_stored_and_each_delivery_checks_it_again(
    app, client, to_bob, bob, celery_worker
):
    """A host with no address yet is taken at registration; the delivery finds it still
    unresolved, records a DNS failure and keeps the delivery pending for a retry."""
    url = "https://receiver-not-started.invalid/push"
    task = to_bob.send("push me")
    config = to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "id": "later", "url": url})
    assert config["url"] == url
    sent = to_bob.ok(
        "SendMessage", {"message": message(), "configuration": {"taskPushNotificationConfig": {"url": url}}}
    )
    assert sql(app, "SELECT count(*) FROM webhook_endpoints WHERE url = :u", u=url)[0][0] == 2
    seed_update(client, bob[1], task["id"], "accept")
    errors = wait_until(
        lambda: sql(
            app,
            "SELECT a.error FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id "
            "JOIN webhook_endpoints e ON e.id = d.endpoint_id WHERE e.url = :u AND a.error NOT LIKE 'in flight%'",
            u=url,
        ),
        what="a recorded attempt at the unresolved push URL",
    )
    assert errors[0][0] == "DNS failure: host 'receiver-not-started.invalid' does not resolve"
    assert sent["task"]["id"] != task["id"]


def test_push_config_methods_on_another_pairs_task_are_32001(client, to_bob, carol, bob):
    task = to_bob.send()
    to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1", "url": "http://127.0.0.1:9/h"})
    intruder = A2A(client, carol[1], bob[0])
    intruder.err(
        "CreateTaskPushNotificationConfig",
        {"taskId": task["id"], "url": "http://127.0.0.1:9/evil"},
        -32001,
        "thread_not_found",
    )
    intruder.err("GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1"}, -32001, "thread_not_found")
    intruder.err("DeleteTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1"}, -32001, "thread_not_found")
    assert to_bob.ok("GetTaskPushNotificationConfig", {"taskId": task["id"], "id": "c1"})["id"] == "c1"


def test_a_task_holds_at_most_ten_push_configs(app, to_bob):
    task = to_bob.send()
    for i in range(10):
        to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": f"http://127.0.0.1:9/{i}"})
    found = to_bob.invalid(
        "CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": "http://127.0.0.1:9/x"}, "taskId"
    )
    assert "10" in found["taskId"]
    assert count(app, "webhook_endpoints") == 10


def test_list_push_configs_honours_page_size(to_bob):
    task = to_bob.send()
    for i in range(3):
        to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": f"http://127.0.0.1:9/{i}"})
    page = to_bob.ok("ListTaskPushNotificationConfigs", {"taskId": task["id"], "pageSize": 1})
    assert len(page["configs"]) == 1 and page["nextPageToken"]


def test_send_message_configuration_registers_a_push_config_once(app, to_bob):
    params = {
        "message": message("with push", message_id="m-push"),
        "configuration": {
            "taskPushNotificationConfig": {"id": "inline", "url": "http://127.0.0.1:9/push", "token": "t"}
        },
    }
    headers = {**bearer(to_bob.key), **VERSION, "Idempotency-Key": "push-once"}
    task = to_bob.raw("SendMessage", params, headers)["result"]["task"]
    configs = to_bob.ok("ListTaskPushNotificationConfigs", {"taskId": task["id"]})["configs"]
    assert configs == [{"id": "inline", "taskId": task["id"], "url": "http://127.0.0.1:9/push", "token": "t"}]
    # A retry of the same send replays it: no second task, no second config.
    assert to_bob.raw("SendMessage", params, headers)["result"]["task"]["id"] == task["id"]
    assert count(app, "threads") == 1 and count(app, "webhook_endpoints") == 1


def test_refused_push_config_in_send_message_opens_no_task(app, to_bob):
    params = {"message": message(), "configuration": {"taskPushNotificationConfig": {"url": "ftp://example.com/x"}}}
    to_bob.err("SendMessage", params, -32602, "invalid_params")
    assert count(app, "threads") == 0 and count(app, "webhook_endpoints") == 0


def test_refused_push_config_in_send_message_names_its_a2a_path(to_bob):
    params = {"message": message(), "configuration": {"taskPushNotificationConfig": {"url": "ftp://example.com/x"}}}
    to_bob.invalid("SendMessage", params, "configuration.taskPushNotificationConfig.url")


def test_push_notifications_are_delivered_with_token_and_credentials(client, to_bob, bob, celery_worker):
    with Receiver() as rx:
        task = to_bob.send("please accept")
        to_bob.ok(
            "CreateTaskPushNotificationConfig",
            {
                "taskId": task["id"],
                "url": rx.url("/push"),
                "token": "tok-123",
                "authentication": {"scheme": "Bearer", "credentials": "c-9"},
            },
        )

        seed_update(client, bob[1], task["id"], "accept")
        [first] = rx.wait_for(1, timeout=20, path="/push")
        assert first.method == "POST"
        assert first.header("X-A2A-Notification-Token") == "tok-123"
        assert first.header("Authorization") == "Bearer c-9"
        assert first.header("Content-Type").startswith("application/json")
        update = json.loads(first.body)
        assert set(update) == {"statusUpdate"}
        assert update["statusUpdate"]["taskId"] == task["id"]
        assert update["statusUpdate"]["contextId"] == task["contextId"]
        assert update["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
        assert update["statusUpdate"]["metadata"] == {"transition": "accept", "from": "pending", "to": "accepted"}
        assert "message" not in update["statusUpdate"]["status"]

        rpc(client, bob[1], "message/send", {"task_id": task["id"], "message": seed_msg("on it")})
        pushes = rx.wait_for(2, timeout=20, path="/push")
        second = json.loads(pushes[1].body)
        # A reply is shaped as the task stream shapes it: a statusUpdate whose status.message holds it.
        assert set(second) == {"statusUpdate"}
        reply = second["statusUpdate"]
        assert reply["taskId"] == task["id"] and reply["contextId"] == task["contextId"]
        assert reply["status"]["state"] == "TASK_STATE_WORKING"
        assert "metadata" not in reply  # a state change carries its transition; a reply does not
        assert reply["status"]["message"]["role"] == "ROLE_AGENT"
        assert reply["status"]["message"]["taskId"] == task["id"]
        assert reply["status"]["message"]["parts"] == [{"text": "on it"}]
        assert pushes[1].header("X-A2A-Notification-Token") == "tok-123"
        assert pushes[1].header("Authorization") == "Bearer c-9"


def test_a_push_for_request_input_is_input_required_with_the_question(client, to_bob, bob, celery_worker):
    with Receiver() as rx:
        task = to_bob.send("please accept")
        to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": rx.url("/push")})
        seed_update(client, bob[1], task["id"], "accept")
        rpc(
            client,
            bob[1],
            "tasks/update",
            {"task_id": task["id"], "transition": "request_input", "question": "Staging or production?"},
        )
        pushes = rx.wait_for(2, timeout=20, path="/push")
        update = json.loads(pushes[1].body)["statusUpdate"]
        assert update["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert update["metadata"] == {"transition": "request_input", "from": "accepted", "to": "input_required"}
        message = update["status"]["message"]
        assert (message["role"], message["parts"]) == ("ROLE_AGENT", [{"text": "Staging or production?"}])


# --------------------------------------------------------------------------- unsupported methods


@pytest.mark.parametrize("method, params", [("GetExtendedAgentCard", {})])
def test_extended_card_method_is_32004(app, to_bob, method, params):
    error = to_bob.err(method, params, -32004, "unsupported_operation")
    assert error["data"][0]["reason"] == "UNSUPPORTED_OPERATION"
    assert count(app, "threads") == 0


# --------------------------------------------------------------------------- rate limit shared with POST /a2a


def test_rate_limit_budget_is_shared_with_the_seed_dialect(base_env, celery_app, redis_url, alice, bob):
    with extra_app(base_env, celery_app, redis_url, RELAY_RATE_LIMIT="4/minute") as limited:
        c = limited.test_client()
        for _ in range(2):
            resp = c.post(
                "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}}, headers=bearer(alice[1])
            )
            assert resp.status_code == 200 and "result" in resp.get_json()
        to_bob = A2A(c, alice[1], bob[0])
        to_bob.ok("ListTasks", {})
        to_bob.ok("ListTasks", {})  # the 4th call of the minute, across both dialects
        resp = to_bob.post({"jsonrpc": "2.0", "id": "over", "method": "ListTasks", "params": {}})
        assert resp.status_code == 429, resp.get_data(as_text=True)
        assert resp.headers["Retry-After"].isdigit() and 1 <= int(resp.headers["Retry-After"]) <= 60
        body = resp.get_json()
        assert body["id"] == "over"
        assert body["error"]["data"][0]["@type"] == ERROR_INFO
        assert body["error"]["data"][0]["metadata"]["symbol"] == "rate_limited"
        seed = c.post(
            "/a2a", json={"jsonrpc": "2.0", "id": 2, "method": "tasks/list", "params": {}}, headers=bearer(alice[1])
        )
        assert seed.status_code == 429
        assert seed.get_json()["error"]["code"] == -32003
        # The budget is per agent: bob still has his.
        A2A(c, bob[1], alice[0]).ok("ListTasks", {})


# --------------------------------------------------------------------------- POST /a2a is unchanged


def test_seed_dialect_keeps_its_own_codes_and_error_object(client, alice):
    resp = client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"task_id": UNKNOWN_ULID}},
        headers=bearer(alice[1]),
    )
    assert resp.status_code == 200
    error = resp.get_json()["error"]
    assert error["code"] == -32006
    assert isinstance(error["data"], dict) and error["data"]["symbol"] == "thread_not_found"
    # No A2A-Version needed there, and A2A method names are unknown to it.
    resp = client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": UNKNOWN_ULID}},
        headers=bearer(alice[1]),
    )
    assert resp.get_json()["error"]["code"] == -32601
    assert resp.get_json()["error"]["data"]["symbol"] == "method_not_found"


def test_a2a_tasks_are_the_seed_dialects_threads(client, alice, to_bob):
    task = to_bob.send("one thread, two dialects")
    sent = rpc(client, alice[1], "tasks/list", {"filter": {"role": "sender"}})["items"]
    assert [(i["task_id"], i["recipient"]["handle"], i["status"]["state"]) for i in sent] == [
        (task["id"], "bob@acme", "pending")
    ]
    appended = rpc(client, alice[1], "message/send", {"task_id": task["id"], "message": seed_msg("via seed")})
    assert appended["sequence_no"] == 2
    assert [m["role"] for m in to_bob.get(task["id"])["history"]] == ["ROLE_USER", "ROLE_USER"]


# --------------------------------------------------------------------------- odd input: never a 500


def test_status_timestamp_after_the_last_instant_is_an_empty_page(to_bob):
    to_bob.send()
    assert to_bob.list(statusTimestampAfter="9999-12-31T23:59:59.999999Z")["tasks"] == []


@pytest.mark.parametrize("kind", [["link"], {}, 7, None], ids=["list", "object", "number", "null"])
def test_data_part_whose_type_is_not_a_string_is_32602(to_bob, kind):
    to_bob.invalid(
        "SendMessage", {"message": message(parts=[{"text": "x"}, {"data": {"type": kind}}])}, "message.parts.1.data"
    )


@pytest.mark.parametrize(
    "field, config",
    [
        ("token", {"token": "a\r\nX-Evil: 1"}),
        ("token", {"token": "t\u00f6k\u20acn"}),
        ("authentication.credentials", {"authentication": {"scheme": "Bearer", "credentials": "c\nX-Evil: 1"}}),
    ],
    ids=["crlf-token", "non-ascii-token", "crlf-credentials"],
)
def test_push_token_and_credentials_must_be_sendable_as_headers(app, to_bob, field, config):
    task = to_bob.send()
    to_bob.invalid(
        "CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": "http://127.0.0.1:9/hook", **config}, field
    )
    assert sql(app, "select count(*) from webhook_endpoints")[0][0] == 0


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9/nl\nurl", "http://127.0.0.\t1:9/tab", "http://127.0.0.1:9/a b"],
    ids=["newline", "tab", "space"],
)
def test_push_url_with_whitespace_or_control_characters_is_refused(to_bob, url):
    task = to_bob.send()
    to_bob.invalid("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": url}, "url")


def test_url_part_errors_name_the_parts_own_fields(to_bob):
    bad_url = to_bob.invalid(
        "SendMessage", {"message": message(parts=[{"text": "x"}, {"url": "file:///etc/passwd"}])}, "message.parts.1.url"
    )
    assert "message.parts.1.url.url" not in bad_url
    to_bob.invalid(
        "SendMessage",
        {"message": message(parts=[{"text": "x"}, {"url": "https://x.example/a", "filename": "f" * 9000}])},
        "message.parts.1.filename",
    )


def test_parse_error_says_why(to_bob):
    resp = to_bob.client.post(
        agent_url(to_bob.handle),
        data=b'{"jsonrpc": "2.0", "id": 1,',
        headers={**bearer(to_bob.key), **VERSION, "Content-Type": "application/json"},
    )
    info = resp.get_json()["error"]["data"][0]
    assert info["metadata"]["symbol"] == "parse_error" and info["metadata"]["reason"]


def test_agent_card_varies_with_the_host_it_names(client, bob):
    resp = client.get(f"/a2a/agents/{bob[0]}/.well-known/agent-card.json", headers={"Host": "relay.example"})
    assert [i["url"] for i in resp.get_json()["supportedInterfaces"]] == [
        f"http://relay.example/a2a/agents/{bob[0]}",
        f"http://relay.example/a2a/agents/{bob[0]}/http",
    ]
    assert "Host" in resp.headers["Vary"]


# --------------------------------------------------------------------------- races (real threads, real PostgreSQL)


def _race(app, calls):
    """Run each ``call(client)`` on its own thread with its own test client, released together."""
    import threading

    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        c = app.test_client()
        barrier.wait()
        results[i] = call(c)

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_concurrent_push_configs_with_one_id_store_one(app, to_bob):
    task = to_bob.send()
    params = {"taskId": task["id"], "id": "same", "url": "http://127.0.0.1:9/hook"}
    answers = _race(
        app,
        [lambda c: A2A(c, to_bob.key, to_bob.handle).raw("CreateTaskPushNotificationConfig", params) for _ in range(4)],
    )
    assert [a.get("result", a)["id"] for a in answers] == ["same"] * 4, answers
    assert count(app, "webhook_endpoints") == 1


def test_concurrent_push_configs_never_pass_the_limit(app, to_bob):
    task = to_bob.send()
    for i in range(8):
        to_bob.ok("CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": f"http://127.0.0.1:9/{i}"})
    answers = _race(
        app,
        [
            lambda c, i=i: A2A(c, to_bob.key, to_bob.handle).raw(
                "CreateTaskPushNotificationConfig", {"taskId": task["id"], "url": f"http://127.0.0.1:9/r{i}"}
            )
            for i in range(4)
        ],
    )
    assert sum("result" in a for a in answers) == 2, answers
    assert count(app, "webhook_endpoints") == 10


def test_two_agents_adopting_one_new_context_id_do_not_share_it(app, client, alice, carol, bob):
    context = str(uuid.uuid4())
    answers = _race(
        app,
        [
            lambda c, key=key: A2A(c, key, bob[0]).raw("SendMessage", {"message": message(contextId=context)})
            for key in (alice[1], carol[1])
        ],
    )
    assert sum("result" in a for a in answers) == 1, answers
    [refused] = [a for a in answers if "error" in a]
    assert refused["error"]["code"] == -32602 and "message.contextId" in violations(refused["error"])


def test_list_tasks_history_length_keeps_the_newest_messages_of_each_task(client, to_bob, bob):
    task = to_bob.send("opening")
    to_bob.send("second", taskId=task["id"])
    to_bob.send("third", taskId=task["id"])
    [listed] = to_bob.list(historyLength=2)["tasks"]
    assert [m["parts"][0]["text"] for m in listed["history"]] == ["second", "third"]
    assert "artifacts" not in listed


def test_push_config_in_send_message_may_not_name_another_task(app, to_bob):
    other = to_bob.send("other")
    to_bob.invalid(
        "SendMessage",
        {
            "message": message(),
            "configuration": {"taskPushNotificationConfig": {"taskId": other["id"], "url": "http://127.0.0.1:9/hook"}},
        },
        "configuration.taskPushNotificationConfig.taskId",
    )
    assert count(app, "threads") == 1


def test_sending_or_cancelling_does_not_mark_the_agents_messages_read(client, to_bob, alice, bob):
    task = to_bob.send("opening")
    rpc(client, bob[1], "message/send", {"task_id": task["id"], "message": seed_msg("a question back")})
    to_bob.send("an append of mine", taskId=task["id"])  # answers with the task, but is not a read

    def unread():
        items = rpc(client, alice[1], "tasks/list", {"filter": {"role": "sender"}})["items"]
        return items[0]["unread_messages"]

    assert unread() == 1
    to_bob.get(task["id"])  # GetTask is a read, as tasks/get is
    assert unread() == 0
