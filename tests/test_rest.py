"""The REST transport under ``/api/v1`` (docs/api.md, "REST: `/api/v1`"): tasks, transitions, audit,
blocks, keys, the one error shape, the OpenAPI document and the REST rate limit.

REST calls the same services as JSON-RPC, so the rules are the same; these tests check
that the REST side maps each rule to the right status and error code.
"""

from __future__ import annotations

import re
import secrets

import pytest
from ulid import ULID

from tests.conftest import bearer, rpc, rpc_answer, sql

API = "/api/v1/identities"
KEY_FORMAT = re.compile(r"^ah_live_[a-z2-7]{32}$")


# --------------------------------------------------------------------------- helpers


def msg(text_):
    return {"parts": [{"type": "text", "text": text_}]}


def create(client, key, recipient, text_="please review", **extra):
    return rpc(client, key, "message/send", {"recipient": recipient, "message": msg(text_), **extra})


def api_get(client, key, path, **query):
    return client.get(f"{API}/{path}", query_string=query, headers=bearer(key))


def api_post(client, key, path, body):
    return client.post(f"{API}/{path}", json=body, headers=bearer(key))


def ok(resp, status=200):
    assert resp.status_code == status, resp.get_data(as_text=True)
    return resp.get_json()


def assert_error(resp, status, code):
    """Every REST error: the status, JSON, and exactly {"error": {"code", "message", "details"}}."""
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.mimetype == "application/json", resp.headers
    body = resp.get_json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def tasks(client, key, handle, **query):
    return ok(api_get(client, key, f"{handle}/a2a/tasks", **query))


def task_ids(client, key, handle, **query):
    return [t["task_id"] for t in tasks(client, key, handle, **query)["items"]]


def transition(client, key, handle, task_id, name, **extra):
    return api_post(client, key, f"{handle}/a2a/tasks/{task_id}/transitions", {"transition": name, **extra})


def reply(client, key, handle, task_id, text_="a reply", **extra):
    return api_post(client, key, f"{handle}/a2a/tasks/{task_id}/messages", {"message": msg(text_), **extra})


@pytest.fixture
def carol(make_agent):
    return make_agent("carol@acme", name="Carol", role="qa")


# --------------------------------------------------------------------------- GET .../a2a/tasks


def test_list_tasks_defaults_to_the_inbox_newest_first(client, alice, bob, carol):
    a_handle, a_key = alice
    b_handle, b_key = bob
    _c, c_key = carol
    t1 = create(client, a_key, b_handle, "one")["task_id"]
    t2 = create(client, c_key, b_handle, "two")["task_id"]
    create(client, b_key, a_handle, "bob's own")
    body = tasks(client, b_key, b_handle)
    assert [t["task_id"] for t in body["items"]] == [t2, t1]
    assert body["next_cursor"] is None
    item = body["items"][1]
    assert item["summary_preview"] == "one" and item["status"] == {"state": "pending"}
    assert item["sender"] == {"handle": a_handle, "name": "Alice", "role": "frontend"}
    assert item["unread_messages"] == 1


