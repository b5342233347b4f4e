"""A2A streaming in the v1.0 binding: ``SendStreamingMessage`` and ``SubscribeToTask`` (docs/a2a.md, "Streaming").

Against a live gunicorn + Celery worker. The stock ``a2a-sdk`` 1.3 client streams as a
client would; the recipient works the task in another thread through the relay's JSON-RPC dialect
(``POST /a2a``), one step after each event the client saw, so every update is shown to
arrive live. Plain-HTTP tests read the Server-Sent Events themselves. No assertion is
on time: every wait is bounded (a read timeout, a count of heartbeats, ``asyncio.timeout``)
and fails naming what did not arrive.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import requests
from a2a.types.a2a_pb2 import (
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import UnsupportedOperationError

from tests import a2a_helpers as helpers
from tests.a2a_helpers import REPLY, RESULT, Event, Recipient, next_step, seed, sse_events
from tests.conftest import (
    bearer,
    connections_named,
    post_a2a,
    rpc_answer,
    rpc_doc,
    slots_in,
    sql,
    wait_until,
    with_application_name,
)
from tests.live import claimed_redis_db, live_relay

pytestmark = [pytest.mark.timeout(240)]

HEARTBEAT = "1"  # seconds: heartbeats, the slow re-read and the re-authentication tick
CAP = 3  # RELAY_STREAMS_PER_AGENT
MAX_HEARTBEATS = 30  # heartbeats a read skips before it fails: about 30 s at HEARTBEAT
APP_NAME = "relay-live-a2a-streams"
VERSION = {"A2A-Version": "1.0"}
LIVE_REDIS: list[str] = []


@pytest.fixture(scope="module")
def live(base_env):
    env = with_application_name(base_env, APP_NAME)  # so the tests can count the relay's own connections
    with (
        claimed_redis_db(base_env["REDIS_URL"]) as broker,
        live_relay(env, RELAY_STREAM_HEARTBEAT=HEARTBEAT, RELAY_STREAMS_PER_AGENT=str(CAP), REDIS_URL=broker) as base,
    ):
        LIVE_REDIS[:] = [broker]
        yield base


@pytest.fixture
def pair(make_agent, live, settled):
    """``(alice, alice_key, bob, bob_key)``: alice (the A2A client) hands work to bob."""
    a, a_key = make_agent("alice@acme")
    b, b_key = make_agent("bob@acme")
    return a, a_key, b, b_key


# --------------------------------------------------------------------------- helpers


def a2a_message(text: str, **extra) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}


def open_task(base: str, handle: str, key: str, text: str = "please adopt the new /users shape") -> dict:
    """SendMessage (not streamed): a new task; returns it."""
    body = rpc_answer(base, key, "SendMessage", {"message": a2a_message(text)}, agent=handle, id="plain")
    assert "result" in body, body
    return body["result"]["task"]


def slots_held(app, handle: str) -> int:
    """How many waits and streams ``handle`` holds now, across web processes (its slots in Redis)."""
    return slots_in(app, LIVE_REDIS[0], handle)


class RpcStream:
    """One streaming A2A call over plain HTTP (``POST`` with ``Accept: text/event-stream``)."""

    def __init__(self, base: str, handle: str, key: str, method: str, params: dict, headers: dict | None = None):
        self.request_id = f"stream-{uuid.uuid4()}"
        self.response = post_a2a(
            base,
            key,
            rpc_doc(method, params, id=self.request_id),
            agent=handle,
            headers={"Accept": "text/event-stream", **(headers or {})},
            stream=True,
            timeout=(5, 20),
        )
        self._events = sse_events(self.response)

    @property
    def is_stream(self) -> bool:
        return self.response.headers.get("Content-Type", "").startswith("text/event-stream")

    def _response(self, event: Event) -> dict:
        doc = json.loads(event.data)
        assert doc["jsonrpc"] == "2.0" and doc["id"] == self.request_id, doc
        return doc

    def next(self) -> dict:
        """The next JSON-RPC response of the stream (heartbeats skipped, at most MAX_HEARTBEATS)."""
        beats = 0
        for event in self._events:
            if event.kind == "comment":
                beats += 1
                assert beats <= MAX_HEARTBEATS, f"no event within {MAX_HEARTBEATS} heartbeats"
                continue
            return self._response(event)
        raise AssertionError("the stream ended before the next event")

    def heartbeat(self) -> None:
        """Read up to the next heartbeat comment; any other event before it fails."""
        for event in self._events:
            assert event.kind == "comment", event
            if event.data == "heartbeat":
                return
        raise AssertionError("the stream ended before a heartbeat")

    def result(self) -> dict:
        """The next event, which must be a result (a StreamResponse)."""
        doc = self.next()
        assert "result" in doc, doc
        return doc["result"]

    def rest(self) -> list[tuple[str, dict]]:
        """Every event to the end of the stream as ``(kind, response)``; fails if it does not end
        within MAX_HEARTBEATS heartbeats of the last event."""
        out, beats = [], 0
        for event in self._events:
            if event.kind == "comment":
                beats += 1
                assert beats <= MAX_HEARTBEATS, f"the stream had not ended {MAX_HEARTBEATS} heartbeats after {out}"
                continue
            out.append((event.kind, self._response(event)))
            beats = 0
        return out

    def close(self) -> None:
        self.response.close()


def state_of(result: dict) -> str:
    return (result.get("task") or result.get("statusUpdate"))["status"]["state"]


def sdk_client(base: str, handle: str, key: str):
    """The stock SDK client, streaming (its default), built from the agent's card."""
    return helpers.sdk_client(base, handle, key, streaming=True)


