"""A private PgBouncer in transaction mode, for the tests' pooled run and ``python -m bench nodes``.

Debian's ``pgbouncer`` package (1.18: no protocol-level prepared statements) in the
mode Heroku's connection pooling and most managed poolers run. Any database of the
server is reachable through it by name (a ``*`` fallback entry), with trust
authentication: it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import psycopg2
from sqlalchemy.engine import make_url

from relay.config import normalize_database_url
from relay.ops.embedded import free_port


class PoolerError(RuntimeError):
    """PgBouncer is not installed, or did not start; the message says which, with its log."""


def _run_as() -> str | None:
    """The user to run as when we are root (PgBouncer refuses to run as root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PoolerError("running as root and there is no postgres or nobody user for PgBouncer to run as")


class Pooler:
    """One running PgBouncer: :meth:`url` turns a direct database URL into the pooled one."""

    def __init__(
        self, server_url: str, *, pool_size: int = 20, max_client_conn: int = 2000, query_wait_timeout: int = 10
    ):
        """Start PgBouncer for ``server_url``'s server (TCP host and port), waiting until it answers.

        ``pool_size`` is its ``default_pool_size``: server connections per database and user.
        ``query_wait_timeout`` (seconds) is how long a query may wait for a server connection
        before PgBouncer fails it (120 s by default there, longer than any client waits).
        Raises PoolerError when the binary is missing or it does not answer within 10 s.
        """
        binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
        if binary is None:
            raise PoolerError("pgbouncer is not installed (apt-get install pgbouncer)")
        server = make_url(normalize_database_url(server_url))
        if not server.host:
            raise PoolerError("the pooler needs a TCP server URL (host and port), not a socket one")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="relay-pgbouncer-"))
        user = server.username or "postgres"
        (self.dir / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={server.host} port={server.port or 5432}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'userlist.txt'}",
                    "pool_mode = transaction",
                    # After a failed server login PgBouncer waits this long before the next
                    # (15 s by default): a failover's new primary would sit unused that long.
                    "server_login_retry = 1",
                    f"query_wait_timeout = {query_wait_timeout}",
                    f"default_pool_size = {pool_size}",
                    f"max_client_conn = {max_client_conn}",
                    f"admin_users = {user}",
                    f"logfile = {self.dir / 'pgbouncer.log'}",
                    f"pidfile = {self.dir / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        self.user = user
        argv = [binary]
        run_as = _run_as()
        if run_as is not None:
            os.chmod(self.dir, 0o777)
            for name in ("userlist.txt", "pgbouncer.ini"):
                os.chmod(self.dir / name, 0o644)
            argv += ["-u", run_as]
        # PgBouncer copies every log line to stderr; a pipe nobody reads fills after a few hundred
        # connections and then blocks its single thread for good, so stderr goes to a file too.
        with open(self.dir / "stderr.log", "wb") as stderr:
            self.proc = subprocess.Popen(
                [*argv, str(self.dir / "pgbouncer.ini")],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PoolerError(f"pgbouncer exited with {self.proc.returncode}: {self.log()[-2000:]}")
            try:
                psycopg2.connect(
                    host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer", connect_timeout=1
                ).close()
                return
            except psycopg2.Error as exc:
                last = str(exc).strip()
                time.sleep(0.05)
        self.stop()
        raise PoolerError(f"pgbouncer did not answer within {timeout:g} s ({last}): {self.log()[-2000:]}")

    def log(self) -> str:
        """PgBouncer's log so far: its log file, or what it printed before it opened one."""
        for name in ("pgbouncer.log", "stderr.log"):
            path = self.dir / name
            if path.exists() and (text := path.read_text(errors="replace")):
                return text
        return ""

    def url(self, database_url: str) -> str:
        """``database_url`` (direct) with the pooler's host and port: the same database, pooled."""
        direct = make_url(normalize_database_url(database_url))
        return direct.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def admin(self, command: str) -> list[dict]:
        """Run an admin console ``command`` (``SHOW POOLS``...); return its rows as ``{column: value}``."""
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer")
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(command)
                if not cur.description:
                    return []
                names = [column.name for column in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            conn.close()

    def repoint(self, port: int, databases: Iterable[str], host: str = "127.0.0.1") -> None:
        """Send ``databases`` (and any other, through ``*``) to the server at ``host:port`` (a failover's last step).

        Rewrites the ini's ``[databases]`` and RELOADs: transactions under way finish where
        they are, new ones go to the new server. The databases clients already use are named
        one by one: an entry PgBouncer made from ``*`` keeps its old server across a RELOAD.
        """
        ini = self.dir / "pgbouncer.ini"
        text = ini.read_text().splitlines()
        head, rest = text[: text.index("[databases]") + 1], text[text.index("[pgbouncer]") :]
        entries = [f"{name} = host={host} port={port} dbname={name}" for name in databases]
        ini.write_text("\n".join([*head, *entries, f"* = host={host} port={port}", *rest]) + "\n")
        self.admin("RELOAD")

    def stop(self) -> None:
        """Stop PgBouncer (SIGINT: a safe shutdown) and remove its folder."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGINT)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
