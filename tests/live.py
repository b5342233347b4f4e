"""A live relay for end-to-end tests: the Procfile's ``web`` and ``worker`` lines as subprocesses.

The stack serves the test session's database (``base_env``) on a free loopback port.
Its worker consumes the default queue of a Redis database of its own, which the
in-process test app never uses, and no beat runs, so a live stack never touches events
written by the in-process tests. Use it module-scoped:

    @pytest.fixture(scope="module")
    def relay_url(base_env):
        with live_relay(base_env) as url:
            yield url
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from honcho.environ import parse_procfile

from relay.ops.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROCFILE = parse_procfile((ROOT / "Procfile").read_text()).processes


class LiveStack:
    """Processes started from Procfile lines, each in its own process group, logs kept."""

    def __init__(self, env: dict, logdir: Path):
        self.env = env
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.base = f"http://127.0.0.1:{env['PORT']}"

    def start(self, name: str) -> subprocess.Popen:
        log = self.logdir / f"{name}-{len(self.procs)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", f"exec {PROCFILE[name]}"],
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append((name, proc, log))
        return proc

    def log(self, name: str) -> str:
        return "".join(path.read_text(errors="replace") for n, _, path in self.procs if n == name)

    def wait_healthy(self, timeout: float = 60) -> None:
        web = [p for n, p, _ in self.procs if n == "web"][-1]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if web.poll() is not None:
                raise AssertionError(f"gunicorn exited:\n{self.log('web')[-3000:]}")
            try:
                if requests.get(f"{self.base}/healthz", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise AssertionError(f"no /healthz on {self.base} within {timeout} s:\n{self.log('web')[-3000:]}")

    def stop_all(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:  # whatever is left of the group (pool children of a worker)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def _private_redis_db(url: str) -> str:
    # A Redis database of its own (8-15) per stack: its worker then never takes another
    # stack's tasks (the default queue is per database), even with two test sessions on
    # one Redis server.
    base, _, tail = url.rpartition("/")
    db = 8 + secrets.randbelow(8)
    return f"{base}/{db}" if tail.isdigit() else f"{url.rstrip('/')}/{db}"


@contextmanager
def live_relay(base_env: dict, *, worker: bool = True, **extra: str) -> Iterator[str]:
    """Run gunicorn (and a Celery worker) on ``base_env``'s servers; yield the base URL."""
    env = {
        **base_env,
        "HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "WEB_CONCURRENCY": "2",
        "CELERY_CONCURRENCY": "2",
        "PATH": f"{BIN}{os.pathsep}{base_env.get('PATH', '')}",
        "REDIS_URL": _private_redis_db(base_env["REDIS_URL"]),
        **extra,
    }
    with tempfile.TemporaryDirectory(prefix="relay-live-") as logdir:
        env.setdefault("RELAY_HOME", logdir)
        stack = LiveStack(env, Path(logdir))
        try:
            stack.start("web")
            if worker:
                stack.start("worker")
            stack.wait_healthy()
            yield stack.base
        finally:
            stack.stop_all()