def test_list_tasks_role_sender_lists_sent_threads(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    sent = create(client, a_key, b_handle)["task_id"]
    create(client, b_key, a_handle)
    assert task_ids(client, a_key, a_handle, role="sender") == [sent]


def test_list_tasks_bad_role_is_422(client, alice):
    a_handle, a_key = alice
    error = assert_error(api_get(client, a_key, f"{a_handle}/a2a/tasks", role="owner"), 422, "invalid_params")
    assert "role" in error["details"]


@pytest.fixture
def three_states(client, alice, bob):
    """bob's inbox: one pending, one accepted, one completed thread."""
    a_handle, a_key = alice
    b_handle, b_key = bob
    pending = create(client, a_key, b_handle, "pending one")["task_id"]
    accepted = create(client, a_key, b_handle, "accepted one")["task_id"]
    completed = create(client, a_key, b_handle, "completed one")["task_id"]
    ok(transition(client, b_key, b_handle, accepted, "accept"))
    ok(transition(client, b_key, b_handle, completed, "accept"))
    ok(transition(client, b_key, b_handle, completed, "complete"))
    return b_handle, b_key, {"pending": pending, "accepted": accepted, "completed": completed}


def test_status_filter_as_repeated_parameter(client, three_states):
    handle, key, ids = three_states
    resp = client.get(f"{API}/{handle}/a2a/tasks?status=pending&status=completed", headers=bearer(key))
    assert {t["task_id"] for t in ok(resp)["items"]} == {ids["pending"], ids["completed"]}


def test_status_filter_as_comma_list(client, three_states):
    handle, key, ids = three_states
    assert set(task_ids(client, key, handle, status="pending,accepted")) == {ids["pending"], ids["accepted"]}


def test_status_filter_single_value(client, three_states):
    handle, key, ids = three_states
    assert task_ids(client, key, handle, status="completed") == [ids["completed"]]
    assert task_ids(client, key, handle, status="cancelled") == []


def test_unknown_status_is_422_naming_status(client, three_states):
    handle, key, _ids = three_states
    error = assert_error(api_get(client, key, f"{handle}/a2a/tasks", status="pending,done"), 422, "invalid_params")
    assert any(k.startswith("status") for k in error["details"]), error


def test_list_tasks_since_is_inclusive_on_last_activity(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    old = create(client, a_key, b_handle, "old")["task_id"]
    new = create(client, a_key, b_handle, "new")["task_id"]
    sql(
        app, "UPDATE threads SET updated_at = CAST(:t AS timestamptz) WHERE summary = 'old'", t="2026-05-01 10:00:00+00"
    )
    sql(
        app, "UPDATE threads SET updated_at = CAST(:t AS timestamptz) WHERE summary = 'new'", t="2026-05-01 10:00:01+00"
    )
    assert task_ids(client, b_key, b_handle, since="2026-05-01T10:00:00Z") == [new, old]
    assert task_ids(client, b_key, b_handle, since="2026-05-01T10:00:00.000001Z") == [new]
    assert task_ids(client, b_key, b_handle, since="2026-05-01T12:00:01+02:00") == [new]


@pytest.mark.parametrize(
    "query, param",
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"since": "2026-05-01T10:00:00"}, "since"),
        ({"cursor": "nope"}, "cursor"),
        ({"page": "2"}, "page"),
    ],
    ids=["limit-0", "limit-201", "since-no-zone", "cursor", "unknown"],
)
def test_list_tasks_bad_parameter_is_422_naming_it(client, alice, query, param):
    a_handle, a_key = alice
    error = assert_error(api_get(client, a_key, f"{a_handle}/a2a/tasks", **query), 422, "invalid_params")
    assert param in error["details"], error


def test_list_tasks_limit_200_is_accepted(client, alice):
    a_handle, a_key = alice
    assert tasks(client, a_key, a_handle, limit="200") == {"items": [], "next_cursor": None}


