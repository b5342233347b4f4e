"""The A2A bindings' rules that A2A's own compatibility kit (a2a-tck) checks, on both bindings.

Opaque ids (an id the relay never issued is TaskNotFound; an unknown contextId filter
matches nothing), proto3 JSON names in both spellings (any other member is an error naming
it), raw parts and non-JSON bodies (ContentTypeNotSupported), trailing slashes, the cards'
validators (ETag, Last-Modified, 304), the relay card's interfaces, and blocking sends
(a stock client's default send waits for the task to settle, up to the bound, holding no
database connection). ``python -m bench tck`` runs the kit itself (docs/a2a.md).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import requests
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageConfiguration, SendMessageRequest, TaskState

from relay.agent.client import RelayClient
from tests.a2a_helpers import run
from tests.conftest import bearer, connections_named, post_a2a, rpc_doc, with_application_name
from tests.live import live_relay

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("settled")]

VERSION = {"A2A-Version": "1.0"}
BINDINGS = ("jsonrpc", "http_json")
BOUND = 3.0  # RELAY_A2A_BLOCKING_SECONDS of this module's relay: under a2a-sdk's default 5 s read timeout
UNKNOWN_ID = "tck-nonexistent-7f3a"
APP_NAME = "relay-a2a-blocking"


@pytest.fixture(scope="module")
def relay_url(base_env):
    with live_relay(
        with_application_name(base_env, APP_NAME),
        # The worker's connections under another name: only the web process's are counted.
        worker_env={
            k: v
            for k, v in with_application_name(base_env, APP_NAME + "-worker").items()
            if k in ("DATABASE_URL", "DATABASE_CONNECTION_POOL_URL")
        },
        RELAY_A2A_BLOCKING_SECONDS=str(BOUND),
        # One process with one pooled connection: a waiting send that kept it would hold up
        # every other request of the relay.
        WEB_CONCURRENCY="1",
        RELAY_DB_POOL_SIZE="1",
        RELAY_DB_MAX_OVERFLOW="0",
    ) as url:
        yield url


@pytest.fixture
def pair(make_agent):
    """``(caller handle, caller key, target handle, target key)``."""
    suffix = uuid.uuid4().hex[:6]
    a, a_key = make_agent(f"a{suffix}@tck")
    b, b_key = make_agent(f"b{suffix}@tck")
    return a, a_key, b, b_key


# --------------------------------------------------------------------------- calls on either binding

# A2A method -> (HTTP verb, path under /http with {id}/{taskId}/{configId}, where the params go)
HTTP_ROUTES = {
    "SendMessage": ("POST", "/message:send", "body"),
    "GetTask": ("GET", "/tasks/{id}", "query"),
    "ListTasks": ("GET", "/tasks", "query"),
    "CancelTask": ("POST", "/tasks/{id}:cancel", "body"),
    "SubscribeToTask": ("POST", "/tasks/{id}:subscribe", None),
    "CreateTaskPushNotificationConfig": ("POST", "/tasks/{taskId}/pushNotificationConfigs", "body"),
    "GetTaskPushNotificationConfig": ("GET", "/tasks/{taskId}/pushNotificationConfigs/{id}", None),
    "ListTaskPushNotificationConfigs": ("GET", "/tasks/{taskId}/pushNotificationConfigs", "query"),
    "DeleteTaskPushNotificationConfig": ("DELETE", "/tasks/{taskId}/pushNotificationConfigs/{id}", None),
}


class Answer:
    """One binding's answer, read the same way on both: ``result``, or the error's A2A reason,
    its fields in violation and (JSON-RPC) its code or (HTTP+JSON) its status."""

    def __init__(self, binding: str, resp: requests.Response):
        self.binding, self.resp = binding, resp
        body = resp.json()
        if binding == "jsonrpc":
            assert resp.status_code == 200, (resp.status_code, resp.text)
            self.result = body.get("result")
            error = body.get("error")
            self.code = error["code"] if error else None
            details = error["data"] if error else []
        else:
            self.result = body if resp.ok else None
            self.code = resp.status_code
            details = [] if resp.ok else body["error"]["details"]
        self.reason = next((d["reason"] for d in details if d["@type"].endswith("ErrorInfo")), None)
        self.fields = {
            v["field"]: v["description"]
            for d in details
            if d["@type"].endswith("BadRequest")
            for v in d["fieldViolations"]
        }

    def __repr__(self) -> str:
        return f"Answer({self.binding}, {self.resp.status_code}, {self.resp.text[:500]})"


def binding_call(relay_url: str, binding: str, handle: str, key: str, method: str, params: dict, **kw) -> Answer:
    """Call ``method`` on ``binding`` with ``params`` as A2A's JSON names them."""
    if binding == "jsonrpc":
        return Answer(binding, post_a2a(relay_url, key, rpc_doc(method, params), agent=handle, **kw))
    headers = {**bearer(key), **VERSION}
    verb, path, source = HTTP_ROUTES[method]
    rest = dict(params)
    for name in ("id", "taskId"):
        if "{" + name + "}" in path:
            path = path.replace("{" + name + "}", rest.pop(name))
    query = rest if source == "query" else None
    body = rest if source == "body" else None
    resp = requests.request(
        verb,
        f"{relay_url}/a2a/agents/{handle}/http{path}",
        params=query,
        json=body,
        headers=headers,
        timeout=30,
        **kw,
    )
    return Answer(binding, resp)


