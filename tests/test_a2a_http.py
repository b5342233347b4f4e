"""A2A v1.0's HTTP+JSON binding (spec §11) at ``/a2a/agents/{handle}/http``, against a live relay.

The stock ``a2a-sdk`` client, configured with ``supported_protocol_bindings=["HTTP+JSON"]``,
picks the card's HTTP+JSON interface and drives every operation over REST paths; the
recipient works through the relay's JSON-RPC dialect (``POST /a2a``). Plain-HTTP tests check the statuses and the
``google.rpc.Status`` bodies themselves, and that each data line of a stream is a bare
StreamResponse. A few error paths that need a broken database or a tiny budget run
in-process on the test app.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg2
import pytest
import requests
from a2a.client.transports.rest import RestTransport
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)

from tests.a2a_helpers import (
    HTTP_JSON,
    REPLY,
    RESULT,
    Recipient,
    next_step,
    run,
    sdk_client,
    seed,
    send_text,
    sse_events,
)
from tests.conftest import bearer, extra_app
from tests.live import live_relay

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("settled")]

VERSION = {"A2A-Version": "1.0"}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"


@pytest.fixture(scope="module")
def relay_url(base_env):
    """A live relay whose streams beat every second, so a stream's end is seen quickly."""
    with live_relay(base_env, RELAY_STREAM_HEARTBEAT="1") as url:
        yield url


def http_client(relay_url: str, handle: str, key: str, **kw):
    """The SDK client over HTTP+JSON (and a check that it really is)."""
    return sdk_client(relay_url, handle, key, binding=HTTP_JSON, **kw)


def base_of(relay_url: str, handle: str) -> str:
    return f"{relay_url}/a2a/agents/{handle}/http"


def http_call(relay_url: str, handle: str, key: str | None, verb: str, path: str, **kw) -> requests.Response:
    """One plain HTTP call of the binding (bearer key and A2A-Version unless overridden)."""
    headers = {**(bearer(key) if key else {}), **VERSION, **kw.pop("headers", {})}
    return requests.request(verb, base_of(relay_url, handle) + path, headers=headers, timeout=30, **kw)


