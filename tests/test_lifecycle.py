"""The work lifecycle (docs/decisions.md, "The work lifecycle"): decline, fail, release, renew; leases that
fence and lapse; read receipts; priority and expiry.

One test per rule, against a real PostgreSQL (and Redis, a real worker and a real beat
where the rule is about them). Accept, complete and cancel are pinned by
tests/test_rules_threads.py and tests/test_concurrency.py.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import requests

from relay.ids import parse_ulid
from tests.conftest import bearer, rpc, rpc_answer, sql
from tests.receiver import Receiver

STATES = ("pending", "accepted", "completed", "cancelled", "declined", "failed", "expired", "input_required")
NEW = {  # transition -> (from, to, who)
    "decline": ("pending", "declined", "recipient"),
    "fail": ("accepted", "failed", "recipient"),
    "release": ("accepted", "pending", "recipient"),
    "renew": ("accepted", "accepted", "recipient"),
    "request_input": ("accepted", "input_required", "recipient"),
}
ALSO_FROM = {"complete": "input_required", "fail": "input_required", "release": "input_required"}
REASONED = {"decline": "not my area", "fail": "the tests will not pass", "release": "out of time"}
QUESTION = "Which branch should the fix go on?"


def error_of(body: dict) -> tuple[int, str]:
    assert "error" in body, body
    return body["error"]["code"], body["error"]["data"]["symbol"]


def create(client, key, recipient, **extra) -> dict:
    params = {"recipient": recipient, "message": {"parts": [{"type": "text", "text": "please do it"}]}, **extra}
    return rpc(client, key, "message/send", params)


def update(client, key, task_id, name, **params) -> dict:
    return rpc_answer(client, key, "tasks/update", {"task_id": task_id, "transition": name, **params})


def params_for(name: str) -> dict:
    if name == "renew":
        return {"lease_seconds": 30}  # an unleased handoff: renew starts a lease
    if name == "request_input":
        return {"question": QUESTION}
    return {"reason": REASONED[name]} if name in ("decline", "fail") else {}


def in_state(app, client, alice, bob, state: str) -> str:
    """A new handoff from alice to bob, brought to ``state`` the way agents (or the clock) do."""
    task_id = create(client, alice[1], bob[0], expires_in_seconds=3600)["task_id"]
    moves = {
        "pending": [],
        "accepted": [(bob, "accept", {})],
        "completed": [(bob, "accept", {}), (bob, "complete", {})],
        "cancelled": [(alice, "cancel", {})],
        "declined": [(bob, "decline", {"reason": "no"})],
        "failed": [(bob, "accept", {}), (bob, "fail", {"reason": "stuck"})],
        "expired": [],
        "input_required": [(bob, "accept", {}), (bob, "request_input", {"question": QUESTION})],
    }[state]
    for who, name, params in moves:
        assert "result" in update(client, who[1], task_id, name, **params)
    if state == "expired":  # its expiry has passed; no sweep has run
        sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE id = :id", id=parse_ulid(task_id))
    return task_id


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("side", ["sender", "recipient"])
@pytest.mark.parametrize("name", list(NEW))
def test_every_new_transition_from_every_state_by_either_side(app, client, alice, bob, name, side, state):
    task_id = in_state(app, client, alice, bob, state)
    caller = bob if side == "recipient" else alice
    body = update(client, caller[1], task_id, name, **params_for(name))
    source, target, who = NEW[name]
    if side != who:
        assert error_of(body) == (-32009, "not_authorized_transition"), body
    elif state not in (source, ALSO_FROM.get(name)):
        assert error_of(body) == (-32008, "invalid_transition"), body
        assert body["error"]["data"]["details"]["state"] == state
    else:
        assert body["result"]["status"] == {"state": target}, body
        got = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
        assert got["status"] == {"state": target}


@pytest.mark.parametrize("state", ["declined", "failed", "expired"])
def test_the_new_ends_are_terminal(app, client, alice, bob, state):
    task_id = in_state(app, client, alice, bob, state)
    body = rpc_answer(
        client,
        alice[1],
        "message/send",
        {"task_id": task_id, "message": {"parts": [{"type": "text", "text": "hello?"}]}},
    )
    assert error_of(body) == (-32007, "thread_terminal"), body
    for who, name in [(bob, "accept"), (bob, "complete"), (alice, "cancel"), (bob, "release")]:
        assert error_of(update(client, who[1], task_id, name))[1] == "invalid_transition"


def test_a_transition_writes_an_audit_row_with_its_reason_and_a_webhook_event_to_the_other_side(
    app, client, alice, bob
):
    task_id = create(client, alice[1], bob[0])["task_id"]
    assert "result" in update(client, bob[1], task_id, "decline", reason="not my area")
    [(action, actor, reason, frm, to)] = sql(
        app,
        "SELECT a.action, g.handle, a.reason, a.from_state, a.to_state FROM audit_events a"
        " JOIN agents g ON g.id = a.actor_id WHERE a.thread_id = :id AND a.action <> 'create'",
        id=parse_ulid(task_id),
    )
    assert (action, actor, reason, frm, to) == ("decline", bob[0], "not my area", "pending", "declined")
    [(owner, payload)] = sql(
        app,
        "SELECT g.handle, e.payload FROM events e JOIN agents g ON g.id = e.agent_id"
        " WHERE e.thread_id = :id AND e.type = 'task.updated'",
        id=parse_ulid(task_id),
    )
    assert (owner, payload) == (alice[0], {"transition": "decline", "from": "pending", "to": "declined"})
    got = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    assert (got["reason"], got["declined_at"] is not None) == ("not my area", True)


# --------------------------------------------------------------------------- params


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("decline", {}, "reason"),
        ("fail", {}, "reason"),
        ("decline", {"reason": ""}, "reason"),
        ("decline", {"reason": "x" * 2001}, "reason"),
        ("accept", {"reason": "why not"}, "reason"),
        ("complete", {"lease_seconds": 60}, "lease_seconds"),
        ("accept", {"lease_seconds": 9}, "lease_seconds"),
        ("accept", {"lease_seconds": 86_401}, "lease_seconds"),
        ("accept", {"lease_seconds": "60"}, "lease_seconds"),
        ("complete", {"lease_token": "x" * 65}, "lease_token"),
    ],
)
def test_a_bad_transition_param_is_invalid_params_naming_it(app, client, alice, bob, name, params, field):
    task_id = create(client, alice[1], bob[0])["task_id"]
    body = update(client, bob[1], task_id, name, **params)
    assert error_of(body) == (-32602, "invalid_params"), body
    assert field in json.dumps(body["error"]["data"]), body
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "pending"}


def test_the_rest_route_takes_the_same_transitions_and_params(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    url = f"/api/v1/identities/{bob[0]}/a2a/tasks/{task_id}/transitions"
    resp = client.post(url, json={"transition": "decline"}, headers=bearer(bob[1]))
    assert resp.status_code == 422 and "reason" in resp.get_data(as_text=True), resp.get_data(as_text=True)
    resp = client.post(url, json={"transition": "decline", "reason": "busy"}, headers=bearer(bob[1]))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json()["status"] == {"state": "declined"} and resp.get_json()["reason"] == "busy"


# --------------------------------------------------------------------------- leases


def leased(client, alice, bob, seconds=60) -> tuple[str, dict]:
    task_id = create(client, alice[1], bob[0])["task_id"]
    body = update(client, bob[1], task_id, "accept", lease_seconds=seconds)
    return task_id, body["result"]


def test_accept_with_a_lease_answers_its_token_and_end_and_only_the_recipient_sees_the_token(client, alice, bob):
    task_id, accepted = leased(client, alice, bob, 60)
    ends = datetime.fromisoformat(accepted["lease_expires_at"])
    assert timedelta(seconds=55) < ends - datetime.now(UTC) <= timedelta(seconds=61)
    assert isinstance(accepted["lease_token"], str) and len(accepted["lease_token"]) >= 20
    mine = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    theirs = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    assert mine["lease_token"] == accepted["lease_token"] and theirs["lease_token"] is None
    assert mine["lease_expires_at"] == theirs["lease_expires_at"] == accepted["lease_expires_at"]
    plain = create(client, alice[1], bob[0])["task_id"]
    unleased = update(client, bob[1], plain, "accept")["result"]
    assert (unleased["lease_token"], unleased["lease_expires_at"]) == (None, None)


@pytest.mark.parametrize("name", ["complete", "fail", "release", "renew"])
def test_a_leased_handoff_refuses_a_missing_or_stale_token(client, alice, bob, name):
    task_id, first = leased(client, alice, bob)
    assert "result" in update(client, bob[1], task_id, "release", lease_token=first["lease_token"])
    second = update(client, bob[1], task_id, "accept", lease_seconds=60)["result"]
    assert second["lease_token"] != first["lease_token"]  # a new token with every accept
    extra = {"reason": "stuck"} if name == "fail" else {}
    for token in (None, first["lease_token"]):  # missing, then the session that lost the lease
        body = update(client, bob[1], task_id, name, **extra, **({"lease_token": token} if token else {}))
        assert error_of(body) == (-32010, "state_changed"), body
        assert body["error"]["data"]["details"]["field"] == "lease_token"
    body = update(client, bob[1], task_id, name, lease_token=second["lease_token"], **extra)
    assert "result" in body, body


def test_renew_and_a_recipient_message_extend_the_lease_and_a_sender_message_does_not(app, client, alice, bob):
    task_id, accepted = leased(client, alice, bob, 60)
    sql(
        app,
        "UPDATE threads SET lease_expires_at = now() + interval '20 seconds' WHERE id = :id",
        id=parse_ulid(task_id),
    )

    def ends():
        return datetime.fromisoformat(rpc(client, alice[1], "tasks/get", {"task_id": task_id})["lease_expires_at"])

    short = ends()
    rpc(
        client,
        alice[1],
        "message/send",
        {"task_id": task_id, "message": {"parts": [{"type": "text", "text": "any news?"}]}},
    )
    assert ends() == short
    rpc(client, bob[1], "message/send", {"task_id": task_id, "message": {"parts": [{"type": "text", "text": "on it"}]}})
    assert ends() - short > timedelta(seconds=30)
    renewed = update(client, bob[1], task_id, "renew", lease_token=accepted["lease_token"], lease_seconds=600)
    assert renewed["result"]["lease_token"] == accepted["lease_token"]  # renew keeps the token
    assert datetime.fromisoformat(renewed["result"]["lease_expires_at"]) - datetime.now(UTC) > timedelta(seconds=590)


def test_renew_without_a_lease_needs_lease_seconds_and_then_starts_one(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    update(client, bob[1], task_id, "accept")
    body = update(client, bob[1], task_id, "renew")
    assert error_of(body) == (-32602, "invalid_params") and "lease_seconds" in json.dumps(body), body
    started = update(client, bob[1], task_id, "renew", lease_seconds=30)["result"]
    assert started["lease_token"] and started["lease_expires_at"]


def lapse(app, task_id):
    sql(app, "UPDATE threads SET lease_expires_at = now() - interval '1 second' WHERE id = :id", id=parse_ulid(task_id))


def test_a_lapsed_lease_is_pending_at_once_in_every_read_before_any_sweep(app, client, alice, bob):
    task_id, accepted = leased(client, alice, bob)
    lapse(app, task_id)
    for key in (alice[1], bob[1]):
        got = rpc(client, key, "tasks/get", {"task_id": task_id})
        assert got["status"] == {"state": "pending"} and got["lease_token"] is None and got["lease_expires_at"] is None
        assert got["accepted_at"] is None  # as the sweep will record it
    inbox = rpc(client, bob[1], "tasks/list", {"filter": {"status": ["pending"]}})["items"]
    assert [i["task_id"] for i in inbox] == [task_id]
    assert rpc(client, bob[1], "tasks/list", {"filter": {"status": ["accepted"]}})["items"] == []
    feed = client.get(f"/api/v1/identities/{bob[0]}/a2a/messages", headers=bearer(bob[1])).get_json()
    assert [r["task_state"] for r in feed["items"]] == ["pending"]
    # ... and the holder of the lost lease cannot finish the work.
    body = update(client, bob[1], task_id, "complete", lease_token=accepted["lease_token"])
    assert error_of(body) == (-32008, "invalid_transition"), body
    [(state,)] = sql(app, "SELECT state FROM threads WHERE id = :id", id=parse_ulid(task_id))
    assert state == "accepted"  # a refused call records nothing; the sweep will


def test_a_transition_on_a_lapsed_lease_records_it_once_with_events_to_both(app, client, alice, bob):
    task_id, _ = leased(client, alice, bob)
    lapse(app, task_id)
    again = update(client, bob[1], task_id, "accept", lease_seconds=60)  # someone takes the work back
    assert again["result"]["status"] == {"state": "accepted"}, again
    rows = sql(
        app,
        "SELECT action, from_state, to_state FROM audit_events WHERE thread_id = :id ORDER BY id",
        id=parse_ulid(task_id),
    )
    assert [tuple(r) for r in rows] == [
        ("create", None, "pending"),
        ("accept", "pending", "accepted"),
        ("lease_expired", "accepted", "pending"),
        ("accept", "pending", "accepted"),
    ]
    owners = sql(
        app,
        "SELECT g.handle FROM events e JOIN agents g ON g.id = e.agent_id"
        " WHERE e.thread_id = :id AND e.payload->>'transition' = 'lease_expired' ORDER BY g.handle",
        id=parse_ulid(task_id),
    )
    assert sorted(r[0] for r in owners) == sorted([alice[0], bob[0]])


def test_the_sweep_records_lapsed_leases_and_expiries(app, client, alice, bob, celery_app):
    import workers.tasks  # noqa: F401  (registers the tasks)

    lease_task, _ = leased(client, alice, bob)
    old_task = create(client, alice[1], bob[0], expires_in_seconds=60)["task_id"]
    fresh_task, _ = leased(client, alice, bob)
    lapse(app, lease_task)
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE id = :id", id=parse_ulid(old_task))
    assert celery_app.tasks["workers.tasks.settle_due"]() == {"settled": 2}
    states = dict(sql(app, "SELECT id, state FROM threads"))
    assert (states[parse_ulid(lease_task)], states[parse_ulid(old_task)]) == ("pending", "expired")
    assert states[parse_ulid(fresh_task)] == "accepted"
    assert celery_app.tasks["workers.tasks.settle_due"]() == {"settled": 0}  # recorded once


def test_a_lease_ending_as_complete_runs_has_one_winner(app, alice, bob):
    """Real threads: a complete sent at the lease's end, a sweep and a read, 12 rounds."""
    from relay.services import threads

    outcomes = set()
    for _round in range(12):
        client = app.test_client()
        task_id, accepted = leased(client, alice, bob)
        sql(
            app,
            "UPDATE threads SET lease_expires_at = clock_timestamp() + interval '150 milliseconds' WHERE id = :id",
            id=parse_ulid(task_id),
        )
        start = threading.Barrier(3, timeout=20)

        def complete():
            start.wait()
            time.sleep(0.14)
            return update(app.test_client(), bob[1], task_id, "complete", lease_token=accepted["lease_token"])

        def sweep():
            start.wait()
            settled = 0
            with app.app_context():
                for _ in range(40):
                    settled += threads.settle_due()
                    time.sleep(0.005)
            return settled

        def read():
            start.wait()
            time.sleep(0.145)
            return rpc(app.test_client(), alice[1], "tasks/get", {"task_id": task_id})["status"]["state"]

        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(fn) for fn in (complete, sweep, read)]
            done, settled, seen = (f.result(timeout=60) for f in futures)
        [(state,)] = sql(app, "SELECT state FROM threads WHERE id = :id", id=parse_ulid(task_id))
        actions = [
            r[0] for r in sql(app, "SELECT action FROM audit_events WHERE thread_id = :id", id=parse_ulid(task_id))
        ]
        if "result" in done:
            assert (state, settled, "lease_expired" in actions) == ("completed", 0, False), (done, actions)
        else:
            assert error_of(done)[1] in ("state_changed", "invalid_transition"), done
            assert (state, actions.count("lease_expired"), "complete" in actions) == ("pending", 1, False)
        assert seen in ("accepted", "pending", "completed")
        outcomes.add(state)
    assert outcomes  # which side wins each round is the clock's; one always does


