"""Webhooks: CRUD, routing, Standard Webhooks signatures, retries, outbox sweeps, SSRF.

The rules are docs/webhooks.md's (and, for SSRF, tests/test_ssrf.py's). Everything runs on
the real servers: PostgreSQL, Redis, a real Celery worker thread (``celery_worker``) and a
real HTTP receiver on loopback (tests/receiver.py). Nothing HTTP is mocked; one test monkeypatches DNS
(``socket.getaddrinfo``) to make a fake host name resolve to 10.0.0.8.

The periodic sweep is driven by calling the main app's ``workers.tasks.sweep_outbox``
task object directly (``celery_app.tasks[...]()``, which pushes the main app's context);
the deliveries it enqueues run on the real worker. The task is looked up on the main
Celery app rather than through ``workers.tasks.sweep_outbox`` because every extra
``create_app`` below makes its own Celery the default one.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from relay.ids import format_ulid, parse_ulid
from tests.conftest import _connect_admin, bearer, extra_app, rpc_answer, wait_until
from tests.receiver import Receiver

ALICE, BOB = "alice@acme", "bob@acme"
BOTH_EVENTS = ["message.created", "task.updated"]


# --------------------------------------------------------------------------- helpers


def _msg(text):
    return {"role": "user", "parts": [{"type": "text", "text": text}]}


def create_thread(client, key, recipient, text="please review the /users API change"):
    body = rpc_answer(client, key, "message/send", {"recipient": recipient, "message": _msg(text)})
    assert "result" in body, body
    return body["result"]


def append(client, key, task_id, text="a follow-up"):
    body = rpc_answer(client, key, "message/send", {"task_id": task_id, "message": _msg(text)})
    assert "result" in body, body
    return body["result"]


def transition(client, handle, key, task_id, name):
    resp = client.post(
        f"/api/v1/identities/{handle}/a2a/tasks/{task_id}/transitions", json={"transition": name}, headers=bearer(key)
    )
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()


def hooks_url(handle, hook_id=None, suffix=""):
    base = f"/api/v1/identities/{handle}/webhooks"
    return base + (f"/{hook_id}" if hook_id else "") + suffix


def create_hook(client, handle, key, url, events=None, description=None):
    body = {"url": url}
    if events is not None:
        body["events"] = events
    if description is not None:
        body["description"] = description
    resp = client.post(hooks_url(handle), json=body, headers=bearer(key))
    assert resp.status_code == 201, resp.get_data(as_text=True)
    return resp.get_json()


def get_hook(client, handle, key, hook_id):
    resp = client.get(hooks_url(handle, hook_id), headers=bearer(key))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()


def deliveries(client, handle, key, hook_id):
    resp = client.get(hooks_url(handle, hook_id, "/deliveries"), headers=bearer(key))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp.get_json()["items"]


def wait_delivery(client, handle, key, hook_id, status, timeout=20.0, count=1):
    """Wait until the endpoint has ``count`` deliveries, all with ``status``; return them."""

    def done():
        items = deliveries(client, handle, key, hook_id)
        return items if len(items) == count and all(d["status"] == status for d in items) else None

    return wait_until(done, timeout, f"{count} {status} deliveries of {hook_id}")


def assert_422_naming(resp, field):
    assert resp.status_code == 422, (resp.status_code, resp.get_data(as_text=True))
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_params", error
    # A list item is named with its index ("events.1").
    assert any(k == field or k.startswith(field + ".") for k in error["details"]), error
    return error


def verify(secret, req):
    """Verify one received request with the Standard Webhooks library; return the payload."""
    return Webhook(secret).verify(req.body, req.headers)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def sql(database_url):
    """Run one SQL statement on the test database (autocommit); return its rows, if any."""
    conn = _connect_admin(make_url(database_url))
    conn.autocommit = True

    def run(query, params=None):
        with conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else None

    yield run
    conn.close()


@pytest.fixture
def rx():
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def agents(make_agent):
    """alice@acme and bob@acme (same org, so one may name the other's path: 403, not 404)."""
    return {ALICE: make_agent(ALICE)[1], BOB: make_agent(BOB)[1]}


@pytest.fixture
def sweep(celery_app):
    """Run one outbox sweep now, in the main app's context; return its counts."""
    import workers.tasks  # noqa: F401  (registers the shared tasks)

    task = celery_app.tasks["workers.tasks.sweep_outbox"]
    return lambda: task()


@pytest.fixture
def settle(sql):
    """Wait until every event is fanned out and no delivery is pending."""

    def run(timeout=30.0):
        def idle():
            events = sql("SELECT count(*) FROM events WHERE fanned_out_at IS NULL")[0][0]
            pending = sql("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")[0][0]
            return events == 0 and pending == 0

        wait_until(idle, timeout, "events fanned out and deliveries finished")

    return run


@pytest.fixture(scope="module")
def app_down(base_env, celery_app, redis_url):
    """The relay with its broker unreachable (nothing listens on port 1)."""
    with extra_app(base_env, celery_app, redis_url, REDIS_URL="redis://127.0.0.1:1/0") as other:
        yield other


@pytest.fixture(scope="module")
def app_off(base_env, celery_app, redis_url):
    """The relay with private targets refused (the production default)."""
    with extra_app(
        base_env, celery_app, redis_url, RELAY_WEBHOOK_ALLOW_PRIVATE="0", RELAY_WEBHOOK_ALLOW_HTTP="1"
    ) as other:
        yield other


@pytest.fixture(scope="module")
def app_https_only(base_env, celery_app, redis_url):
    """Private targets allowed, plain http refused."""
    with extra_app(
        base_env, celery_app, redis_url, RELAY_WEBHOOK_ALLOW_PRIVATE="1", RELAY_WEBHOOK_ALLOW_HTTP="0"
    ) as other:
        yield other


# --------------------------------------------------------------------------- CRUD


def test_create_returns_secret_once_with_default_events(client, agents, rx):
    created = create_hook(client, ALICE, agents[ALICE], rx.url(), description="ci bot")
    assert created["secret"].startswith("whsec_")
    assert len(Webhook(created["secret"])._whsecret) == 32
    assert created["events"] == BOTH_EVENTS
    assert created["enabled"] is True and created["disabled_reason"] is None and created["failing_since"] is None
    assert created["url"] == rx.url() and created["description"] == "ci bot"
    uuid.UUID(created["id"])

    one = get_hook(client, ALICE, agents[ALICE], created["id"])
    assert "secret" not in one
    assert one == {k: v for k, v in created.items() if k != "secret"}
    listed = client.get(hooks_url(ALICE), headers=bearer(agents[ALICE]))
    assert listed.status_code == 200
    assert listed.get_json() == {"items": [one]}
    assert created["secret"] not in listed.get_data(as_text=True) + json.dumps(one)


def test_create_with_unknown_event_type_is_422(client, agents, rx):
    resp = client.post(
        hooks_url(ALICE),
        json={"url": rx.url(), "events": ["message.created", "message.deleted"]},
        headers=bearer(agents[ALICE]),
    )
    assert_422_naming(resp, "events")
    resp = client.post(hooks_url(ALICE), json={"url": rx.url(), "events": []}, headers=bearer(agents[ALICE]))
    assert_422_naming(resp, "events")
    assert client.get(hooks_url(ALICE), headers=bearer(agents[ALICE])).get_json() == {"items": []}


def test_list_shows_only_own_endpoints_oldest_first(client, agents, rx):
    first = create_hook(client, ALICE, agents[ALICE], rx.url("/a"))
    second = create_hook(client, ALICE, agents[ALICE], rx.url("/b"), events=["task.updated"])
    create_hook(client, BOB, agents[BOB], rx.url("/c"))
    items = client.get(hooks_url(ALICE), headers=bearer(agents[ALICE])).get_json()["items"]
    assert [i["id"] for i in items] == [first["id"], second["id"]]
    assert items[1]["events"] == ["task.updated"]
    assert all("secret" not in i for i in items)


def test_patch_changes_url_events_description_and_enabled(client, agents, rx):
    key = agents[ALICE]
    hook = create_hook(client, ALICE, key, rx.url("/old"))
    url = hooks_url(ALICE, hook["id"])

    resp = client.patch(
        url, json={"url": rx.url("/new"), "events": ["task.updated"], "description": "renamed"}, headers=bearer(key)
    )
    assert resp.status_code == 200, resp.get_data(as_text=True)
    patched = resp.get_json()
    assert (patched["url"], patched["events"], patched["description"]) == (rx.url("/new"), ["task.updated"], "renamed")
    assert "secret" not in patched

    off = client.patch(url, json={"enabled": False}, headers=bearer(key)).get_json()
    assert off["enabled"] is False and off["disabled_reason"] == "disabled by its owner" and off["disabled_at"]
    on = client.patch(url, json={"enabled": True}, headers=bearer(key)).get_json()
    assert on["enabled"] is True and on["disabled_reason"] is None and on["disabled_at"] is None

    again = get_hook(client, ALICE, key, hook["id"])
    assert (again["url"], again["events"], again["description"], again["enabled"]) == (
        rx.url("/new"),
        ["task.updated"],
        "renamed",
        True,
    )


def test_patch_with_empty_body_is_422(client, agents, rx):
    hook = create_hook(client, ALICE, agents[ALICE], rx.url())
    resp = client.patch(hooks_url(ALICE, hook["id"]), json={}, headers=bearer(agents[ALICE]))
    assert_422_naming(resp, "body")
    resp = client.patch(hooks_url(ALICE, hook["id"]), json={"events": ["nope"]}, headers=bearer(agents[ALICE]))
    assert_422_naming(resp, "events")


def test_delete_then_get_is_404(client, agents, rx):
    hook = create_hook(client, ALICE, agents[ALICE], rx.url())
    resp = client.delete(hooks_url(ALICE, hook["id"]), headers=bearer(agents[ALICE]))
    assert resp.status_code == 204 and resp.get_data() == b""
    resp = client.get(hooks_url(ALICE, hook["id"]), headers=bearer(agents[ALICE]))
    assert resp.status_code == 404 and resp.get_json()["error"]["code"] == "not_found"
    resp = client.delete(hooks_url(ALICE, hook["id"]), headers=bearer(agents[ALICE]))
    assert resp.status_code == 404
    assert client.get(hooks_url(ALICE), headers=bearer(agents[ALICE])).get_json() == {"items": []}


def test_another_agent_cannot_see_patch_or_delete_an_endpoint(client, agents, rx):
    hook = create_hook(client, ALICE, agents[ALICE], rx.url())
    bob = bearer(agents[BOB])
    for resp in (
        client.get(hooks_url(ALICE), headers=bob),
        client.get(hooks_url(ALICE, hook["id"]), headers=bob),
        client.patch(hooks_url(ALICE, hook["id"]), json={"enabled": False}, headers=bob),
        client.delete(hooks_url(ALICE, hook["id"]), headers=bob),
        client.post(hooks_url(ALICE, hook["id"], "/rotate-secret"), headers=bob),
        client.get(hooks_url(ALICE, hook["id"], "/deliveries"), headers=bob),
    ):
        assert resp.status_code == 403, resp.get_data(as_text=True)
        assert resp.get_json()["error"]["code"] == "forbidden"
    # Under his own handle the id is simply not one of his.
    resp = client.get(hooks_url(BOB, hook["id"]), headers=bob)
    assert resp.status_code == 404
    resp = client.delete(hooks_url(BOB, hook["id"]), headers=bob)
    assert resp.status_code == 404
    still = get_hook(client, ALICE, agents[ALICE], hook["id"])
    assert still["enabled"] is True


def test_secret_is_stored_encrypted(client, agents, rx, sql):
    hook = create_hook(client, ALICE, agents[ALICE], rx.url())
    rows = sql("SELECT secret_encrypted FROM webhook_endpoints WHERE id = %s", (hook["id"],))
    assert len(rows) == 1
    stored = rows[0][0]
    raw = hook["secret"][len("whsec_") :]
    assert stored and hook["secret"] not in stored and raw not in stored


# --------------------------------------------------------------------------- routing


def test_events_go_to_the_participant_who_did_not_act(client, agents, rx, settle, celery_worker):
    a, b = agents[ALICE], agents[BOB]
    hook_a = create_hook(client, ALICE, a, rx.url("/alice"))
    hook_b = create_hook(client, BOB, b, rx.url("/bob"))
    hook_b_tasks = create_hook(client, BOB, b, rx.url("/bob-tasks"), events=["task.updated"])

    t1 = create_thread(client, a, BOB, "thread one")["task_id"]  # -> bob: message.created
    append(client, b, t1, "bob answers")  # -> alice: message.created
    transition(client, BOB, b, t1, "accept")  # -> alice: task.updated
    transition(client, BOB, b, t1, "complete")  # -> alice: task.updated
    t2 = create_thread(client, a, BOB, "thread two")["task_id"]  # -> bob: message.created
    transition(client, ALICE, a, t2, "cancel")  # -> bob, bob-tasks: task.updated
    settle()

    def seen(path):
        return [(json.loads(r.body)["type"], json.loads(r.body)["data"].get("transition")) for r in rx.requests(path)]

    assert sorted(seen("/alice")) == sorted(
        [("message.created", None), ("task.updated", "accept"), ("task.updated", "complete")]
    )
    assert sorted(seen("/bob")) == sorted(
        [("message.created", None), ("message.created", None), ("task.updated", "cancel")]
    )
    assert seen("/bob-tasks") == [("task.updated", "cancel")]
    assert rx.count() == 7
    assert [d["event_type"] for d in deliveries(client, BOB, b, hook_b_tasks["id"])] == ["task.updated"]
    assert len(deliveries(client, ALICE, a, hook_a["id"])) == 3
    assert len(deliveries(client, BOB, b, hook_b["id"])) == 3

    bodies = {
        json.loads(r.body)["data"]["body"]
        for r in rx.requests("/bob")
        if json.loads(r.body)["type"] == "message.created"
    }
    assert bodies == {"thread one", "thread two"}
    cancel = json.loads(rx.requests("/bob-tasks")[0].body)["data"]
    assert (cancel["task_id"], cancel["from_state"], cancel["to_state"]) == (t2, "pending", "cancelled")


# --------------------------------------------------------------------------- payload and signature


def test_delivery_is_signed_and_carries_the_feed_row(client, agents, rx, settle, celery_worker):
    b = agents[BOB]
    one = create_hook(client, BOB, b, rx.url("/one"))
    two = create_hook(client, BOB, b, rx.url("/two"))
    sent = create_thread(client, agents[ALICE], BOB, "ship the pagination change")
    got = rx.wait_for(1, path="/one") + rx.wait_for(1, path="/two")
    settle()
    assert rx.count() == 2

    for req, hook in zip(got, (one, two)):
        payload = verify(hook["secret"], req)
        assert set(payload) == {"type", "timestamp", "data"}
        assert payload["type"] == "message.created"
        assert req.header("content-type") == "application/json"
        assert req.method == "POST"
        with pytest.raises(WebhookVerificationError):
            Webhook((two if hook is one else one)["secret"]).verify(req.body, req.headers)

    feed = client.get(f"/api/v1/identities/{BOB}/a2a/messages", headers=bearer(b)).get_json()["items"]
    row = [m for m in feed if m["id"] == sent["message_id"]]
    assert len(row) == 1
    data = json.loads(got[0].body)["data"]
    assert set(data) == set(row[0])
    assert data == row[0]
    assert data["id"] == sent["message_id"] and data["body"] == "ship the pagination change"
    assert json.loads(got[1].body) == json.loads(got[0].body)

    # One event, one webhook-id on every endpoint.
    ids = {r.header("webhook-id") for r in got}
    assert len(ids) == 1 and ids.pop().startswith("evt_")


# --------------------------------------------------------------------------- C10


class _Abort(Exception):
    pass


def test_rolled_back_send_is_never_announced(app, client, agents, rx, sql, sweep, settle, celery_worker):
    from relay.extensions import db
    from relay.models import Agent, Event
    from relay.services import unit_of_work, webhooks
    from relay.services.threads.append import _append

    a, b = agents[ALICE], agents[BOB]
    create_hook(client, BOB, b, rx.url("/bob"))
    create_hook(client, ALICE, a, rx.url("/alice"))
    task_id = create_thread(client, a, BOB, "opening")["task_id"]
    rx.wait_for(1, path="/bob")
    settle()
    events_before = sql("SELECT count(*) FROM events")[0][0]
    messages_before = sql("SELECT count(*) FROM messages")[0][0]

    # A send that writes its message and event, then fails before commit.
    with app.app_context():
        bob = db.session.scalar(select(Agent).where(Agent.handle == BOB))
        params = {"task_id": parse_ulid(task_id), "message": _msg("never committed"), "artifacts": [], "metadata": {}}
        with pytest.raises(_Abort):
            with unit_of_work() as session:
                result = _append(session, bob, params)
                session.flush()
                event_id = session.scalar(select(Event.id).where(Event.message_id == uuid.UUID(result["message_id"])))
                assert event_id is not None
                # A worker running before the commit (its own session) finds nothing to send.
                with app.app_context():
                    assert webhooks.fan_out(event_id) == []
                raise _Abort

    # A send refused by the service (append to a terminal thread) writes nothing either.
    transition(client, ALICE, a, task_id, "cancel")
    body = rpc_answer(client, b, "message/send", {"task_id": task_id, "message": _msg("too late")})
    assert body["error"]["data"]["symbol"] == "thread_terminal", body
    settle()
    rx.wait_for(1, path="/bob")

    assert sql("SELECT count(*) FROM events")[0][0] == events_before + 1  # the cancel only
    assert sql("SELECT count(*) FROM events WHERE type = 'message.created'")[0][0] == 1
    assert sql("SELECT count(*) FROM messages")[0][0] == messages_before
    assert sql("SELECT count(*) FROM events WHERE id = %s", (str(event_id),)) == [(0,)]
    assert sweep() == {"fanned_out": 0, "due": 0, "redrives_resumed": 0}
    assert rx.count("/alice") == 0  # bob's sends never reached alice
    assert [json.loads(r.body)["type"] for r in rx.requests("/bob")] == ["message.created", "task.updated"]


def test_committed_message_delivery_carries_the_message(client, agents, rx, settle, celery_worker):
    hook = create_hook(client, ALICE, agents[ALICE], rx.url())
    task_id = create_thread(client, agents[ALICE], BOB, "first")["task_id"]
    sent = append(client, agents[BOB], task_id, "the reply the worker must read back")
    req = rx.wait_for(1)[0]
    settle()
    payload = verify(hook["secret"], req)
    assert payload["type"] == "message.created"
    assert payload["data"]["id"] == sent["message_id"]
    assert payload["data"]["body"] == "the reply the worker must read back"
    assert payload["data"]["from"] == BOB and payload["data"]["sequence_no"] == 2
    assert rx.count() == 1


# --------------------------------------------------------------------------- retries


def test_retries_until_success_with_one_webhook_id(client, agents, rx, settle, celery_worker):
    rx.program("/hook", [500, 500, 200])
    hook = create_hook(client, BOB, agents[BOB], rx.url())
    create_thread(client, agents[ALICE], BOB)
    got = rx.wait_for(3, timeout=20)
    [delivery] = wait_delivery(client, BOB, agents[BOB], hook["id"], "succeeded")
    settle()
    assert rx.count() == 3

    assert delivery["attempt_count"] == 3
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]
    assert [a["error"] for a in delivery["attempts"]] == [None, None, None]
    assert delivery["last_error"] is None and delivery["next_attempt_at"] is None and delivery["completed_at"]
    assert {r.header("webhook-id") for r in got} == {delivery["event_id"]}
    stamps = [int(r.header("webhook-timestamp")) for r in got]
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    assert len({r.header("webhook-signature") for r in got}) == 3
    for r in got:
        verify(hook["secret"], r)
    assert len({r.body for r in got}) == 1


