"""Regressions found by following the README as a new user would (one test per finding)."""

from __future__ import annotations

import io

from tests.conftest import bearer, rpc_answer, send_message


def test_chunked_body_over_the_limit_is_413_on_a2a_not_a_parse_error(client, alice):
    big = b'{"jsonrpc":"2.0","id":1,"method":"tasks/list","params":{"x":"' + b"a" * (1024 * 1024 + 10) + b'"}}'
    resp = client.post(
        "/a2a",
        input_stream=io.BytesIO(big),
        headers={**bearer(alice[1]), "Transfer-Encoding": "chunked", "Content-Type": "application/json"},
    )
    assert resp.status_code == 413
    assert resp.get_json()["error"]["data"]["symbol"] == "payload_too_large"


def test_chunked_body_over_the_limit_is_413_on_rest(client, alice):
    big = b'{"url":"' + b"a" * (1024 * 1024 + 10) + b'"}'
    resp = client.post(
        f"/api/v1/identities/{alice[0]}/webhooks",
        input_stream=io.BytesIO(big),
        headers={**bearer(alice[1]), "Transfer-Encoding": "chunked", "Content-Type": "application/json"},
    )
    assert resp.status_code == 413
    assert resp.get_json()["error"]["code"] == "payload_too_large"


def test_rest_reply_refuses_create_only_and_unknown_fields(client, alice, bob):
    task_id = send_message(client, alice[1], bob[0])["task_id"]
    for extra in ({"recipient": alice[0]}, {"bogus": 1}):
        resp = client.post(
            f"/api/v1/identities/{bob[0]}/a2a/tasks/{task_id}/messages",
            headers=bearer(bob[1]),
            json={"message": {"parts": [{"type": "text", "text": "r"}]}, **extra},
        )
        assert resp.status_code == 422, resp.get_json()
        assert list(extra)[0] in resp.get_json()["error"]["details"]


def test_jsonrpc_unknown_top_level_param_is_32602_naming_it(client, alice):
    body = rpc_answer(client, alice[1], "tasks/list", {"limit": 5})
    assert body["error"]["code"] == -32602
    assert "limit" in body["error"]["data"]["errors"]


def test_webhook_enabled_must_be_a_real_boolean(client, alice):
    made = client.post(
        f"/api/v1/identities/{alice[0]}/webhooks", headers=bearer(alice[1]), json={"url": "http://127.0.0.1:9/hook"}
    ).get_json()
    for value in ("off", 1, "yes"):
        resp = client.patch(
            f"/api/v1/identities/{alice[0]}/webhooks/{made['id']}", headers=bearer(alice[1]), json={"enabled": value}
        )
        assert resp.status_code == 422, (value, resp.get_json())
        assert "enabled" in resp.get_json()["error"]["details"]


def test_rest_json_body_without_a_content_type_is_read(client, alice):
    resp = client.post(
        f"/api/v1/identities/{alice[0]}/keys",
        headers=bearer(alice[1]),
        data=b'{"label": "curl -d"}',
        content_type="application/x-www-form-urlencoded",
    )
    assert resp.status_code == 201, resp.get_json()
    assert resp.get_json()["label"] == "curl -d"


def test_notification_answers_204_without_a_content_type(client, alice):
    resp = client.post("/a2a", json={"jsonrpc": "2.0", "method": "tasks/list", "params": {}}, headers=bearer(alice[1]))
    assert resp.status_code == 204
    assert resp.data == b""
    assert "Content-Type" not in resp.headers


def test_metrics_content_type_names_its_charset_once(client):
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].count("charset") == 1


def test_identity_and_key_times_use_z_like_the_rest_of_the_api(client, alice):
    me = client.get("/api/v1/identities/me", headers=bearer(alice[1])).get_json()
    assert me["created_at"].endswith("Z")
    keys = client.get(f"/api/v1/identities/{alice[0]}/keys", headers=bearer(alice[1])).get_json()["items"]
    assert all(k["created_at"].endswith("Z") for k in keys)


def test_file_ref_line_end_before_line_start_is_refused(client, alice, bob):
    body = rpc_answer(
        client,
        alice[1],
        "message/send",
        {
            "recipient": bob[0],
            "message": {"parts": [{"type": "text", "text": "see"}]},
            "artifacts": [{"type": "file_ref", "path": "a.py", "line_start": 10, "line_end": 2}],
        },
    )
    assert body["error"]["code"] == -32602
    assert "artifacts.0.line_end" in body["error"]["data"]["errors"]