NOT_FOUND = {"jsonrpc": -32001, "http_json": 404}
INVALID = {"jsonrpc": -32602, "http_json": 400}
CONTENT_TYPE = {"jsonrpc": -32005, "http_json": 415}


def text_message(text: str = "hello", **extra) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}


def open_task(relay_url: str, a_key: str, b: str) -> dict:
    answer = binding_call(
        relay_url,
        "jsonrpc",
        b,
        a_key,
        "SendMessage",
        {"message": text_message(), "configuration": {"returnImmediately": True}},
    )
    assert answer.result, answer
    return answer.result["task"]


# --------------------------------------------------------------------------- opaque ids


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    "method, params",
    [
        ("GetTask", {"id": UNKNOWN_ID}),
        ("CancelTask", {"id": UNKNOWN_ID}),
        ("SubscribeToTask", {"id": UNKNOWN_ID}),
        ("CreateTaskPushNotificationConfig", {"taskId": UNKNOWN_ID, "url": "https://hooks.example/a2a"}),
        ("GetTaskPushNotificationConfig", {"taskId": UNKNOWN_ID, "id": "c-1"}),
        ("ListTaskPushNotificationConfigs", {"taskId": UNKNOWN_ID}),
        ("DeleteTaskPushNotificationConfig", {"taskId": UNKNOWN_ID, "id": "c-1"}),
        ("SendMessage", {"message": text_message(taskId=UNKNOWN_ID)}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_an_id_the_relay_never_issued_is_task_not_found(relay_url, pair, binding, method, params):
    _a, a_key, b, _ = pair
    answer = binding_call(relay_url, binding, b, a_key, method, params)
    assert (answer.code, answer.reason) == (NOT_FOUND[binding], "TASK_NOT_FOUND"), answer


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("context", ["tck-unknown-context", str(uuid.uuid4())], ids=["any-string", "unused-uuid"])
def test_an_unknown_context_filter_matches_nothing(relay_url, pair, binding, context):
    _a, a_key, b, _ = pair
    open_task(relay_url, a_key, b)
    answer = binding_call(relay_url, binding, b, a_key, "ListTasks", {"contextId": context})
    assert answer.result is not None, answer
    assert answer.result["tasks"] == [] and answer.result["totalSize"] == 0


# --------------------------------------------------------------------------- proto3 JSON names


@pytest.mark.parametrize("binding", BINDINGS)
def test_snake_case_names_are_read_as_their_camel_case(relay_url, pair, binding):
    _a, a_key, b, _ = pair
    message = text_message()
    sent = binding_call(
        relay_url,
        binding,
        b,
        a_key,
        "SendMessage",
        {
            "message": {"message_id": message["messageId"], "role": "ROLE_USER", "parts": message["parts"]},
            "configuration": {"return_immediately": True, "history_length": 0},
        },
    )
    assert sent.result and "history" not in sent.result["task"], sent  # history_length 0 was read
    assert sent.resp.elapsed.total_seconds() < BOUND  # return_immediately was read
    open_task(relay_url, a_key, b)
    listed = binding_call(
        relay_url,
        binding,
        b,
        a_key,
        "ListTasks",
        {"page_size": 1, "include_artifacts": "true" if binding == "http_json" else True},
    )
    assert listed.result and len(listed.result["tasks"]) == 1 and listed.result["pageSize"] == 1, listed
    got = binding_call(relay_url, binding, b, a_key, "GetTask", {"id": sent.result["task"]["id"], "history_length": 1})
    assert got.result and len(got.result["history"]) == 1, got


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    "method, params, field",
    [
        ("ListTasks", {"pageSiz": 5}, "pageSiz"),
        ("ListTasks", {"pageSize": 5, "page_size": 5}, "page_size"),
        ("SendMessage", {"message": text_message(colour="blue")}, "message.colour"),
    ],
    ids=["unknown", "both-spellings", "nested-unknown"],
)
def test_a_member_known_in_neither_spelling_is_an_error_naming_it(relay_url, pair, binding, method, params, field):
    _a, a_key, b, _ = pair
    answer = binding_call(relay_url, binding, b, a_key, method, params)
    assert (answer.code, answer.reason) == (INVALID[binding], "INVALID_PARAMS"), answer
    assert field in answer.fields, answer


# --------------------------------------------------------------------------- content types


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_raw_part_is_content_type_not_supported(app, relay_url, pair, binding):
    _a, a_key, b, _ = pair
    message = text_message(parts=[{"raw": "dGNr", "mediaType": "application/x-unsupported"}])
    answer = binding_call(relay_url, binding, b, a_key, "SendMessage", {"message": message})
    assert (answer.code, answer.reason) == (CONTENT_TYPE[binding], "CONTENT_TYPE_NOT_SUPPORTED"), answer


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_body_not_declared_as_json_is_content_type_not_supported(relay_url, pair, binding):
    _a, a_key, b, _ = pair
    url = f"{relay_url}/a2a/agents/{b}" + ("/http/message:send" if binding == "http_json" else "")
    body = {"message": text_message()}
    if binding == "jsonrpc":
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": body}
    resp = requests.post(
        url,
        data=json.dumps(body),
        headers={**bearer(a_key), **VERSION, "Content-Type": "text/plain"},
        timeout=30,
    )
    answer = Answer(binding, resp)
    assert (answer.code, answer.reason) == (CONTENT_TYPE[binding], "CONTENT_TYPE_NOT_SUPPORTED"), answer


# --------------------------------------------------------------------------- URLs and cards


@pytest.mark.parametrize("binding", BINDINGS)
def test_the_binding_urls_take_a_trailing_slash(relay_url, pair, binding):
    _a, a_key, b, _ = pair
    task = open_task(relay_url, a_key, b)
    headers = {**bearer(a_key), **VERSION}
    if binding == "jsonrpc":
        resp = requests.post(
            f"{relay_url}/a2a/agents/{b}/",
            json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task["id"]}},
            headers=headers,
            timeout=30,
        )
        assert resp.status_code == 200 and resp.json()["result"]["id"] == task["id"], resp.text
    else:
        resp = requests.get(f"{relay_url}/a2a/agents/{b}/http/tasks/{task['id']}/", headers=headers, timeout=30)
        assert resp.status_code == 200 and resp.json()["id"] == task["id"], resp.text