def test_410_disables_the_endpoint(client, agents, rx, settle, celery_worker):
    rx.program("/hook", [], default=410)
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    task_id = create_thread(client, agents[ALICE], BOB)["task_id"]
    rx.wait_for(1)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "failed")
    assert delivery["attempt_count"] == 1 and [a["status_code"] for a in delivery["attempts"]] == [410]
    record = get_hook(client, BOB, b, hook["id"])
    assert record["enabled"] is False
    assert record["disabled_reason"] and "410" in record["disabled_reason"] and record["disabled_at"]

    append(client, agents[ALICE], task_id, "anyone there?")
    settle()
    assert rx.count() == 1
    assert len(deliveries(client, BOB, b, hook["id"])) == 1


def test_redirect_is_a_failed_attempt_and_not_followed(client, agents, rx, settle, celery_worker):
    b = agents[BOB]
    with Receiver() as target:
        rx.program("/hook", [], default={"status": 302, "headers": {"Location": target.url("/stolen")}})
        hook = create_hook(client, BOB, b, rx.url())
        create_thread(client, agents[ALICE], BOB)
        rx.wait_for(1)

        def first_attempt():
            items = deliveries(client, BOB, b, hook["id"])
            # attempts and the delivery row are two reads: wait until both show the attempt
            return items if items and items[0]["attempts"] and items[0]["last_error"] else None

        [delivery] = wait_until(first_attempt, what="the first attempt")
        assert delivery["attempts"][0]["status_code"] == 302
        assert delivery["status"] == "pending" and delivery["last_error"] == "HTTP 302"
        # Stop retrying, let the pending attempt end, then check the target saw nothing.
        client.patch(hooks_url(BOB, hook["id"]), json={"enabled": False}, headers=bearer(b))
        [delivery] = wait_delivery(client, BOB, b, hook["id"], "failed")
        settle()
        assert all(a["status_code"] == 302 for a in delivery["attempts"])
        assert rx.count() == delivery["attempt_count"]
        assert target.count() == 0