def test_list_tasks_cursor_walk_returns_every_thread_once_in_order(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    created = [create(client, a_key, b_handle, f"t{i}")["task_id"] for i in range(5)]
    pages, cursor = [], None
    for _ in range(10):
        query = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        body = tasks(client, b_key, b_handle, **query)
        pages.append([t["task_id"] for t in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == [created[4:2:-1], created[2:0:-1], created[0:1]]


def test_list_tasks_of_a_teammate_is_403(client, alice, bob):
    _a, a_key = alice
    b_handle, _b = bob
    assert_error(api_get(client, a_key, f"{b_handle}/a2a/tasks"), 403, "forbidden")


# --------------------------------------------------------------------------- GET .../a2a/tasks/{id}


def test_get_task_returns_history_and_marks_read(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    sent = create(client, a_key, b_handle, "read me")
    rpc(client, a_key, "message/send", {"task_id": sent["task_id"], "message": msg("and this")})
    assert tasks(client, b_key, b_handle)["items"][0]["unread_messages"] == 2
    thread = ok(api_get(client, b_key, f"{b_handle}/a2a/tasks/{sent['task_id']}"))
    assert thread["task_id"] == sent["task_id"] and thread["status"] == {"state": "pending"}
    assert [(m["sequence_no"], m["body"], m["from"]) for m in thread["messages"]] == [
        (1, "read me", a_handle),
        (2, "and this", a_handle),
    ]
    assert thread["messages"][0]["id"] == sent["message_id"]
    assert tasks(client, b_key, b_handle)["items"][0]["unread_messages"] == 0


def test_get_task_pages_its_messages(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    sent = create(client, a_key, b_handle, "m1")
    for text in ("m2", "m3"):
        rpc(client, a_key, "message/send", {"task_id": sent["task_id"], "message": msg(text)})
    path = f"{b_handle}/a2a/tasks/{sent['task_id']}"
    first = ok(api_get(client, b_key, path, messages_limit=2))
    assert [m["body"] for m in first["messages"]] == ["m1", "m2"] and first["messages_next"] == 2
    rest = ok(api_get(client, b_key, path, messages_limit=2, messages_after=first["messages_next"]))
    assert [m["body"] for m in rest["messages"]] == ["m3"] and rest["messages_next"] is None
    assert "messages_next" not in ok(api_get(client, b_key, path))
    for bad, field in (({"messages_limit": 0}, "messages_limit"), ({"messages_after": "x"}, "messages_after")):
        error = assert_error(api_get(client, b_key, path, **bad), 422, "invalid_params")
        assert field in error["details"], error


def test_get_task_accepts_the_uuid_form_of_the_id(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    uuid_form = str(ULID.from_str(task_id).to_uuid())
    assert ok(api_get(client, b_key, f"{b_handle}/a2a/tasks/{uuid_form}"))["task_id"] == task_id


def test_get_unknown_task_is_404(client, alice):
    a_handle, a_key = alice
    assert_error(api_get(client, a_key, f"{a_handle}/a2a/tasks/{ULID()}"), 404, "thread_not_found")


def test_get_task_with_malformed_id_is_422(client, alice):
    a_handle, a_key = alice
    error = assert_error(api_get(client, a_key, f"{a_handle}/a2a/tasks/not-an-id"), 422, "invalid_params")
    assert "task_id" in error["details"]


def test_get_task_by_a_non_participant_is_403_without_content(client, alice, bob, carol):
    _a, a_key = alice
    b_handle, _b = bob
    c_handle, c_key = carol
    task_id = create(client, a_key, b_handle, "secret plans")["task_id"]
    error = assert_error(api_get(client, c_key, f"{c_handle}/a2a/tasks/{task_id}"), 403, "not_a_participant")
    assert "secret" not in str(error) and "alice" not in str(error)


# --------------------------------------------------------------------------- POST .../messages (reply)


def test_reply_is_201_with_sequence_no(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    first = ok(reply(client, b_key, b_handle, task_id, "on it"), 201)
    second = ok(reply(client, a_key, a_handle, task_id, "thanks"), 201)
    assert (first["task_id"], first["sequence_no"], second["sequence_no"]) == (task_id, 2, 3)
    assert first["status"] == {"state": "pending"}
    history = ok(api_get(client, a_key, f"{a_handle}/a2a/tasks/{task_id}"))["messages"]
    assert [(m["id"], m["role"], m["body"]) for m in history[1:]] == [
        (first["message_id"], "agent", "on it"),
        (second["message_id"], "caller", "thanks"),
    ]


def test_reply_with_artifacts_and_metadata_stores_them(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    artifact = {"type": "test_command", "command": "pytest -q"}
    ok(reply(client, b_key, b_handle, task_id, "done", artifacts=[artifact], metadata={"run": 7}), 201)
    last = ok(api_get(client, a_key, f"{a_handle}/a2a/tasks/{task_id}"))["messages"][-1]
    assert last["artifacts"] == [artifact] and last["payload"] == {"run": 7}


def test_reply_with_the_same_idempotency_key_twice_returns_the_same_message(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    meta = {"client_idempotency_key": "reply-1"}
    first = ok(reply(client, b_key, b_handle, task_id, "once", metadata=meta), 201)
    again = ok(reply(client, b_key, b_handle, task_id, "once", metadata=meta), 201)
    assert again["message_id"] == first["message_id"] and again["sequence_no"] == 2
    [(count,)] = sql(app, "SELECT count(*) FROM messages")
    assert count == 2


def test_reply_with_a_reused_key_and_other_text_is_409(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    meta = {"client_idempotency_key": "reply-2"}
    ok(reply(client, b_key, b_handle, task_id, "first text", metadata=meta), 201)
    assert_error(reply(client, b_key, b_handle, task_id, "other text", metadata=meta), 409, "duplicate_idempotency_key")
    [(count,)] = sql(app, "SELECT count(*) FROM messages")
    assert count == 2


def test_reply_to_a_terminal_thread_is_409_thread_terminal(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    ok(transition(client, a_key, a_handle, task_id, "cancel"))
    error = assert_error(reply(client, b_key, b_handle, task_id), 409, "thread_terminal")
    assert error["details"] == {"state": "cancelled"}


def test_reply_by_a_non_participant_is_403(client, alice, bob, carol):
    _a, a_key = alice
    b_handle, _b = bob
    c_handle, c_key = carol
    task_id = create(client, a_key, b_handle)["task_id"]
    assert_error(reply(client, c_key, c_handle, task_id), 403, "not_a_participant")


def test_reply_to_an_unknown_thread_is_404(client, alice):
    a_handle, a_key = alice
    assert_error(reply(client, a_key, a_handle, str(ULID())), 404, "thread_not_found")


def test_reply_without_a_message_is_422_naming_it(client, alice, bob):
    a_handle, a_key = alice
    b_handle, _b = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    error = assert_error(
        api_post(client, a_key, f"{a_handle}/a2a/tasks/{task_id}/messages", {"metadata": {}}), 422, "invalid_params"
    )
    assert "message" in error["details"]


def test_reply_with_a_non_object_body_is_422(client, alice, bob):
    a_handle, a_key = alice
    b_handle, _b = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    resp = client.post(
        f"{API}/{a_handle}/a2a/tasks/{task_id}/messages",
        data="[1, 2]",
        headers={**bearer(a_key), "Content-Type": "application/json"},
    )
    assert "body" in assert_error(resp, 422, "invalid_params")["details"]


# --------------------------------------------------------------------------- POST .../transitions


def test_accept_then_complete(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    accepted = ok(transition(client, b_key, b_handle, task_id, "accept", session_id="sess-9"))
    assert accepted["status"] == {"state": "accepted"} and accepted["version"] == 2
    assert accepted["accepted_at"] is not None and accepted["completed_at"] is None
    completed = ok(transition(client, b_key, b_handle, task_id, "complete", result_summary="shipped"))
    assert completed["status"] == {"state": "completed"} and completed["version"] == 3
    assert completed["result_summary"] == "shipped" and completed["completed_at"] is not None


def test_cancel_by_the_sender(client, alice, bob):
    a_handle, a_key = alice
    b_handle, _b = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    cancelled = ok(transition(client, a_key, a_handle, task_id, "cancel"))
    assert cancelled["status"] == {"state": "cancelled"} and cancelled["cancelled_at"] is not None


def test_invalid_transition_is_409(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    error = assert_error(transition(client, b_key, b_handle, task_id, "complete"), 409, "invalid_transition")
    assert error["details"] == {"transition": "complete", "state": "pending"}
    ok(transition(client, b_key, b_handle, task_id, "accept"))
    assert_error(transition(client, a_key, a_handle, task_id, "cancel"), 409, "invalid_transition")


def test_transition_by_the_wrong_side_is_403_not_authorized(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    error = assert_error(transition(client, a_key, a_handle, task_id, "accept"), 403, "not_authorized_transition")
    assert error["details"] == {"transition": "accept", "required_role": "recipient"}
    assert_error(transition(client, b_key, b_handle, task_id, "cancel"), 403, "not_authorized_transition")


def test_transition_by_a_non_participant_is_403(client, alice, bob, carol):
    _a, a_key = alice
    b_handle, _b = bob
    c_handle, c_key = carol
    task_id = create(client, a_key, b_handle)["task_id"]
    assert_error(transition(client, c_key, c_handle, task_id, "accept"), 403, "not_a_participant")


def test_transition_of_an_unknown_thread_is_404(client, alice):
    a_handle, a_key = alice
    assert_error(transition(client, a_key, a_handle, str(ULID()), "accept"), 404, "thread_not_found")


def test_transition_with_a_malformed_id_is_422(client, alice):
    a_handle, a_key = alice
    error = assert_error(transition(client, a_key, a_handle, "12345", "accept"), 422, "invalid_params")
    assert "task_id" in error["details"]


@pytest.mark.parametrize(
    "body, field",
    [({"transition": "finish"}, "transition"), ({}, "transition"), ({"transition": "accept", "reason": "x"}, "reason")],
    ids=["bad-name", "missing", "unknown-field"],
)
def test_bad_transition_body_is_422_naming_the_field(client, alice, bob, body, field):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle)["task_id"]
    resp = api_post(client, b_key, f"{b_handle}/a2a/tasks/{task_id}/transitions", body)
    assert field in assert_error(resp, 422, "invalid_params")["details"]
    assert ok(api_get(client, b_key, f"{b_handle}/a2a/tasks/{task_id}"))["status"] == {"state": "pending"}


# --------------------------------------------------------------------------- GET .../audit


def test_audit_lists_create_append_accept_complete_in_order(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    sent = create(client, a_key, b_handle)
    task_id = sent["task_id"]
    appended = ok(reply(client, b_key, b_handle, task_id, "question"), 201)
    ok(transition(client, b_key, b_handle, task_id, "accept", session_id="sess-42"))
    ok(transition(client, b_key, b_handle, task_id, "complete", result_summary="all green"))
    rows = ok(api_get(client, a_key, f"{a_handle}/a2a/tasks/{task_id}/audit"))["items"]
    assert [
        (r["action"], r["actor"], r["from_state"], r["to_state"], r["session_id"], r["result_summary"], r["message_id"])
        for r in rows
    ] == [
        ("create", a_handle, None, "pending", None, None, sent["message_id"]),
        ("append", b_handle, None, "pending", None, None, appended["message_id"]),
        ("accept", b_handle, "pending", "accepted", "sess-42", None, None),
        ("complete", b_handle, "accepted", "completed", None, "all green", None),
    ]
    stamps = [r["created_at"] for r in rows]
    assert stamps == sorted(stamps)


def test_audit_by_a_non_participant_is_403(client, alice, bob, carol):
    _a, a_key = alice
    b_handle, _b = bob
    c_handle, c_key = carol
    task_id = create(client, a_key, b_handle)["task_id"]
    assert_error(api_get(client, c_key, f"{c_handle}/a2a/tasks/{task_id}/audit"), 403, "not_a_participant")


def test_audit_of_an_unknown_thread_is_404(client, alice):
    a_handle, a_key = alice
    assert_error(api_get(client, a_key, f"{a_handle}/a2a/tasks/{ULID()}/audit"), 404, "thread_not_found")


# --------------------------------------------------------------------------- blocks


def block(client, key, handle, other):
    return client.put(f"{API}/{handle}/blocks/{other}", headers=bearer(key))


def unblock(client, key, handle, other):
    return client.delete(f"{API}/{handle}/blocks/{other}", headers=bearer(key))


def test_block_answers_200_and_is_listed(client, alice, bob):
    a_handle, _a = alice
    b_handle, b_key = bob
    assert ok(block(client, b_key, b_handle, a_handle)) == {"handle": a_handle, "blocked": True}
    items = ok(api_get(client, b_key, f"{b_handle}/blocks"))["items"]
    assert [(i["handle"], i["name"], i["role"]) for i in items] == [(a_handle, "Alice", "frontend")]
    assert items[0]["created_at"].endswith("Z")


def test_blocking_twice_is_idempotent(client, alice, bob):
    a_handle, _a = alice
    b_handle, b_key = bob
    ok(block(client, b_key, b_handle, a_handle))
    ok(block(client, b_key, b_handle, a_handle.upper()))
    assert len(ok(api_get(client, b_key, f"{b_handle}/blocks"))["items"]) == 1


def test_blocked_sender_gets_teammate_blocked_on_create(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    ok(block(client, b_key, b_handle, a_handle))
    body = rpc_answer(client, a_key, "message/send", {"recipient": b_handle, "message": msg("let me in")})
    assert body["error"]["code"] == -32013 and body["error"]["data"]["symbol"] == "teammate_blocked"
    assert task_ids(client, b_key, b_handle) == []


def test_block_is_one_way(client, alice, bob):
    a_handle, _a = alice
    b_handle, b_key = bob
    ok(block(client, b_key, b_handle, a_handle))
    assert create(client, b_key, a_handle, "bob may still write")["status"] == {"state": "pending"}


def test_existing_thread_still_accepts_appends_from_the_blocked_sender(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "before the block")["task_id"]
    ok(block(client, b_key, b_handle, a_handle))
    via_rpc = rpc(client, a_key, "message/send", {"task_id": task_id, "message": msg("still here")})
    via_rest = ok(reply(client, a_key, a_handle, task_id, "and here"), 201)
    assert (via_rpc["sequence_no"], via_rest["sequence_no"]) == (2, 3)


def test_unblock_answers_204_and_create_works_again(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    ok(block(client, b_key, b_handle, a_handle))
    resp = unblock(client, b_key, b_handle, a_handle)
    assert resp.status_code == 204 and resp.get_data() == b""
    assert ok(api_get(client, b_key, f"{b_handle}/blocks"))["items"] == []
    task_id = create(client, a_key, b_handle, "welcome back")["task_id"]
    assert task_ids(client, b_key, b_handle) == [task_id]


def test_unblocking_someone_not_blocked_is_204(client, alice, bob):
    a_handle, _a = alice
    b_handle, b_key = bob
    assert unblock(client, b_key, b_handle, a_handle).status_code == 204


def test_blocking_yourself_is_422(client, bob):
    b_handle, b_key = bob
    error = assert_error(block(client, b_key, b_handle, b_handle), 422, "invalid_params")
    assert "blocked_handle" in error["details"]


def test_blocking_an_unknown_handle_is_404(client, bob):
    b_handle, b_key = bob
    assert_error(block(client, b_key, b_handle, "ghost@acme"), 404, "identity_not_found")
    assert_error(unblock(client, b_key, b_handle, "ghost@acme"), 404, "identity_not_found")


def test_blocking_a_malformed_handle_is_422(client, bob):
    b_handle, b_key = bob
    error = assert_error(block(client, b_key, b_handle, "not-a-handle"), 422, "invalid_params")
    assert "blocked_handle" in error["details"]


def test_blocks_of_a_teammate_are_403(client, alice, bob):
    a_handle, a_key = alice
    b_handle, _b = bob
    assert_error(api_get(client, a_key, f"{b_handle}/blocks"), 403, "forbidden")
    assert_error(block(client, a_key, b_handle, a_handle), 403, "forbidden")


# --------------------------------------------------------------------------- keys

KEY_FIELDS = {"key_id", "label", "hint", "created_at", "last_used_at", "revoked_at"}


def test_list_keys_never_shows_a_secret(client, alice):
    a_handle, a_key = alice
    extra = ok(api_post(client, a_key, f"{a_handle}/keys", {"label": "ci"}), 201)["api_key"]
    items = ok(api_get(client, a_key, f"{a_handle}/keys"))["items"]
    assert len(items) == 2
    for item in items:
        assert set(item) == KEY_FIELDS
        for value in item.values():
            assert a_key not in str(value) and extra not in str(value)
            assert a_key[8:] not in str(value) and extra[8:] not in str(value)
    assert sorted(i["label"] for i in items) == ["ci", "initial"]


def test_create_key_is_201_and_the_new_key_works(client, alice):
    a_handle, a_key = alice
    created = ok(api_post(client, a_key, f"{a_handle}/keys", {"label": "deploy"}), 201)
    assert set(created) == {"key_id", "api_key", "label", "created_at"}
    assert KEY_FORMAT.fullmatch(created["api_key"]) and created["label"] == "deploy"
    me = ok(client.get(f"{API}/me", headers=bearer(created["api_key"])))
    assert me["handle"] == a_handle
    listed = {i["key_id"]: i for i in ok(api_get(client, a_key, f"{a_handle}/keys"))["items"]}
    assert listed[created["key_id"]]["hint"] == created["api_key"][-4:]


def test_create_key_with_an_unknown_field_is_422(client, alice):
    a_handle, a_key = alice
    assert (
        "scope"
        in assert_error(api_post(client, a_key, f"{a_handle}/keys", {"scope": "all"}), 422, "invalid_params")["details"]
    )


def test_revoking_another_agents_key_is_404_and_leaves_it_working(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    [bob_key_id] = [i["key_id"] for i in ok(api_get(client, b_key, f"{b_handle}/keys"))["items"]]
    resp = client.delete(f"{API}/{a_handle}/keys/{bob_key_id}", headers=bearer(a_key))
    assert_error(resp, 404, "key_not_found")
    assert ok(client.get(f"{API}/me", headers=bearer(b_key)))["handle"] == b_handle


def test_revoking_an_unknown_key_is_404_and_a_malformed_id_is_422(client, alice):
    a_handle, a_key = alice
    assert_error(
        client.delete(f"{API}/{a_handle}/keys/00000000-0000-4000-8000-000000000000", headers=bearer(a_key)),
        404,
        "key_not_found",
    )
    error = assert_error(client.delete(f"{API}/{a_handle}/keys/nope", headers=bearer(a_key)), 422, "invalid_params")
    assert "key_id" in error["details"]


def test_revoking_the_key_in_use_answers_200_then_it_is_401(client, alice):
    a_handle, a_key = alice
    other = ok(api_post(client, a_key, f"{a_handle}/keys", {"label": "spare"}), 201)["api_key"]
    [key_id] = [i["key_id"] for i in ok(api_get(client, a_key, f"{a_handle}/keys"))["items"] if i["label"] == "initial"]
    revoked = ok(client.delete(f"{API}/{a_handle}/keys/{key_id}", headers=bearer(a_key)))
    assert revoked["key_id"] == key_id and revoked["revoked_at"] is not None
    assert_error(api_get(client, a_key, f"{a_handle}/keys"), 401, "unauthenticated")
    assert ok(client.get(f"{API}/me", headers=bearer(other)))["handle"] == a_handle


def test_keys_of_a_teammate_are_403(client, alice, bob):
    _a, a_key = alice
    b_handle, _b = bob
    assert_error(api_get(client, a_key, f"{b_handle}/keys"), 403, "forbidden")
    assert_error(api_post(client, a_key, f"{b_handle}/keys", {}), 403, "forbidden")


# --------------------------------------------------------------------------- error shape, unknown paths


def test_unknown_rest_path_is_a_json_404(client, alice):
    _a, a_key = alice
    resp = client.get("/api/v1/nothing/here", headers=bearer(a_key))
    error = assert_error(resp, 404, "not_found")
    assert "<html" not in resp.get_data(as_text=True).lower()
    assert error["details"] is None


def test_unknown_path_without_a_key_is_still_a_json_404(client):
    assert_error(client.get("/api/v1/identities/x@y/a2a/nothing"), 404, "not_found")


def test_wrong_method_is_a_json_405(client, alice):
    a_handle, a_key = alice
    assert_error(client.delete(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)), 405, "method_not_allowed")


def test_missing_key_on_every_identity_route_is_401_in_the_error_shape(app, client, alice):
    a_handle, _a = alice
    task_id = str(ULID())
    routes = [
        ("get", f"{a_handle}/a2a/messages"),
        ("get", f"{a_handle}/a2a/tasks"),
        ("get", f"{a_handle}/a2a/tasks/{task_id}"),
        ("post", f"{a_handle}/a2a/tasks/{task_id}/messages"),
        ("post", f"{a_handle}/a2a/tasks/{task_id}/transitions"),
        ("get", f"{a_handle}/a2a/tasks/{task_id}/audit"),
        ("get", f"{a_handle}/blocks"),
        ("put", f"{a_handle}/blocks/b@acme"),
        ("delete", f"{a_handle}/blocks/b@acme"),
        ("get", f"{a_handle}/keys"),
        ("post", f"{a_handle}/keys"),
        ("delete", f"{a_handle}/keys/{task_id}"),
        ("get", "me"),
    ]
    for method, path in routes:
        resp = getattr(client, method)(f"{API}/{path}", json={})
        assert_error(resp, 401, "unauthenticated")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer"), path


# --------------------------------------------------------------------------- OpenAPI


def test_openapi_document_is_3_1_and_lists_every_route_and_method(app, client):
    resp = client.get("/api/v1/openapi.json")
    doc = ok(resp)
    assert doc["openapi"].startswith("3.1")
    expected = set()
    for rule in app.url_map.iter_rules():
        if not rule.endpoint.startswith("api_v1."):
            continue
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            expected.add((path, method.lower()))
    assert len(expected) >= 20
    documented = {
        (path, method)
        for path, ops in doc["paths"].items()
        for method in ops
        if method in {"get", "put", "post", "patch", "delete"}
    }
    assert expected <= documented, sorted(expected - documented)
    assert documented <= expected, sorted(documented - expected)


def test_openapi_declares_the_feed_parameters_and_error_shape(client):
    doc = ok(client.get("/api/v1/openapi.json"))
    op = doc["paths"]["/api/v1/identities/{handle}/a2a/messages"]["get"]
    names = {p["name"] for p in op["parameters"]}
    assert {
        "handle",
        "direction",
        "requester_handle",
        "worker_handle",
        "task_id",
        "context_id",
        "role",
        "q",
        "since",
        "cursor",
        "limit",
    } <= names
    assert {"200", "401", "403", "404", "422", "429"} <= set(op["responses"])
    error = doc["components"]["schemas"]["Error"]
    assert set(error["properties"]["error"]["properties"]) == {"code", "message", "details"}


# --------------------------------------------------------------------------- REST rate limit


def limited_client(base_env, **env):
    from relay.factory import create_app

    return create_app(
        {**base_env, "RELAY_REST_RATE_LIMIT": "3/minute", **env}, RATELIMIT_KEY_PREFIX="t-" + secrets.token_hex(4)
    ).test_client()


def test_rest_rate_limit_fourth_call_is_429_with_retry_after(base_env, make_agent):
    limited = limited_client(base_env)
    a_handle, a_key = make_agent("alice@acme")
    for _ in range(3):
        ok(limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)))
    resp = limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key))
    error = assert_error(resp, 429, "rate_limited")
    retry = resp.headers["Retry-After"]
    assert retry.isdigit() and 1 <= int(retry) <= 60, retry
    assert error["details"] == {"retry_after": int(retry)}


def test_rest_rate_limit_is_per_agent(base_env, make_agent):
    limited = limited_client(base_env)
    a_handle, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    for _ in range(3):
        ok(limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)))
    assert_error(limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)), 429, "rate_limited")
    ok(limited.get(f"{API}/{b_handle}/a2a/messages", headers=bearer(b_key)))


def test_rest_budget_is_one_per_agent_across_rest_routes(base_env, make_agent):
    """REST has its own budget: one per agent, not one per endpoint (docs/api.md, "Conventions")."""
    limited = limited_client(base_env)
    a_handle, a_key = make_agent("alice@acme")
    ok(limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)))
    ok(limited.get(f"{API}/{a_handle}/a2a/tasks", headers=bearer(a_key)))
    ok(limited.get(f"{API}/{a_handle}/blocks", headers=bearer(a_key)))
    assert_error(limited.get(f"{API}/{a_handle}/keys", headers=bearer(a_key)), 429, "rate_limited")


def test_rest_budget_is_separate_from_the_jsonrpc_budget(base_env, make_agent):
    limited = limited_client(base_env, RELAY_RATE_LIMIT="3/minute")
    a_handle, a_key = make_agent("alice@acme")
    for _ in range(3):
        ok(limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)))
    assert_error(limited.get(f"{API}/{a_handle}/a2a/messages", headers=bearer(a_key)), 429, "rate_limited")
    resp = limited.post(
        "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}}, headers=bearer(a_key)
    )
    assert resp.status_code == 200 and "result" in resp.get_json(), resp.get_data(as_text=True)


def test_wrong_method_answers_405_with_an_allow_header(client, alice):
    resp = client.delete("/api/v1/identities/me", headers=bearer(alice[1]))
    assert resp.status_code == 405
    assert resp.is_json and resp.get_json()["error"]["code"] == "method_not_allowed"
    assert "GET" in resp.headers["Allow"]


def test_webhook_url_with_a_tab_or_newline_is_refused(client, bob):
    for url in ("http://127.0.0.\t1:9/hook", "http://127.0.0.1:9/a\nb"):
        resp = client.post(f"/api/v1/identities/{bob[0]}/webhooks", headers=bearer(bob[1]), json={"url": url})
        assert resp.status_code == 422, resp.get_json()
        assert "url" in resp.get_json()["error"]["details"]
