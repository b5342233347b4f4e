"""Bad bodies just under RELAY_MAX_BODY_BYTES are refused with a small answer, on every surface.

A list of 349,000 bad items, loaded item by item, would be answered with one field error
per item (about 30 MB, seconds of CPU). So lists are refused whole when longer than their
bound (``BoundedList``, relay/schemas/common.py), and every field-error list
is capped at MAX_FIELD_ERRORS (relay/errors.py) paths plus a count of the rest (JSON-RPC ``data.errors`` /
``data.errors_omitted``, REST ``error.details`` / ``error.details_omitted``, A2A
``BadRequest.fieldViolations`` / ``ErrorInfo.metadata.errors_omitted``).

Nothing here is timed; bench/bad_bodies.py measures the cost.
"""

from __future__ import annotations

import json
import uuid

import pytest
from marshmallow import Schema, ValidationError, fields

from relay import errors
from relay.errors import RelayError
from relay.schemas import common
from relay.schemas.handoffs import MessageSendParams
from tests.conftest import bearer, rpc_doc

BODY_LIMIT = 1_048_576  # RELAY_MAX_BODY_BYTES' default
SMALL = 8192  # every answer below must be smaller than this
ID = 7  # the id of every JSON-RPC request here
UNKNOWN_TASK = "01HXYZ4K2VNJQP7R8MWDB3CSTF"
FILL = "__FILL__"
A2A_HEADERS = {"A2A-Version": "1.0"}


def filled(doc: dict, item: str = "1") -> tuple[bytes, int]:
    """``doc`` as JSON with ``"__FILL__"`` replaced by a list of ``item`` just under the body limit."""
    text = json.dumps(doc, separators=(",", ":"))
    room = BODY_LIMIT - 512 - len(text)
    count = room // (len(item) + 1)
    body = text.replace(json.dumps(FILL), "[" + ",".join([item] * count) + "]").encode()
    assert BODY_LIMIT - 1024 < len(body) < BODY_LIMIT
    return body, count


def post_small(client, key, path, body: bytes, headers=None):
    """POST ``body`` as JSON to ``path``; assert the answer is smaller than SMALL; return it and its JSON."""
    resp = client.post(path, data=body, headers={**bearer(key), "Content-Type": "application/json", **(headers or {})})
    raw = resp.get_data()
    assert len(raw) < SMALL, (resp.status_code, len(raw), raw[:500])
    return resp, json.loads(raw)


def rpc_errors(client, key, body: bytes) -> dict:
    """POST /a2a; assert a small -32602 invalid_params answer; return ``error.data``."""
    resp, doc = post_small(client, key, "/a2a", body)
    assert resp.status_code == 200, doc
    assert doc["id"] == ID and doc["error"]["code"] == -32602, doc
    data = doc["error"]["data"]
    assert data["symbol"] == "invalid_params", data
    return data


def a2a_violations(client, key, handle, body: bytes) -> tuple[dict, dict]:
    """POST /a2a/agents/{handle}; assert a small -32602; return ({field: description}, ErrorInfo.metadata)."""
    resp, doc = post_small(client, key, f"/a2a/agents/{handle}", body, A2A_HEADERS)
    assert resp.status_code == 200, doc
    error = doc["error"]
    assert error["code"] == -32602, error
    info = error["data"][0]
    assert info["metadata"]["symbol"] == "invalid_params", error
    bad = [d for d in error["data"] if d["@type"] == "type.googleapis.com/google.rpc.BadRequest"]
    assert len(bad) == 1, error
    return {v["field"]: v["description"] for v in bad[0]["fieldViolations"]}, info["metadata"]


TEXT_PART = [{"type": "text", "text": "hello"}]


# --------------------------------------------------------------------------- one error for a list past its bound


def test_rpc_message_send_with_349k_parts_is_one_small_error_naming_the_bound(client, alice, bob):
    body, count = filled(
        rpc_doc("message/send", {"recipient": bob[0], "message": {"role": "user", "parts": FILL}}, id=ID)
    )
    assert count > 300_000
    data = rpc_errors(client, alice[1], body)
    assert data["errors"] == {"message.parts": [f"must hold at most 20 parts, got {count}"]}
    assert "errors_omitted" not in data


def test_rpc_message_send_with_349k_artifacts_is_one_small_error_naming_the_bound(client, alice, bob):
    params = {"recipient": bob[0], "message": {"role": "user", "parts": TEXT_PART}, "artifacts": FILL}
    body, count = filled(rpc_doc("message/send", params, id=ID))
    data = rpc_errors(client, alice[1], body)
    assert data["errors"] == {"artifacts": [f"must hold at most 50 artifacts, got {count}"]}


