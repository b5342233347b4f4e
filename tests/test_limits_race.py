"""Count limits hold under races, on real PostgreSQL with real threads.

A limit is a count followed by an insert; unless the two are serialised, concurrent
creates each count 19 and each insert, ending above the limit. Each trial fills the
owner up to one below its limit, then releases several creates at once (each thread
its own test client, so its own app context, session and connection) and checks that
exactly one wins, the others get the limit error, and the count ends at the limit.
"""

from __future__ import annotations

import json
import uuid

from relay.services.push import MAX_CONFIGS_PER_TASK
from relay.services.webhooks import MAX_ENDPOINTS_PER_AGENT
from tests.conftest import bearer, rpc_answer, sql
from tests.test_concurrency import run_parallel

TRIALS = 8
RACERS = 4
PUBLIC = "http://93.184.216.34/hook"  # a literal: the check resolves nothing, nothing is sent


def _webhook_count(app, handle):
    return sql(
        app,
        "SELECT count(*) FROM webhook_endpoints e JOIN agents a ON a.id = e.agent_id "
        "WHERE a.handle = :h AND e.kind = 'webhook'",
        h=handle,
    )[0][0]


def test_concurrent_webhook_creates_never_exceed_the_limit(app, client, make_agent):
    outcomes = []
    for trial in range(TRIALS):
        handle, key = make_agent(f"racer{trial}@acme")
        hooks = f"/api/v1/identities/{handle}/webhooks"
        for i in range(MAX_ENDPOINTS_PER_AGENT - 1):
            resp = client.post(hooks, json={"url": f"{PUBLIC}/{i}"}, headers=bearer(key))
            assert resp.status_code == 201, resp.get_data(as_text=True)

        def create(n, hooks=hooks, key=key):
            def call(c):
                resp = c.post(hooks, json={"url": f"{PUBLIC}/race{n}"}, headers=bearer(key))
                return resp.status_code, resp.get_json()

            return call

        answers = run_parallel(app, [create(n) for n in range(RACERS)])
        total = _webhook_count(app, handle)
        outcomes.append((trial, total, sorted(status for status, _ in answers)))
        for status, body in answers:
            if status != 201:
                assert status == 422, body
                assert body["error"]["code"] == "invalid_params" and "url" in body["error"]["details"], body
                assert f"at most {MAX_ENDPOINTS_PER_AGENT}" in body["error"]["message"], body
    over = [o for o in outcomes if o[1] != MAX_ENDPOINTS_PER_AGENT or o[2] != [201] + [422] * (RACERS - 1)]
    assert over == [], f"trials (trial, endpoints, statuses) that broke the limit of {MAX_ENDPOINTS_PER_AGENT}: {over}"


def test_concurrent_push_config_creates_never_exceed_the_limit(app, client, make_agent):
    """Both ways of adding a config race: CreateTaskPushNotificationConfig and SendMessage's configuration."""
    _a, a_key = make_agent("alice@acme")
    bob, _b_key = make_agent("bob@acme")

    def message(text, task_id=None):
        m = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}
        return {**m, "taskId": task_id} if task_id else m

    outcomes = []
    for trial in range(TRIALS):
        task = rpc_answer(client, a_key, "SendMessage", {"message": message(f"trial {trial}")}, agent=bob)["result"][
            "task"
        ]
        for i in range(MAX_CONFIGS_PER_TASK - 1):
            body = rpc_answer(
                client,
                a_key,
                "CreateTaskPushNotificationConfig",
                {"taskId": task["id"], "url": f"{PUBLIC}/{i}"},
                agent=bob,
            )
            assert "result" in body, body

        def create(n, task_id=task["id"]):
            def call(c):
                if n % 2:
                    params = {
                        "message": message(f"append {n}", task_id),
                        "configuration": {"taskPushNotificationConfig": {"url": f"{PUBLIC}/send{n}"}},
                    }
                    return rpc_answer(c, a_key, "SendMessage", params, agent=bob)
                params = {"taskId": task_id, "url": f"{PUBLIC}/race{n}"}
                return rpc_answer(c, a_key, "CreateTaskPushNotificationConfig", params, agent=bob)

            return call

        answers = run_parallel(app, [create(n) for n in range(RACERS)])
        total = sql(
            app,
            "SELECT count(*) FROM webhook_endpoints WHERE kind = 'a2a_push' AND thread_id = :t",
            t=str(uuid.UUID(bytes=_ulid_bytes(task["id"]))),
        )[0][0]
        wins = sum("result" in a for a in answers)
        outcomes.append((trial, total, wins))
        for answer in answers:
            if "error" in answer:
                assert answer["error"]["code"] == -32602, answer
                assert str(MAX_CONFIGS_PER_TASK) in json.dumps(answer["error"]), answer
    over = [o for o in outcomes if o[1] != MAX_CONFIGS_PER_TASK or o[2] != 1]
    assert over == [], f"trials (trial, configs, winners) that broke the limit of {MAX_CONFIGS_PER_TASK}: {over}"


def _ulid_bytes(text: str) -> bytes:
    from relay.ids import parse_ulid

    return parse_ulid(text).bytes
