"""Production defaults: every documented setting and request default, exactly.

``relay.config.load_settings()`` given only the two server URLs must yield the defaults
of docs/operations.md and docs/api.md (the test fixtures override many of them, so nothing else checks
them); the feed's ``limit`` and ``tasks/list``'s ``page.limit`` default to 50.
"""

from __future__ import annotations

import pytest
from marshmallow import ValidationError

from relay.config import load_settings
from relay.ids import parse_ulid
from relay.schemas.handoffs import ListPage, TasksListParams
from relay.schemas.rest import FeedQuery
from relay.services import threads
from relay.services.agents import get_agent
from tests.conftest import bearer


def test_production_defaults_from_only_the_server_urls():
    s = load_settings({"DATABASE_URL": "postgresql://u@db.example:5432/relay", "REDIS_URL": "redis://cache:6379/0"})
    assert s.database_url == "postgresql+psycopg2://u@db.example:5432/relay"
    assert s.redis_url == "redis://cache:6379/0"
    assert s.idempotency_ttl_seconds == 86400
    assert s.rate_limit == "60/minute"
    assert s.rest_rate_limit == "600/minute"
    assert s.auth_failure_limit == "60/minute"
    assert s.webhook_schedule == (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
    assert s.webhook_timeout == 10
    assert s.webhook_disable_after == 432000
    assert s.webhook_endpoint_concurrency == 4
    assert s.webhook_org_concurrency == 32
    assert s.webhook_max_in_flight == 64
    assert (s.webhook_circuit_failures, s.webhook_circuit_open) == (5, 30)
    assert s.webhook_slow_ms == 2000
    assert s.webhook_max_payload_bytes == 262144
    assert s.max_body_bytes == 1048576
    assert s.feed_budget_bytes == 524288
    assert s.search_config == "english"
    assert s.log_level == "INFO"
    assert s.env == "development"
    # The production-safe switches are off unless an operator turns them on.
    assert (s.webhook_allow_private, s.webhook_allow_http) == (False, False)
    # Waits and streams, and the pool that keeps their bursts off new backends.
    assert (s.streams_per_agent, s.stream_heartbeat) == (10, 15.0)
    # The Procfile's default deploy fits a 20-connection database; direct, prepared.
    assert (s.db_pool_size, s.db_max_overflow, s.db_pool_timeout) == (5, 0, 5.0)
    assert s.flask_config()["SQLALCHEMY_ENGINE_OPTIONS"] == {
        "pool_size": 5,
        "max_overflow": 0,
        "pool_timeout": 5.0,
        "connect_args": {"connect_timeout": 5},  # a new connection waits as long as a pooled one
        "hide_parameters": True,  # an error's text never carries a statement's values (message bodies)
    }
    assert (s.database_pool_url, s.db_prepare) == ("", True)


@pytest.mark.parametrize(
    "name,value,says",
    [
        ("RELAY_STREAMS_PER_AGENT", "0", "RELAY_STREAMS_PER_AGENT must be at least 1"),
        ("RELAY_STREAM_HEARTBEAT", "0", "RELAY_STREAM_HEARTBEAT must be a positive number of seconds"),
        ("RELAY_DB_POOL_SIZE", "0", "RELAY_DB_POOL_SIZE must be at least 1"),
        ("RELAY_DB_MAX_OVERFLOW", "-1", "RELAY_DB_MAX_OVERFLOW must be at least 0"),
        ("RELAY_DB_POOL_SIZE", "many", "RELAY_DB_POOL_SIZE must be an integer"),
    ],
)
def test_a_bad_wait_or_pool_setting_names_the_variable(name, value, says):
    from relay.config import ConfigError

    env = {"DATABASE_URL": "postgresql://u@db/relay", "REDIS_URL": "redis://cache:6379/0", name: value}
    with pytest.raises(ConfigError, match=says):
        load_settings(env)


def test_request_defaults_feed_limit_50_of_100_and_tasks_list_limit_50_of_200():
    assert FeedQuery().load({})["limit"] == 50
    assert FeedQuery().load({"limit": "100"})["limit"] == 100
    with pytest.raises(ValidationError) as exc:
        FeedQuery().load({"limit": "101"})
    assert "limit" in exc.value.messages

    assert ListPage().load({})["limit"] == 50
    assert TasksListParams().load({})["page"]["limit"] == 50
    assert ListPage().load({"limit": 200})["limit"] == 200
    with pytest.raises(ValidationError) as exc:
        ListPage().load({"limit": 201})
    assert "limit" in exc.value.messages


def test_feed_of_60_messages_returns_50_by_default(app, client, alice, bob):
    a_handle, a_key = alice
    b_handle, _b_key = bob
    text = {"message": {"parts": [{"type": "text", "text": "note"}]}}
    with app.app_context():
        sender = get_agent(a_handle)
        task_id = threads.send_message(sender, {**text, "recipient": b_handle})["task_id"]
        for _ in range(59):
            threads.send_message(sender, {**text, "task_id": parse_ulid(task_id)})
    resp = client.get(f"/api/v1/identities/{a_handle}/a2a/messages", headers=bearer(a_key))
    assert resp.status_code == 200, resp.get_data(as_text=True)
    page = resp.get_json()
    assert len(page["items"]) == 50
    assert page["next_cursor"] is not None


def test_a_connect_timeout_in_the_url_wins_over_the_pool_timeout():
    env = {"DATABASE_URL": "postgresql://u@db.example:5432/relay?connect_timeout=17", "REDIS_URL": "redis://c:6379/0"}
    assert load_settings(env).flask_config()["SQLALCHEMY_ENGINE_OPTIONS"]["connect_args"] == {}
    env = {
        "DATABASE_URL": "postgresql://u@db.example/relay",
        "REDIS_URL": "redis://c:6379/0",
        "RELAY_DB_POOL_TIMEOUT": "0.3",
    }
    assert load_settings(env).flask_config()["SQLALCHEMY_ENGINE_OPTIONS"]["connect_args"] == {"connect_timeout": 2}