def test_rpc_tasks_list_with_349k_statuses_is_one_small_error_naming_the_bound(client, alice):
    body, count = filled(rpc_doc("tasks/list", {"filter": {"status": FILL}}, id=ID))
    data = rpc_errors(client, alice[1], body)
    assert list(data["errors"]) == ["filter.status"]
    (reason,) = data["errors"]["filter.status"]
    assert "at most" in reason and f"got {count}" in reason


def test_rest_reply_with_349k_parts_is_one_small_422_naming_the_bound(client, alice):
    body, count = filled({"message": {"role": "user", "parts": FILL}})
    resp, doc = post_small(client, alice[1], f"/api/v1/identities/{alice[0]}/a2a/tasks/{UNKNOWN_TASK}/messages", body)
    assert resp.status_code == 422, doc
    assert doc["error"]["code"] == "invalid_params"
    assert doc["error"]["details"] == {"message.parts": [f"must hold at most 20 parts, got {count}"]}
    assert "details_omitted" not in doc["error"]


def test_rest_reply_with_349k_artifacts_is_one_small_422(client, alice):
    body, count = filled({"message": {"role": "user", "parts": TEXT_PART}, "artifacts": FILL})
    resp, doc = post_small(client, alice[1], f"/api/v1/identities/{alice[0]}/a2a/tasks/{UNKNOWN_TASK}/messages", body)
    assert resp.status_code == 422, doc
    assert doc["error"]["details"] == {"artifacts": [f"must hold at most 50 artifacts, got {count}"]}


def test_a2a_send_message_with_349k_parts_is_one_small_violation_naming_the_bound(client, alice, bob):
    message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": FILL}
    body, count = filled(rpc_doc("SendMessage", {"message": message}, id=ID))
    found, _ = a2a_violations(client, alice[1], bob[0], body)
    assert found == {"message.parts": f"must hold at most 70 parts, got {count}"}


@pytest.mark.parametrize("member", ["extensions", "referenceTaskIds"])
def test_a2a_send_message_string_lists_are_bounded_too(client, alice, bob, member):
    message = {"messageId": str(uuid.uuid4()), "parts": [{"text": "hi"}], member: FILL}
    body, count = filled(rpc_doc("SendMessage", {"message": message}, id=ID))
    found, _ = a2a_violations(client, alice[1], bob[0], body)
    assert list(found) == [f"message.{member}"]
    assert f"got {count}" in found[f"message.{member}"]


def test_a2a_send_message_accepted_output_modes_are_bounded(client, alice, bob):
    message = {"messageId": str(uuid.uuid4()), "parts": [{"text": "hi"}]}
    body, count = filled(
        rpc_doc("SendMessage", {"message": message, "configuration": {"acceptedOutputModes": FILL}}, id=ID)
    )
    found, _ = a2a_violations(client, alice[1], bob[0], body)
    assert list(found) == ["configuration.acceptedOutputModes"]


def test_a_huge_string_is_refused_naming_its_bound(client, alice, bob):
    params = {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "x" * (BODY_LIMIT - 4096)}]}}
    data = rpc_errors(client, alice[1], json.dumps(rpc_doc("message/send", params, id=ID)).encode())
    assert data["errors"] == {"message.parts.0.text": ["must be at most 262144 characters"]}


def test_a_huge_link_url_is_refused_naming_its_bound(client, alice, bob):
    link = {"type": "link", "url": "http://" + "a-" * 500_000}
    params = {"recipient": bob[0], "message": {"parts": TEXT_PART}, "artifacts": [link]}
    data = rpc_errors(client, alice[1], json.dumps(rpc_doc("message/send", params, id=ID)).encode())
    assert data["errors"] == {"artifacts.0.url": ["must be at most 2048 characters"]}


# --------------------------------------------------------------------------- capped error lists


def test_90k_unknown_members_answer_20_errors_and_a_count(client, alice):
    members = ",".join(f'"k{i}":1' for i in range(90_000))
    body = ('{"jsonrpc":"2.0","id":7,"method":"tasks/list","params":{' + members + "}}").encode()
    assert len(body) < BODY_LIMIT
    data = rpc_errors(client, alice[1], body)
    assert len(data["errors"]) == errors.MAX_FIELD_ERRORS
    assert data["errors_omitted"] == 90_000 - errors.MAX_FIELD_ERRORS


def test_an_unknown_member_with_a_huge_name_is_named_shortened(client, alice):
    body = json.dumps(rpc_doc("tasks/list", {"k" * (BODY_LIMIT - 1024): 1}, id=ID)).encode()
    data = rpc_errors(client, alice[1], body)
    (path,) = data["errors"]
    assert path.startswith("kkkk") and path.endswith("…") and len(path) <= errors.MAX_FIELD_NAME


