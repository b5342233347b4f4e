"""Settings read from environment variables only (cookiecutter-flask style)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy.engine import make_url

# RELAY_SECRET_KEY outside production when unset. Public, so nothing it signs can be trusted:
# the console refuses sign-ins under it, and `relay up` keeps a generated key instead.
DEV_SECRET_KEY = "dev-insecure-secret-key"


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


DEFAULTS: dict[str, str] = {
    "RELAY_ENV": "development",
    "RELAY_RATE_LIMIT": "60/minute",
    "RELAY_REST_RATE_LIMIT": "600/minute",
    "RELAY_AUTH_FAILURE_LIMIT": "60/minute",
    "RELAY_HEADER_TIMEOUT": "10",
    "RELAY_BODY_TIMEOUT": "30",
    "RELAY_CLIENT_IDLE_TIMEOUT": "30",
    "RELAY_MAX_BODY_BYTES": str(1024 * 1024),
    "RELAY_FEED_BUDGET_BYTES": str(512 * 1024),
    "RELAY_SEARCH_CONFIG": "english",
    "RELAY_IDEMPOTENCY_TTL_SECONDS": str(24 * 3600),
    "RELAY_LOG_LEVEL": "INFO",
    "RELAY_WEBHOOK_TIMEOUT": "10",
    "RELAY_WEBHOOK_SCHEDULE": "0,5,300,1800,7200,18000,36000,36000",
    "RELAY_WEBHOOK_DISABLE_AFTER": str(5 * 24 * 3600),
    "RELAY_WEBHOOK_ENDPOINT_CONCURRENCY": "4",
    "RELAY_WEBHOOK_ORG_CONCURRENCY": "32",
    "RELAY_WEBHOOK_MAX_IN_FLIGHT": "64",
    "RELAY_WEBHOOK_CIRCUIT_FAILURES": "5",
    "RELAY_WEBHOOK_CIRCUIT_OPEN": "30",
    "RELAY_WEBHOOK_SLOW_MS": "2000",
    "RELAY_WEBHOOK_MAX_PAYLOAD_BYTES": str(256 * 1024),
    "RELAY_STREAMS_PER_AGENT": "10",
    "RELAY_WORKER_HEARTBEAT": "1",
    "RELAY_WORKER_STALE": "5",
    "RELAY_DB_POOL_SIZE": "5",
    "RELAY_DB_MAX_OVERFLOW": "0",
    "RELAY_DB_POOL_TIMEOUT": "5",
    "RELAY_DB_PREPARE": "auto",
    "RELAY_STREAM_HEARTBEAT": "15",
    "RELAY_A2A_BLOCKING_SECONDS": "4",
    "RELAY_CONSOLE_SESSION_HOURS": "12",
    "RELAY_CONSOLE_LOGIN_LIMIT": "10/minute",
    "RELAY_CONSOLE_LOGIN_ADDRESS_LIMIT": "30/minute",
    "RELAY_RETAIN_DELIVERIES_DAYS": "30",
    "RELAY_RETAIN_EVENTS_DAYS": "30",
    "RELAY_RETAIN_AUDIT_DAYS": "365",
    "RELAY_RETAIN_CLOSED_THREADS_DAYS": "0",
    "RELAY_RETENTION_LOCK_TIMEOUT_MS": "500",
    "RELAY_SIGNING_KEY_GRACE_DAYS": "7",
}


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "0").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be 1 or 0, got {raw!r}")


def _log_level(env: Mapping[str, str]) -> str:
    raw = env.get("RELAY_LOG_LEVEL", DEFAULTS["RELAY_LOG_LEVEL"]).upper()
    if raw not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"RELAY_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, got {raw!r}")
    return raw


def _schedule(env: Mapping[str, str]) -> tuple[int, ...]:
    raw = env.get("RELAY_WEBHOOK_SCHEDULE", DEFAULTS["RELAY_WEBHOOK_SCHEDULE"])
    try:
        values = tuple(int(v) for v in raw.split(","))
    except ValueError:
        raise ConfigError(f"RELAY_WEBHOOK_SCHEDULE must be comma-separated seconds, got {raw!r}") from None
    if not values or any(v < 0 for v in values):
        raise ConfigError(f"RELAY_WEBHOOK_SCHEDULE must list at least one non-negative number, got {raw!r}")
    return values


def normalize_database_url(url: str, name: str = "DATABASE_URL") -> str:
    """Return a SQLAlchemy URL for psycopg2; Heroku's ``postgres://`` is accepted.

    Raises ConfigError naming ``name`` (the variable the URL came from) for another scheme,
    or for a URL that does not parse (a port that is not a number, a broken IPv6 host).
    """
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            normalized = "postgresql+psycopg2://" + url[len(prefix) :]
            try:
                make_url(normalized).port  # noqa: B018 - parsing is the check
            except ValueError as exc:
                raise ConfigError(f"{name} is not a valid URL: {exc}") from None
            return normalized
    raise ConfigError(f"{name} must be a postgres:// or postgresql:// URL, got scheme of {url.split(':', 1)[0]!r}")


def _int(env: Mapping[str, str], name: str, minimum: int = 1, maximum: int | None = None) -> int:
    raw = env.get(name, DEFAULTS.get(name, ""))
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


# Retention's bounds: what a date can hold past a partition's end (PostgreSQL's and
# Python's dates end at year 9999), and PostgreSQL's largest lock_timeout in ms.
_MAX_DAYS = 36500
_MAX_LOCK_TIMEOUT_MS = 2147483647


def seconds(env: Mapping[str, str], name: str) -> float:
    """A positive number of seconds from ``env[name]`` (default from DEFAULTS); ConfigError naming it."""
    return _positive(env, name, "seconds")


def _blocking_seconds(env: Mapping[str, str]) -> float:
    """``RELAY_A2A_BLOCKING_SECONDS``: 0 (a blocking send answers at once) to 300; ConfigError naming it."""
    raw = env.get("RELAY_A2A_BLOCKING_SECONDS", "") or DEFAULTS["RELAY_A2A_BLOCKING_SECONDS"]
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"RELAY_A2A_BLOCKING_SECONDS must be a number of seconds, got {raw!r}") from None
    if not 0 <= value <= 300:
        raise ConfigError(f"RELAY_A2A_BLOCKING_SECONDS must be 0-300 seconds, got {raw!r}")
    return value


def _positive(env: Mapping[str, str], name: str, unit: str, at_most: float | None = None) -> float:
    raw = env.get(name, "") or DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of {unit}, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a positive number of {unit}, got {raw!r}")
    if at_most is not None and value > at_most:
        raise ConfigError(f"{name} must be at most {at_most:g} {unit}, got {raw!r}")
    return value


def _rate(env: Mapping[str, str], name: str) -> str:
    from limits import parse_many

    raw = env.get(name, DEFAULTS[name])
    try:
        parse_many(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a rate such as '60/minute', got {raw!r}") from None
    return raw


@dataclass(frozen=True)
class Settings:
    """The effective configuration; build it with :func:`load_settings`."""

    database_url: str
    redis_url: str
    secret_key: str
    env: str
    rate_limit: str
    rest_rate_limit: str
    max_body_bytes: int
    feed_budget_bytes: int
    search_config: str
    idempotency_ttl_seconds: int
    webhook_timeout: int = 10
    webhook_schedule: tuple[int, ...] = (0, 5, 300, 1800, 7200, 18000, 36000, 36000)
    webhook_disable_after: int = 5 * 24 * 3600
    webhook_allow_private: bool = False
    webhook_allow_http: bool = False
    webhook_endpoint_concurrency: int = 4
    webhook_org_concurrency: int = 32
    webhook_max_in_flight: int = 64
    webhook_circuit_failures: int = 5
    webhook_circuit_open: int = 30
    webhook_slow_ms: int = 2000
    webhook_max_payload_bytes: int = 256 * 1024
    log_level: str = "INFO"
    metrics_token: str = ""
    public_url: str = ""
    auth_failure_limit: str = "60/minute"
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    client_idle_timeout: float = 30.0
    forwarded_allow_ips: tuple[str, ...] = ("127.0.0.1",)
    # Concurrent long-polls and streams per agent, and the seconds between a stream's
    # heartbeats (also a waiter's re-check and re-authentication:
    # docs/decisions.md, "Waking agents").
    streams_per_agent: int = 10
    stream_heartbeat: float = 15.0
    # How long a blocking A2A SendMessage waits for its task to end or be interrupted before
    # answering the task as it stands: under a2a-sdk's default 5 s read timeout (docs/a2a.md).
    a2a_blocking_seconds: float = 4.0
    # Each worker's pump writes its heartbeat every worker_heartbeat seconds; a worker
    # silent for worker_stale seconds is dead and its claimed deliveries are sent again
    # (docs/decisions.md, "Surviving the relay's own servers failing").
    worker_heartbeat: float = 1.0
    worker_stale: float = 5.0
    # PostgreSQL connections each process keeps open, and may open beyond them for a burst;
    # a request waits at most db_pool_timeout seconds for one, then answers 503 with
    # Retry-After. Small by default (docs/decisions.md, "Scale-out"): the Procfile's web (WEB_CONCURRENCY=2),
    # worker and beat must fit a 20-connection database; a gevent worker's requests each
    # hold a connection only between checkout and teardown, and waiters hold none.
    # 5 + 0 rather than 4 + 1: the same 5 a process, but kept open; at 4 + 1 message/send
    # ran at 0.83x of 5 + 0 (python -m bench modes, 2026-12-03; docs/decisions.md).
    db_pool_size: int = 5
    db_max_overflow: int = 0
    db_pool_timeout: float = 5.0
    # The pooler's URL (Heroku's DATABASE_CONNECTION_POOL_URL) when set: web, worker and
    # beat reach PostgreSQL through it; migrations use database_url, the direct one.
    database_pool_url: str = ""
    # PREPARE the hot statements once per connection. Off behind a transaction-mode pooler,
    # where a client connection meets a different server session each transaction.
    db_prepare: bool = True
    # The operator console (relay/transport/console): how long a sign-in lasts, and the
    # sign-in attempts allowed per email and per client address.
    console_session_hours: float = 12.0
    console_login_limit: str = "10/minute"
    console_login_address_limit: str = "30/minute"
    # Retention (relay/services/retention.py), in whole days: the time partitions of the
    # delivery log (deliveries and attempts) and of the outbox events are dropped once
    # every row they can hold is older than this; idempotency records once expired.
    # retain_closed_threads_days 0 keeps the ledger (threads, messages, audit) forever;
    # N > 0 deletes completed and cancelled threads closed more than N days ago.
    # retention_lock_timeout_ms bounds the wait for a partition's lock: a busy
    # partition is skipped until the next pass, so traffic never queues behind a drop.
    retain_deliveries_days: int = 30
    retain_events_days: int = 30
    retain_audit_days: int = 365  # the operators' audit log (docs/console.md)
    retain_closed_threads_days: int = 0
    retention_lock_timeout_ms: int = 500
    # Agent-card signing (relay/services/signing.py): whole days a retired signing key stays
    # in /.well-known/jwks.json, so a card signed before a rotation still verifies. 0 drops
    # it at once (a compromised key).
    signing_key_grace_days: int = 7

    @property
    def app_database_url(self) -> str:
        """The URL the app's processes connect to: the pooler's when set, else the direct one."""
        return self.database_pool_url or self.database_url

    @property
    def connections_per_process(self) -> int:
        """The most PostgreSQL connections one process's pool opens: pool size plus overflow."""
        return self.db_pool_size + self.db_max_overflow

    def _connect_args(self) -> dict:
        if "connect_timeout=" in self.app_database_url.partition("?")[2]:
            return {}
        return {"connect_timeout": max(2, math.ceil(self.db_pool_timeout))}

    def flask_config(self) -> dict:
        """Return the Flask/extension config keys derived from these settings."""
        return {
            "SECRET_KEY": self.secret_key,
            "SQLALCHEMY_DATABASE_URI": self.app_database_url,
            # No pool_pre_ping: relay.extensions pings on checkout itself, reading the key
            # generation in the same round trip.
            "SQLALCHEMY_ENGINE_OPTIONS": {
                "pool_size": self.db_pool_size,
                "max_overflow": self.db_max_overflow,
                "pool_timeout": self.db_pool_timeout,
                # A new connection waits no longer than a pooled one would: a server or pooler
                # that accepts TCP but never answers (a frozen PgBouncer) is then a 503, not a
                # request thread blocked for good. libpq counts whole seconds, at least 2.
                # A connect_timeout in the URL's query wins.
                "connect_args": self._connect_args(),
                # An error's text never carries the statement's parameters (message bodies),
                # wherever it is logged or shown.
                "hide_parameters": True,
            },
            "SQLALCHEMY_TRACK_MODIFICATIONS": False,
            "RATELIMIT_STORAGE_URI": self.redis_url,
            "RATELIMIT_STRATEGY": "sliding-window-counter",
            # Fail open: an unreachable Redis must not take the API down (DESIGN, rate limit).
            "RATELIMIT_SWALLOW_ERRORS": True,
            "RATELIMIT_STORAGE_OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
            "RATELIMIT_HEADERS_ENABLED": False,
            "RELAY": self,
        }


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; raise :class:`ConfigError` naming the bad variable."""
    env = os.environ if env is None else env
    relay_env = env.get("RELAY_ENV", DEFAULTS["RELAY_ENV"])
    if relay_env not in ("development", "production", "test"):
        raise ConfigError(f"RELAY_ENV must be development, production or test, got {relay_env!r}")
    db = env.get("DATABASE_URL")
    if not db:
        raise ConfigError("DATABASE_URL is not set (run `relay up` for an embedded PostgreSQL)")
    redis_url = env.get("REDIS_URL")
    if not redis_url:
        raise ConfigError("REDIS_URL is not set (run `relay up` for an embedded Redis)")
    if not redis_url.startswith(("redis://", "rediss://")):
        raise ConfigError(
            f"REDIS_URL must be a redis:// or rediss:// URL, got scheme of {redis_url.split(':', 1)[0]!r}"
        )
    search_config = env.get("RELAY_SEARCH_CONFIG", DEFAULTS["RELAY_SEARCH_CONFIG"])
    if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?", search_config):
        raise ConfigError(
            f"RELAY_SEARCH_CONFIG must name a text-search configuration such as english, got {search_config!r}"
        )
    pool_url = env.get("DATABASE_CONNECTION_POOL_URL", "").strip()
    secret = env.get("RELAY_SECRET_KEY", "")
    if not secret:
        if relay_env == "production":
            raise ConfigError("RELAY_SECRET_KEY is required when RELAY_ENV=production")
        secret = DEV_SECRET_KEY
    beat, stale = seconds(env, "RELAY_WORKER_HEARTBEAT"), seconds(env, "RELAY_WORKER_STALE")
    if stale < 2 * beat:
        # A worker one late heartbeat behind would be called dead and its attempts sent twice.
        raise ConfigError(
            f"RELAY_WORKER_STALE must be at least twice RELAY_WORKER_HEARTBEAT ({beat:g} s), got {stale:g}"
        )
    return Settings(
        database_url=normalize_database_url(db),
        redis_url=redis_url,
        secret_key=secret,
        env=relay_env,
        rate_limit=_rate(env, "RELAY_RATE_LIMIT"),
        rest_rate_limit=_rate(env, "RELAY_REST_RATE_LIMIT"),
        auth_failure_limit=_rate(env, "RELAY_AUTH_FAILURE_LIMIT"),
        header_timeout=seconds(env, "RELAY_HEADER_TIMEOUT"),
        body_timeout=seconds(env, "RELAY_BODY_TIMEOUT"),
        client_idle_timeout=seconds(env, "RELAY_CLIENT_IDLE_TIMEOUT"),
        forwarded_allow_ips=tuple(
            ip.strip() for ip in env.get("FORWARDED_ALLOW_IPS", "127.0.0.1").split(",") if ip.strip()
        ),
        max_body_bytes=_int(env, "RELAY_MAX_BODY_BYTES", 1024),
        feed_budget_bytes=_int(env, "RELAY_FEED_BUDGET_BYTES", 1024),
        search_config=search_config,
        idempotency_ttl_seconds=_int(env, "RELAY_IDEMPOTENCY_TTL_SECONDS", 1, _MAX_DAYS * 86400),
        webhook_timeout=_int(env, "RELAY_WEBHOOK_TIMEOUT", 1),
        webhook_schedule=_schedule(env),
        webhook_disable_after=_int(env, "RELAY_WEBHOOK_DISABLE_AFTER", 1),
        webhook_allow_private=_flag(env, "RELAY_WEBHOOK_ALLOW_PRIVATE"),
        webhook_allow_http=_flag(env, "RELAY_WEBHOOK_ALLOW_HTTP"),
        webhook_endpoint_concurrency=_int(env, "RELAY_WEBHOOK_ENDPOINT_CONCURRENCY", 1),
        webhook_org_concurrency=_int(env, "RELAY_WEBHOOK_ORG_CONCURRENCY", 2),
        webhook_max_in_flight=_int(env, "RELAY_WEBHOOK_MAX_IN_FLIGHT", 1),
        webhook_circuit_failures=_int(env, "RELAY_WEBHOOK_CIRCUIT_FAILURES", 1),
        webhook_circuit_open=_int(env, "RELAY_WEBHOOK_CIRCUIT_OPEN", 1),
        webhook_slow_ms=_int(env, "RELAY_WEBHOOK_SLOW_MS", 1),
        webhook_max_payload_bytes=_int(env, "RELAY_WEBHOOK_MAX_PAYLOAD_BYTES", 4096),
        streams_per_agent=_int(env, "RELAY_STREAMS_PER_AGENT", 1),
        db_pool_size=_int(env, "RELAY_DB_POOL_SIZE", 1),
        db_max_overflow=_int(env, "RELAY_DB_MAX_OVERFLOW", 0),
        db_pool_timeout=seconds(env, "RELAY_DB_POOL_TIMEOUT"),
        database_pool_url=normalize_database_url(pool_url, "DATABASE_CONNECTION_POOL_URL") if pool_url else "",
        db_prepare=_prepare(env, pooled=bool(pool_url)),
        stream_heartbeat=seconds(env, "RELAY_STREAM_HEARTBEAT"),
        a2a_blocking_seconds=_blocking_seconds(env),
        worker_heartbeat=beat,
        worker_stale=stale,
        log_level=_log_level(env),
        metrics_token=env.get("RELAY_METRICS_TOKEN", ""),
        public_url=_public_url(env),
        console_session_hours=_hours(env, "RELAY_CONSOLE_SESSION_HOURS"),
        console_login_limit=_rate(env, "RELAY_CONSOLE_LOGIN_LIMIT"),
        console_login_address_limit=_rate(env, "RELAY_CONSOLE_LOGIN_ADDRESS_LIMIT"),
        retain_deliveries_days=_int(env, "RELAY_RETAIN_DELIVERIES_DAYS", 1, _MAX_DAYS),
        retain_events_days=_int(env, "RELAY_RETAIN_EVENTS_DAYS", 1, _MAX_DAYS),
        retain_audit_days=_int(env, "RELAY_RETAIN_AUDIT_DAYS", 1, _MAX_DAYS),
        retain_closed_threads_days=_int(env, "RELAY_RETAIN_CLOSED_THREADS_DAYS", 0, _MAX_DAYS),
        retention_lock_timeout_ms=_int(env, "RELAY_RETENTION_LOCK_TIMEOUT_MS", 1, _MAX_LOCK_TIMEOUT_MS),
        signing_key_grace_days=_int(env, "RELAY_SIGNING_KEY_GRACE_DAYS", 0, _MAX_DAYS),
    )


def _prepare(env: Mapping[str, str], *, pooled: bool) -> bool:
    """RELAY_DB_PREPARE: ``auto`` (on, but off when DATABASE_CONNECTION_POOL_URL is set), ``1`` or ``0``.

    PgBouncer 1.18 in transaction mode (Heroku's pooling) hands each transaction any server
    session, so a statement PREPAREd in one is missing in the next (docs/decisions.md).
    """
    raw = env.get("RELAY_DB_PREPARE", DEFAULTS["RELAY_DB_PREPARE"]).strip().lower()
    if raw == "auto":
        return not pooled
    if raw in ("1", "0"):
        return raw == "1"
    raise ConfigError(f"RELAY_DB_PREPARE must be auto, 1 or 0, got {raw!r}")


def _hours(env: Mapping[str, str], name: str) -> float:
    return _positive(env, name, "hours", at_most=24 * 366)


def _public_url(env: Mapping[str, str]) -> str:
    raw = env.get("RELAY_PUBLIC_URL", "").strip().rstrip("/")
    if raw and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", raw):
        raise ConfigError(f"RELAY_PUBLIC_URL must be an http(s) URL such as https://relay.example.com, got {raw!r}")
    return raw


@dataclass(frozen=True)
class Budget:
    """PostgreSQL connections a deploy's processes may hold at most, by process type.

    ``processes`` maps a Procfile process type to ``(processes, connections each)``: web
    runs ``WEB_CONCURRENCY`` gunicorn workers a dyno, each with its own pool; the Celery
    worker is one process (threads pool) sharing one pool; beat only enqueues (no
    connection). Each pool opens at most ``RELAY_DB_POOL_SIZE + RELAY_DB_MAX_OVERFLOW``.
    """

    processes: dict[str, tuple[int, int]]

    @property
    def total(self) -> int:
        """Connections in all: the sum of processes times connections each."""
        return sum(n * each for n, each in self.processes.values())

    def lines(self) -> list[str]:
        """The formula, one line a process type and one for the total."""
        out = [f"{name:<7} {n} x {each} = {n * each}" for name, (n, each) in self.processes.items()]
        return out + [f"total   {self.total} connections"]


#: gunicorn.conf.py's whole-number settings and their defaults: read there, checked by
#: ``relay config check`` and ``relay up`` too, so a bad one is one line before anything starts.
# The integers gunicorn.conf.py and the Procfile read, with their defaults; relay config
# check and relay up refuse a bad one before anything starts.
PROCESS_INTEGERS = {
    "PORT": "8000",
    "WEB_CONCURRENCY": "2",
    "WEB_CONNECTIONS": "10000",
    "GUNICORN_TIMEOUT": "30",
    "GUNICORN_GRACEFUL_TIMEOUT": "20",
    "GUNICORN_KEEPALIVE": "75",
    "CELERY_CONCURRENCY": "8",  # the Procfile's worker: --concurrency
}
# Beyond these a value is a typo, not a sizing (each web or worker process holds its own pool).
_MAXIMA = {
    "PORT": 65535,
    "WEB_CONCURRENCY": 256,
    "WEB_CONNECTIONS": 100000,
    "GUNICORN_TIMEOUT": 86400,
    "GUNICORN_GRACEFUL_TIMEOUT": 86400,
    "GUNICORN_KEEPALIVE": 86400,
    "CELERY_CONCURRENCY": 1000,
}
_HOSTNAME_RE = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")


def process_integer(env: Mapping[str, str], name: str) -> int:
    """``env[name]`` (else its :data:`PROCESS_INTEGERS` default) as a positive integer.

    Raises ConfigError naming ``name`` when it is not one (PORT: also above 65535).
    """
    raw = env.get(name) or PROCESS_INTEGERS[name]
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    if int(raw) > _MAXIMA.get(name, int(raw)):
        raise ConfigError(f"{name} must be at most {_MAXIMA[name]}, got {raw!r}")
    return int(raw)


def web_host(env: Mapping[str, str]) -> str:
    """``HOST``, the address gunicorn binds (default 0.0.0.0): an IP address or a host name.

    Raises ConfigError naming HOST otherwise.
    """
    import ipaddress

    raw = env.get("HOST") or "0.0.0.0"
    try:
        ipaddress.ip_address(raw)
        return raw
    except ValueError:
        pass
    # All digits and dots is a mistyped IPv4 address (999.1.1.1), not a host name.
    if len(raw) > 253 or not _HOSTNAME_RE.fullmatch(raw) or re.fullmatch(r"[\d.]+", raw):
        raise ConfigError(f"HOST must be an IP address or a host name such as 127.0.0.1, got {raw!r}")
    return raw


def connection_budget(
    settings: Settings, env: Mapping[str, str], *, web_dynos: int = 1, worker_dynos: int = 1
) -> Budget:
    """The :class:`Budget` of ``web_dynos`` web and ``worker_dynos`` worker dynos (and one beat).

    Raises ConfigError naming WEB_CONCURRENCY when it is not a positive integer.
    """
    web = process_integer(env, "WEB_CONCURRENCY")
    each = settings.connections_per_process
    return Budget({"web": (web_dynos * web, each), "worker": (worker_dynos, each), "beat": (1, 0)})