def test_delivery_fails_after_the_last_attempt_of_the_schedule(client, agents, rx, settle, celery_worker):
    rx.program("/hook", [], default=503)
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    create_thread(client, agents[ALICE], BOB)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "failed", timeout=30)
    settle()
    assert delivery["attempt_count"] == 4  # RELAY_WEBHOOK_SCHEDULE=0,1,2,5
    assert [a["status_code"] for a in delivery["attempts"]] == [503] * 4
    assert delivery["last_error"] == "HTTP 503" and delivery["next_attempt_at"] is None
    assert rx.count() == 4
    assert len({r.header("webhook-id") for r in rx.requests()}) == 1
    record = get_hook(client, BOB, b, hook["id"])
    assert record["enabled"] is True and record["failing_since"] is not None


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    "retry_after, least, most",
    [
        ("4", 3.5, 15),  # delay-seconds, above the schedule's 1 s
        ("date+4", 3.0, 15),  # an HTTP-date 4 s ahead (counted from before the attempt)
        ("3600", 4.5, 15),  # bounded by the schedule's longest wait, 5 s
        ("date+3600", 4.5, 15),
        ("soon", 0.5, 4.0),  # neither form: the schedule alone (1 s)
    ],
)
def test_retry_after_in_either_form_sets_the_next_attempt_within_the_schedule(
    client, agents, rx, settle, celery_worker, retry_after, least, most
):
    from email.utils import format_datetime

    if retry_after.startswith("date+"):
        ahead = timedelta(seconds=int(retry_after.removeprefix("date+")))
        retry_after = format_datetime(datetime.now(UTC) + ahead, usegmt=True)
    rx.program("/hook", [{"status": 503, "headers": {"Retry-After": retry_after}}], default=200)
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    create_thread(client, agents[ALICE], BOB)

    def second_made():
        items = deliveries(client, BOB, b, hook["id"])
        return items if items and len(items[0]["attempts"]) >= 2 else None

    # The gap between the attempts themselves: next_attempt_at is not read, since the
    # second attempt's lease overwrites it (now + timeout + 30 s) before it is recorded.
    [delivery] = wait_until(second_made, what="the second attempt recorded")
    first, second = sorted(_ts(a["attempted_at"]) for a in delivery["attempts"][:2])
    # RELAY_WEBHOOK_SCHEDULE=0,1,2,5: the second attempt is 1 s after the first unless the receiver asks later.
    wait = (second - first).total_seconds()
    assert least <= wait <= most, (retry_after, wait)
    settle()


