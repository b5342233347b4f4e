"""The methods of POST /a2a: message/send (create, append), tasks/get, tasks/list,
tasks/update, tasks/cancel; the state machine, unread counts, audit rows and outbox events.

The rules are docs/api.md's ("JSON-RPC: `POST /a2a`", "Thread", "Errors") and docs/decisions.md's.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import select
from ulid import ULID

from relay.extensions import db
from relay.models import Agent, AuditEvent, Block, Event, Message
from relay.services.agents import disable_agent
from tests.conftest import bearer, rpc, send_message

URL = "/a2a"
TEXT = "Refactored /users API. New shape: paginated with { items, next_cursor }."
UNKNOWN_ULID = "01HXYZ4K2VNJQP7R8MWDB3CSTF"


# --------------------------------------------------------------------------- helpers


class Rpc:
    """Calls POST /a2a as one agent."""

    def __init__(self, client, key):
        self.client = client
        self.key = key
        self._n = 0

    def raw(self, method, params=None):
        self._n += 1
        doc = {"jsonrpc": "2.0", "id": f"req-{self._n}", "method": method}
        if params is not None:
            doc["params"] = params
        resp = self.client.post(
            URL, data=json.dumps(doc), headers={**bearer(self.key), "Content-Type": "application/json"}
        )
        assert resp.status_code == 200, resp.get_data(as_text=True)
        body = resp.get_json()
        assert body["jsonrpc"] == "2.0" and body["id"] == doc["id"]
        return body

    def ok(self, method, params=None):
        body = self.raw(method, params)
        assert "error" not in body, body
        return body["result"]

    def err(self, method, params, code, symbol):
        body = self.raw(method, params)
        assert "result" not in body, body
        assert body["error"]["code"] == code, body
        assert body["error"]["data"]["symbol"] == symbol, body
        return body["error"]

    def invalid(self, method, params, field=None):
        """Assert -32602 invalid_params naming ``field``; return the field errors."""
        error = self.err(method, params, -32602, "invalid_params")
        errors = error["data"]["errors"]
        if field is not None:
            assert field in errors, errors
        return errors

    # shortcuts
    def create(self, recipient, text=TEXT, **extra):
        return self.ok("message/send", {"recipient": recipient, "message": _msg(text), **extra})

    def append(self, task_id, text="a follow-up", **extra):
        return self.ok("message/send", {"task_id": task_id, "message": _msg(text), **extra})

    def get(self, task_id):
        return self.ok("tasks/get", {"task_id": task_id})

    def update(self, task_id, transition, **extra):
        return self.ok("tasks/update", {"task_id": task_id, "transition": transition, **extra})

    def inbox(self, **filter_):
        return self.ok("tasks/list", {"filter": {"role": "recipient", **filter_}})["items"]

    def sent(self, **filter_):
        return self.ok("tasks/list", {"filter": {"role": "sender", **filter_}})["items"]


def _msg(text=TEXT):
    return {"role": "user", "parts": [{"type": "text", "text": text}]}


def _item(items, task_id):
    found = [i for i in items if i["task_id"] == task_id]
    assert len(found) == 1, items
    return found[0]


def _is_ulid(value):
    assert isinstance(value, str) and len(value) == 26
    assert str(ULID.from_str(value)) == value
    return True


def _is_utc_iso(value):
    assert isinstance(value, str) and value.endswith("Z")
    assert datetime.fromisoformat(value).utcoffset() == timedelta(0)
    return True


def _to_uuid(ulid_text):
    return str(ULID.from_str(ulid_text).to_uuid())


@pytest.fixture
def alice(client, make_agent):
    return Rpc(client, make_agent("alice@acme", name="Alice", role="frontend")[1])


@pytest.fixture
def bob(client, make_agent):
    return Rpc(client, make_agent("bob@acme", name="Bob", role="backend")[1])


@pytest.fixture
def carol(client, make_agent):
    return Rpc(client, make_agent("carol@other", name="Carol", role="qa")[1])


def _agent_id(app, handle):
    with app.app_context():
        return db.session.scalar(select(Agent.id).where(Agent.handle == handle))


# --------------------------------------------------------------------------- message/send: create


def test_create_returns_ids_state_and_first_message(alice, bob):
    result = alice.create("bob@acme")
    assert _is_ulid(result["task_id"])
    assert result["thread_id"] == result["task_id"]
    assert _is_ulid(result["context_id"])
    assert result["status"] == {"state": "pending"}
    assert str(uuid.UUID(result["message_id"])) == result["message_id"]
    assert result["sequence_no"] == 1
    assert _is_utc_iso(result["created_at"])


def test_create_normalises_recipient_handle_case(alice, bob):
    result = alice.create("  BOB@ACME ")
    assert alice.get(result["task_id"])["recipient"]["handle"] == "bob@acme"


ARTIFACTS = {
    "file_diff": {"type": "file_diff", "path": "src/api/users.py", "diff": "@@ -1,5 +1,8 @@\n-a\n+b"},
    "file_ref": {"type": "file_ref", "path": "src/api/users.py"},
    "test_command": {"type": "test_command", "command": "pytest -q tests/test_users.py"},
    "api_contract": {"type": "api_contract", "name": "GET /users", "spec": {"items": "array", "next_cursor": "string"}},
    "link": {"type": "link", "url": "https://example.com/pr/42"},
}


@pytest.mark.parametrize("kind", sorted(ARTIFACTS))
def test_each_artifact_type_is_accepted_and_returned(alice, bob, kind):
    result = alice.create("bob@acme", artifacts=[ARTIFACTS[kind]])
    thread = alice.get(result["task_id"])
    assert thread["artifacts"] == [ARTIFACTS[kind]]
    assert thread["messages"][0]["artifacts"] == [ARTIFACTS[kind]]


def test_all_artifact_types_together_are_accepted_in_order(alice, bob):
    every = [ARTIFACTS[k] for k in sorted(ARTIFACTS)]
    result = alice.create("bob@acme", artifacts=every)
    assert alice.get(result["task_id"])["artifacts"] == every


def test_unknown_artifact_type_names_its_type_field(alice, bob):
    params = {"recipient": "bob@acme", "message": _msg(), "artifacts": [{"type": "image", "url": "x"}]}
    alice.invalid("message/send", params, "artifacts.0.type")
    assert alice.sent() == []


@pytest.mark.parametrize(
    "artifact, field",
    [
        ({"type": "file_diff", "path": "a.py"}, "artifacts.0.diff"),
        ({"type": "file_diff", "diff": "@@"}, "artifacts.0.path"),
        ({"type": "file_ref"}, "artifacts.0.path"),
        ({"type": "test_command"}, "artifacts.0.command"),
        ({"type": "api_contract", "name": "GET /users"}, "artifacts.0.spec"),
        ({"type": "api_contract", "spec": "openapi: 3.1.0"}, "artifacts.0.name"),
        ({"type": "link"}, "artifacts.0.url"),
    ],
    ids=["diff", "diff_path", "ref_path", "command", "spec", "contract_name", "url"],
)
def test_artifact_missing_a_required_field_names_it(alice, bob, artifact, field):
    params = {"recipient": "bob@acme", "message": _msg(), "artifacts": [artifact]}
    alice.invalid("message/send", params, field)


@pytest.mark.parametrize("line", [1.5, "3", 10**30, 0], ids=["fraction", "string", "huge", "zero"])
def test_file_ref_line_must_be_a_whole_number_in_range(alice, bob, line):
    params = {
        "recipient": "bob@acme",
        "message": _msg(),
        "artifacts": [{"type": "file_ref", "path": "a.py", "line_start": line}],
    }
    alice.invalid("message/send", params, "artifacts.0.line_start")
    assert alice.sent() == []


def test_second_bad_artifact_is_named_by_its_index(alice, bob):
    params = {
        "recipient": "bob@acme",
        "message": _msg(),
        "artifacts": [ARTIFACTS["link"], {"type": "file_diff", "path": "a.py"}],
    }
    errors = alice.invalid("message/send", params, "artifacts.1.diff")
    assert not any(k.startswith("artifacts.0") for k in errors)


def test_more_than_50_artifacts_are_refused_naming_the_bound(alice, bob):
    params = {"recipient": "bob@acme", "message": _msg(), "artifacts": [ARTIFACTS["file_ref"]] * 51}
    errors = alice.invalid("message/send", params, "artifacts")
    assert any("50" in reason for reason in errors["artifacts"])
    assert alice.sent() == []


def test_exactly_50_artifacts_are_accepted(alice, bob):
    result = alice.create("bob@acme", artifacts=[ARTIFACTS["file_ref"]] * 50)
    assert len(alice.get(result["task_id"])["artifacts"]) == 50


def test_message_without_parts_is_invalid(alice, bob):
    alice.invalid("message/send", {"recipient": "bob@acme", "message": {"role": "user"}}, "message.parts")


def test_message_with_empty_parts_list_is_invalid(alice, bob):
    alice.invalid("message/send", {"recipient": "bob@acme", "message": {"role": "user", "parts": []}}, "message.parts")


def test_message_whose_parts_have_only_blank_text_is_invalid(alice, bob):
    params = {"recipient": "bob@acme", "message": {"parts": [{"type": "text", "text": "   "}]}}
    alice.invalid("message/send", params, "message.parts")


def test_non_text_part_is_invalid(alice, bob):
    params = {
        "recipient": "bob@acme",
        "message": {"parts": [{"type": "file", "file": {"uri": "https://example.com/a.png"}}]},
    }
    alice.invalid("message/send", params, "message.parts.0.type")


def test_missing_message_is_invalid(alice, bob):
    alice.invalid("message/send", {"recipient": "bob@acme"}, "message")


def test_create_without_recipient_names_recipient(alice, bob):
    alice.invalid("message/send", {"message": _msg()}, "recipient")
    alice.invalid("message/send", {"task_id": None, "recipient": None, "message": _msg()}, "recipient")


def test_unknown_recipient_is_recipient_not_found(alice):
    alice.err("message/send", {"recipient": "nobody@acme", "message": _msg()}, -32004, "recipient_not_found")


def test_disabled_recipient_is_recipient_not_found(app, alice, bob):
    with app.app_context():
        disable_agent("bob@acme")
    alice.err("message/send", {"recipient": "bob@acme", "message": _msg()}, -32004, "recipient_not_found")
    assert alice.sent() == []


def test_sending_to_yourself_is_invalid(alice):
    alice.invalid("message/send", {"recipient": "alice@acme", "message": _msg()}, "recipient")
    assert alice.sent() == []


def test_blocked_sender_is_teammate_blocked(app, alice, bob):
    with app.app_context():
        db.session.add(Block(blocker_id=_agent_id(app, "bob@acme"), blocked_id=_agent_id(app, "alice@acme")))
        db.session.commit()
    alice.err("message/send", {"recipient": "bob@acme", "message": _msg()}, -32013, "teammate_blocked")
    assert bob.inbox() == []


def test_block_is_one_way(app, alice, bob):
    with app.app_context():
        db.session.add(Block(blocker_id=_agent_id(app, "bob@acme"), blocked_id=_agent_id(app, "alice@acme")))
        db.session.commit()
    # bob blocked alice; bob may still hand off to alice
    result = bob.create("alice@acme")
    assert result["status"] == {"state": "pending"}


PROPOSED = {
    "description": "Switch /users to keyset pagination",
    "target_files": ["src/api/users.py"],
    "rationale": "Offset pagination skips rows under concurrent inserts",
}


def test_propose_action_without_proposed_action_is_invalid_intent_payload(alice, bob):
    params = {"recipient": "bob@acme", "intent": "propose_action", "message": _msg()}
    alice.err("message/send", params, -32012, "invalid_intent_payload")
    assert alice.sent() == []


@pytest.mark.parametrize("intent", ["inform", "ask_question"])
def test_other_intent_with_proposed_action_is_invalid_intent_payload(alice, bob, intent):
    params = {"recipient": "bob@acme", "intent": intent, "message": _msg(), "proposed_action": PROPOSED}
    alice.err("message/send", params, -32012, "invalid_intent_payload")


def test_propose_action_with_proposed_action_is_stored(alice, bob):
    result = alice.create("bob@acme", intent="propose_action", proposed_action=PROPOSED)
    thread = bob.get(result["task_id"])
    assert thread["intent"] == "propose_action"
    assert {k: thread["proposed_action"][k] for k in PROPOSED} == PROPOSED
    assert thread["proposed_action"].get("suggested_diff") is None


def test_proposed_action_missing_rationale_is_invalid_params(alice, bob):
    pa = {k: v for k, v in PROPOSED.items() if k != "rationale"}
    alice.invalid(
        "message/send",
        {"recipient": "bob@acme", "intent": "propose_action", "message": _msg(), "proposed_action": pa},
        "proposed_action.rationale",
    )


def test_invalid_intent_string_is_invalid_params(alice, bob):
    alice.invalid("message/send", {"recipient": "bob@acme", "intent": "demand", "message": _msg()}, "intent")


def test_intent_defaults_to_inform(alice, bob):
    result = alice.create("bob@acme")
    assert alice.get(result["task_id"])["intent"] == "inform"


def test_new_thread_with_callers_context_id_shares_it(alice, bob, make_agent):
    make_agent("dave@acme")
    first = alice.create("bob@acme")
    second = alice.create("dave@acme", context_id=first["context_id"])
    assert second["context_id"] == first["context_id"]
    assert second["task_id"] != first["task_id"]
    assert alice.get(second["task_id"])["context_id"] == first["context_id"]


def test_context_id_in_uuid_form_is_accepted(alice, bob):
    first = alice.create("bob@acme")
    second = alice.create("bob@acme", context_id=_to_uuid(first["context_id"]))
    assert second["context_id"] == first["context_id"]


def test_recipient_may_reuse_a_context_it_takes_part_in(alice, bob):
    first = alice.create("bob@acme")
    second = bob.create("alice@acme", context_id=first["context_id"])
    assert second["context_id"] == first["context_id"]


def test_without_context_id_each_thread_gets_a_new_context(alice, bob):
    assert alice.create("bob@acme")["context_id"] != alice.create("bob@acme")["context_id"]


def test_unknown_context_id_is_invalid_params(alice, bob):
    alice.invalid("message/send", {"recipient": "bob@acme", "message": _msg(), "context_id": str(ULID())}, "context_id")
    assert alice.sent() == []


def test_someone_elses_context_id_is_invalid_params(alice, bob, carol, make_agent):
    make_agent("dave@acme")
    foreign = bob.create("dave@acme")
    alice.invalid(
        "message/send", {"recipient": "bob@acme", "message": _msg(), "context_id": foreign["context_id"]}, "context_id"
    )


@pytest.mark.parametrize("bad", ["not-a-ulid", "01HXYZ4K2VNJQP7R8MWDB3CST!", "8" * 26, 12345, ""])
def test_malformed_context_id_is_invalid_params(alice, bob, bad):
    alice.invalid("message/send", {"recipient": "bob@acme", "message": _msg(), "context_id": bad}, "context_id")


@pytest.mark.parametrize("bad", ["not-a-ulid", "01HXYZ4K2VNJQP7R8MWDB3CSTU", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", 7])
def test_malformed_task_id_is_invalid_params(alice, bad):
    alice.invalid("tasks/get", {"task_id": bad}, "task_id")
    alice.invalid("message/send", {"task_id": bad, "message": _msg()}, "task_id")
    alice.invalid("tasks/update", {"task_id": bad, "transition": "accept"}, "task_id")
    alice.invalid("tasks/cancel", {"task_id": bad}, "task_id")


# --------------------------------------------------------------------------- message/send: append


def test_append_numbers_messages_2_and_3(alice, bob):
    created = alice.create("bob@acme")
    second = bob.append(created["task_id"], "what about /search?")
    third = alice.append(created["task_id"], "same shape")
    assert (second["sequence_no"], third["sequence_no"]) == (2, 3)
    assert second["task_id"] == created["task_id"] and second["thread_id"] == created["task_id"]
    assert str(uuid.UUID(second["message_id"])) == second["message_id"]
    assert len({created["message_id"], second["message_id"], third["message_id"]}) == 3
    assert _is_utc_iso(second["created_at"])
    messages = alice.get(created["task_id"])["messages"]
    assert [(m["sequence_no"], m["from"], m["body"]) for m in messages] == [
        (1, "alice@acme", TEXT),
        (2, "bob@acme", "what about /search?"),
        (3, "alice@acme", "same shape"),
    ]


def test_append_by_a_stranger_is_not_a_participant(alice, bob, carol):
    created = alice.create("bob@acme")
    carol.err("message/send", {"task_id": created["task_id"], "message": _msg()}, -32005, "not_a_participant")
    assert len(alice.get(created["task_id"])["messages"]) == 1


def test_append_to_unknown_thread_is_thread_not_found(alice):
    alice.err("message/send", {"task_id": UNKNOWN_ULID, "message": _msg()}, -32006, "thread_not_found")


@pytest.mark.parametrize(
    "field, value",
    [("recipient", "bob@acme"), ("intent", "inform"), ("proposed_action", PROPOSED), ("context_id", None)],
)
def test_append_with_a_create_only_field_is_invalid(alice, bob, field, value):
    created = alice.create("bob@acme")
    if field == "context_id":
        value = created["context_id"]
    alice.invalid("message/send", {"task_id": created["task_id"], "message": _msg(), field: value}, field)
    assert len(alice.get(created["task_id"])["messages"]) == 1


def test_append_after_complete_is_thread_terminal(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.update(tid, "accept")
    bob.update(tid, "complete", result_summary="done")
    alice.err("message/send", {"task_id": tid, "message": _msg()}, -32007, "thread_terminal")
    bob.err("message/send", {"task_id": tid, "message": _msg()}, -32007, "thread_terminal")
    assert len(alice.get(tid)["messages"]) == 1


def test_append_after_cancel_is_thread_terminal(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    alice.ok("tasks/cancel", {"task_id": tid})
    alice.err("message/send", {"task_id": tid, "message": _msg()}, -32007, "thread_terminal")
    bob.err("message/send", {"task_id": tid, "message": _msg()}, -32007, "thread_terminal")
    assert len(alice.get(tid)["messages"]) == 1


def test_append_while_accepted_is_allowed(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.update(tid, "accept")
    result = bob.append(tid, "working on it")
    assert result["sequence_no"] == 2
    assert result["status"] == {"state": "accepted"}


def test_ids_in_uuid_form_are_accepted_everywhere(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    as_uuid = _to_uuid(tid)
    assert alice.get(as_uuid)["task_id"] == tid
    appended = bob.append(as_uuid)
    assert appended["task_id"] == tid and appended["sequence_no"] == 2
    assert bob.update(as_uuid, "accept")["task_id"] == tid
    assert bob.get(as_uuid.upper())["status"] == {"state": "accepted"}
    other = alice.create("bob@acme")["task_id"]
    cancelled = alice.ok("tasks/cancel", {"task_id": _to_uuid(other)})
    assert cancelled["task_id"] == other and cancelled["status"] == {"state": "cancelled"}


def test_lower_case_ulid_is_accepted(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    assert alice.get(tid.lower())["task_id"] == tid


# --------------------------------------------------------------------------- tasks/get

SEED_GET_FIELDS = {
    "thread_id",
    "task_id",
    "status",
    "sender",
    "recipient_id",
    "summary",
    "intent",
    "artifacts",
    "proposed_action",
    "messages",
    "accepted_at",
    "completed_at",
    "cancelled_at",
    "created_at",
}
SEED_MESSAGE_FIELDS = {"id", "sequence_no", "from", "body", "payload", "created_at"}


def test_tasks_get_returns_every_seed_field(app, alice, bob):
    artifact = ARTIFACTS["file_diff"]
    created = alice.create("bob@acme", artifacts=[artifact], metadata={"client_idempotency_key": "k-1", "trace": "abc"})
    thread = bob.get(created["task_id"])
    assert SEED_GET_FIELDS | {"recipient", "context_id", "result_summary"} <= set(thread)
    assert thread["thread_id"] == thread["task_id"] == created["task_id"]
    assert thread["context_id"] == created["context_id"]
    assert thread["status"] == {"state": "pending"}
    assert thread["sender"] == {"handle": "alice@acme", "name": "Alice", "role": "frontend"}
    assert thread["recipient"] == {"handle": "bob@acme", "name": "Bob", "role": "backend"}
    assert thread["recipient_id"] == str(_agent_id(app, "bob@acme"))
    assert thread["summary"] == TEXT
    assert thread["intent"] == "inform"
    assert thread["artifacts"] == [artifact]
    assert thread["proposed_action"] is None
    assert thread["accepted_at"] is None and thread["completed_at"] is None and thread["cancelled_at"] is None
    assert thread["result_summary"] is None
    assert thread["created_at"] == created["created_at"]
    [message] = thread["messages"]
    assert SEED_MESSAGE_FIELDS <= set(message)
    assert message["id"] == created["message_id"]
    assert message["sequence_no"] == 1
    assert message["from"] == "alice@acme"
    assert message["body"] == TEXT
    assert message["payload"] == {"trace": "abc"}
    assert message["created_at"] == created["created_at"]


def test_payload_drops_only_the_idempotency_key(alice, bob):
    meta = {"client_idempotency_key": "k-2", "trace": {"span": 7}, "tags": ["a", "b"]}
    created = alice.create("bob@acme", metadata=meta)
    payload = alice.get(created["task_id"])["messages"][0]["payload"]
    assert payload == {"trace": {"span": 7}, "tags": ["a", "b"]}
    assert "client_idempotency_key" not in json.dumps(payload)


def test_payload_without_metadata_is_empty_object(alice, bob):
    created = alice.create("bob@acme")
    assert alice.get(created["task_id"])["messages"][0]["payload"] == {}


def test_tasks_get_on_unknown_thread_is_thread_not_found(alice):
    alice.err("tasks/get", {"task_id": UNKNOWN_ULID}, -32006, "thread_not_found")


def test_summary_is_the_opening_messages_text_only(alice, bob):
    tid = alice.create("bob@acme", "opening text")["task_id"]
    bob.append(tid, "a reply")
    thread = alice.get(tid)
    assert thread["summary"] == "opening text"


def test_tasks_get_pages_messages_with_limit_and_after(alice, bob):
    tid = alice.create("bob@acme", "m1")["task_id"]
    for n in range(2, 6):
        (bob if n % 2 else alice).append(tid, f"m{n}")
    whole = bob.get(tid)
    assert "messages_next" not in whole and [m["sequence_no"] for m in whole["messages"]] == [1, 2, 3, 4, 5]

    def page(**p):
        got = bob.ok("tasks/get", {"task_id": tid, **p})
        return [m["body"] for m in got["messages"]], got["messages_next"]

    assert page(messages_limit=2) == (["m1", "m2"], 2)
    assert page(messages_limit=2, messages_after=2) == (["m3", "m4"], 4)
    assert page(messages_limit=2, messages_after=4) == (["m5"], None)
    assert page(messages_after=3) == (["m4", "m5"], None)  # the rest, at most 1000
    assert page(messages_after=5) == ([], None)
    assert page(messages_limit=2)[0] == ["m1", "m2"]


def test_tasks_get_pages_mark_read_only_what_they_returned(alice, bob):
    tid = alice.create("bob@acme", "m1")["task_id"]
    alice.append(tid, "m2")
    alice.append(tid, "m3")
    bob.ok("tasks/get", {"task_id": tid, "messages_limit": 1})
    assert _item(bob.inbox(), tid)["unread_messages"] == 2
    bob.ok("tasks/get", {"task_id": tid, "messages_after": 0, "messages_limit": 3})
    assert _item(bob.inbox(), tid)["unread_messages"] == 0
    bob.ok("tasks/get", {"task_id": tid, "messages_limit": 1})  # an older page marks nothing back
    assert _item(bob.inbox(), tid)["unread_messages"] == 0


@pytest.mark.parametrize(
    "params, field",
    [
        ({"messages_limit": 0}, "messages_limit"),
        ({"messages_limit": 1001}, "messages_limit"),
        ({"messages_limit": "5"}, "messages_limit"),
        ({"messages_limit": 2.5}, "messages_limit"),
        ({"messages_after": -1}, "messages_after"),
        ({"messages_after": 2**31}, "messages_after"),  # beyond the column's range: refused, never a 500
        ({"messages_after": "x"}, "messages_after"),
        ({"messages_before": 3}, "messages_before"),
    ],
)
def test_tasks_get_bad_page_is_invalid_params_naming_it(alice, bob, params, field):
    tid = alice.create("bob@acme")["task_id"]
    alice.invalid("tasks/get", {"task_id": tid, **params}, field)


# --------------------------------------------------------------------------- unread


def test_new_handoff_is_unread_for_the_recipient_until_tasks_get(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    assert _item(bob.inbox(), tid)["unread_messages"] == 1
    assert _item(bob.inbox(), tid)["unread_messages"] == 1  # listing does not mark read
    bob.get(tid)
    assert _item(bob.inbox(), tid)["unread_messages"] == 0


def test_senders_own_message_is_not_unread_for_the_sender(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    assert _item(alice.sent(), tid)["unread_messages"] == 0


def test_recipients_reply_is_unread_for_the_sender(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.get(tid)
    bob.append(tid, "reply one")
    assert _item(alice.sent(), tid)["unread_messages"] == 1
    assert _item(bob.inbox(), tid)["unread_messages"] == 0
    bob.append(tid, "reply two")
    assert _item(alice.sent(), tid)["unread_messages"] == 2
    alice.get(tid)
    assert _item(alice.sent(), tid)["unread_messages"] == 0


def test_stranger_tasks_get_does_not_mark_read(alice, bob, carol):
    tid = alice.create("bob@acme")["task_id"]
    carol.err("tasks/get", {"task_id": tid}, -32005, "not_a_participant")
    assert _item(bob.inbox(), tid)["unread_messages"] == 1


# --------------------------------------------------------------------------- tasks/list


def test_list_item_fields(alice, bob):
    created = alice.create("bob@acme")
    [item] = bob.inbox()
    assert {
        "thread_id",
        "task_id",
        "status",
        "sender",
        "summary_preview",
        "intent",
        "unread_messages",
        "created_at",
        "updated_at",
    } <= set(item)
    assert item["task_id"] == item["thread_id"] == created["task_id"]
    assert item["status"] == {"state": "pending"}
    assert item["sender"] == {"handle": "alice@acme", "name": "Alice", "role": "frontend"}
    assert item["summary_preview"] == TEXT
    assert item["intent"] == "inform"
    assert item["created_at"] == created["created_at"]
    assert _is_utc_iso(item["updated_at"])


def test_list_role_defaults_to_recipient(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    assert [i["task_id"] for i in bob.ok("tasks/list", {})["items"]] == [tid]
    assert [i["task_id"] for i in bob.ok("tasks/list")["items"]] == [tid]  # params omitted entirely
    assert alice.ok("tasks/list", {})["items"] == []
    assert [i["task_id"] for i in alice.sent()] == [tid]
    assert bob.sent() == []


def test_list_unknown_role_is_invalid(alice):
    alice.invalid("tasks/list", {"filter": {"role": "observer"}}, "filter.role")


def _three_states(alice, bob):
    pending = alice.create("bob@acme", "p")["task_id"]
    accepted = alice.create("bob@acme", "a")["task_id"]
    bob.update(accepted, "accept")
    cancelled = alice.create("bob@acme", "c")["task_id"]
    alice.ok("tasks/cancel", {"task_id": cancelled})
    return pending, accepted, cancelled


def test_list_filter_single_status(alice, bob):
    pending, accepted, cancelled = _three_states(alice, bob)
    assert [i["task_id"] for i in bob.inbox(status=["pending"])] == [pending]
    assert [i["task_id"] for i in bob.inbox(status=["accepted"])] == [accepted]
    assert bob.inbox(status=["completed"]) == []


def test_list_filter_multiple_statuses(alice, bob):
    pending, accepted, cancelled = _three_states(alice, bob)
    assert {i["task_id"] for i in bob.inbox(status=["pending", "cancelled"])} == {pending, cancelled}
    assert {i["task_id"] for i in bob.inbox()} == {pending, accepted, cancelled}


def test_list_filter_unknown_status_is_invalid(alice):
    errors = alice.invalid("tasks/list", {"filter": {"status": ["pending", "archived"]}})
    assert any(k.startswith("filter.status") for k in errors), errors


def test_list_filter_status_as_string_is_invalid(alice):
    errors = alice.invalid("tasks/list", {"filter": {"status": "pending"}})
    assert any(k.startswith("filter.status") for k in errors), errors


def test_list_since_is_inclusive_at_an_items_updated_at(alice, bob):
    older = alice.create("bob@acme", "older")["task_id"]
    newer = alice.create("bob@acme", "newer")["task_id"]
    stamp = _item(bob.inbox(), newer)["updated_at"]
    assert _item(bob.inbox(), older)["updated_at"] < stamp
    assert [i["task_id"] for i in bob.inbox(since=stamp)] == [newer]
    later = (datetime.fromisoformat(stamp) + timedelta(microseconds=1)).isoformat()
    assert bob.inbox(since=later) == []


def test_list_since_with_offset_is_accepted(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    stamp = datetime.fromisoformat(_item(bob.inbox(), tid)["updated_at"])
    for offset in (timedelta(hours=2), timedelta(hours=-5, minutes=-30)):
        same_instant = stamp.astimezone(timezone(offset)).isoformat()
        assert not same_instant.endswith("Z")
        assert [i["task_id"] for i in bob.inbox(since=same_instant)] == [tid]
        one_later = (stamp + timedelta(microseconds=1)).astimezone(timezone(offset)).isoformat()
        assert bob.inbox(since=one_later) == []


def test_list_since_without_zone_is_invalid(alice):
    alice.invalid("tasks/list", {"filter": {"since": "2026-01-01T00:00:00"}}, "filter.since")


def test_list_since_garbage_is_invalid(alice):
    alice.invalid("tasks/list", {"filter": {"since": "yesterday"}}, "filter.since")


@pytest.mark.parametrize("limit", [0, 201, -1, "10", 1.5, True])
def test_list_page_limit_out_of_range_is_invalid(alice, limit):
    alice.invalid("tasks/list", {"page": {"limit": limit}}, "page.limit")


@pytest.mark.parametrize("limit", [1, 200])
def test_list_page_limit_bounds_are_accepted(alice, limit):
    assert alice.ok("tasks/list", {"page": {"limit": limit}}) == {"items": [], "next_cursor": None}


@pytest.mark.parametrize("cursor", ["garbage", "!!!", "eyJ4IjoxfQ", "W10", 12, "a" * 300])
def test_list_garbage_cursor_is_invalid(alice, cursor):
    alice.invalid("tasks/list", {"page": {"cursor": cursor}}, "page.cursor")


def test_list_pages_through_with_the_cursor(alice, bob):
    tids = [alice.create("bob@acme", f"t{i}")["task_id"] for i in range(5)]
    seen, cursor = [], None
    for _ in range(5):
        page = bob.ok("tasks/list", {"page": {"limit": 2, "cursor": cursor}})
        seen += [i["task_id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(tids))


def test_summary_preview_is_truncated_to_200_characters(alice, bob):
    long_text = "".join(chr(ord("a") + i % 26) for i in range(450))
    tid = alice.create("bob@acme", long_text)["task_id"]
    item = _item(bob.inbox(), tid)
    assert item["summary_preview"] == long_text[:200]
    assert bob.get(tid)["summary"] == long_text


def test_list_newest_activity_first(alice, bob):
    first = alice.create("bob@acme", "first")["task_id"]
    second = alice.create("bob@acme", "second")["task_id"]
    assert [i["task_id"] for i in bob.inbox()] == [second, first]
    alice.append(first, "bump")
    assert [i["task_id"] for i in bob.inbox()] == [first, second]


# --------------------------------------------------------------------------- transitions: allowed


def test_recipient_accepts_pending(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    result = bob.update(tid, "accept", session_id="claude-1234")
    assert result["task_id"] == result["thread_id"] == tid
    assert result["status"] == {"state": "accepted"}
    assert _is_utc_iso(result["accepted_at"])
    assert result["completed_at"] is None and result["cancelled_at"] is None
    assert result["updated_at"] == result["accepted_at"]
    thread = alice.get(tid)
    assert thread["status"] == {"state": "accepted"} and thread["accepted_at"] == result["accepted_at"]


def test_recipient_completes_accepted(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    accepted = bob.update(tid, "accept")
    result = bob.update(tid, "complete", result_summary="all tests pass")
    assert result["status"] == {"state": "completed"}
    assert _is_utc_iso(result["completed_at"])
    assert result["accepted_at"] == accepted["accepted_at"]
    assert result["cancelled_at"] is None
    thread = alice.get(tid)
    assert thread["status"] == {"state": "completed"}
    assert thread["completed_at"] == result["completed_at"]
    assert thread["result_summary"] == "all tests pass"


def test_sender_cancels_pending_via_tasks_update(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    result = alice.update(tid, "cancel")
    assert result["status"] == {"state": "cancelled"}
    assert _is_utc_iso(result["cancelled_at"])
    assert result["accepted_at"] is None and result["completed_at"] is None
    assert bob.get(tid)["cancelled_at"] == result["cancelled_at"]


def test_sender_cancels_pending_via_tasks_cancel(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    result = alice.ok("tasks/cancel", {"task_id": tid})
    assert result["task_id"] == tid
    assert result["status"] == {"state": "cancelled"}
    assert _is_utc_iso(result["updated_at"])
    thread = bob.get(tid)
    assert thread["status"] == {"state": "cancelled"} and thread["cancelled_at"] == result["updated_at"]


def test_unknown_transition_is_invalid_params(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    alice.invalid("tasks/update", {"task_id": tid, "transition": "reopen"}, "transition")
    alice.invalid("tasks/update", {"task_id": tid}, "transition")


def test_transition_on_unknown_thread_is_thread_not_found(alice):
    alice.err("tasks/update", {"task_id": UNKNOWN_ULID, "transition": "accept"}, -32006, "thread_not_found")
    alice.err("tasks/cancel", {"task_id": UNKNOWN_ULID}, -32006, "thread_not_found")


# --------------------------------------------------------------------------- transitions: refused


def test_sender_accepting_is_not_authorized(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    alice.err("tasks/update", {"task_id": tid, "transition": "accept"}, -32009, "not_authorized_transition")
    assert alice.get(tid)["status"] == {"state": "pending"}


def test_sender_completing_is_not_authorized(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.update(tid, "accept")
    alice.err("tasks/update", {"task_id": tid, "transition": "complete"}, -32009, "not_authorized_transition")
    assert alice.get(tid)["status"] == {"state": "accepted"}


def test_recipient_cancelling_is_not_authorized(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.err("tasks/update", {"task_id": tid, "transition": "cancel"}, -32009, "not_authorized_transition")
    bob.err("tasks/cancel", {"task_id": tid}, -32009, "not_authorized_transition")
    assert alice.get(tid)["status"] == {"state": "pending"}


def test_completing_a_pending_thread_is_invalid_transition(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.err("tasks/update", {"task_id": tid, "transition": "complete"}, -32008, "invalid_transition")
    thread = alice.get(tid)
    assert thread["status"] == {"state": "pending"} and thread["completed_at"] is None


def test_accepting_an_accepted_thread_is_invalid_transition(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    first = bob.update(tid, "accept")
    bob.err("tasks/update", {"task_id": tid, "transition": "accept"}, -32008, "invalid_transition")
    assert alice.get(tid)["accepted_at"] == first["accepted_at"]


def test_refused_transition_error_data_names_state_and_transition(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    error = bob.err("tasks/update", {"task_id": tid, "transition": "complete"}, -32008, "invalid_transition")
    assert error["data"]["details"] == {"transition": "complete", "state": "pending"}


# --------------------------------------------------------------------------- C3: strangers


def test_c3_stranger_gets_not_a_participant_from_every_method(alice, bob, carol):
    secret = "Rotate the prod database password before Friday"
    tid = alice.create("bob@acme", secret)["task_id"]
    calls = [
        ("tasks/get", {"task_id": tid}),
        ("tasks/update", {"task_id": tid, "transition": "accept"}),
        ("tasks/update", {"task_id": tid, "transition": "cancel"}),
        ("tasks/update", {"task_id": tid, "transition": "complete"}),
        ("tasks/cancel", {"task_id": tid}),
        ("message/send", {"task_id": tid, "message": _msg("let me in")}),
    ]
    for method, params in calls:
        error = carol.err(method, params, -32005, "not_a_participant")
        dumped = json.dumps(error)
        for leak in (secret, "alice@acme", "bob@acme", "Alice", "Bob", "pending"):
            assert leak not in dumped, (method, error)
    thread = alice.get(tid)
    assert thread["status"] == {"state": "pending"}
    assert len(thread["messages"]) == 1
    assert carol.inbox() == [] and carol.sent() == []


def test_c3_stranger_gets_not_a_participant_on_terminal_thread_too(alice, bob, carol):
    tid = alice.create("bob@acme")["task_id"]
    alice.ok("tasks/cancel", {"task_id": tid})
    carol.err("message/send", {"task_id": tid, "message": _msg()}, -32005, "not_a_participant")
    carol.err("tasks/cancel", {"task_id": tid}, -32005, "not_a_participant")


# --------------------------------------------------------------------------- C4: terminal states


def test_c4_completed_thread_stays_completed(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.update(tid, "accept")
    done = bob.update(tid, "complete", result_summary="shipped")
    alice.err("tasks/cancel", {"task_id": tid}, -32008, "invalid_transition")
    alice.err("tasks/update", {"task_id": tid, "transition": "cancel"}, -32008, "invalid_transition")
    bob.err("tasks/update", {"task_id": tid, "transition": "complete"}, -32008, "invalid_transition")
    bob.err("tasks/update", {"task_id": tid, "transition": "accept"}, -32008, "invalid_transition")
    alice.err("message/send", {"task_id": tid, "message": _msg()}, -32007, "thread_terminal")
    thread = alice.get(tid)
    assert thread["status"] == {"state": "completed"}
    assert thread["completed_at"] == done["completed_at"]
    assert thread["cancelled_at"] is None
    assert thread["result_summary"] == "shipped"


def test_c4_cancelling_an_accepted_thread_is_invalid_transition(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    accepted = bob.update(tid, "accept")
    alice.err("tasks/cancel", {"task_id": tid}, -32008, "invalid_transition")
    alice.err("tasks/update", {"task_id": tid, "transition": "cancel"}, -32008, "invalid_transition")
    thread = alice.get(tid)
    assert thread["status"] == {"state": "accepted"}
    assert thread["cancelled_at"] is None
    assert thread["accepted_at"] == accepted["accepted_at"]


def test_cancelled_thread_stays_cancelled(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    cancelled = alice.ok("tasks/cancel", {"task_id": tid})
    bob.err("tasks/update", {"task_id": tid, "transition": "accept"}, -32008, "invalid_transition")
    alice.err("tasks/cancel", {"task_id": tid}, -32008, "invalid_transition")
    thread = bob.get(tid)
    assert thread["status"] == {"state": "cancelled"}
    assert thread["cancelled_at"] == cancelled["updated_at"]
    assert thread["accepted_at"] is None


# --------------------------------------------------------------------------- audit and outbox


def test_audit_rows_record_actor_states_session_and_result(app, alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    bob.update(tid, "accept", session_id="claude-1234")
    bob.update(tid, "complete", result_summary="Updated API client; all tests pass.")
    alice_id, bob_id = _agent_id(app, "alice@acme"), _agent_id(app, "bob@acme")
    with app.app_context():
        rows = db.session.execute(
            select(
                AuditEvent.action,
                AuditEvent.actor_id,
                AuditEvent.from_state,
                AuditEvent.to_state,
                AuditEvent.session_id,
                AuditEvent.result_summary,
                AuditEvent.created_at,
            )
            .where(AuditEvent.thread_id == ULID.from_str(tid).to_uuid())
            .order_by(AuditEvent.id)
        ).all()
        db.session.rollback()
    assert [tuple(r[:6]) for r in rows] == [
        ("create", alice_id, None, "pending", None, None),
        ("accept", bob_id, "pending", "accepted", "claude-1234", None),
        ("complete", bob_id, "accepted", "completed", None, "Updated API client; all tests pass."),
    ]
    assert all(r.created_at is not None for r in rows)


def test_cancel_writes_an_audit_row(app, alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    alice.ok("tasks/cancel", {"task_id": tid})
    with app.app_context():
        rows = db.session.execute(
            select(AuditEvent.action, AuditEvent.actor_id, AuditEvent.from_state, AuditEvent.to_state).where(
                AuditEvent.thread_id == ULID.from_str(tid).to_uuid(), AuditEvent.action == "cancel"
            )
        ).all()
        db.session.rollback()
    assert [tuple(r) for r in rows] == [("cancel", _agent_id(app, "alice@acme"), "pending", "cancelled")]


def test_refused_transition_writes_no_audit_row_or_event(app, alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    alice.err("tasks/update", {"task_id": tid, "transition": "accept"}, -32009, "not_authorized_transition")
    bob.err("tasks/update", {"task_id": tid, "transition": "complete"}, -32008, "invalid_transition")
    thread_uuid = ULID.from_str(tid).to_uuid()
    with app.app_context():
        actions = db.session.scalars(select(AuditEvent.action).where(AuditEvent.thread_id == thread_uuid)).all()
        events = db.session.scalars(select(Event.type).where(Event.thread_id == thread_uuid)).all()
        db.session.rollback()
    assert actions == ["create"]
    assert events == ["message.created"]


def test_events_announce_each_message_and_transition_to_the_other_side(app, alice, bob):
    created = alice.create("bob@acme")
    tid = created["task_id"]
    reply = bob.append(tid, "on it")
    bob.update(tid, "accept")
    bob.update(tid, "complete", result_summary="done")
    alice_id, bob_id = _agent_id(app, "alice@acme"), _agent_id(app, "bob@acme")
    thread_uuid = ULID.from_str(tid).to_uuid()
    with app.app_context():
        rows = db.session.execute(
            select(Event.type, Event.agent_id, Event.message_id, Event.payload)
            .where(Event.thread_id == thread_uuid)
            .order_by(Event.created_at, Event.id)
        ).all()
        message_ids = db.session.scalars(
            select(Message.id).where(Message.thread_id == thread_uuid).order_by(Message.sequence_no)
        ).all()
        db.session.rollback()
    assert [str(m) for m in message_ids] == [created["message_id"], reply["message_id"]]
    created_events = [(r.agent_id, str(r.message_id)) for r in rows if r.type == "message.created"]
    assert created_events == [(bob_id, created["message_id"]), (alice_id, reply["message_id"])]
    updated_events = [(r.agent_id, r.payload.get("transition")) for r in rows if r.type == "task.updated"]
    assert updated_events == [(alice_id, "accept"), (alice_id, "complete")]
    assert len(rows) == 4


def test_cancel_event_is_addressed_to_the_recipient(app, alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    alice.ok("tasks/cancel", {"task_id": tid})
    with app.app_context():
        rows = db.session.execute(
            select(Event.agent_id).where(Event.thread_id == ULID.from_str(tid).to_uuid(), Event.type == "task.updated")
        ).all()
        db.session.rollback()
    assert [r.agent_id for r in rows] == [_agent_id(app, "bob@acme")]


def test_updated_at_moves_forward_with_each_message_and_transition(alice, bob):
    tid = alice.create("bob@acme")["task_id"]
    stamps = [_item(alice.sent(), tid)["updated_at"]]
    bob.append(tid, "question")
    stamps.append(_item(alice.sent(), tid)["updated_at"])
    alice.append(tid, "answer")
    stamps.append(_item(alice.sent(), tid)["updated_at"])
    bob.update(tid, "accept")
    stamps.append(_item(alice.sent(), tid)["updated_at"])
    bob.update(tid, "complete", result_summary="done")
    stamps.append(_item(bob.inbox(), tid)["updated_at"])
    parsed = [datetime.fromisoformat(s) for s in stamps]
    assert all(a < b for a, b in zip(parsed, parsed[1:])), stamps
    # reading does not count as activity
    bob.get(tid)
    assert _item(bob.inbox(), tid)["updated_at"] == stamps[-1]
    assert alice.get(tid)["created_at"] == _item(alice.sent(), tid)["created_at"]


# --------------------------------------------------------------------------- strings PostgreSQL cannot store

# U+0000 cannot be stored in PostgreSQL text or jsonb, and an unpaired surrogate cannot be
# encoded as UTF-8: either is -32602 naming the field, never an internal error (-32603).
UNSTORABLE = {"nul": "a\u0000b", "lone_surrogate": "a\ud800b"}
SEND_FIELDS = {
    "message.parts.0.text": lambda s: {"message": _msg(s)},
    "message.parts.1.text": lambda s: {
        "message": {"parts": [{"type": "text", "text": "ok"}, {"type": "text", "text": s}]}
    },
    "message.parts.0.note": lambda s: {"message": {"parts": [{"type": "text", "text": "ok", "note": s}]}},
    "metadata.trace": lambda s: {"metadata": {"trace": s}},
    "metadata.deep.0.x": lambda s: {"metadata": {"deep": [{"x": s}]}},
    "metadata": lambda s: {"metadata": {s: "key itself"}},
    "metadata.client_idempotency_key": lambda s: {"metadata": {"client_idempotency_key": s}},
    "artifacts.0.path": lambda s: {"artifacts": [{"type": "file_ref", "path": s}]},
    "artifacts.0.spec.x": lambda s: {"artifacts": [{"type": "api_contract", "name": "n", "spec": {"x": s}}]},
    "proposed_action.description": lambda s: {
        "intent": "propose_action",
        "proposed_action": {**PROPOSED, "description": s},
    },
}


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
@pytest.mark.parametrize("field", sorted(SEND_FIELDS))
def test_create_with_unstorable_string_names_the_field(alice, bob, field, kind):
    params = {"recipient": "bob@acme", "message": _msg(), **SEND_FIELDS[field](UNSTORABLE[kind])}
    errors = alice.invalid("message/send", params, field)
    assert set(errors) == {field}
    assert alice.sent() == [] and bob.inbox() == []


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_append_with_unstorable_text_is_invalid(alice, bob, kind):
    tid = alice.create("bob@acme")["task_id"]
    bob.invalid("message/send", {"task_id": tid, "message": _msg(UNSTORABLE[kind])}, "message.parts.0.text")
    assert len(alice.get(tid)["messages"]) == 1


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
def test_transition_with_unstorable_session_or_summary_is_invalid(alice, bob, kind):
    tid = alice.create("bob@acme")["task_id"]
    bob.invalid("tasks/update", {"task_id": tid, "transition": "accept", "session_id": UNSTORABLE[kind]}, "session_id")
    bob.update(tid, "accept")
    bob.invalid(
        "tasks/update", {"task_id": tid, "transition": "complete", "result_summary": UNSTORABLE[kind]}, "result_summary"
    )
    assert alice.get(tid)["status"] == {"state": "accepted"}


def test_other_non_ascii_text_round_trips(alice, bob):
    text = "caf\u00e9 \u2014 \u65e5\u672c\u8a9e \U0001f680 don\u02bct"
    tid = alice.create("bob@acme", text, metadata={"\u00e9": "\U0001f680"})["task_id"]
    thread = bob.get(tid)
    assert thread["summary"] == text
    assert thread["messages"][0]["payload"] == {"\u00e9": "\U0001f680"}


def test_unread_counts_stay_per_thread_when_the_caller_has_read_several_threads(client, make_agent):
    """Regression: the read-position subquery once lost its correlation and failed with 2+ read threads."""
    sender, skey = make_agent("unread-s@acme")
    recipient, rkey = make_agent("unread-r@acme")

    ids = [send_message(client, skey, recipient, f"t{i}")["task_id"] for i in range(3)]
    for task_id in ids:
        rpc(client, rkey, "tasks/get", {"task_id": task_id})
    send_message(client, skey, None, "one more", task_id=ids[1])
    items = {i["task_id"]: i["unread_messages"] for i in rpc(client, rkey, "tasks/list", {})["items"]}
    assert items == {ids[0]: 0, ids[1]: 1, ids[2]: 0}
