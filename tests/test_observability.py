"""Configuration check, request ids, metrics and log hygiene."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from relay.factory import create_app
from tests.conftest import bearer


def _relay(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_config_check_prints_the_effective_settings_with_secrets_masked(base_env, tmp_path):
    env = {
        **base_env,
        "RELAY_HOME": str(tmp_path),
        "RELAY_SECRET_KEY": "s3cret-value-123",
        "DATABASE_URL": "postgres://relay:dbpass-456@db.example:5432/relay",
        "RELAY_METRICS_TOKEN": "tok-789",
    }
    out = _relay(env, "config", "check")
    assert out.returncode == 0, out.stderr
    assert "database_url" in out.stdout and "postgresql+psycopg2://relay:***@db.example:5432/relay" in out.stdout
    assert "rate_limit" in out.stdout and "webhook_schedule" in out.stdout
    for secret in ("s3cret-value-123", "dbpass-456", "tok-789"):
        assert secret not in out.stdout + out.stderr


def test_config_check_names_a_bad_variable_in_one_line(base_env, tmp_path):
    out = _relay({**base_env, "RELAY_HOME": str(tmp_path), "RELAY_WEBHOOK_TIMEOUT": "soon"}, "config", "check")
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0
    assert "RELAY_WEBHOOK_TIMEOUT" in out.stderr


def test_gunicorn_entry_point_stops_with_one_line_on_a_bad_setting(base_env):
    env = {**base_env, "RELAY_ENV": "production", "RELAY_SECRET_KEY": ""}
    out = subprocess.run(
        [sys.executable, "-c", "import app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert out.returncode == 3
    assert out.stderr.strip() == "relay: configuration error: RELAY_SECRET_KEY is required when RELAY_ENV=production"


def test_request_id_is_echoed_when_safe_and_generated_otherwise(client):
    assert client.get("/healthz", headers={"X-Request-Id": "trace-42"}).headers["X-Request-Id"] == "trace-42"
    generated = client.get("/healthz", headers={"X-Request-Id": "bad id; <script>"}).headers["X-Request-Id"]
    assert generated != "bad id; <script>" and len(generated) == 32
    assert len(client.get("/healthz").headers["X-Request-Id"]) == 32


def test_metrics_count_requests_and_report_backlog_gauges(client, alice, bob):
    client.post(
        "/a2a",
        headers=bearer(alice[1]),
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "metrics"}]}},
        },
    )
    text = client.get("/metrics").get_data(as_text=True)
    assert 'relay_rpc_calls_total{method="message/send",outcome="ok"}' in text
    assert 'relay_http_requests_total{method="POST",route="/a2a",status="200"}' in text
    for gauge in (
        "relay_outbox_backlog",
        "relay_webhook_deliveries_pending",
        "relay_messages_unindexed",
        "relay_webhook_oldest_pending_seconds",
    ):
        assert f"\n{gauge} " in text
    # No worker runs in this test, so the message is still unindexed.
    assert "\nrelay_messages_unindexed 1.0" in text


def test_metrics_need_the_token_when_one_is_set(base_env):
    app = create_app({**base_env, "RELAY_METRICS_TOKEN": "scrape-me"})
    c = app.test_client()
    assert c.get("/metrics").status_code == 401
    assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/metrics", headers={"Authorization": "Bearer scrape-me"}).status_code == 200


def test_request_log_line_has_the_fields_and_no_key_secret_or_body(client, alice, bob, capsys):
    capsys.readouterr()
    body_text = "confidential-body-text-31337"
    client.post(
        "/a2a",
        headers={**bearer(alice[1]), "X-Request-Id": "log-check-1"},
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": body_text}]}},
        },
    )
    made = client.post(
        f"/api/v1/identities/{bob[0]}/webhooks", headers=bearer(bob[1]), json={"url": "http://127.0.0.1:9/hook"}
    ).get_json()
    client.get("/api/v1/identities/me", headers={"Authorization": "Bearer ah_live_" + "a" * 32})
    captured = capsys.readouterr()
    logs = captured.out + captured.err
    for secret in (alice[1], bob[1], made["secret"], body_text, "ah_live_" + "a" * 32):
        assert secret not in logs
    lines = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    request_line = next(l for l in lines if l.get("request_id") == "log-check-1")
    assert request_line["agent"] == alice[0]
    assert request_line["rpc_methods"] == ["message/send"]
    assert request_line["status"] == 200 and request_line["route"] == "/a2a"
    assert isinstance(request_line["duration_ms"], float)