def test_beat_records_a_lapsed_lease_within_15_seconds(app, base_env, alice, bob):
    """The Procfile's web, worker and beat: a lapsed lease is recorded, with a webhook, by beat alone."""
    from tests.live import live_relay

    with Receiver() as rx, live_relay(base_env, RELAY_WEBHOOK_ALLOW_PRIVATE="1", RELAY_WEBHOOK_ALLOW_HTTP="1") as url:
        url.stack.start("beat")
        hook = requests.post(
            f"{url}/api/v1/identities/{alice[0]}/webhooks",
            json={"url": rx.url("/hook"), "events": ["task.updated"]},
            headers=bearer(alice[1]),
            timeout=10,
        )
        assert hook.status_code == 201, hook.text
        client = app.test_client()
        task_id, _ = leased(client, alice, bob)
        rx.wait_for(1, timeout=20, path="/hook")  # the accept
        lapse(app, task_id)
        lapsed_at = time.monotonic()
        [_accept, expired] = rx.wait_for(2, timeout=20, path="/hook")
        assert time.monotonic() - lapsed_at <= 15
        data = json.loads(expired.body)["data"]
        assert (data["transition"], data["from_state"], data["to_state"]) == ("lease_expired", "accepted", "pending")
        [(state,)] = sql(app, "SELECT state FROM threads WHERE id = :id", id=parse_ulid(task_id))
        assert state == "pending"