def test_an_unreadable_retry_after_on_a_2xx_is_still_delivered_once(client, agents, rx, settle, celery_worker):
    rx.program("/hook", [], default={"status": 200, "headers": {"Retry-After": "²"}})  # isdigit(), not int()
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    create_thread(client, agents[ALICE], BOB)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "succeeded")
    settle()
    assert delivery["attempt_count"] == 1 and rx.count() == 1, delivery


def test_parse_retry_after_reads_seconds_and_dates():
    from email.utils import format_datetime

    from relay.agent.retry_after import parse_retry_after

    now = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after(" 7 ", now) == 7
    assert parse_retry_after(format_datetime(now + timedelta(seconds=9), usegmt=True), now) == 9
    assert parse_retry_after("Thu, 03 Dec 2026 12:00:09 GMT", now) == 9
    assert parse_retry_after("Thursday, 03-Dec-26 12:00:09 GMT", now) == 9  # RFC 850, obsolete but allowed
    assert parse_retry_after(format_datetime(now - timedelta(hours=1), usegmt=True), now) == 0
    for bad in (None, "", "soon", "-5", "1.5", "Thu, 99 Foo 2026", "²", "٥", "1e3"):
        assert parse_retry_after(bad, now) is None, bad


def test_answer_slower_than_the_timeout_is_a_failed_attempt(client, agents, rx, settle, celery_worker):
    rx.program("/hook", [{"status": 200, "delay": 4}], default=200)  # RELAY_WEBHOOK_TIMEOUT=3
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    create_thread(client, agents[ALICE], BOB)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "succeeded", timeout=20)
    settle()
    first, second = delivery["attempts"]
    assert first["status_code"] is None and first["error"] == "timeout after 3 s (waiting for the response)"
    assert first["duration_ms"] >= 2900  # it waited for the answer until the timeout
    assert second["status_code"] == 200 and second["error"] is None
    assert delivery["attempt_count"] == 2 and rx.count() == 2