# --------------------------------------------------------------------------- the SDK client


def test_sdk_streaming_send_follows_the_task_to_completion(live, pair):
    a, a_key, b, b_key = pair
    bob = Recipient(live, b_key)

    async def scenario():
        events, task_id = [], None
        async with sdk_client(live, b, a_key) as client, asyncio.timeout(60):
            request = SendMessageRequest(
                message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text="adopt /users")])
            )
            async for event in client.send_message(request):  # ends when the relay ends the stream
                events.append(event)
                task_id = task_id or event.task.id
                step = next_step(task_id, len(events))
                if step is not None:
                    bob.steps.put(step)  # the recipient's next step only once this event arrived
        return events

    events = asyncio.run(scenario())
    bob.stop()
    assert [e.WhichOneof("payload") for e in events] == ["task", "status_update", "status_update", "status_update"]
    task, accepted, reply, completed = events
    assert task.task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert [m.role for m in task.task.history] == [Role.ROLE_USER]
    assert accepted.status_update.task_id == task.task.id
    assert accepted.status_update.context_id == task.task.context_id
    assert accepted.status_update.status.state == TaskState.TASK_STATE_WORKING
    assert reply.status_update.status.state == TaskState.TASK_STATE_WORKING
    assert reply.status_update.status.message.role == Role.ROLE_AGENT
    assert reply.status_update.status.message.parts[0].text == REPLY
    assert completed.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert completed.status_update.status.message.parts[0].text == RESULT