def test_a2a_metadata_full_of_nul_strings_answers_20_violations_and_a_count(client, alice, bob):
    meta = {f"k{i}": "\x00" for i in range(50_000)}
    message = {"messageId": str(uuid.uuid4()), "parts": [{"text": "hi"}]}
    body = json.dumps(
        rpc_doc("SendMessage", {"message": message, "metadata": meta}, id=ID), separators=(",", ":")
    ).encode()
    assert len(body) < BODY_LIMIT
    found, metadata = a2a_violations(client, alice[1], bob[0], body)
    assert len(found) == errors.MAX_FIELD_ERRORS
    assert all(field.startswith("metadata.k") for field in found)
    assert metadata["errors_omitted"] == str(50_000 - errors.MAX_FIELD_ERRORS)


def _25_bad_artifacts(bob_handle: str) -> dict:
    return {"recipient": bob_handle, "message": {"role": "user", "parts": TEXT_PART}, "artifacts": [1] * 25}


def test_25_bad_items_yield_20_errors_plus_5_more():
    with pytest.raises(RelayError) as caught:
        common.load_or_invalid(MessageSendParams(), _25_bad_artifacts("bob@acme"))
    exc = caught.value
    assert exc.symbol == "invalid_params"
    assert list(exc.details) == [f"artifacts.{i}" for i in range(20)]
    assert all(reasons == ["must be an object"] for reasons in exc.details.values())
    assert exc.omitted == 5
    assert exc.message.endswith("and 5 more")
    assert "artifacts.19" in exc.message and "artifacts.20" not in exc.message


def test_25_bad_items_on_each_surface_yield_20_errors_plus_5_more(client, alice, bob):
    data = rpc_errors(client, alice[1], json.dumps(rpc_doc("message/send", _25_bad_artifacts(bob[0]), id=ID)).encode())
    assert len(data["errors"]) == 20 and data["errors_omitted"] == 5

    body = {"message": {"role": "user", "parts": TEXT_PART}, "artifacts": [1] * 25}
    resp, doc = post_small(
        client,
        alice[1],
        f"/api/v1/identities/{alice[0]}/a2a/tasks/{UNKNOWN_TASK}/messages",
        json.dumps(body).encode(),
    )
    assert resp.status_code == 422, doc
    assert len(doc["error"]["details"]) == 20 and doc["error"]["details_omitted"] == 5

    # A2A: 25 url parts of a refused scheme beside one text part, named by their A2A index.
    parts = [{"text": "hi"}] + [{"url": "ftp://example.com/x"}] * 25
    message = {"messageId": str(uuid.uuid4()), "parts": parts}
    found, metadata = a2a_violations(
        client, alice[1], bob[0], json.dumps(rpc_doc("SendMessage", {"message": message}, id=ID)).encode()
    )
    assert list(found) == [f"message.parts.{i}.url" for i in range(1, 21)], found
    assert metadata["errors_omitted"] == "5"


def test_relay_error_caps_any_invalid_params_details():
    exc = RelayError("invalid_params", "x", {f"f{i}": ["bad"] for i in range(30)})
    assert len(exc.details) == errors.MAX_FIELD_ERRORS and exc.omitted == 10
    small = RelayError("invalid_params", "x", {"f": ["bad"]})
    assert small.details == {"f": ["bad"]} and small.omitted == 0


# --------------------------------------------------------------------------- the pieces


class _Counting(fields.Integer):
    calls = 0

    def _deserialize(self, value, attr, data, **kwargs):
        type(self).calls += 1
        return super()._deserialize(value, attr, data, **kwargs)


def test_bounded_list_refuses_a_long_list_before_loading_any_item():
    class _Numbers(Schema):
        numbers = common.BoundedList(_Counting(), max_items=3, noun="numbers")

    _Counting.calls = 0
    with pytest.raises(ValidationError) as caught:
        _Numbers().load({"numbers": ["x"] * 1000})
    assert caught.value.messages == {"numbers": ["must hold at most 3 numbers, got 1000"]}
    assert _Counting.calls == 0
    assert _Numbers().load({"numbers": [1, 2, 3]}) == {"numbers": [1, 2, 3]}
    assert _Counting.calls == 3


def test_unstorable_paths_keeps_the_first_paths_and_counts_the_rest():
    value = {"meta": {f"k{i:02}": "\x00" for i in range(30)}, "ok": ["fine", "also fine"]}
    paths, omitted = common.find_unstorable(value, limit=20)
    assert len(paths) == 20 and omitted == 10
    assert paths == sorted(paths) and all(p.startswith("meta.k") for p in paths)
    assert common.find_unstorable({"a": ["x", "\ud800"], "b": {"\x00": 1}}) == (["a.1", "b"], 0)
    assert common.find_unstorable({"a": "back\\u0000slash"}) == ([], 0)
    assert common.unstorable_paths({"a": {f"k{i}": "\x00" for i in range(30)}}, "p") == sorted(
        f"p.a.k{i}" for i in range(30)
    )