def _one_fanned_out_delivery(app, client, agents, rx, sql, app_down) -> tuple[dict, uuid.UUID]:
    """Bob's hook on ``rx`` and one message to him, fanned out by hand (its enqueue lost: broker down).

    Returns the hook and the id of its one pending delivery, not yet attempted.
    """
    from relay.services import webhooks

    hook = create_hook(client, BOB, agents[BOB], rx.url())
    body = rpc_answer(app_down.test_client(), agents[ALICE], "message/send", {"recipient": BOB, "message": _msg("x")})
    assert "result" in body, body
    [(event_id,)] = sql("SELECT id FROM events WHERE message_id = %s", (body["result"]["message_id"],))
    with app.app_context():
        [delivery_id] = webhooks.fan_out(uuid.UUID(event_id))
    return hook, delivery_id


def test_endpoint_deleted_during_an_attempt_ends_it_quietly(app, client, agents, rx, sql, app_down):
    from relay.services import webhooks

    gate = threading.Event()
    rx.program("/hook", [{"status": 200, "gate": gate}])
    b = agents[BOB]
    hook, delivery_id = _one_fanned_out_delivery(app, client, agents, rx, sql, app_down)
    outcome = {}

    def attempt():
        try:
            with app.app_context():
                outcome["status"] = webhooks.deliver(delivery_id)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    worker = threading.Thread(target=attempt)
    worker.start()
    try:
        rx.wait_for(1)
        resp = client.delete(hooks_url(BOB, hook["id"]), headers=bearer(b))
        assert resp.status_code == 204
    finally:
        gate.set()
        worker.join(30)
    assert "error" not in outcome, repr(outcome.get("error"))
    assert outcome == {"status": None}
    assert sql("SELECT count(*) FROM webhook_deliveries") == [(0,)]
    assert sql("SELECT count(*) FROM webhook_attempts") == [(0,)]
    assert rx.count() == 1


