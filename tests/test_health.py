"""/healthz, /readyz against real and unreachable servers; configuration errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from relay.config import ConfigError, load_settings

CLOSED_REDIS = "redis://127.0.0.1:1/0"
CLOSED_DATABASE = "postgresql://postgres@127.0.0.1:1/x"

# Building an app re-binds process-wide state (the shared Flask-Limiter storage and the
# default Celery app), so apps pointed at dead servers are built in a child process to
# keep the session ``app`` of the other tests on the real servers.
_READYZ_CHILD = """
import json, os
from relay.factory import create_app
app = create_app(dict(os.environ), TESTING=True)
resp = app.test_client().get("/readyz")
print(json.dumps({"status": resp.status_code, "body": resp.get_json()}))
"""


def _readyz_in_fresh_app(env: dict) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-c", _READYZ_CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["status"], out["body"]


def test_healthz_answers_200(client):
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.get_json() == {"status": "ok"}


def test_readyz_answers_200_when_both_servers_answer(client):
    resp = client.get("/readyz")
    assert resp.status_code == 200
    body = resp.get_json()
    # "beat" (when each sweep last ran) is covered by tests/test_beat.py.
    assert {k: body[k] for k in ("status", "checks")} == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}


def test_readyz_answers_503_naming_redis_when_redis_unreachable(base_env):
    status, body = _readyz_in_fresh_app(dict(base_env, REDIS_URL=CLOSED_REDIS))
    assert status == 503
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("failed")


def test_readyz_answers_503_naming_database_when_database_unreachable(base_env):
    # Both URLs: in the pooled run the app would otherwise reach the database through the pooler.
    env = {k: v for k, v in base_env.items() if k != "DATABASE_CONNECTION_POOL_URL"}
    status, body = _readyz_in_fresh_app(dict(env, DATABASE_URL=CLOSED_DATABASE))
    assert status == 503
    assert body["checks"]["database"].startswith("failed")
    assert body["checks"]["redis"] == "ok"


GOOD_ENV = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/postgres", "REDIS_URL": "redis://127.0.0.1:6379/0"}


def _config_error(**overrides) -> str:
    env = {**GOOD_ENV, **overrides}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    return str(info.value)


def test_good_env_loads():
    settings = load_settings(GOOD_ENV)
    assert settings.database_url == "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
    assert settings.redis_url == "redis://127.0.0.1:6379/0"


def test_missing_database_url_names_variable():
    assert "DATABASE_URL" in _config_error(DATABASE_URL=None)


def test_mysql_database_url_names_variable():
    assert "DATABASE_URL" in _config_error(DATABASE_URL="mysql://root@127.0.0.1:3306/relay")


def test_unparseable_rate_limit_names_variable():
    assert "RELAY_RATE_LIMIT" in _config_error(RELAY_RATE_LIMIT="lots")


def test_non_integer_max_body_bytes_names_variable():
    assert "RELAY_MAX_BODY_BYTES" in _config_error(RELAY_MAX_BODY_BYTES="abc")


def test_production_without_secret_key_names_variable():
    assert "RELAY_SECRET_KEY" in _config_error(RELAY_ENV="production")


def test_heroku_postgres_scheme_is_normalised():
    settings = load_settings({**GOOD_ENV, "DATABASE_URL": "postgres://u:p@db.example:5432/relay"})
    assert settings.database_url == "postgresql+psycopg2://u:p@db.example:5432/relay"
