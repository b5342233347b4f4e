"""What the lifecycle stores, read back by a later call: never the answer of the call that wrote it.

Each test pins one rule a call's own answer could hide: an answer built from its input
(an expiry echoed but not stored), or built before the write it describes (a receipt).
The clock's rules run through the sweep's own service function (beat's ``settle_due``).
"""

from __future__ import annotations

from datetime import datetime

from relay.ids import parse_ulid
from tests.conftest import bearer, rpc, sql
from tests.test_lifecycle import create, lapse, leased, update


def _feed(client, agent) -> dict[str, dict]:
    """The agent's feed rows by task id (one message per task here)."""
    page = client.get(f"/api/v1/identities/{agent[0]}/a2a/messages", headers=bearer(agent[1])).get_json()
    return {row["task_id"]: row for row in page["items"]}


def _feed_rows(client, agent) -> list[dict]:
    """The agent's feed, oldest first."""
    page = client.get(f"/api/v1/identities/{agent[0]}/a2a/messages", headers=bearer(agent[1])).get_json()
    return sorted(page["items"], key=lambda row: (row["task_id"], row["sequence_no"]))


def _settle_due(app) -> int:
    from relay.services import threads

    with app.app_context():
        return threads.settle_due()


def _stored(app, task_id: str, columns: str):
    [row] = sql(app, f"SELECT {columns} FROM threads WHERE id = :id", id=parse_ulid(task_id))  # noqa: S608
    return tuple(row)


def test_an_expiry_is_stored_and_the_sweep_expires_the_handoff_at_it(app, client, alice, bob):
    made = create(client, alice[1], bob[0], expires_in_seconds=600)
    task_id = made["task_id"]
    for key in (alice[1], bob[1]):  # the stored expiry, read back by another call
        assert rpc(client, key, "tasks/get", {"task_id": task_id})["expires_at"] == made["expires_at"]
    assert _feed(client, bob)[task_id]["task_state"] == "pending"
    # Move the STORED expiry ten minutes back (a handoff made with none keeps none: NULL - 10 min is NULL).
    sql(
        app,
        "UPDATE threads SET expires_at = expires_at - interval '600 seconds' WHERE id = :id",
        id=parse_ulid(task_id),
    )
    assert _settle_due(app) == 1
    state, expired_at, expires_at = _stored(app, task_id, "state, expired_at, expires_at")
    assert state == "expired" and expired_at == expires_at
    got = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert got["status"] == {"state": "expired"}
    assert _feed(client, bob)[task_id]["task_state"] == "expired"
    trail = client.get(f"/api/v1/identities/{alice[0]}/a2a/tasks/{task_id}/audit", headers=bearer(alice[1]))
    assert [r["action"] for r in trail.get_json()["items"]] == ["create", "expire"]


def test_expired_at_is_the_moment_of_expiry_before_and_after_the_sweep_records_it(app, client, alice, bob):
    task_id = create(client, alice[1], bob[0], expires_in_seconds=600)["task_id"]
    sql(  # made two hours ago, expired one hour ago
        app,
        "UPDATE threads SET created_at = now() - interval '2 hours', updated_at = now() - interval '2 hours',"
        " expires_at = now() - interval '1 hour' WHERE id = :id",
        id=parse_ulid(task_id),
    )
    [(expires_at,)] = [_stored(app, task_id, "expires_at")]
    before = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert before["status"] == {"state": "expired"}
    assert datetime.fromisoformat(before["expired_at"]) == expires_at  # not null until the sweep runs
    assert _settle_due(app) == 1
    after = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert datetime.fromisoformat(after["expired_at"]) == expires_at  # the expiry's moment, not the sweep's
    # updated_at is when the relay recorded it: after the expiry, so a since= reader sees the change.
    assert datetime.fromisoformat(after["updated_at"]) > datetime.fromisoformat(before["updated_at"])
    assert datetime.fromisoformat(after["updated_at"]) > expires_at


def test_a_lease_lapsing_after_the_expiry_expires_the_handoff_at_the_lease_end(app, client, alice, bob):
    task_id, _accepted = leased(client, alice, bob)
    sql(
        app,
        "UPDATE threads SET expires_at = now() - interval '1 hour', lease_expires_at = now() - interval '30 minutes'"
        " WHERE id = :id",
        id=parse_ulid(task_id),
    )
    [(lease_end,)] = [_stored(app, task_id, "lease_expires_at")]
    before = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    assert before["status"] == {"state": "expired"}
    assert datetime.fromisoformat(before["expired_at"]) == lease_end  # pending again only then, and past its expiry
    assert _settle_due(app) == 1
    after = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    assert datetime.fromisoformat(after["expired_at"]) == lease_end