# --------------------------------------------------------------------------- rotation, test event


def test_rotated_secret_signs_alongside_the_old_one(client, agents, rx, settle, celery_worker):
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    resp = client.post(hooks_url(BOB, hook["id"], "/rotate-secret"), headers=bearer(b))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    rotated = resp.get_json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != hook["secret"]
    assert rotated["previous_secret_expires_at"]
    assert "secret" not in get_hook(client, BOB, b, hook["id"])

    create_thread(client, agents[ALICE], BOB)
    req = rx.wait_for(1)[0]
    settle()
    assert rx.count() == 1
    signatures = req.header("webhook-signature").split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    assert verify(hook["secret"], req)["type"] == "message.created"
    assert verify(rotated["secret"], req)["type"] == "message.created"
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 43 + "=").verify(req.body, req.headers)


def test_test_event_goes_to_that_endpoint_only(client, agents, rx, settle, celery_worker):
    b = agents[BOB]
    one = create_hook(client, BOB, b, rx.url("/one"))
    two = create_hook(client, BOB, b, rx.url("/two"))
    resp = client.post(hooks_url(BOB, two["id"], "/test"), headers=bearer(b))
    assert resp.status_code == 202, resp.get_data(as_text=True)
    sent = resp.get_json()
    assert sent["type"] == "webhook.test" and sent["event_id"].startswith("evt_")
    req = rx.wait_for(1, path="/two")[0]
    settle()
    payload = verify(two["secret"], req)
    assert payload["type"] == "webhook.test" and payload["data"]["endpoint_id"] == two["id"]
    assert req.header("webhook-id") == sent["event_id"]
    assert rx.count() == 1 and rx.count("/one") == 0
    assert deliveries(client, BOB, b, one["id"]) == []


# --------------------------------------------------------------------------- C11


