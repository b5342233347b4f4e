"""JSON-RPC 2.0 envelope of POST /a2a: parse errors, invalid requests, batches,
notifications, HTTP statuses, authentication and the body limit.

The rules are docs/api.md's ("JSON-RPC: `POST /a2a`", "Errors") and docs/decisions.md's.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from relay.extensions import db
from relay.models import ApiKey
from relay.services.agents import key_digest, revoke_key
from tests.conftest import JSON, post_a2a

# --------------------------------------------------------------------------- helpers


def _assert_clean_json(resp):
    """A JSON answer with no HTML page and no traceback in it."""
    assert resp.mimetype == JSON
    text = resp.get_data(as_text=True)
    lowered = text.lower()
    assert "<html" not in lowered and "<!doctype" not in lowered
    assert "traceback" not in lowered
    return json.loads(text, parse_constant=_strict_constant)


def _strict_constant(name):
    raise AssertionError(f"the answer is not valid JSON: it holds {name}")


def _single_error(resp, code, symbol, id_=None, status=200):
    """Assert one JSON-RPC error object and return it."""
    assert resp.status_code == status, resp.get_data(as_text=True)
    body = _assert_clean_json(resp)
    assert isinstance(body, dict)
    assert body["jsonrpc"] == "2.0"
    assert "result" not in body
    assert body["id"] == id_ and type(body["id"]) is type(id_)
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["data"]["symbol"] == symbol, body
    return body["error"]


@pytest.fixture
def key(make_agent):
    return make_agent("frank@acme", name="Frank", role="frontend")[1]


def _send_params(recipient, text="Please review the /users pagination change."):
    return {"recipient": recipient, "message": {"role": "user", "parts": [{"type": "text", "text": text}]}}


# --------------------------------------------------------------------------- C1: parse errors

TRUNCATED = '{"jsonrpc":"2.0","method":"tasks/get",'


def test_c1_truncated_body_is_parse_error_with_null_id(client, key):
    _single_error(post_a2a(client, key, TRUNCATED), -32700, "parse_error")


def test_c1_truncated_body_sent_as_text_plain_is_parse_error(client, key):
    _single_error(post_a2a(client, key, TRUNCATED, content_type="text/plain"), -32700, "parse_error")


def test_valid_request_sent_as_text_plain_is_served(client, key):
    resp = post_a2a(
        client, key, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/list"}), content_type="text/plain"
    )
    assert resp.status_code == 200
    body = _assert_clean_json(resp)
    assert body["id"] == 1
    assert body["result"] == {"items": [], "next_cursor": None}


def test_invalid_utf8_body_is_parse_error(client, key):
    body = b'{"jsonrpc":"2.0","id":1,"method":"tasks/list","params":{"x":"\xff\xfe"}}'
    _single_error(post_a2a(client, key, body), -32700, "parse_error")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_number_literals_are_parse_errors(client, key, literal):
    body = '{"jsonrpc":"2.0","id":1,"method":"tasks/list","params":{"page":{"limit":%s}}}' % literal
    _single_error(post_a2a(client, key, body), -32700, "parse_error")


def test_number_overflowing_to_infinity_is_parse_error(client, key):
    # 1e400 is valid JSON text but has no finite value; the answer must stay valid JSON
    body = '{"jsonrpc":"2.0","id":1e400,"method":"tasks/list"}'
    _single_error(post_a2a(client, key, body), -32700, "parse_error")


def test_empty_body_is_parse_error(client, key):
    _single_error(post_a2a(client, key, b""), -32700, "parse_error")


# --------------------------------------------------------------------------- C2: invalid requests


def test_c2_object_that_is_not_a_request_is_invalid_request_with_null_id(client, key):
    _single_error(post_a2a(client, key, {"hello": "world"}), -32600, "invalid_request")


def test_c2_bare_number_is_invalid_request_with_null_id(client, key):
    _single_error(post_a2a(client, key, "42"), -32600, "invalid_request")


def test_c2_jsonrpc_1_0_is_invalid_request_echoing_id(client, key):
    doc = {"jsonrpc": "1.0", "id": 1, "method": "tasks/get", "params": {}}
    _single_error(post_a2a(client, key, doc), -32600, "invalid_request", id_=1)


def test_missing_method_is_invalid_request_echoing_id(client, key):
    _single_error(post_a2a(client, key, {"jsonrpc": "2.0", "id": "r-1"}), -32600, "invalid_request", id_="r-1")


def test_c2_unknown_method_echoes_string_id(client, key):
    err = _single_error(
        post_a2a(client, key, {"jsonrpc": "2.0", "id": "req-9", "method": "tasks/explode"}),
        -32601,
        "method_not_found",
        id_="req-9",
    )
    assert err["data"]["method"] == "tasks/explode"


def test_c2_unknown_method_echoes_numeric_id(client, key):
    _single_error(
        post_a2a(client, key, {"jsonrpc": "2.0", "id": 77, "method": "nope", "params": {}}),
        -32601,
        "method_not_found",
        id_=77,
    )


def test_c2_array_params_are_invalid_params_echoing_id(client, key):
    err = _single_error(
        post_a2a(client, key, {"jsonrpc": "2.0", "id": 5, "method": "tasks/get", "params": ["x"]}),
        -32602,
        "invalid_params",
        id_=5,
    )
    assert "params" in err["data"]["errors"]


def test_string_params_are_invalid_request(client, key):
    _single_error(
        post_a2a(client, key, {"jsonrpc": "2.0", "id": 6, "method": "tasks/get", "params": "x"}),
        -32600,
        "invalid_request",
        id_=6,
    )


@pytest.mark.parametrize("bad_id", [{"a": 1}, True, False, [1]], ids=["object", "true", "false", "array"])
def test_id_of_wrong_type_is_invalid_request_with_null_id(client, key, bad_id):
    doc = {"jsonrpc": "2.0", "id": bad_id, "method": "tasks/list", "params": {}}
    _single_error(post_a2a(client, key, doc), -32600, "invalid_request")


def test_invalid_params_name_the_field(client, key):
    err = _single_error(
        post_a2a(client, key, {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {}}),
        -32602,
        "invalid_params",
        id_=3,
    )
    assert set(err["data"]["errors"]) == {"task_id"}
    assert all(isinstance(r, str) for r in err["data"]["errors"]["task_id"])


def test_null_id_is_answered_with_null_id(client, key):
    resp = post_a2a(client, key, {"jsonrpc": "2.0", "id": None, "method": "tasks/list"})
    assert resp.status_code == 200
    body = _assert_clean_json(resp)
    assert body["id"] is None
    assert body["result"] == {"items": [], "next_cursor": None}


# --------------------------------------------------------------------------- batches


def test_batch_is_answered_in_order_with_mixed_results(client, make_agent, key):
    make_agent("grace@acme")
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "tasks/list", "params": {}},
        {"jsonrpc": "2.0", "id": "b", "method": "no/such"},
        {"jsonrpc": "2.0", "id": "c", "method": "message/send", "params": _send_params("grace@acme")},
        42,
        {"jsonrpc": "2.0", "method": "tasks/list"},  # a notification: no answer
        {"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": {"task_id": "nope"}},
        {"jsonrpc": "2.0", "id": "e", "method": "tasks/list", "params": {"filter": {"role": "sender"}}},
    ]
    resp = post_a2a(client, key, batch)
    assert resp.status_code == 200
    answers = _assert_clean_json(resp)
    assert isinstance(answers, list)
    assert [a["id"] for a in answers] == ["a", "b", "c", None, 4, "e"]
    assert answers[0]["result"] == {"items": [], "next_cursor": None}
    assert answers[1]["error"]["code"] == -32601
    assert answers[2]["result"]["status"] == {"state": "pending"}
    assert answers[3]["error"]["code"] == -32600
    assert answers[4]["error"]["code"] == -32602
    assert "task_id" in answers[4]["error"]["data"]["errors"]
    # the element after the create sees it: elements run in order
    assert [i["task_id"] for i in answers[5]["result"]["items"]] == [answers[2]["result"]["task_id"]]
    for a in answers:
        assert a["jsonrpc"] == "2.0"
        assert ("result" in a) != ("error" in a)


def test_empty_batch_is_a_single_invalid_request_object(client, key):
    resp = post_a2a(client, key, "[]")
    err = _single_error(resp, -32600, "invalid_request")
    assert err["code"] == -32600


def test_batch_of_only_notifications_answers_204_with_empty_body(client, key):
    batch = [
        {"jsonrpc": "2.0", "method": "tasks/list"},
        {"jsonrpc": "2.0", "method": "tasks/list", "params": {"filter": {"role": "sender"}}},
    ]
    resp = post_a2a(client, key, batch)
    assert resp.status_code == 204
    assert resp.get_data() == b""


# --------------------------------------------------------------------------- notifications


def test_notification_answers_204_and_is_carried_out(client, make_agent, key):
    _grace, grace_key = make_agent("grace@acme")
    doc = {"jsonrpc": "2.0", "method": "message/send", "params": _send_params("grace@acme", "notified handoff")}
    resp = post_a2a(client, key, doc)
    assert resp.status_code == 204
    assert resp.get_data() == b""
    inbox = post_a2a(client, grace_key, {"jsonrpc": "2.0", "id": 1, "method": "tasks/list"}).get_json()["result"]
    assert [i["summary_preview"] for i in inbox["items"]] == ["notified handoff"]
    assert inbox["items"][0]["sender"]["handle"] == "frank@acme"


def test_unknown_method_notification_answers_204(client, key):
    resp = post_a2a(client, key, {"jsonrpc": "2.0", "method": "no/such", "params": {}})
    assert resp.status_code == 204
    assert resp.get_data() == b""


def test_notification_with_invalid_params_answers_204(client, key):
    resp = post_a2a(client, key, {"jsonrpc": "2.0", "method": "tasks/get", "params": {}})
    assert resp.status_code == 204
    assert resp.get_data() == b""


# --------------------------------------------------------------------------- statuses and symbols

ERROR_BODIES = {
    "truncated": (TRUNCATED, -32700),
    "invalid_utf8": (b'{"a":"\xff"}', -32700),
    "nan": ('{"jsonrpc":"2.0","id":1,"method":"tasks/list","x":NaN}', -32700),
    "not_a_request": ('{"hello":"world"}', -32600),
    "number": ("42", -32600),
    "jsonrpc_1_0": ('{"jsonrpc":"1.0","id":1,"method":"tasks/get","params":{}}', -32600),
    "unknown_method": ('{"jsonrpc":"2.0","id":1,"method":"x/y"}', -32601),
    "array_params": ('{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":["x"]}', -32602),
    "string_params": ('{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":"x"}', -32600),
    "object_id": ('{"jsonrpc":"2.0","id":{},"method":"tasks/list"}', -32600),
    "bool_id": ('{"jsonrpc":"2.0","id":true,"method":"tasks/list"}', -32600),
    "empty_batch": ("[]", -32600),
    "missing_task_id": ('{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{}}', -32602),
    "unknown_thread": (
        '{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"task_id":"01HXYZ4K2VNJQP7R8MWDB3CSTF"}}',
        -32006,
    ),
}


@pytest.mark.parametrize("name", sorted(ERROR_BODIES))
def test_every_jsonrpc_error_is_http_200_with_a_symbol(client, key, name):
    body, code = ERROR_BODIES[name]
    resp = post_a2a(client, key, body)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    doc = _assert_clean_json(resp)
    assert doc["error"]["code"] == code
    assert isinstance(doc["error"]["data"]["symbol"], str) and doc["error"]["data"]["symbol"]


# --------------------------------------------------------------------------- authentication


def test_missing_key_is_401_with_bearer_challenge(client):
    resp = post_a2a(client, None, {"jsonrpc": "2.0", "id": 1, "method": "tasks/list"})
    err = _single_error(resp, -32001, "unauthenticated", id_=1, status=401)
    assert err["code"] == -32001
    assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")


def test_unknown_key_is_401(client, key):
    resp = post_a2a(client, "ah_live_" + "a" * 32, {"jsonrpc": "2.0", "id": 1, "method": "tasks/list"})
    _single_error(resp, -32001, "unauthenticated", id_=1, status=401)
    assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")


def test_revoked_key_is_401(app, client, key):
    doc = {"jsonrpc": "2.0", "id": 1, "method": "tasks/list"}
    assert post_a2a(client, key, doc).status_code == 200
    with app.app_context():
        key_id = db.session.scalar(select(ApiKey.id).where(ApiKey.digest == key_digest(key)))
        revoke_key(key_id)
    resp = post_a2a(client, key, doc)
    _single_error(resp, -32001, "unauthenticated", id_=1, status=401)
    assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")


def test_missing_key_with_unparseable_body_is_still_401(client):
    resp = post_a2a(client, None, TRUNCATED)
    _single_error(resp, -32001, "unauthenticated", status=401)
    assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")


# --------------------------------------------------------------------------- body limit


def test_body_over_the_limit_is_413_payload_too_large(client, key):
    filler = "x" * 1_100_000
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {"pad": filler}})
    assert len(body) > 1024 * 1024
    resp = post_a2a(client, key, body)
    err = _single_error(resp, -32600, "payload_too_large", status=413)
    assert err["data"]["limit_bytes"] == 1024 * 1024