@pytest.mark.parametrize("which", ["agent", "relay"])
def test_cards_carry_validators_and_answer_a_conditional_get_with_304(relay_url, pair, which):
    _a, _ak, b, _ = pair
    url = (
        f"{relay_url}/a2a/agents/{b}/.well-known/agent-card.json"
        if which == "agent"
        else f"{relay_url}/.well-known/agent-card.json"
    )
    first = requests.get(url, timeout=30)
    assert first.status_code == 200
    etag, modified = first.headers.get("ETag"), first.headers.get("Last-Modified")
    assert etag and modified, first.headers
    assert requests.get(url, headers={"If-None-Match": etag}, timeout=30).status_code == 304
    assert requests.get(url, headers={"If-Modified-Since": modified}, timeout=30).status_code == 304
    assert requests.get(url, headers={"If-None-Match": '"another"'}, timeout=30).status_code == 200
    again = requests.get(url, timeout=30)
    assert again.headers["ETag"] == etag  # the same card, though its ES256 signature differs each time


def test_the_relay_card_lists_its_own_interface(relay_url):
    card = requests.get(f"{relay_url}/.well-known/agent-card.json", timeout=30).json()
    assert card["supportedInterfaces"] == [
        {"url": f"{relay_url}/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}
    ]


# --------------------------------------------------------------------------- blocking sends


async def _stock_send(relay_url: str, handle: str, key: str, text: str, binding: str, **config) -> tuple[object, float]:
    """A stock a2a-sdk client's send, as its defaults make it (non-streaming; httpx's 5 s read
    timeout): the task it answers, and the seconds it took."""
    async with httpx.AsyncClient(headers=bearer(key)) as http:  # httpx's default timeout: 5 s
        factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http, supported_protocol_bindings=[binding]))
        client = await factory.create_from_url(f"{relay_url}/a2a/agents/{handle}")
        try:
            request = SendMessageRequest(
                message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)]),
                **({"configuration": SendMessageConfiguration(**config)} if config else {}),
            )
            started = time.monotonic()
            events = [event async for event in client.send_message(request)]
            took = time.monotonic() - started
        finally:
            await client.close()
    assert len(events) == 1 and events[0].HasField("task"), events
    return events[0].task, took


