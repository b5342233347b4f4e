"""The real ``relay`` console script, run as a subprocess against the per-session test DB."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import datetime

import pytest
from sqlalchemy import text

from relay.extensions import db
from tests.conftest import bearer, sql

ME = "/api/v1/identities/me"
CREATE_KEYS = {"handle", "name", "role", "api_key", "key_id", "created_at"}


@pytest.fixture
def cli_env(base_env, tmp_path):
    """base_env with an isolated RELAY_HOME, so no running ``relay up`` leaks its URLs in."""
    env = dict(base_env)
    env["RELAY_HOME"] = str(tmp_path / "relay-home")
    return env


@pytest.fixture
def relay(cli_env, tmp_path):
    def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "relay.ops.cli", *args],
            env=env or cli_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return _run


def _stderr_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def _assert_one_line_failure(proc) -> str:
    assert proc.returncode != 0
    lines = _stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def _create(relay, handle="frank@acme", name="Frank", role="frontend") -> dict:
    proc = relay("agents", "create", handle, "--name", name, "--role", role, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_agents_create_json_prints_one_object_with_exact_keys(relay):
    proc = relay("agents", "create", "frank@acme", "--name", "Frank", "--role", "frontend", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1
    obj = json.loads(lines[0])
    assert set(obj) == CREATE_KEYS
    assert obj["handle"] == "frank@acme"
    assert obj["name"] == "Frank"
    assert obj["role"] == "frontend"
    uuid.UUID(obj["key_id"])
    assert datetime.fromisoformat(obj["created_at"]).tzinfo is not None


def test_agents_create_key_authenticates(relay, client):
    obj = _create(relay)
    resp = client.get(ME, headers=bearer(obj["api_key"]))
    assert resp.status_code == 200
    body = resp.get_json()
    assert datetime.fromisoformat(body.pop("created_at")) == datetime.fromisoformat(obj["created_at"])
    assert body == {"handle": "frank@acme", "name": "Frank", "role": "frontend", "org": "acme"}


def test_agents_create_duplicate_handle_fails_with_one_line(relay):
    _create(relay)
    proc = relay("agents", "create", "frank@acme", "--name", "Frank again", "--json")
    line = _assert_one_line_failure(proc)
    assert "frank@acme" in line
    assert proc.stdout == ""


def test_agents_create_malformed_handle_fails_with_one_line(relay):
    proc = relay("agents", "create", "not a handle", "--name", "X", "--json")
    _assert_one_line_failure(proc)
    assert proc.stdout == ""


def test_agents_list_json_lists_created_agents(relay):
    _create(relay, "frank@acme", "Frank", "frontend")
    _create(relay, "bob@acme", "Bob", "backend")
    proc = relay("agents", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["handle"] for r in rows] == ["bob@acme", "frank@acme"]
    by_handle = {r["handle"]: r for r in rows}
    assert by_handle["frank@acme"]["name"] == "Frank"
    assert by_handle["bob@acme"]["role"] == "backend"
    assert all(r["disabled_at"] is None for r in rows)


def test_agents_disable_makes_key_401(relay, client):
    obj = _create(relay)
    assert client.get(ME, headers=bearer(obj["api_key"])).status_code == 200
    proc = relay("agents", "disable", "frank@acme")
    assert proc.returncode == 0, proc.stderr
    resp = client.get(ME, headers=bearer(obj["api_key"]))
    assert resp.status_code == 401
    assert resp.get_json()["error"]["code"] == "unauthenticated"


def test_agents_disable_unknown_fails_with_one_line(relay):
    proc = relay("agents", "disable", "unknown@x")
    line = _assert_one_line_failure(proc)
    assert "unknown@x" in line


def test_keys_create_json_gives_working_second_key(relay, client):
    first = _create(relay)
    proc = relay("keys", "create", "frank@acme", "--label", "laptop", "--json")
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)
    assert second["api_key"] != first["api_key"]
    assert second["key_id"] != first["key_id"]
    resp = client.get(ME, headers=bearer(second["api_key"]))
    assert resp.status_code == 200
    assert resp.get_json()["handle"] == "frank@acme"
    assert client.get(ME, headers=bearer(first["api_key"])).status_code == 200


def test_keys_create_json_names_the_label_it_stored(relay, app):
    _create(relay)
    proc = relay("keys", "create", "frank@acme", "--label", "ci runner", "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert set(printed) == {"handle", "label", "api_key", "key_id", "created_at"}
    assert printed["label"] == "ci runner"
    [(stored,)] = sql(app, "SELECT label FROM api_keys WHERE id = :id", id=printed["key_id"])
    assert stored == "ci runner"


def test_keys_create_with_a_label_over_200_characters_fails_with_one_line(relay):
    _create(relay)
    line = _assert_one_line_failure(relay("keys", "create", "frank@acme", "--label", "x" * 201, "--json"))
    assert "label" in line


def test_keys_revoke_makes_that_key_401(relay, client):
    first = _create(relay)
    second = json.loads(relay("keys", "create", "frank@acme", "--json").stdout)
    proc = relay("keys", "revoke", second["key_id"])
    assert proc.returncode == 0, proc.stderr
    resp = client.get(ME, headers=bearer(second["api_key"]))
    assert resp.status_code == 401
    assert resp.get_json()["error"]["code"] == "unauthenticated"
    assert client.get(ME, headers=bearer(first["api_key"])).status_code == 200


def test_keys_revoke_non_uuid_fails_with_one_line(relay):
    _assert_one_line_failure(relay("keys", "revoke", "not-a-uuid"))


def test_keys_revoke_unknown_uuid_fails_with_one_line(relay):
    unknown = str(uuid.uuid4())
    line = _assert_one_line_failure(relay("keys", "revoke", unknown))
    assert unknown in line


def _alembic_revision(app) -> str:
    with app.app_context():
        rev = db.session.scalar(text("SELECT version_num FROM alembic_version"))
        db.session.rollback()
    return rev


def test_db_upgrade_on_migrated_db_is_noop(relay, app, client):
    obj = _create(relay)
    before = _alembic_revision(app)
    proc = relay("db", "upgrade")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert _alembic_revision(app) == before
    assert client.get(ME, headers=bearer(obj["api_key"])).status_code == 200


def test_agents_create_with_unreachable_database_fails_with_one_line(relay, cli_env):
    # Both URLs: in the pooled run the CLI would otherwise reach the database through the pooler.
    env = dict(cli_env, DATABASE_URL="postgresql://postgres@127.0.0.1:1/x")
    env.pop("DATABASE_CONNECTION_POOL_URL", None)
    proc = relay("agents", "create", "frank@acme", "--name", "Frank", "--json", env=env)
    _assert_one_line_failure(proc)
    assert proc.stdout == ""


def test_retention_on_a_database_not_migrated_fails_with_one_line(relay, cli_env, server_urls):
    from tests.conftest import fresh_database

    with fresh_database(server_urls[0], "relay_bare") as url:
        env = dict(cli_env, DATABASE_URL=url)
        env.pop("DATABASE_CONNECTION_POOL_URL", None)
        for args in (("retention", "status", "--json"), ("retention", "run")):
            line = _assert_one_line_failure(relay(*args, env=env))
            assert "relay db upgrade" in line


# --------------------------------------------------------------------------- finding the relay


def _no_database(cli_env: dict, **extra: str) -> dict:
    env = {k: v for k, v in cli_env.items() if k not in ("DATABASE_URL", "DATABASE_CONNECTION_POOL_URL", "RELAY_HOME")}
    return {**env, **extra}


def _as_relay_up(home, cli_env) -> tuple:
    """Write the relay.env a relay up writes, and hold its lock as it does; return the lock."""
    import fcntl

    home.mkdir(parents=True, exist_ok=True)
    (home / "relay.env").write_text(
        f"DATABASE_URL={cli_env['DATABASE_URL']}\nREDIS_URL={cli_env['REDIS_URL']}\nRELAY_URL=http://127.0.0.1:8123\n"
    )
    held = open(home / "relay-up.lock", "a+")  # noqa: SIM115  (closed by the caller)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return held


def test_with_no_relay_up_and_no_database_url_the_error_names_relay_home(relay, cli_env, tmp_path):
    line = _assert_one_line_failure(relay("agents", "list", env=_no_database(cli_env)))
    assert line.startswith(f"error: no relay up found under {tmp_path / '.relay'} (./.relay, the default RELAY_HOME)")
    assert "set RELAY_HOME" in line and "DATABASE_URL" in line
    elsewhere = tmp_path / "elsewhere"
    line = _assert_one_line_failure(relay("db", "upgrade", env=_no_database(cli_env, RELAY_HOME=str(elsewhere))))
    assert line.startswith(f"error: no relay up found under {elsewhere} (RELAY_HOME={elsewhere})"), line


def test_a_relay_env_left_by_a_relay_up_that_is_gone_is_not_used(relay, cli_env, tmp_path):
    home = tmp_path / ".relay"
    _as_relay_up(home, cli_env).close()  # the lock released: that relay up has exited
    line = _assert_one_line_failure(relay("agents", "list", env=_no_database(cli_env)))
    assert "no relay up found under" in line


def test_the_cli_finds_a_running_relay_up_under_relay_home_and_prints_its_console_url(relay, cli_env, tmp_path):
    home = tmp_path / "custom-home"
    with _as_relay_up(home, cli_env):
        env = _no_database(cli_env, RELAY_HOME=str(home))
        created = relay("agents", "create", "frank@acme", "--name", "Frank", "--json", env=env)
        assert created.returncode == 0, created.stderr
        operator = relay("operators", "create", "you@example.com", "--org", "acme", env=env)
        assert operator.returncode == 0, operator.stderr
        assert operator.stdout.splitlines()[-1] == "sign in at http://127.0.0.1:8123/console/login"
    public = relay(
        "operators",
        "create",
        "me@example.com",
        "--org",
        "acme",
        env=dict(cli_env, RELAY_PUBLIC_URL="https://relay.example.com/"),
    )
    assert public.stdout.splitlines()[-1] == "sign in at https://relay.example.com/console/login", public.stderr
    local = relay("operators", "create", "they@example.com", "--org", "acme", env=dict(cli_env, PORT="8765"))
    assert local.stdout.splitlines()[-1] == "sign in at http://localhost:8765/console/login", local.stderr


def test_under_a_running_relay_up_the_cli_stores_secrets_under_its_homes_key(relay, cli_env, tmp_path, app):
    """A signing key made by the CLI must decrypt in relay up's processes, which use home/secret_key."""
    from relay import crypto
    from tests.conftest import sql

    home = tmp_path / "home"
    with _as_relay_up(home, cli_env):
        (home / "secret_key").write_text("the-home-secret\n")
        env = {k: v for k, v in _no_database(cli_env, RELAY_HOME=str(home)).items() if k != "RELAY_SECRET_KEY"}
        made = relay("signing-keys", "create", "--json", env=env)
        assert made.returncode == 0, made.stderr
    kid = json.loads(made.stdout)["kid"]
    [(stored,)] = sql(app, "SELECT private_key_encrypted FROM signing_keys WHERE kid = :kid", kid=kid)
    assert crypto._fernet("the-home-secret").decrypt(stored.encode("ascii"))  # InvalidToken under any other key


def test_a_bad_port_refuses_operators_create_before_it_makes_anyone(relay, cli_env):
    bad = relay("operators", "create", "p@example.com", "--org", "acme", env=dict(cli_env, PORT="abc"))
    assert _assert_one_line_failure(bad) == "error: PORT must be a positive integer, got 'abc'"
    assert bad.stdout == ""
    assert relay("operators", "create", "p@example.com", "--org", "acme").returncode == 0  # nothing was made


def test_a_relay_home_that_is_a_file_is_one_line(relay, cli_env, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    line = _assert_one_line_failure(relay("agents", "list", env=_no_database(cli_env, RELAY_HOME=str(a_file))))
    assert "no relay up found under" in line