def test_sdk_subscribe_to_an_existing_task_starts_with_its_current_state(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    seed(live, b_key, "tasks/update", {"task_id": task["id"], "transition": "accept"})
    bob = Recipient(live, b_key)

    async def scenario():
        events = []
        async with sdk_client(live, b, a_key) as client, asyncio.timeout(60):
            async for event in client.subscribe(SubscribeToTaskRequest(id=task["id"])):
                events.append(event)
                if len(events) == 1:
                    bob.steps.put(next_step(task["id"], 3))  # complete
        return events

    events = asyncio.run(scenario())
    bob.stop()
    first, last = events
    assert first.task.id == task["id"]
    assert first.task.status.state == TaskState.TASK_STATE_WORKING
    assert [m.parts[0].text for m in first.task.history] == ["please adopt the new /users shape"]
    assert last.status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_sdk_subscribe_to_a_terminal_task_is_unsupported_operation(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    assert "result" in rpc_answer(live, a_key, "CancelTask", {"id": task["id"]}, agent=b, id="plain")

    async def scenario():
        async with sdk_client(live, b, a_key) as client:
            with pytest.raises(UnsupportedOperationError) as info:
                async for _ in client.subscribe(SubscribeToTaskRequest(id=task["id"])):
                    pass
            assert info.value.data["symbol"] == "unsupported_operation"
            assert info.value.data["state"] == "TASK_STATE_CANCELED"

    asyncio.run(scenario())


# --------------------------------------------------------------------------- the stream's events


def test_every_event_is_a_json_rpc_response_with_the_request_id(live, pair):
    a, a_key, b, b_key = pair
    stream = RpcStream(live, b, a_key, "SendStreamingMessage", {"message": a2a_message("streamed")})
    assert stream.response.status_code == 200
    assert stream.is_stream, stream.response.headers
    first = stream.result()  # RpcStream checks jsonrpc and id on each
    assert first["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    seed(live, b_key, "tasks/update", {"task_id": first["task"]["id"], "transition": "accept"})
    update = stream.result()["statusUpdate"]
    assert update["status"]["state"] == "TASK_STATE_WORKING"
    assert update["metadata"] == {"transition": "accept", "from": "pending", "to": "accepted"}
    stream.close()


def test_a_streamed_message_to_an_open_task_streams_that_task(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    more = a2a_message("and the /orders shape too", taskId=task["id"])
    stream = RpcStream(live, b, a_key, "SendStreamingMessage", {"message": more, "configuration": {"historyLength": 1}})
    first = stream.result()["task"]
    assert first["id"] == task["id"]
    assert [m["messageId"] for m in first["history"]] == [more["messageId"]]  # historyLength 1: the newest
    seed(live, b_key, "tasks/update", {"task_id": task["id"], "transition": "accept"})
    assert state_of(stream.result()) == "TASK_STATE_WORKING"
    stream.close()


def test_the_stream_sends_heartbeat_comments(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    for _ in range(2):
        stream.heartbeat()  # nothing happened to the task: comments only
    stream.close()


def test_the_stream_ends_after_a_terminal_state(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    assert "result" in rpc_answer(live, a_key, "CancelTask", {"id": task["id"]}, agent=b, id="plain")
    rest = stream.rest()  # to the end of the stream
    assert [(kind, state_of(doc["result"])) for kind, doc in rest] == [("data", "TASK_STATE_CANCELED")]


def test_the_callers_own_messages_are_not_echoed(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    mine = rpc_answer(
        live, a_key, "SendMessage", {"message": a2a_message("one more thing", taskId=task["id"])}, agent=b, id="plain"
    )
    assert "result" in mine, mine
    seed(live, b_key, "message/send", {"task_id": task["id"], "message": {"parts": [{"type": "text", "text": "ok"}]}})
    # Had the client's message been echoed it would come first: it committed first.
    update = stream.result()["statusUpdate"]
    assert update["status"]["message"]["role"] == "ROLE_AGENT"
    assert update["status"]["message"]["parts"] == [{"text": "ok"}]
    assert update["status"]["state"] == "TASK_STATE_SUBMITTED"  # a reply before accepting
    stream.close()


def test_a_reply_with_an_artifact_is_a_status_message_then_an_artifact_update(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    diff = {"type": "file_diff", "path": "web/src/api/users.ts", "diff": "@@ -1 +1 @@\n-a\n+b"}
    sent = seed(
        live,
        b_key,
        "message/send",
        {"task_id": task["id"], "message": {"parts": [{"type": "text", "text": "patch"}]}, "artifacts": [diff]},
    )
    status = stream.result()["statusUpdate"]["status"]
    assert status["message"]["parts"] == [{"text": "patch"}, {"data": diff, "mediaType": "application/json"}]
    artifact = stream.result()["artifactUpdate"]
    assert artifact["taskId"] == task["id"] and artifact["lastChunk"] is True
    assert artifact["artifact"]["artifactId"] == f"{sent['message_id']}:0"
    assert artifact["artifact"]["parts"] == [{"data": diff, "mediaType": "application/json"}]
    # The same artifact GetTask lists.
    got = rpc_answer(live, a_key, "GetTask", {"id": task["id"]}, agent=b, id="plain")["result"]
    assert got["artifacts"] == [artifact["artifact"]]
    stream.close()


# --------------------------------------------------------------------------- refusals before the stream


@pytest.mark.parametrize(
    "method, params, code, symbol",
    [
        ("SendStreamingMessage", {"message": {"messageId": "m-1", "parts": []}}, -32602, "invalid_params"),
        ("SubscribeToTask", {}, -32602, "invalid_params"),
        ("SubscribeToTask", {"id": "not-a-task-id"}, -32001, "thread_not_found"),  # ids are opaque
        ("SubscribeToTask", {"id": "01HXYZ4K2VNJQP7R8MWDB3CSTF"}, -32001, "thread_not_found"),
        (
            "SendStreamingMessage",
            {"message": a2a_message("x", taskId="01HXYZ4K2VNJQP7R8MWDB3CSTF")},
            -32001,
            "thread_not_found",
        ),
        ("SendStreamingMessage", {"message": a2a_message("x", taskId="terminal")}, -32004, "thread_terminal"),
        ("SubscribeToTask", {"id": "terminal"}, -32004, "unsupported_operation"),
    ],
)
def test_refusals_before_the_stream_are_json_rpc_errors(app, live, pair, method, params, code, symbol):
    a, a_key, b, b_key = pair
    done = open_task(live, b, a_key)
    assert "result" in rpc_answer(live, a_key, "CancelTask", {"id": done["id"]}, agent=b, id="plain")
    params = json.loads(json.dumps(params).replace('"terminal"', json.dumps(done["id"])))
    stream = RpcStream(live, b, a_key, method, params)
    assert stream.response.status_code == 200
    assert stream.response.headers["Content-Type"].startswith("application/json"), stream.response.headers
    error = stream.response.json()["error"]
    assert error["code"] == code, error
    assert error["data"][0]["metadata"]["symbol"] == symbol, error
    assert slots_held(app, a) == 0  # a refused stream gives its slot back


def test_a_streaming_method_in_a_batch_is_invalid_request(app, live, pair):
    a, a_key, b, b_key = pair
    resp = requests.post(
        f"{live}/a2a/agents/{b}",
        headers={**bearer(a_key), **VERSION},
        json=[{"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": a2a_message("x")}}],
        timeout=30,
    )
    answers = resp.json()
    assert isinstance(answers, list) and len(answers) == 1, (resp.status_code, answers)
    assert answers[0]["error"]["code"] == -32600, answers
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == 0  # nothing was sent


# --------------------------------------------------------------------------- the cap, revocation, connections


def test_streams_count_against_the_per_agent_cap_with_the_feeds(app, live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    streams = [RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]}) for _ in range(CAP - 1)]
    for s in streams:
        s.result()
    feed = requests.get(
        f"{live}/api/v1/identities/{a}/a2a/messages/stream", headers=bearer(a_key), stream=True, timeout=(5, 20)
    )
    assert feed.status_code == 200
    wait_until(lambda: slots_held(app, a) == CAP, what=f"{a} holding {CAP} slots")
    threads_before = sql(app, "SELECT count(*) FROM threads")[0][0]
    for method, params in (
        ("SendStreamingMessage", {"message": a2a_message("over")}),
        ("SubscribeToTask", {"id": task["id"]}),
    ):
        over = RpcStream(live, b, a_key, method, params)
        assert not over.is_stream, over.response.headers
        error = over.response.json()["error"]
        assert error["code"] == -32600 and error["data"][0]["metadata"]["symbol"] == "rate_limited", error
        assert int(error["data"][0]["metadata"]["retry_after"]) >= 1
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == threads_before  # the refused send sent nothing
    streams.pop().close()
    wait_until(lambda: slots_held(app, a) == CAP - 1, what="the closed stream's slot given back")
    again = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    assert again.result()["task"]["id"] == task["id"]
    for s in [*streams, again]:
        s.close()
    feed.close()


def test_a_revoked_key_ends_its_stream_with_an_error(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    keys = requests.get(f"{live}/api/v1/identities/{a}/keys", headers=bearer(a_key), timeout=30).json()["items"]
    revoked = requests.delete(
        f"{live}/api/v1/identities/{a}/keys/{keys[0]['key_id']}", headers=bearer(a_key), timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    rest = stream.rest()  # to the end of the stream
    assert [kind for kind, _ in rest] == ["error"], rest
    error = rest[0][1]["error"]
    assert error["code"] == -32600 and error["data"][0]["metadata"]["symbol"] == "unauthenticated", error


def test_waiting_streams_hold_no_database_connection(app, live, make_agent, settled, pooler):
    # Each of the two web processes' pools holds at most pool size + overflow connections:
    # streams that kept theirs while waiting would starve the ones opened after they ran out.
    settings = app.config["RELAY"]
    pool_capacity = 2 * (settings.db_pool_size + settings.db_max_overflow)
    b, b_key = make_agent("bob@acme")
    callers = [make_agent(f"c{i}@acme") for i in range(pool_capacity // CAP + 1)]
    tasks = {handle: open_task(live, b, key)["id"] for handle, key in callers}
    streams = [
        (handle, RpcStream(live, b, key, "SubscribeToTask", {"id": tasks[handle]}))
        for handle, key in callers
        for _ in range(CAP)
    ]
    assert len(streams) > pool_capacity
    for _, stream in streams:
        assert stream.result()["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    for _, stream in streams:  # each has been through a tick (a re-read, a re-authentication) and waits again
        stream.heartbeat()
    connections = connections_named(app, pooler, APP_NAME)
    assert connections <= pool_capacity
    for task_id in tasks.values():
        seed(live, b_key, "tasks/update", {"task_id": task_id, "transition": "accept"})
    for handle, stream in streams:
        update = stream.result()["statusUpdate"]
        assert (update["taskId"], update["status"]["state"]) == (tasks[handle], "TASK_STATE_WORKING")
        stream.close()


@pytest.mark.parametrize("back", ["release", "lease_expired"])
def test_a_task_stream_names_the_way_back_to_pending_as_the_audit_trail_does(live, pair, app, back):
    """accepted -> pending is a release or a lapsed lease; the stream says which."""
    from relay.ids import parse_ulid
    from relay.services import threads
    from tests.conftest import sql

    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    token = seed(live, b_key, "tasks/update", {"task_id": task["id"], "transition": "accept", "lease_seconds": 60})[
        "lease_token"
    ]
    assert stream.result()["statusUpdate"]["metadata"]["transition"] == "accept"
    if back == "release":
        seed(live, b_key, "tasks/update", {"task_id": task["id"], "transition": "release", "lease_token": token})
    else:
        sql(
            app,
            "UPDATE threads SET lease_expires_at = now() - interval '1 second' WHERE id = :id",
            id=parse_ulid(task["id"]),
        )
        with app.app_context():
            assert threads.settle_due() == 1
    update = stream.result()["statusUpdate"]
    assert update["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert update["metadata"] == {"transition": back, "from": "accepted", "to": "pending"}
    stream.close()


def test_a_task_stream_shows_input_required_with_the_question(live, pair):
    a, a_key, b, b_key = pair
    task = open_task(live, b, a_key)
    stream = RpcStream(live, b, a_key, "SubscribeToTask", {"id": task["id"]})
    stream.result()
    seed(live, b_key, "tasks/update", {"task_id": task["id"], "transition": "accept"})
    assert stream.result()["statusUpdate"]["metadata"]["transition"] == "accept"
    question = "Which region should it run in?"
    seed(live, b_key, "tasks/update", {"task_id": task["id"], "transition": "request_input", "question": question})
    update = stream.result()["statusUpdate"]
    assert update["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert update["metadata"] == {"transition": "request_input", "from": "accepted", "to": "input_required"}
    message = update["status"]["message"]
    assert (message["role"], message["parts"], message["metadata"]) == (
        "ROLE_AGENT",
        [{"text": question}],
        {"question": True},
    )
    stream.close()


def test_a_re_read_finds_the_way_back_from_input_required():
    from relay.services.task_streams import path

    assert path("input_required", "accepted") == [("input_provided", "input_required", "accepted")]
    assert path("input_required", "completed") == [("complete", "input_required", "completed")]
    assert path("pending", "input_required") == [
        ("accept", "pending", "accepted"),
        ("request_input", "accepted", "input_required"),
    ]