def test_broker_down_send_succeeds_and_sweep_delivers_once(
    client, agents, rx, sql, sweep, settle, app_down, celery_worker
):
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    down = app_down.test_client()
    body = rpc_answer(
        down, agents[ALICE], "message/send", {"recipient": BOB, "message": _msg("sent while Redis is away")}
    )
    assert "result" in body, body
    message_id = body["result"]["message_id"]
    rows = sql("SELECT id, fanned_out_at FROM events WHERE message_id = %s", (message_id,))
    assert len(rows) == 1 and rows[0][1] is None
    assert rx.count() == 0

    # The sweep only takes events older than 2 s (the normal enqueue's head start).
    wait_until(lambda: sweep()["fanned_out"] == 1, timeout=15, what="the sweep to fan the event out", interval=0.3)
    got = rx.wait_for(1)
    wait_delivery(client, BOB, b, hook["id"], "succeeded")
    settle()
    assert sweep() == {"fanned_out": 0, "due": 0, "redrives_resumed": 0}
    assert rx.count() == 1
    payload = verify(hook["secret"], got[0])
    assert payload["data"]["id"] == message_id
    assert got[0].header("webhook-id") == "evt_" + format_ulid(uuid.UUID(rows[0][0]))


def test_a_lost_enqueue_is_fanned_out_by_a_running_pumps_poll(app, client, agents, rx, sql, app_down, celery_app):
    """After Redis returns (or while it is away), an event whose enqueue was lost
    goes out on a pump's next poll (about 2 s), with no task and no outbox sweep."""
    from workers import delivery as pumps

    hook = create_hook(client, BOB, agents[BOB], rx.url())
    body = rpc_answer(
        app_down.test_client(), agents[ALICE], "message/send", {"recipient": BOB, "message": _msg("lost")}
    )
    assert "result" in body, body
    with app.app_context():
        pumps.pump_for(app)  # as a worker starts it; nothing is handed to it
    try:
        got = rx.wait_for(1, timeout=5)
        wait_delivery(client, BOB, agents[BOB], hook["id"], "succeeded")
    finally:
        pumps.stop_pumps(celery_app)
    assert verify(hook["secret"], got[0])["data"]["id"] == body["result"]["message_id"]


# --------------------------------------------------------------------------- C12 / SSRF

REFUSED_URLS = [  # (url, what the refusal must say)
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://127.0.0.1:5432/", "loopback"),
    ("http://[::1]/", "loopback"),
    ("http://[::ffff:169.254.169.254]/", "IPv4-mapped a link-local"),
    ("file:///etc/passwd", "scheme 'file' is not allowed"),
    ("http://user:pw@example.com/", "credentials"),
]


@pytest.mark.parametrize("url,reason", REFUSED_URLS)
def test_private_and_odd_targets_refused_at_registration(app_off, agents, url, reason):
    off = app_off.test_client()
    resp = off.post(hooks_url(ALICE), json={"url": url}, headers=bearer(agents[ALICE]))
    error = assert_422_naming(resp, "url")
    assert reason in error["message"], error
    resp = off.get(hooks_url(ALICE), headers=bearer(agents[ALICE]))
    assert resp.get_json() == {"items": []}


def test_private_target_refused_on_patch_too(client, app_off, agents, rx):
    hook = create_hook(client, ALICE, agents[ALICE], "http://93.184.216.34/hook")
    off = app_off.test_client()
    resp = off.patch(hooks_url(ALICE, hook["id"]), json={"url": "http://10.1.2.3/"}, headers=bearer(agents[ALICE]))
    assert_422_naming(resp, "url")
    assert get_hook(client, ALICE, agents[ALICE], hook["id"])["url"] == "http://93.184.216.34/hook"


def test_plain_http_refused_when_not_allowed(app_https_only, agents, rx):
    only = app_https_only.test_client()
    resp = only.post(hooks_url(ALICE), json={"url": rx.url()}, headers=bearer(agents[ALICE]))
    error = assert_422_naming(resp, "url")
    assert "https" in error["message"]
    resp = only.post(hooks_url(ALICE), json={"url": f"https://127.0.0.1:{rx.port}/hook"}, headers=bearer(agents[ALICE]))
    assert resp.status_code == 201, resp.get_data(as_text=True)


def test_host_name_resolving_to_a_private_address_is_refused(app_off, agents, monkeypatch):
    real = socket.getaddrinfo

    def fake_dns(host, port, *args, **kwargs):
        if host == "hooks.internal.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.8", port or 80))]
        if host == "hooks.public.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port or 80))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake_dns)
    off = app_off.test_client()
    resp = off.post(hooks_url(ALICE), json={"url": "http://hooks.internal.example/in"}, headers=bearer(agents[ALICE]))
    error = assert_422_naming(resp, "url")
    assert "10.0.0.8" in error["message"]
    # The same name resolving to a public address is accepted: the address decides.
    resp = off.post(hooks_url(ALICE), json={"url": "http://hooks.public.example/in"}, headers=bearer(agents[ALICE]))
    assert resp.status_code == 201, resp.get_data(as_text=True)