def error_of(resp: requests.Response, status: int, grpc: str, reason: str, symbol: str) -> dict:
    """Check a google.rpc.Status error body; return its ``error``."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["Content-Type"].startswith("application/json"), resp.headers  # AIP-193 errors
    error = resp.json()["error"]
    assert error["code"] == status and error["status"] == grpc, error
    assert isinstance(error["message"], str) and error["message"]
    info = error["details"][0]
    assert info["@type"] == ERROR_INFO and info["domain"] == "a2a-protocol.org", info
    assert info["reason"] == reason and info["metadata"]["symbol"] == symbol, info
    return error


def violations(error: dict) -> dict[str, str]:
    [bad] = [d for d in error["details"] if d["@type"] == BAD_REQUEST]
    return {v["field"]: v["description"] for v in bad["fieldViolations"]}


def a2a_message(text: str, **extra) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}


def open_task(relay_url: str, handle: str, key: str, text: str = "adopt the /users shape") -> dict:
    resp = http_call(relay_url, handle, key, "POST", "/message:send", json={"message": a2a_message(text)})
    assert resp.status_code == 200, resp.text
    return resp.json()["task"]


# --------------------------------------------------------------------------- the card


def test_the_card_lists_both_bindings_and_the_sdk_picks_http_json(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    card = requests.get(f"{relay_url}/a2a/agents/{bob}/.well-known/agent-card.json", timeout=10).json()
    assert card["supportedInterfaces"] == [
        {"url": f"{relay_url}/a2a/agents/{bob}", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": f"{relay_url}/a2a/agents/{bob}/http", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ]

    async def scenario():
        async with http_client(relay_url, bob, alice_key) as client:
            assert isinstance(client._transport, RestTransport)
            assert client._transport.url == base_of(relay_url, bob)

    run(scenario())


# --------------------------------------------------------------------------- the SDK over HTTP+JSON


def test_sdk_send_and_get_follow_the_task(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, bob_key = make_agent("bob@http", name="Bob")

    async def scenario():
        async with http_client(relay_url, bob, alice_key) as client:
            task = await send_text(client, "Refactored /users; please adopt the paginated shape.")
            assert task.status.state == TaskState.TASK_STATE_SUBMITTED
            assert [m.role for m in task.history] == [Role.ROLE_USER]
            seed(relay_url, bob_key, "tasks/update", {"task_id": task.id, "transition": "accept"})
            seed(
                relay_url,
                bob_key,
                "message/send",
                {"task_id": task.id, "message": {"parts": [{"type": "text", "text": REPLY}]}},
            )
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_WORKING
            assert [m.role for m in got.history] == [Role.ROLE_USER, Role.ROLE_AGENT]
            newest = await client.get_task(GetTaskRequest(id=task.id, history_length=1))  # ?historyLength=1
            assert [m.parts[0].text for m in newest.history] == [REPLY]
            assert got.context_id == task.context_id

    run(scenario())


def test_sdk_list_filters_and_pages(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")

    async def scenario():
        async with http_client(relay_url, bob, alice_key) as client:
            sent = [(await send_text(client, f"task {i}")).id for i in range(5)]
            for task_id in sent[:2]:
                await client.cancel_task(CancelTaskRequest(id=task_id))
            cancelled = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_CANCELED))
            assert sorted(t.id for t in cancelled.tasks) == sorted(sent[:2]) and cancelled.total_size == 2
            submitted = await client.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_SUBMITTED, page_size=2))
            assert submitted.total_size == 3 and len(submitted.tasks) == 2
            seen, token, pages = [], "", 0
            while True:
                page = await client.list_tasks(ListTasksRequest(page_size=2, page_token=token))
                pages += 1
                assert page.total_size == 5 and page.page_size == 2
                seen += [t.id for t in page.tasks]
                token = page.next_page_token
                if not token:
                    break
            assert pages == 3 and sorted(seen) == sorted(sent) and len(set(seen)) == 5

    run(scenario())


def test_sdk_cancel_then_not_cancelable(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")

    async def scenario():
        async with http_client(relay_url, bob, alice_key) as client:
            task = await send_text(client, "never mind soon")
            cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert cancelled.id == task.id and cancelled.status.state == TaskState.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError) as info:
                await client.cancel_task(CancelTaskRequest(id=task.id))
            assert info.value.data["symbol"] == "invalid_transition"

    run(scenario())


def test_sdk_streaming_send_follows_the_task_to_completion(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, bob_key = make_agent("bob@http")
    recipient = Recipient(relay_url, bob_key)

    async def scenario():
        events, task_id = [], None
        async with http_client(relay_url, bob, alice_key, streaming=True) as client, asyncio.timeout(60):
            request = SendMessageRequest(
                message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text="adopt /users")])
            )
            async for event in client.send_message(request):  # POST .../http/message:stream
                events.append(event)
                task_id = task_id or event.task.id
                step = next_step(task_id, len(events))
                if step is not None:
                    recipient.steps.put(step)
        return events

    events = run(scenario())
    recipient.stop()
    assert [e.WhichOneof("payload") for e in events] == ["task", "status_update", "status_update", "status_update"]
    task, accepted, reply, completed = events
    assert task.task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert accepted.status_update.status.state == TaskState.TASK_STATE_WORKING
    assert reply.status_update.status.message.parts[0].text == REPLY
    assert completed.status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert completed.status_update.status.message.parts[0].text == RESULT


def test_sdk_subscribe_starts_with_the_task_and_ends_at_its_end(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, bob_key = make_agent("bob@http")
    task = open_task(relay_url, bob, alice_key)
    seed(relay_url, bob_key, "tasks/update", {"task_id": task["id"], "transition": "accept"})
    recipient = Recipient(relay_url, bob_key)

    async def scenario():
        events = []
        async with http_client(relay_url, bob, alice_key, streaming=True) as client, asyncio.timeout(60):
            async for event in client.subscribe(SubscribeToTaskRequest(id=task["id"])):  # POST tasks/{id}:subscribe
                events.append(event)
                if len(events) == 1:
                    recipient.steps.put(next_step(task["id"], 3))  # complete
            # A finished task has nothing to subscribe to: refused before any stream.
            with pytest.raises(UnsupportedOperationError) as info:
                async for _ in client.subscribe(SubscribeToTaskRequest(id=task["id"])):
                    pass
            assert info.value.data["state"] == "TASK_STATE_COMPLETED"
        return events

    events = run(scenario())
    recipient.stop()
    first, last = events
    assert first.task.id == task["id"] and first.task.status.state == TaskState.TASK_STATE_WORKING
    assert last.status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_sdk_push_config_create_get_list_delete(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")

    async def scenario():
        async with http_client(relay_url, bob, alice_key) as client:
            task = await send_text(client, "tell me when you start")
            made = [
                await client.create_task_push_notification_config(
                    TaskPushNotificationConfig(task_id=task.id, url=f"http://127.0.0.1:9/push-{i}", token=f"tok-{i}")
                )
                for i in range(3)
            ]
            assert all(c.task_id == task.id and c.id for c in made)
            got = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task.id, id=made[1].id)
            )
            assert got.url == "http://127.0.0.1:9/push-1" and got.token == "tok-1"
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id, page_size=2)
            )
            assert [c.id for c in listed.configs] == [c.id for c in made[:2]] and listed.next_page_token
            rest = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task.id, page_size=2, page_token=listed.next_page_token)
            )
            assert [c.id for c in rest.configs] == [made[2].id] and not rest.next_page_token
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task.id, id=made[1].id)
            )
            with pytest.raises(TaskNotFoundError) as info:
                await client.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id=task.id, id=made[1].id)
                )
            assert info.value.data["symbol"] == "not_found"

    run(scenario())


def test_sdk_raises_its_own_errors(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")

    async def scenario():
        async with http_client(relay_url, bob, alice_key) as client:
            with pytest.raises(TaskNotFoundError) as info:
                await client.get_task(GetTaskRequest(id=str(uuid.uuid4())))
            assert info.value.data["symbol"] == "thread_not_found"
            with pytest.raises(InvalidParamsError) as info:
                await client.list_tasks(ListTasksRequest(page_size=500))
            assert info.value.data["symbol"] == "invalid_params"
        async with http_client(relay_url, bob, "ah_live_not-a-key") as stranger:
            with pytest.raises(InvalidRequestError) as info:
                await stranger.get_task(GetTaskRequest(id=str(uuid.uuid4())))
            assert info.value.data["symbol"] == "unauthenticated"
        # The factory sets A2A-Version only when the caller has not: an old client says 0.3.
        async with http_client(relay_url, bob, alice_key, **{"A2A-Version": "0.3"}) as old:
            with pytest.raises(VersionNotSupportedError):
                await old.get_task(GetTaskRequest(id=str(uuid.uuid4())))

    run(scenario())


# --------------------------------------------------------------------------- plain HTTP: statuses and bodies


def test_plain_send_get_cancel_bodies_are_the_a2a_objects(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    task = open_task(relay_url, bob, alice_key)
    got = http_call(relay_url, bob, alice_key, "GET", f"/tasks/{task['id']}", params={"historyLength": "0"})
    assert got.status_code == 200 and got.headers["Content-Type"].startswith("application/json")
    body = got.json()
    assert body["id"] == task["id"] and body["status"]["state"] == "TASK_STATE_SUBMITTED" and "history" not in body
    # A cancel with no body at all: the path names the task.
    cancelled = http_call(relay_url, bob, alice_key, "POST", f"/tasks/{task['id']}:cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"]["state"] == "TASK_STATE_CANCELED"
    again = http_call(relay_url, bob, alice_key, "POST", f"/tasks/{task['id']}:cancel", json={"id": task["id"]})
    error = error_of(again, 400, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE", "invalid_transition")
    assert error["details"][0]["metadata"]["state"] == "cancelled"


def test_plain_unknown_task_is_404_task_not_found(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    for verb, path in (("GET", "/tasks/{id}"), ("POST", "/tasks/{id}:cancel"), ("POST", "/tasks/{id}:subscribe")):
        resp = http_call(relay_url, bob, alice_key, verb, path.format(id=uuid.uuid4()))
        error_of(resp, 404, "NOT_FOUND", "TASK_NOT_FOUND", "thread_not_found")


def test_plain_bad_params_are_400_naming_the_field(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    cases = [
        ("GET", "/tasks", {"params": {"pageSize": "abc"}}, "pageSize"),
        ("GET", "/tasks", {"params": {"pageSize": "0"}}, "pageSize"),
        ("GET", "/tasks", {"params": {"status": "TASK_STATE_RUNNING"}}, "status"),
        ("GET", "/tasks", {"params": {"includeArtifacts": "yes"}}, "includeArtifacts"),
        ("GET", f"/tasks/{uuid.uuid4()}", {"params": {"historyLength": "-1"}}, "historyLength"),
        ("POST", "/message:send", {"json": {"message": {"messageId": "m-1", "parts": []}}}, "message.parts"),
        ("POST", "/message:send", {"json": {}}, "message"),
        ("POST", "/message:stream", {"json": {"message": a2a_message("x", contextId="nope")}}, "message.contextId"),
    ]
    for verb, path, kw, field in cases:
        resp = http_call(relay_url, bob, alice_key, verb, path, **kw)
        error = error_of(resp, 400, "INVALID_ARGUMENT", "INVALID_PARAMS", "invalid_params")
        assert field in violations(error), (path, kw, error)


def test_plain_bodies_that_are_not_json_objects_are_400(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    headers = {"Content-Type": "application/json"}
    resp = http_call(relay_url, bob, alice_key, "POST", "/message:send", data=b'{"message":', headers=headers)
    error_of(resp, 400, "INVALID_ARGUMENT", "PARSE_ERROR", "parse_error")
    resp = http_call(relay_url, bob, alice_key, "POST", "/message:send", data=b"[1, 2]", headers=headers)
    error_of(resp, 400, "INVALID_ARGUMENT", "INVALID_REQUEST", "invalid_request")


def test_plain_no_key_is_401_and_a_bad_version_400(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    resp = http_call(relay_url, bob, None, "GET", "/tasks")
    error_of(resp, 401, "UNAUTHENTICATED", "INVALID_REQUEST", "unauthenticated")
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    for version in ("0.3", "2.0", "x"):
        resp = http_call(relay_url, bob, alice_key, "GET", "/tasks", headers={"A2A-Version": version})
        error = error_of(resp, 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED", "version_not_supported")
        assert error["details"][0]["metadata"]["supported"] == "1.0"
    resp = requests.get(base_of(relay_url, bob) + "/tasks", headers=bearer(alice_key), timeout=10)  # no header: 0.3
    error_of(resp, 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED", "version_not_supported")
    assert http_call(relay_url, bob, alice_key, "GET", "/tasks", headers={"A2A-Version": "1.0.3"}).status_code == 200


def test_plain_unknown_paths_404_and_wrong_verbs_405_in_json(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    for path in ("", "/", "/nope", "/message:sned", "/tasks/x:pause", "/tasks/x/y", "/acme/message:send"):
        resp = http_call(relay_url, bob, alice_key, "POST", path, json={})
        error_of(resp, 404, "NOT_FOUND", "METHOD_NOT_FOUND", "method_not_found")
    for verb, path, allow in (
        ("GET", "/message:send", "POST"),
        ("DELETE", "/tasks", "GET"),
        ("PUT", "/tasks/x/pushNotificationConfigs", "POST, GET"),
        ("POST", "/tasks/x/pushNotificationConfigs/y", "GET, DELETE"),
    ):
        resp = http_call(relay_url, bob, alice_key, verb, path, json={})
        error_of(resp, 405, "UNIMPLEMENTED", "METHOD_NOT_FOUND", "method_not_found")
        assert resp.headers["Allow"] == allow
    resp = http_call(relay_url, "nobody@http", alice_key, "GET", "/tasks")
    error_of(resp, 404, "NOT_FOUND", "INVALID_REQUEST", "recipient_not_found")
    resp = http_call(relay_url, bob, alice_key, "GET", "/extendedAgentCard")
    error_of(resp, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", "unsupported_operation")


def test_plain_a_blocked_send_keeps_the_relays_status(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, bob_key = make_agent("bob@http")
    message = a2a_message("once")
    retry = {"Idempotency-Key": "send-once"}
    first = http_call(relay_url, bob, alice_key, "POST", "/message:send", json={"message": message}, headers=retry)
    assert first.status_code == 200
    replayed = http_call(relay_url, bob, alice_key, "POST", "/message:send", json={"message": message}, headers=retry)
    assert replayed.json()["task"]["id"] == first.json()["task"]["id"]  # the header makes a retry one call
    other = {**message, "parts": [{"text": "another"}]}
    resp = http_call(relay_url, bob, alice_key, "POST", "/message:send", json={"message": other}, headers=retry)
    assert resp.status_code == 200 and resp.json()["task"]["id"] != first.json()["task"]["id"]  # another message


def test_plain_stream_data_lines_are_bare_stream_responses(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    resp = http_call(
        relay_url,
        bob,
        alice_key,
        "POST",
        "/message:stream",
        json={"message": a2a_message("streamed")},
        headers={"Accept": "text/event-stream"},
        stream=True,
    )
    try:
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(resp)
        first = json.loads(next(e for e in events if e.kind != "comment").data)
        assert set(first) == {"task"}, first  # not a JSON-RPC envelope
        task_id = first["task"]["id"]
        http_call(relay_url, bob, alice_key, "POST", f"/tasks/{task_id}:cancel")
        rest = [e for e in events if e.kind != "comment"]
        assert [e.kind for e in rest] == ["data"]
        update = json.loads(rest[0].data)
        assert set(update) == {"statusUpdate"} and update["statusUpdate"]["status"]["state"] == "TASK_STATE_CANCELED"
    finally:
        resp.close()


def test_plain_a_refused_stream_is_a_json_error_not_a_stream(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    task = open_task(relay_url, bob, alice_key)
    http_call(relay_url, bob, alice_key, "POST", f"/tasks/{task['id']}:cancel")
    resp = http_call(
        relay_url, bob, alice_key, "POST", f"/tasks/{task['id']}:subscribe", headers={"Accept": "text/event-stream"}
    )
    error_of(resp, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", "unsupported_operation")
    more = a2a_message("more", taskId=task["id"])
    resp = http_call(relay_url, bob, alice_key, "POST", "/message:stream", json={"message": more})
    error_of(resp, 400, "FAILED_PRECONDITION", "UNSUPPORTED_OPERATION", "thread_terminal")


def test_plain_push_config_paths(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    task = open_task(relay_url, bob, alice_key)
    configs = f"/tasks/{task['id']}/pushNotificationConfigs"
    made = http_call(relay_url, bob, alice_key, "POST", configs, json={"url": "http://127.0.0.1:9/p", "id": "mine"})
    assert made.status_code == 200, made.text
    assert made.json()["id"] == "mine" and made.json()["taskId"] == task["id"]
    assert [c["id"] for c in http_call(relay_url, bob, alice_key, "GET", configs).json()["configs"]] == ["mine"]
    bad = http_call(relay_url, bob, alice_key, "POST", configs, json={"url": "not a url"})
    assert "url" in violations(error_of(bad, 400, "INVALID_ARGUMENT", "INVALID_PARAMS", "invalid_params"))
    gone = http_call(relay_url, bob, alice_key, "DELETE", f"{configs}/mine")
    assert gone.status_code == 200 and gone.json() == {}
    again = http_call(relay_url, bob, alice_key, "DELETE", f"{configs}/mine")  # idempotent
    assert again.status_code == 200 and again.json() == {}
    error_of(
        http_call(relay_url, bob, alice_key, "GET", f"{configs}/mine"), 404, "NOT_FOUND", "TASK_NOT_FOUND", "not_found"
    )
    other = http_call(relay_url, bob, alice_key, "GET", f"/tasks/{uuid.uuid4()}/pushNotificationConfigs")
    error_of(other, 404, "NOT_FOUND", "TASK_NOT_FOUND", "thread_not_found")


def test_plain_only_the_callers_tasks_to_that_agent_exist(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    carol, carol_key = make_agent("carol@http")
    task = open_task(relay_url, bob, alice_key)
    # Carol is no participant (told only that there is no such task); and alice's task to bob
    # does not exist at carol's endpoint.
    error_of(
        http_call(relay_url, bob, carol_key, "GET", f"/tasks/{task['id']}"),
        404,
        "NOT_FOUND",
        "TASK_NOT_FOUND",
        "thread_not_found",
    )
    resp = http_call(relay_url, carol, alice_key, "GET", f"/tasks/{task['id']}")
    assert resp.status_code == 404 and resp.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
    assert http_call(relay_url, bob, carol_key, "GET", "/tasks").json()["tasks"] == []


# --------------------------------------------------------------------------- in process: budgets and outages


def test_the_rate_limit_is_the_a2a_budget_shared_with_json_rpc(base_env, celery_app, redis_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    with extra_app(base_env, celery_app, redis_url, RELAY_RATE_LIMIT="3/minute") as app:
        client = app.test_client()
        headers = {**bearer(alice_key), **VERSION}
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
        for _ in range(2):
            assert client.post(f"/a2a/agents/{bob}", json=rpc, headers=headers).status_code == 200
        assert client.get(f"/a2a/agents/{bob}/http/tasks", headers=headers).status_code == 200
        resp = client.get(f"/a2a/agents/{bob}/http/tasks", headers=headers)
        assert resp.status_code == 429
        assert int(resp.headers["Retry-After"]) >= 1
        error = resp.get_json()["error"]
        assert error["code"] == 429 and error["status"] == "RESOURCE_EXHAUSTED"
        info = error["details"][0]
        assert info["reason"] == "INVALID_REQUEST" and info["metadata"]["symbol"] == "rate_limited"
        assert int(info["metadata"]["retry_after"]) >= 1


def test_an_outage_is_503_with_retry_after_and_a_bug_500(app, client, make_agent, monkeypatch):
    from relay.transport import a2a

    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    headers = {**bearer(alice_key), **VERSION}

    def unreachable(*args, **kwargs):
        raise psycopg2.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(a2a.threads, "get_thread", unreachable)
    resp = client.get(f"/a2a/agents/{bob}/http/tasks/{uuid.uuid4()}", headers=headers)
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    error = resp.get_json()["error"]
    assert error["status"] == "UNAVAILABLE" and error["details"][0]["metadata"]["symbol"] == "service_unavailable"

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(a2a.threads, "get_thread", bug)
    resp = client.get(f"/a2a/agents/{bob}/http/tasks/{uuid.uuid4()}", headers=headers)
    assert resp.status_code == 500
    error = resp.get_json()["error"]
    assert error["status"] == "INTERNAL" and error["details"][0]["reason"] == "INTERNAL_ERROR"
    assert error["details"][0]["metadata"]["request_id"]


def test_a_body_over_the_limit_is_413(base_env, celery_app, redis_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    with extra_app(base_env, celery_app, redis_url, RELAY_MAX_BODY_BYTES="2000") as app:
        resp = app.test_client().post(
            f"/a2a/agents/{bob}/http/message:send",
            json={"message": a2a_message("x" * 5000)},
            headers={**bearer(alice_key), **VERSION},
        )
        assert resp.status_code == 413
        info = resp.get_json()["error"]["details"][0]
        assert info["metadata"]["symbol"] == "payload_too_large" and info["metadata"]["limit_bytes"] == "2000"


def test_plain_a_revoked_key_ends_the_stream_with_a_status_error_event(relay_url, make_agent):
    alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    task = open_task(relay_url, bob, alice_key)
    resp = http_call(relay_url, bob, alice_key, "POST", f"/tasks/{task['id']}:subscribe", stream=True)
    try:
        events = sse_events(resp)
        first = next(e for e in events if e.kind != "comment")
        assert json.loads(first.data)["task"]["id"] == task["id"]
        keys = requests.get(f"{relay_url}/api/v1/identities/{alice}/keys", headers=bearer(alice_key), timeout=30)
        key_id = keys.json()["items"][0]["key_id"]
        revoked = requests.delete(
            f"{relay_url}/api/v1/identities/{alice}/keys/{key_id}", headers=bearer(alice_key), timeout=30
        )
        assert revoked.status_code == 200, revoked.text
        rest = [e for e in events if e.kind != "comment"]  # ends within a heartbeat (1 s here)
        assert [e.kind for e in rest] == ["error"], rest
        error = json.loads(rest[0].data)["error"]  # google.rpc.Status, as a2a-sdk's REST transport parses it
        assert error["code"] == 401 and error["status"] == "UNAUTHENTICATED"
        assert error["details"][0]["reason"] == "INVALID_REQUEST"
        assert error["details"][0]["metadata"]["symbol"] == "unauthenticated"
    finally:
        resp.close()


def test_plain_the_path_names_the_task_whatever_the_body_says(relay_url, make_agent):
    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    one, other = open_task(relay_url, bob, alice_key), open_task(relay_url, bob, alice_key)
    resp = http_call(relay_url, bob, alice_key, "POST", f"/tasks/{one['id']}:cancel", json={"id": other["id"]})
    assert resp.status_code == 200 and resp.json()["id"] == one["id"]
    still = http_call(relay_url, bob, alice_key, "GET", f"/tasks/{other['id']}").json()
    assert still["status"]["state"] == "TASK_STATE_SUBMITTED"
    configs = f"/tasks/{one['id']}/pushNotificationConfigs"
    made = http_call(
        relay_url, bob, alice_key, "POST", configs, json={"taskId": other["id"], "url": "http://127.0.0.1:9/p"}
    )
    assert made.status_code == 200 and made.json()["taskId"] == one["id"]


def test_plain_a_disabled_agents_tasks_are_still_read_and_cancelled(app, relay_url, make_agent):
    from relay.services.agents import disable_agent

    _alice, alice_key = make_agent("alice@http")
    bob, _ = make_agent("bob@http")
    task = open_task(relay_url, bob, alice_key)
    with app.app_context():
        disable_agent(bob)
    assert http_call(relay_url, bob, alice_key, "GET", f"/tasks/{task['id']}").status_code == 200
    assert http_call(relay_url, bob, alice_key, "POST", f"/tasks/{task['id']}:cancel").status_code == 200
    resp = http_call(relay_url, bob, alice_key, "POST", "/message:send", json={"message": a2a_message("new work")})
    error_of(resp, 404, "NOT_FOUND", "INVALID_REQUEST", "recipient_not_found")