class Worker(threading.Thread):
    """The target agent through relay.client: accepts and completes the first handoff it is sent."""

    def __init__(self, relay_url: str, key: str):
        super().__init__(daemon=True)
        self.client = RelayClient(relay_url, key, timeout=30)
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.start()

    def run(self):
        try:
            since = datetime.now(UTC) - timedelta(seconds=5)  # before the send: nothing is missed
            self.ready.set()
            rows = []
            deadline = time.monotonic() + 30
            while not rows and time.monotonic() < deadline:
                rows = self.client.wait(since=since, timeout=10, direction="inbound", role="caller")
            assert rows, "no handoff arrived within 30 s"
            self.client.accept(rows[0].task_id)
            self.client.complete(rows[0].task_id, "done")
        except BaseException as exc:  # reported by finish()
            self.error = exc
        finally:
            self.ready.set()

    def finish(self):
        self.join(40)
        assert not self.is_alive() and self.error is None, self.error
        self.client.close()


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_a_stock_clients_default_send_returns_completed_once_the_work_is_done(relay_url, pair, binding):
    _a, a_key, b, b_key = pair
    worker = Worker(relay_url, b_key)
    assert worker.ready.wait(30)
    task, took = run(_stock_send(relay_url, b, a_key, "please do it", binding))
    worker.finish()
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    assert took < BOUND + 1


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_past_the_bound_a_blocking_send_returns_the_task_as_it_stands(relay_url, pair, binding):
    _a, a_key, b, _ = pair  # nobody works the task
    task, took = run(_stock_send(relay_url, b, a_key, "nobody takes this", binding))
    assert task.status.state == TaskState.TASK_STATE_SUBMITTED, task
    assert BOUND - 0.2 <= took < BOUND + 1.5, took


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
def test_return_immediately_answers_submitted_at_once(relay_url, pair, binding):
    _a, a_key, b, _ = pair
    task, took = run(_stock_send(relay_url, b, a_key, "no wait", binding, return_immediately=True))
    assert task.status.state == TaskState.TASK_STATE_SUBMITTED, task
    assert took < 1.5, took


def test_a_waiting_send_holds_no_database_connection(app, relay_url, pair, pooler):
    _a, a_key, b, _ = pair
    task = open_task(relay_url, a_key, b)
    done: list[float] = []

    def blocking_send():
        answer = binding_call(relay_url, "jsonrpc", b, a_key, "SendMessage", {"message": text_message("wait for me")})
        assert answer.result, answer
        done.append(time.monotonic())

    started = time.monotonic()
    senders = [threading.Thread(target=blocking_send) for _ in range(3)]
    for sender in senders:
        sender.start()
    time.sleep(1.0)  # all three are waiting now
    assert not done
    # The relay's one process has one pooled connection: a waiting send that kept it would
    # hold up this read until the bound, and the database would show it busy.
    assert connections_named(app, pooler, APP_NAME) <= 1
    read = binding_call(relay_url, "jsonrpc", b, a_key, "GetTask", {"id": task["id"]})
    assert read.result and read.resp.elapsed.total_seconds() < 1.0, read
    for sender in senders:
        sender.join(30)
    assert len(done) == 3 and max(done) - started < BOUND + 1.5  # side by side, not one after another