# --------------------------------------------------------------------------- priority and expiry


def test_priority_is_shown_everywhere_and_filters_the_list(client, alice, bob):
    urgent = create(client, alice[1], bob[0], priority="urgent")["task_id"]
    high = create(client, alice[1], bob[0], priority="high")["task_id"]
    normal = create(client, alice[1], bob[0])["task_id"]
    assert rpc(client, bob[1], "tasks/get", {"task_id": urgent})["priority"] == "urgent"
    items = rpc(client, bob[1], "tasks/list", {})["items"]
    assert {i["task_id"]: i["priority"] for i in items} == {urgent: "urgent", high: "high", normal: "normal"}
    one = rpc(client, bob[1], "tasks/list", {"filter": {"priority": "urgent"}})["items"]
    assert [i["task_id"] for i in one] == [urgent]
    two = rpc(client, bob[1], "tasks/list", {"filter": {"priority": ["high", "urgent"]}})["items"]
    assert {i["task_id"] for i in two} == {urgent, high}
    rest = client.get(f"/api/v1/identities/{bob[0]}/a2a/tasks?priority=high,urgent", headers=bearer(bob[1]))
    assert {i["task_id"] for i in rest.get_json()["items"]} == {urgent, high}
    feed = client.get(f"/api/v1/identities/{bob[0]}/a2a/messages", headers=bearer(bob[1])).get_json()["items"]
    assert {r["task_id"]: r["priority"] for r in feed}[urgent] == "urgent"


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"priority": "p0"}, "priority"),
        ({"expires_in_seconds": 9}, "expires_in_seconds"),
        ({"expires_in_seconds": 2_592_001}, "expires_in_seconds"),
        ({"expires_in_seconds": 1.5}, "expires_in_seconds"),
    ],
)
def test_a_bad_priority_or_expiry_is_invalid_params_naming_it(app, client, alice, bob, extra, field):
    body = rpc_answer(
        client,
        alice[1],
        "message/send",
        {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "x"}]}, **extra},
    )
    assert error_of(body) == (-32602, "invalid_params") and field in json.dumps(body), body
    assert sql(app, "SELECT count(*) FROM threads")[0][0] == 0