def test_private_target_refused_again_at_delivery(app, client, agents, rx, sql, app_down, app_off):
    from relay.services import webhooks

    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())  # allowed: the main app allows private targets
    body = rpc_answer(app_down.test_client(), agents[ALICE], "message/send", {"recipient": BOB, "message": _msg("hi")})
    assert "result" in body, body
    [(event_id,)] = sql("SELECT id FROM events WHERE message_id = %s", (body["result"]["message_id"],))
    with app.app_context():
        [delivery_id] = webhooks.fan_out(uuid.UUID(event_id))
    with app_off.app_context():
        status = webhooks.deliver(delivery_id)
    assert status == "pending"  # a failed attempt, retried later
    [delivery] = deliveries(client, BOB, b, hook["id"])
    assert delivery["attempt_count"] == 1
    [attempt] = delivery["attempts"]
    assert attempt["status_code"] is None
    assert attempt["error"].startswith("refused:") and "loopback" in attempt["error"]
    assert rx.count() == 0


# --------------------------------------------------------------------------- lost work


def test_delivery_of_a_worker_killed_mid_send_is_sent_once_after_the_lease(
    app, client, agents, rx, sql, sweep, settle, app_down, celery_worker
):
    from relay.services import delivery

    b = agents[BOB]
    hook, delivery_id = _one_fanned_out_delivery(app, client, agents, rx, sql, app_down)
    with app.app_context():  # the "worker" leases it, then dies
        assert delivery.claim([uuid.UUID(hook["id"])], 1, only=[delivery_id]) != []
    assert sweep() == {"fanned_out": 0, "due": 0, "redrives_resumed": 0}  # leased: not due yet
    assert rx.count() == 0

    sql(
        "UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 second' WHERE id = %s", (str(delivery_id),)
    )
    assert sweep() == {"fanned_out": 0, "due": 1, "redrives_resumed": 0}
    got = rx.wait_for(1)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "succeeded")
    settle()
    assert sweep() == {"fanned_out": 0, "due": 0, "redrives_resumed": 0}
    assert rx.count() == 1 and delivery["attempt_count"] == 1
    verify(hook["secret"], got[0])


def test_burst_of_200_messages_gives_200_deliveries_with_distinct_ids(client, agents, rx, settle, celery_worker):
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    task_id = create_thread(client, agents[ALICE], BOB, "message 0")["task_id"]
    for i in range(1, 200):
        append(client, agents[ALICE], task_id, f"message {i}")
    got = rx.wait_for(200, timeout=60)
    settle(timeout=60)
    got = rx.requests()
    assert len(got) == 200
    ids = [r.header("webhook-id") for r in got]
    assert len(set(ids)) == 200
    assert {json.loads(r.body)["data"]["body"] for r in got} == {f"message {i}" for i in range(200)}
    items = []
    resp = client.get(hooks_url(BOB, hook["id"], "/deliveries?limit=100"), headers=bearer(b)).get_json()
    items += resp["items"]
    while resp["next_cursor"]:
        resp = client.get(
            hooks_url(BOB, hook["id"], f"/deliveries?limit=100&cursor={resp['next_cursor']}"), headers=bearer(b)
        ).get_json()
        items += resp["items"]
    assert len(items) == 200 and {d["status"] for d in items} == {"succeeded"}
    assert {d["event_id"] for d in items} == set(ids)


# --------------------------------------------------------------------------- failing endpoints


def test_failing_since_is_set_by_failures_and_cleared_by_success(client, agents, rx, settle, celery_worker):
    rx.program("/hook", [], default=500)
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    create_thread(client, agents[ALICE], BOB)
    rx.wait_for(1)
    record = wait_until(
        lambda: (r := get_hook(client, BOB, b, hook["id"]))["failing_since"] and r, what="failing_since to be set"
    )
    assert record["enabled"] is True
    rx.program("/hook", [], default=200)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "succeeded")
    settle()
    assert delivery["attempts"][-1]["status_code"] == 200
    assert all(a["status_code"] == 500 for a in delivery["attempts"][:-1])
    record = get_hook(client, BOB, b, hook["id"])
    assert record["failing_since"] is None and record["enabled"] is True


def test_endpoint_failing_longer_than_disable_after_is_disabled(client, agents, rx, sql, settle, celery_worker):
    rx.program("/hook", [], default=500)
    b = agents[BOB]
    hook = create_hook(client, BOB, b, rx.url())
    # Failing for 6 days already (RELAY_WEBHOOK_DISABLE_AFTER defaults to 5 days).
    sql("UPDATE webhook_endpoints SET failing_since = now() - interval '6 days' WHERE id = %s", (hook["id"],))
    create_thread(client, agents[ALICE], BOB)
    [delivery] = wait_delivery(client, BOB, b, hook["id"], "failed")
    settle()
    record = get_hook(client, BOB, b, hook["id"])
    assert record["enabled"] is False and record["disabled_at"]
    assert record["disabled_reason"] and "failed" in record["disabled_reason"]
    assert delivery["attempt_count"] == 1 and [a["status_code"] for a in delivery["attempts"]] == [500]
    assert delivery["last_error"].startswith("endpoint disabled")
    assert rx.count() == 1
