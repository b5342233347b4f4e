"""Not-found errors name a task id as the caller sent it (relay.ids.SentId / as_sent).

A thread id is accepted as a 26-character ULID or as a UUID; a well-formed id of no
thread (or of no thread the caller may see) is echoed in the caller's own form on the
relay's JSON-RPC dialect (``POST /a2a``), REST and the A2A binding, not converted to the ULID form.
"""

from __future__ import annotations

import uuid

import pytest
from ulid import ULID

from tests.conftest import bearer, rpc, rpc_error

UNKNOWN = ULID.from_str("01HXYZ4K2VNJQP7R8MWDB3CSTF")
# Every form but the canonical one, which the relay would print anyway.
FORMS = {
    "uuid": str(UNKNOWN.to_uuid()),
    "uuid-upper": str(UNKNOWN.to_uuid()).upper(),
    "uuid-hex": UNKNOWN.to_uuid().hex,
    "ulid-lower": str(UNKNOWN).lower(),
}
SENT = pytest.mark.parametrize("sent", list(FORMS.values()), ids=list(FORMS))
MESSAGE = {"role": "user", "parts": [{"type": "text", "text": "please review"}]}


def _a2a_message(**extra):
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "please review"}], **extra}


# --------------------------------------------------------------------------- POST /a2a


@SENT
def test_jsonrpc_thread_not_found_names_the_id_as_sent(client, alice, sent):
    _handle, key = alice
    calls = [
        ("tasks/get", {"task_id": sent}),
        ("tasks/cancel", {"task_id": sent}),
        ("tasks/update", {"task_id": sent, "transition": "accept"}),
        ("message/send", {"task_id": sent, "message": MESSAGE}),
    ]
    for method, params in calls:
        error = rpc_error(client, key, method, params)
        assert error["code"] == -32006 and error["data"]["symbol"] == "thread_not_found", (method, error)
        assert error["message"] == f"no thread {sent}", (method, error)


def test_jsonrpc_id_with_surrounding_space_is_echoed_without_it(client, alice):
    error = rpc_error(client, alice[1], "tasks/get", {"task_id": f"  {FORMS['uuid']} "})
    assert error["message"] == f"no thread {FORMS['uuid']}", error


# --------------------------------------------------------------------------- REST


@SENT
def test_rest_thread_not_found_names_the_id_as_sent(client, alice, sent):
    handle, key = alice
    base = f"/api/v1/identities/{handle}/a2a/tasks/{sent}"
    answers = [
        client.get(base, headers=bearer(key)),
        client.get(f"{base}/audit", headers=bearer(key)),
        client.post(f"{base}/messages", json={"message": {"parts": MESSAGE["parts"]}}, headers=bearer(key)),
        client.post(f"{base}/transitions", json={"transition": "accept"}, headers=bearer(key)),
    ]
    for resp in answers:
        assert resp.status_code == 404, resp.get_data(as_text=True)
        error = resp.get_json()["error"]
        assert error["code"] == "thread_not_found", error
        assert error["message"] == f"no thread {sent}", (resp.request.path, error)


# --------------------------------------------------------------------------- A2A binding


@SENT
def test_a2a_task_not_found_names_the_id_as_sent(client, alice, bob, sent):
    _handle, key = alice
    calls = [
        ("GetTask", {"id": sent}),
        ("CancelTask", {"id": sent}),
        ("SendMessage", {"message": _a2a_message(taskId=sent)}),
        ("ListTaskPushNotificationConfigs", {"taskId": sent}),
        ("GetTaskPushNotificationConfig", {"taskId": sent, "id": "cfg-1"}),
    ]
    for method, params in calls:
        error = rpc_error(client, key, method, params, agent=bob[0])
        assert error["code"] == -32001, (method, error)
        assert error["data"][0]["metadata"]["symbol"] == "thread_not_found", (method, error)
        assert f"no thread {sent}" in error["message"], (method, error)


def test_a2a_task_of_another_pair_is_named_as_sent(client, alice, bob, make_agent):
    created = rpc(client, alice[1], "message/send", {"recipient": bob[0], "message": MESSAGE})
    as_uuid = str(ULID.from_str(created["task_id"]).to_uuid())
    carol, _key = make_agent("carol@acme")
    # alice at carol's endpoint: the alice->bob task does not exist there.
    error = rpc_error(client, alice[1], "GetTask", {"id": as_uuid}, agent=carol)
    assert error["code"] == -32001 and f"no thread {as_uuid}" in error["message"], error


def test_a2a_unknown_push_config_names_the_task_as_sent(client, alice, bob):
    resp = client.post(
        f"/a2a/agents/{bob[0]}",
        json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": _a2a_message()}},
        headers={**bearer(alice[1]), "A2A-Version": "1.0"},
    )
    task_id = resp.get_json()["result"]["task"]["id"]
    as_uuid = str(ULID.from_str(task_id).to_uuid())
    for method in ("GetTaskPushNotificationConfig",):
        error = rpc_error(client, alice[1], method, {"taskId": as_uuid, "id": "cfg-1"}, agent=bob[0])
        assert error["data"][0]["metadata"]["symbol"] == "not_found", error
        assert f"task {as_uuid} has no push notification config cfg-1" in error["message"], error