def test_a_release_after_the_expiry_expires_the_handoff_at_the_release(app, client, alice, bob):
    task_id = create(client, alice[1], bob[0], expires_in_seconds=600)["task_id"]
    assert "result" in update(client, bob[1], task_id, "accept")
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 hour' WHERE id = :id", id=parse_ulid(task_id))
    released = update(client, bob[1], task_id, "release", reason="cannot finish")["result"]
    got = rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    assert got["status"] == {"state": "expired"}
    assert got["expired_at"] == released["updated_at"]  # expired the moment it was pending again
    assert _settle_due(app) == 1
    assert rpc(client, alice[1], "tasks/get", {"task_id": task_id})["expired_at"] == released["updated_at"]


def test_read_at_is_set_by_the_other_sides_read_only(app, client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    rpc(client, alice[1], "message/send", {"task_id": task_id, "message": {"parts": [{"type": "text", "text": "2"}]}})
    for _ in range(3):  # the author reads its own thread, again and again
        rpc(client, alice[1], "tasks/get", {"task_id": task_id})
    # Read back by a later call: a read's own answer is built before its receipts are written.
    again = rpc(client, alice[1], "tasks/get", {"task_id": task_id})["messages"]
    assert [m["read_at"] for m in again] == [None, None]
    assert [r["read_at"] for r in _feed_rows(client, bob)] == [None, None]
    assert [r[0] for r in sql(app, "SELECT read_at FROM messages ORDER BY sequence_no")] == [None, None]
    shown = rpc(client, bob[1], "tasks/get", {"task_id": task_id})["messages"]
    assert shown[0]["read_at"] is not None
    later = rpc(client, alice[1], "tasks/get", {"task_id": task_id})["messages"]
    assert [m["read_at"] for m in later] == [shown[0]["read_at"]] * 2


def test_a_lapsed_lease_recorded_by_the_sweep_is_read_back_as_pending_without_a_lease(app, client, alice, bob):
    task_id, accepted = leased(client, alice, bob)
    lapse(app, task_id)
    assert _settle_due(app) == 1
    assert _stored(app, task_id, "state, lease_token, lease_expires_at, accepted_at") == ("pending", None, None, None)
    got = rpc(client, bob[1], "tasks/get", {"task_id": task_id})
    assert got["status"] == {"state": "pending"} and got["lease_token"] is None and got["accepted_at"] is None
    body = update(client, bob[1], task_id, "complete", lease_token=accepted["lease_token"])
    assert body["error"]["data"]["symbol"] == "invalid_transition", body


def test_a_release_clears_the_accept_time_read_back_by_both_sides(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    assert "result" in update(client, bob[1], task_id, "accept")
    assert "result" in update(client, bob[1], task_id, "release", reason="out of time")
    for key in (alice[1], bob[1]):
        got = rpc(client, key, "tasks/get", {"task_id": task_id})
        assert (got["status"], got["accepted_at"]) == ({"state": "pending"}, None)


def test_a_fails_reason_is_stored_and_read_back_by_both_sides(client, alice, bob):
    task_id = create(client, alice[1], bob[0])["task_id"]
    assert "result" in update(client, bob[1], task_id, "accept")
    assert "result" in update(client, bob[1], task_id, "fail", reason="the tests will not pass")
    for key in (alice[1], bob[1]):
        got = rpc(client, key, "tasks/get", {"task_id": task_id})
        assert (got["status"], got["reason"]) == ({"state": "failed"}, "the tests will not pass")
        assert got["failed_at"] is not None


def _clock_ran_out(app, client, alice, bob) -> dict[str, str]:
    """An expired handoff and a lapsed lease, both recorded by the sweep: ``{action: task_id}``."""
    expiring = create(client, alice[1], bob[0], expires_in_seconds=600)["task_id"]
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE id = :id", id=parse_ulid(expiring))
    lapsing, _accepted = leased(client, alice, bob)
    lapse(app, lapsing)
    assert _settle_due(app) == 2
    return {"expire": expiring, "lease_expired": lapsing}


def test_the_clocks_audit_rows_name_whose_time_ran_out(app, client, alice, bob):
    """An expiry names the sender (its handoff's time), a lapsed lease the recipient (its lease)."""
    recorded = _clock_ran_out(app, client, alice, bob)
    for action, actor in (("expire", alice[0]), ("lease_expired", bob[0])):
        trail = client.get(
            f"/api/v1/identities/{alice[0]}/a2a/tasks/{recorded[action]}/audit", headers=bearer(alice[1])
        ).get_json()["items"]
        assert [(r["action"], r["actor"]) for r in trail if r["action"] == action] == [(action, actor)]


def test_the_clocks_changes_go_to_both_sides(app, client, alice, bob):
    recorded = _clock_ran_out(app, client, alice, bob)
    for action, task_id in recorded.items():
        owners = sql(
            app,
            "SELECT g.handle FROM events e JOIN agents g ON g.id = e.agent_id"
            " WHERE e.thread_id = :id AND e.type = 'task.updated' AND e.payload->>'transition' = :action",
            id=parse_ulid(task_id),
            action=action,
        )
        assert sorted(r[0] for r in owners) == sorted([alice[0], bob[0]]), action
