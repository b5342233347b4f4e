"""A disabled agent receives nothing: appends to its threads are refused, its webhooks are held.

An agent is usually disabled because its key leaked. Before, the other party's appends
succeeded and the agent's endpoints kept receiving message bodies. Now deliveries wait
(pending, no due time) and go out when an operator re-enables the agent; none is lost.
Real PostgreSQL, a real Celery worker thread and a real receiver on loopback.
"""

from __future__ import annotations

import json

import pytest

from relay.services.agents import disable_agent
from relay.services.webhooks import enable_agent
from tests.conftest import bearer, rpc, rpc_answer, sql, wait_until
from tests.receiver import Receiver


def _msg(text):
    return {"parts": [{"type": "text", "text": text}]}


def test_appends_to_a_thread_with_a_disabled_agent_are_refused(app, client, alice, bob):
    (a, a_key), (b, _b_key) = alice, bob
    task_id = rpc(client, a_key, "message/send", {"recipient": b, "message": _msg("hand-off")})["task_id"]
    with app.app_context():
        disable_agent(b)
    body = rpc_answer(client, a_key, "message/send", {"task_id": task_id, "message": _msg("are you there?")})
    assert body["error"]["code"] == -32020 and body["error"]["data"]["symbol"] == "recipient_disabled", body
    assert b in body["error"]["message"]
    rest = client.post(
        f"/api/v1/identities/{a}/a2a/tasks/{task_id}/messages", json={"message": _msg("again")}, headers=bearer(a_key)
    )
    assert rest.status_code == 409 and rest.get_json()["error"]["code"] == "recipient_disabled"
    assert sql(app, "SELECT count(*) FROM messages")[0][0] == 1
    with app.app_context():
        enable_agent(b)
    assert "result" in rpc_answer(client, a_key, "message/send", {"task_id": task_id, "message": _msg("welcome back")})


@pytest.fixture
def rx():
    with Receiver() as receiver:
        yield receiver


def test_deliveries_to_a_disabled_agent_are_held_then_sent_on_re_enable(app, client, alice, bob, celery_worker, rx):
    (_a, a_key), (b, b_key) = alice, bob
    hook = client.post(f"/api/v1/identities/{b}/webhooks", json={"url": rx.url()}, headers=bearer(b_key))
    assert hook.status_code == 201
    tasks = [
        rpc(client, a_key, "message/send", {"recipient": b, "message": _msg(f"job {i}")})["task_id"] for i in range(3)
    ]
    rx.wait_for(3)
    with app.app_context():
        disable_agent(b)
    # The sender may still cancel what it gave b; b's endpoint must not hear of it yet.
    for task_id in tasks:
        rpc(client, a_key, "tasks/cancel", {"task_id": task_id})
    wait_until(
        lambda: (
            sql(app, "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND next_attempt_at IS NULL")[0][
                0
            ]
            == 3
        ),
        what="three held deliveries",
    )
    assert rx.count() == 3
    listed = client.get(f"/api/v1/identities/{b}/webhooks/{hook.get_json()['id']}/deliveries", headers=bearer(b_key))
    assert listed.status_code == 401  # b's own key is refused while b is disabled
    with app.app_context():
        _, released = enable_agent(b)
    assert released == 3
    got = rx.wait_for(6)
    payloads = [json.loads(r.body) for r in got]
    assert sorted(p["type"] for p in payloads) == ["message.created"] * 3 + ["task.updated"] * 3
    assert sorted(p["data"]["task_id"] for p in payloads if p["type"] == "task.updated") == sorted(tasks)
    assert len({r.header("webhook-id") for r in got}) == 6
    wait_until(
        lambda: sql(app, "SELECT count(*) FROM webhook_deliveries WHERE status = 'succeeded'")[0][0] == 6,
        what="six succeeded deliveries",
    )