def test_priority_and_expiry_are_for_a_create_only(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    for extra in ({"priority": "high"}, {"expires_in_seconds": 60}):
        body = rpc_answer(
            client,
            alice[1],
            "message/send",
            {"task_id": task_id, "message": {"parts": [{"type": "text", "text": "x"}]}, **extra},
        )
        assert error_of(body) == (-32602, "invalid_params"), body


def test_an_expired_handoff_is_refused_at_once_before_the_sweep(app, client, alice, bob):
    made = create(client, alice[1], bob[0], expires_in_seconds=60)
    ends = datetime.fromisoformat(made["expires_at"])
    assert timedelta(seconds=55) < ends - datetime.now(UTC) <= timedelta(seconds=61)
    task_id = made["task_id"]
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE id = :id", id=parse_ulid(task_id))
    assert rpc(client, bob[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "expired"}
    body = update(client, bob[1], task_id, "accept")
    assert error_of(body) == (-32008, "invalid_transition") and body["error"]["data"]["details"]["state"] == "expired"
    listed = rpc(client, bob[1], "tasks/list", {"filter": {"status": ["expired"]}})["items"]
    assert [i["task_id"] for i in listed] == [task_id]


def test_the_reads_and_the_sweep_apply_one_rule(app, alice, bob):
    """models.effective_state_sql and expired_at_sql (the reads) and threads.settle (the writes), both built from
    models.CLOCK_RULES, give the documented state and expiry moment, case by case."""
    from relay.extensions import db
    from relay.models import Thread, effective_state_sql, expired_at_sql
    from relay.services import threads

    client = app.test_client()
    # The lease lapsed after the expiry passed: the moment it expired is the lease's end.
    lapsed, passed, future = "now() - interval '1 minute'", "now() - interval '2 minutes'", "now() + interval '1 hour'"
    L, P, F = "lapsed", "passed", "future"
    # (recorded state, lease_expires_at, expires_at) -> (state as of now, the column whose time it expired at)
    cases = {
        ("pending", None, None): ("pending", None),
        ("pending", None, P): ("expired", "expires_at"),
        ("pending", None, F): ("pending", None),
        ("accepted", None, None): ("accepted", None),
        ("accepted", None, P): ("accepted", None),  # only a pending handoff expires
        ("accepted", None, F): ("accepted", None),
        ("accepted", L, None): ("pending", None),
        ("accepted", L, P): ("expired", "lease_expires_at"),  # pending again at the lease's end, then expired
        ("accepted", L, F): ("pending", None),
        ("accepted", F, None): ("accepted", None),
        ("accepted", F, P): ("accepted", None),
        ("accepted", F, F): ("accepted", None),
        ("completed", None, None): ("completed", None),
        ("completed", None, P): ("completed", None),
        ("completed", None, F): ("completed", None),
    }
    times = {None: "NULL", L: lapsed, P: passed, F: future}
    for (state, lease, expiry), (expected, expired_at) in cases.items():
        task_id = create(client, alice[1], bob[0])["task_id"]
        tid = parse_ulid(task_id)
        sql(
            app,
            f"UPDATE threads SET state = :state, lease_expires_at = {times[lease]}, expires_at = {times[expiry]},"
            " lease_token = CASE WHEN :leased THEN 'tok' END, lease_seconds = CASE WHEN :leased THEN 60 END,"
            " updated_at = now() - interval '1 hour' WHERE id = :id",
            state=state,
            leased=lease is not None,
            id=tid,
        )
        [(read, read_at, moment)] = sql(
            app,
            f"SELECT {effective_state_sql('t')}, {expired_at_sql('t')}, {f't.{expired_at}' if expired_at else 'NULL'}"
            " FROM threads t WHERE t.id = :id",
            id=tid,
        )
        with app.app_context():
            thread = db.session.get(Thread, tid, with_for_update=True)
            threads.settle(db.session, thread, db.session.scalar(db.select(db.func.now())))
            written, written_at = thread.state, thread.expired_at
            db.session.rollback()
        assert read == written == expected, (state, lease, expiry, read, written)
        assert read_at == written_at == moment, (state, lease, expiry, read_at, written_at, moment)


# --------------------------------------------------------------------------- receipts


def test_read_receipts_on_both_sides_in_tasks_get_and_the_feed(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    before = rpc(client, alice[1], "tasks/get", {"task_id": task_id})["messages"]
    assert [m["read_at"] for m in before] == [None]  # the author reading its own message is no receipt
    bob_read = rpc(client, bob[1], "tasks/get", {"task_id": task_id})["messages"]
    assert bob_read[0]["read_at"] is not None  # the answer that read it shows the receipt
    seen = rpc(client, alice[1], "tasks/get", {"task_id": task_id})["messages"]
    assert seen[0]["read_at"] == bob_read[0]["read_at"]
    rpc(client, bob[1], "message/send", {"task_id": task_id, "message": {"parts": [{"type": "text", "text": "on it"}]}})
    unread = rpc(client, bob[1], "tasks/get", {"task_id": task_id})["messages"]
    assert unread[1]["read_at"] is None  # alice has not read bob's reply
    mine = rpc(client, alice[1], "tasks/get", {"task_id": task_id})["messages"]
    assert mine[1]["read_at"] is not None
    feed = client.get(f"/api/v1/identities/{bob[0]}/a2a/messages", headers=bearer(bob[1])).get_json()["items"]
    assert {r["sequence_no"]: r["read_at"] for r in feed} == {1: seen[0]["read_at"], 2: mine[1]["read_at"]}
    again = rpc(client, bob[1], "tasks/get", {"task_id": task_id})["messages"]
    assert again[0]["read_at"] == bob_read[0]["read_at"]  # the first read's time, kept


def test_one_read_gives_every_message_it_reads_one_receipt_time(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    for text in ("two", "three"):
        rpc(
            client,
            alice[1],
            "message/send",
            {"task_id": task_id, "message": {"parts": [{"type": "text", "text": text}]}},
        )
    shown = rpc(client, bob[1], "tasks/get", {"task_id": task_id, "messages_limit": 2})["messages"]
    stored = rpc(client, alice[1], "tasks/get", {"task_id": task_id})["messages"]
    assert [m["read_at"] for m in stored] == [shown[0]["read_at"]] * 2 + [None]
    assert shown[0]["read_at"] == shown[1]["read_at"]


def test_message_read_is_an_opt_in_webhook_event(app, client, alice, bob, celery_worker):
    with Receiver() as rx:
        for path, events in (("/opted", ["message.read"]), ("/default", None)):
            body = {"url": rx.url(path), **({"events": events} if events else {})}
            resp = client.post(f"/api/v1/identities/{alice[0]}/webhooks", json=body, headers=bearer(alice[1]))
            assert resp.status_code == 201, resp.get_data(as_text=True)
            assert "message.read" not in resp.get_json()["events"] or events
        task_id = create(client, alice[1], bob[0])["task_id"]
        rpc(client, bob[1], "tasks/get", {"task_id": task_id})
        [receipt] = rx.wait_for(1, timeout=20, path="/opted")
        doc = json.loads(receipt.body)
        assert doc["type"] == "message.read"
        assert doc["data"]["task_id"] == task_id and doc["data"]["reader"]["handle"] == bob[0]
        assert (doc["data"]["through_sequence_no"], doc["data"]["messages"]) == (1, 1)
        rpc(client, bob[1], "tasks/get", {"task_id": task_id})  # nothing new read: no second receipt
        rpc(client, alice[1], "tasks/get", {"task_id": task_id})  # the author's own read: none either
        time.sleep(2)
        assert len(rx.requests(path="/opted")) == 1
        assert rx.requests(path="/default") == []  # alice's default endpoint: no receipts


def test_the_openapi_document_names_the_new_transitions_and_filters(client):
    doc = client.get("/api/v1/openapi.json").get_json()
    text = json.dumps(doc)
    body = doc["components"]["schemas"]["TransitionBody"]["properties"]
    assert set(body["transition"]["enum"]) >= set(NEW) and {
        "reason",
        "lease_seconds",
        "lease_token",
        "question",
    } <= set(body)
    assert '"name": "priority"' in text


# --------------------------------------------------------------------------- input required


def say(client, key, task_id, text) -> dict:
    return rpc(
        client, key, "message/send", {"task_id": task_id, "message": {"parts": [{"type": "text", "text": text}]}}
    )


def asked(client, alice, bob, **accept) -> tuple[str, dict]:
    """A handoff bob accepted (``accept``: its params) and then asked alice about."""
    task_id = create(client, alice[1], bob[0])["task_id"]
    accepted = update(client, bob[1], task_id, "accept", **accept)["result"]
    token = {"lease_token": accepted["lease_token"]} if accepted["lease_token"] else {}
    body = update(client, bob[1], task_id, "request_input", question=QUESTION, **token)
    assert body["result"]["status"] == {"state": "input_required"}, body
    return task_id, accepted


@pytest.mark.parametrize(
    "params",
    [{}, {"question": ""}, {"question": "x" * 2001}, {"question": None}],
    ids=["none", "empty", "long", "null"],
)
def test_request_input_requires_a_question_of_1_to_2000_characters(client, alice, bob, params):
    task_id = create(client, alice[1], bob[0])["task_id"]
    update(client, bob[1], task_id, "accept")
    body = update(client, bob[1], task_id, "request_input", **params)
    assert error_of(body) == (-32602, "invalid_params"), body
    assert "question" in body["error"]["data"]["errors"], body
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "accepted"}


def test_request_input_shows_the_question_to_both_sides_with_an_audit_row_and_a_webhook_event(app, client, alice, bob):
    task_id, _ = asked(client, alice, bob)
    for key in (alice[1], bob[1]):
        got = rpc(client, key, "tasks/get", {"task_id": task_id})
        assert (got["status"], got["question"]) == ({"state": "input_required"}, QUESTION)
        assert got["input_requested_at"] is not None
    audit = rpc(client, alice[1], "tasks/get", {"task_id": task_id})  # noqa: F841  (read marks only)
    rows = sql(
        app,
        "SELECT a.action, a.from_state, a.to_state, a.question FROM audit_events a"
        " WHERE a.thread_id = :id AND a.action = 'request_input'",
        id=parse_ulid(task_id),
    )
    assert rows == [("request_input", "accepted", "input_required", QUESTION)]
    [(owner, payload)] = sql(
        app,
        "SELECT g.handle, e.payload FROM events e JOIN agents g ON g.id = e.agent_id"
        " WHERE e.thread_id = :id AND e.type = 'task.updated' AND e.payload->>'transition' = 'request_input'",
        id=parse_ulid(task_id),
    )
    assert (owner, payload) == (alice[0], {"transition": "request_input", "from": "accepted", "to": "input_required"})
    listed = rpc(client, alice[1], "tasks/list", {"filter": {"role": "sender", "status": ["input_required"]}})
    assert [i["task_id"] for i in listed["items"]] == [task_id]


def test_a_message_from_the_requester_answers_it_and_the_work_is_accepted_again(app, client, alice, bob):
    task_id, _ = asked(client, alice, bob)
    before = rpc(client, bob[1], "tasks/get", {"task_id": task_id})["version"]
    say(client, bob[1], task_id, "still waiting for you")  # the worker's own message is no answer
    assert rpc(client, bob[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "input_required"}
    sent = say(client, alice[1], task_id, "main, please")
    assert sent["status"] == {"state": "accepted"}, sent
    got = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert (got["status"], got["question"], got["input_requested_at"]) == ({"state": "accepted"}, None, None)
    assert got["version"] == before + 1
    rows = sql(
        app,
        "SELECT a.action, g.handle, a.from_state, a.to_state FROM audit_events a JOIN agents g ON g.id = a.actor_id"
        " WHERE a.thread_id = :id ORDER BY a.created_at, a.id",
        id=parse_ulid(task_id),
    )
    assert rows[-2:] == [
        ("input_provided", alice[0], "input_required", "accepted"),
        ("append", alice[0], None, "accepted"),
    ], rows
    [(owner, payload)] = sql(
        app,
        "SELECT g.handle, e.payload FROM events e JOIN agents g ON g.id = e.agent_id"
        " WHERE e.thread_id = :id AND e.type = 'task.updated' AND e.payload->>'transition' = 'input_provided'",
        id=parse_ulid(task_id),
    )
    assert (owner, payload) == (bob[0], {"transition": "input_provided", "from": "input_required", "to": "accepted"})
    assert "result" in update(client, bob[1], task_id, "complete", result_summary="done on main")


def test_the_lease_clock_stops_while_input_is_required_and_restarts_in_full_at_the_answer(
    app, client, alice, bob, celery_app
):
    import workers.tasks  # noqa: F401  (registers the tasks)

    task_id, accepted = asked(client, alice, bob, lease_seconds=60)
    mine = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert (mine["lease_expires_at"], mine["lease_token"]) == (None, accepted["lease_token"])
    # Long past the accept's lease: the sweep and every read leave it waiting.
    sql(app, "UPDATE threads SET accepted_at = now() - interval '1 hour' WHERE id = :id", id=parse_ulid(task_id))
    assert celery_app.tasks["workers.tasks.settle_due"]() == {"settled": 0}
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "input_required"}
    say(client, alice[1], task_id, "main, please")
    got = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    left = datetime.fromisoformat(got["lease_expires_at"]) - datetime.now(UTC)
    assert timedelta(seconds=55) < left <= timedelta(seconds=61), got
    assert got["lease_token"] == accepted["lease_token"]  # the same lease goes on
    body = update(client, bob[1], task_id, "complete", lease_token=accepted["lease_token"])
    assert body["result"]["status"] == {"state": "completed"}, body


def test_an_expiry_does_not_end_a_handoff_waiting_on_its_requester(app, client, alice, bob, celery_app):
    import workers.tasks  # noqa: F401  (registers the tasks)

    task_id = create(client, alice[1], bob[0], expires_in_seconds=60)["task_id"]
    update(client, bob[1], task_id, "accept")
    update(client, bob[1], task_id, "request_input", question=QUESTION)
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE id = :id", id=parse_ulid(task_id))
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "input_required"}
    listed = rpc(client, alice[1], "tasks/list", {"filter": {"role": "sender", "status": ["input_required"]}})
    assert [i["task_id"] for i in listed["items"]] == [task_id]
    assert celery_app.tasks["workers.tasks.settle_due"]() == {"settled": 0}
    assert say(client, alice[1], task_id, "main")["status"] == {"state": "accepted"}


@pytest.mark.parametrize(
    "name, params, state",
    [("complete", {"result_summary": "found it"}, "completed"), ("release", {"reason": "no answer"}, "pending")],
)
def test_finishing_or_giving_up_while_waiting_drops_the_question(client, alice, bob, name, params, state):
    task_id, accepted = asked(client, alice, bob, lease_seconds=60)
    body = update(client, bob[1], task_id, name, lease_token=accepted["lease_token"], **params)
    assert (body["result"]["status"], body["result"]["question"]) == ({"state": state}, None), body


def test_the_requester_may_withdraw_a_handoff_waiting_on_its_answer(app, client, alice, bob):
    task_id, accepted = asked(client, alice, bob, lease_seconds=60)
    assert error_of(update(client, bob[1], task_id, "cancel")) == (-32009, "not_authorized_transition")
    body = update(client, alice[1], task_id, "cancel")
    assert (body["result"]["status"], body["result"]["question"]) == ({"state": "cancelled"}, None), body
    got = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert (got["status"], got["lease_token"], got["lease_expires_at"]) == ({"state": "cancelled"}, None, None)
    [(owner, payload)] = sql(
        app,
        "SELECT g.handle, e.payload FROM events e JOIN agents g ON g.id = e.agent_id"
        " WHERE e.thread_id = :id AND e.type = 'task.updated' AND e.payload->>'transition' = 'cancel'",
        id=parse_ulid(task_id),
    )
    assert (owner, payload) == (bob[0], {"transition": "cancel", "from": "input_required", "to": "cancelled"})
    stale = update(client, bob[1], task_id, "complete", lease_token=accepted["lease_token"])
    assert error_of(stale) == (-32008, "invalid_transition")


def test_renew_and_a_second_question_need_the_answer_first(client, alice, bob):
    for name, params in (("renew", {"lease_seconds": 30}), ("request_input", {"question": "?"})):
        task_id, _ = asked(client, alice, bob)
        assert error_of(update(client, bob[1], task_id, name, **params)) == (-32008, "invalid_transition")


def test_the_rest_route_takes_request_input(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    update(client, bob[1], task_id, "accept")
    url = f"/api/v1/identities/{bob[0]}/a2a/tasks/{task_id}/transitions"
    resp = client.post(url, json={"transition": "request_input"}, headers=bearer(bob[1]))
    assert resp.status_code == 422 and "question" in resp.get_json()["error"]["details"], resp.get_json()
    resp = client.post(url, json={"transition": "request_input", "question": QUESTION}, headers=bearer(bob[1]))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert (resp.get_json()["status"], resp.get_json()["question"]) == ({"state": "input_required"}, QUESTION)


def test_a2a_shows_input_required_with_the_question_as_the_status_message(client, alice, bob):
    task_id, _ = asked(client, alice, bob)
    url, headers = f"/a2a/agents/{bob[0]}", {**bearer(alice[1]), "A2A-Version": "1.0"}

    def a2a(method, params):
        resp = client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, headers=headers)
        assert resp.status_code == 200 and "result" in resp.get_json(), resp.get_data(as_text=True)
        return resp.get_json()["result"]

    status = a2a("GetTask", {"id": task_id})["status"]
    assert status["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert (status["message"]["role"], status["message"]["parts"]) == ("ROLE_AGENT", [{"text": QUESTION}])
    listed = a2a("ListTasks", {"status": "TASK_STATE_INPUT_REQUIRED"})
    assert [t["id"] for t in listed["tasks"]] == [task_id]
    assert listed["tasks"][0]["status"]["message"]["parts"] == [{"text": QUESTION}]
    assert a2a("ListTasks", {"status": "TASK_STATE_WORKING"})["tasks"] == []
    # CancelTask withdraws it instead of answering.
    assert a2a("CancelTask", {"id": task_id})["status"]["state"] == "TASK_STATE_CANCELED"


# --------------------------------------------------------------------------- fencing with no gap


def token_in_db(app, task_id) -> str:
    [(token,)] = sql(app, "SELECT lease_token FROM threads WHERE id = :id", id=parse_ulid(task_id))
    return token


# (first accept leased?, how it lost the work, second accept leased?)
MIXES = [
    (True, "lapse", False),
    (True, "lapse", True),
    (True, "release", False),
    (True, "release", True),
    (False, "release", True),
    (False, "release", False),
]


@pytest.mark.parametrize("name", ["complete", "fail", "release"])
@pytest.mark.parametrize("first_leased, lost_by, second_leased", MIXES)
def test_a_token_from_before_the_latest_accept_is_refused_leased_now_or_not(
    app, client, alice, bob, name, first_leased, lost_by, second_leased
):
    task_id = create(client, alice[1], bob[0])["task_id"]
    update(client, bob[1], task_id, "accept", **({"lease_seconds": 10} if first_leased else {}))
    stale = token_in_db(app, task_id)  # the first session's token (an unleased accept's is never shown)
    if lost_by == "lapse":
        lapse(app, task_id)
    else:
        assert "result" in update(client, bob[1], task_id, "release", lease_token=stale)
    second = update(client, bob[1], task_id, "accept", **({"lease_seconds": 60} if second_leased else {}))["result"]
    assert token_in_db(app, task_id) not in (None, stale)  # every accept issues a new token
    assert second["lease_token"] == (token_in_db(app, task_id) if second_leased else None)
    extra = {"reason": "stuck"} if name == "fail" else {}
    body = update(client, bob[1], task_id, name, lease_token=stale, **extra)
    assert error_of(body) == (-32010, "state_changed"), body
    assert body["error"]["data"]["details"]["field"] == "lease_token"
    if second_leased:
        assert error_of(update(client, bob[1], task_id, name, **extra)) == (-32010, "state_changed")
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["status"] == {"state": "accepted"}
    current = {"lease_token": second["lease_token"]} if second_leased else {}  # unleased: no token needed
    assert "result" in update(client, bob[1], task_id, name, **current, **extra)


def test_a_stale_token_never_wins_against_an_unleased_accept_racing_it(app, alice, bob):
    """Real threads, 12 rounds: the lapsed session's complete races another session's unleased accept."""
    for _round in range(12):
        client = app.test_client()
        task_id, first = leased(client, alice, bob, 10)
        lapse(app, task_id)
        start = threading.Barrier(2, timeout=20)

        def stale_complete():
            start.wait()
            answers = []
            for _ in range(20):
                answers.append(update(app.test_client(), bob[1], task_id, "complete", lease_token=first["lease_token"]))
                time.sleep(0.002)
            return answers

        def accept():
            start.wait()
            time.sleep(0.01)
            return update(app.test_client(), bob[1], task_id, "accept")

        with ThreadPoolExecutor(2) as pool:
            completes, accepted = pool.submit(stale_complete), pool.submit(accept)
            answers, took = completes.result(timeout=60), accepted.result(timeout=60)
        assert all(error_of(a)[1] in ("state_changed", "invalid_transition") for a in answers), answers
        assert "result" in took, took
        [(state,)] = sql(app, "SELECT state FROM threads WHERE id = :id", id=parse_ulid(task_id))
        assert state == "accepted"


# --------------------------------------------------------------------------- one table of params


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("accept", {"result_summary": "done"}, "result_summary"),
        ("accept", {"question": "which?"}, "question"),
        ("accept", {"lease_token": "t"}, "lease_token"),
        ("complete", {"session_id": "s-1"}, "session_id"),
        ("complete", {"question": "which?"}, "question"),
        ("decline", {"reason": "no", "session_id": "s-1"}, "session_id"),
        ("request_input", {"question": "which?", "result_summary": "x"}, "result_summary"),
        ("renew", {"lease_seconds": 30, "reason": "more time"}, "reason"),
    ],
)
def test_a_param_of_another_transition_is_invalid_params_naming_it(client, alice, bob, name, params, field):
    task_id = create(client, alice[1], bob[0])["task_id"]
    if NEW.get(name, ("pending",))[0] == "accepted" or name == "complete":
        update(client, bob[1], task_id, "accept")
    before = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    body = update(client, bob[1], task_id, name, **params)
    assert error_of(body) == (-32602, "invalid_params"), body
    assert list(body["error"]["data"]["errors"]) == [field], body
    assert "only allowed with" in body["error"]["data"]["errors"][field][0]
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["version"] == before["version"]


def test_cancel_through_tasks_update_takes_no_params(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    body = update(client, alice[1], task_id, "cancel", reason="changed my mind")
    assert error_of(body) == (-32602, "invalid_params") and list(body["error"]["data"]["errors"]) == ["reason"]


def test_a_null_param_of_another_transition_is_as_absent(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    body = update(client, bob[1], task_id, "accept", result_summary=None, question=None, lease_token=None)
    assert body["result"]["status"] == {"state": "accepted"}, body
    body = update(client, bob[1], task_id, "complete", result_summary="done", session_id=None, lease_seconds=None)
    assert body["result"]["status"] == {"state": "completed"}, body


def test_the_rest_route_refuses_a_param_of_another_transition_naming_it(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    url = f"/api/v1/identities/{bob[0]}/a2a/tasks/{task_id}/transitions"
    resp = client.post(url, json={"transition": "accept", "result_summary": "done"}, headers=bearer(bob[1]))
    assert resp.status_code == 422 and list(resp.get_json()["error"]["details"]) == ["result_summary"], resp.get_json()
    update(client, bob[1], task_id, "accept")
    resp = client.post(url, json={"transition": "complete", "session_id": "s-1"}, headers=bearer(bob[1]))
    assert resp.status_code == 422 and list(resp.get_json()["error"]["details"]) == ["session_id"], resp.get_json()
