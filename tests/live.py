"""A live relay for end-to-end tests: the Procfile's ``web`` and ``worker`` lines as subprocesses.

The stack serves the test session's database (``base_env``) on a free loopback port.
Its worker consumes the default queue of a Redis database of its own (claimed with
:func:`claimed_redis_db`), which the in-process test app never uses, and no beat runs,
so a live stack never touches events written by the in-process tests. A stack started
with ``worker=False`` while another stack on the same database runs a worker shares
that stack's broker, so the running worker takes its after-commit tasks. Use it
module-scoped:

    @pytest.fixture(scope="module")
    def relay_url(base_env):
        with live_relay(base_env) as url:
            yield url
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis
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

    def start(self, name: str, env: dict | None = None) -> subprocess.Popen:
        """Start the Procfile's ``name`` on the stack's environment (or ``env``, if given)."""
        log = self.logdir / f"{name}-{len(self.procs)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", f"exec {PROCFILE[name]}"],
                env=self.env if env is None else env,
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


CLAIM_KEY = "relay-tests:db-claim"
CLAIM_TTL = 120  # seconds; renewed every CLAIM_TTL / 4 while held, so a killed run's claim lapses soon
CLAIM_DBS = range(8, 16)
# Compare-and-renew and compare-and-delete: only the holder's token touches the claim.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('expire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def _db_url(url: str, number: int) -> str:
    base, _, tail = url.rpartition("/")
    return f"{base}/{number}" if tail.isdigit() else f"{url.rstrip('/')}/{number}"


def _drop_all_but_claim(client: redis.Redis) -> None:
    for key in client.scan_iter(count=500):
        if key != CLAIM_KEY.encode():
            client.delete(key)


def _keep_claimed(url: str, token: str, stop: threading.Event) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        while not stop.wait(CLAIM_TTL / 4):
            try:
                if not client.eval(_RENEW, 1, CLAIM_KEY, token, CLAIM_TTL):
                    return  # lost (the server restarted?): nothing more to renew
            except redis.RedisError:
                pass  # try again next round; the TTL leaves three more
    finally:
        client.close()


CLAIM_WAIT = 180  # seconds to wait for a db while every one is claimed (parallel workers, other runs)


def _claim_one(url: str, dbs: Iterable[int], token: str) -> tuple[int | None, dict[int, str]]:
    """One pass over ``dbs``: the number of the db whose claim we took (None if none), and who holds the others."""
    taken: dict[int, str] = {}
    for number in dbs:
        client = redis.Redis.from_url(_db_url(url, number))
        try:
            if client.set(CLAIM_KEY, token, nx=True, ex=CLAIM_TTL):
                _drop_all_but_claim(client)
                return number, taken
            taken[number] = (client.get(CLAIM_KEY) or b"(released meanwhile)").decode(errors="replace")
        except redis.ResponseError:  # fewer databases configured on this server
            taken[number] = "not configured"
        finally:
            client.close()
    return None, taken


@contextmanager
def claimed_redis_db(url: str, dbs: Iterable[int] = CLAIM_DBS, wait: float = CLAIM_WAIT) -> Iterator[str]:
    """Claim a Redis database number on ``url``'s server for the caller alone; yield its URL.

    The claim is a ``SET NX`` of :data:`CLAIM_KEY` in each of ``dbs`` in turn; the first
    db that takes it is ours. It carries a TTL, renewed while held, so a run killed
    before its release frees the db within :data:`CLAIM_TTL` seconds. A broker db shared
    by two stacks would let one worker take the other's tasks, so with every db claimed
    this waits up to ``wait`` seconds for one to be released (parallel test workers and
    other runs on the same Redis each hold some), then raises rather than share one.
    Whatever is left in the db (a killed run's queues and bindings) is dropped once it is
    ours; everything the caller wrote is dropped on release, then the claim.
    """
    token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"
    dbs = list(dbs)
    deadline = time.monotonic() + wait
    while True:
        number, taken = _claim_one(url, dbs, token)
        if number is not None:
            break
        if time.monotonic() > deadline or all(holder == "not configured" for holder in taken.values()):
            raise RuntimeError(f"no Redis db free to claim on {url} within {wait:g} s; {CLAIM_KEY} held by: {taken}")
        time.sleep(0.5)
    claimed = _db_url(url, number)
    stop = threading.Event()
    renewer = threading.Thread(target=_keep_claimed, args=(claimed, token, stop), daemon=True)
    renewer.start()
    try:
        yield claimed
    finally:
        stop.set()
        renewer.join(timeout=10)
        client = redis.Redis.from_url(claimed)
        try:
            if client.get(CLAIM_KEY) == token.encode():
                _drop_all_but_claim(client)
                client.eval(_RELEASE, 1, CLAIM_KEY, token)
        finally:
            client.close()


class LiveURL(str):
    """A live relay's base URL, carrying its :class:`LiveStack` (``.stack``: its processes' logs)."""

    stack: LiveStack

    def __new__(cls, base: str, stack: LiveStack):
        url = super().__new__(cls, base)
        url.stack = stack
        return url


# Running stacks with a worker, by database URL: a worker-less stack shares its broker.
_WORKERS: dict[str, list[str]] = {}


@contextmanager
def live_relay(base_env: dict, *, worker: bool = True, worker_env: dict | None = None, **extra: str) -> Iterator[str]:
    """Run gunicorn (and a Celery worker) on ``base_env``'s servers; yield the base URL.

    ``worker_env`` overrides variables for the worker alone (say, its application_name).

    With ``worker=False`` the stack's after-commit tasks go to the broker of the newest
    running stack (on the same database) that has a worker, so they are still done;
    without one it claims a broker db of its own, where nothing takes them.
    """
    database = base_env["DATABASE_URL"]
    running = _WORKERS.get(database, [])
    with ExitStack() as cleanup:
        if "REDIS_URL" in extra:
            broker = extra["REDIS_URL"]
        elif not worker and running:
            broker = running[-1]
        else:
            broker = cleanup.enter_context(claimed_redis_db(base_env["REDIS_URL"]))
        env = {
            **base_env,
            "HOST": "127.0.0.1",
            "PORT": str(free_port()),
            "WEB_CONCURRENCY": "2",
            "CELERY_CONCURRENCY": "2",
            # Stopped only once its tests are done: a kept-alive client connection must not
            # hold gunicorn's graceful shutdown (20 s by default, 10 s until the head deadline).
            "GUNICORN_GRACEFUL_TIMEOUT": "2",
            "PATH": f"{BIN}{os.pathsep}{base_env.get('PATH', '')}",
            **extra,
            "REDIS_URL": broker,
        }
        logdir = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="relay-live-"))
        env.setdefault("RELAY_HOME", logdir)
        stack = LiveStack(env, Path(logdir))
        cleanup.callback(stack.stop_all)
        stack.start("web")
        if worker:
            stack.start("worker", {**env, **worker_env} if worker_env else None)
            _WORKERS.setdefault(database, []).append(broker)
            cleanup.callback(_WORKERS[database].remove, broker)
        stack.wait_healthy()
        yield LiveURL(stack.base, stack)


def stop_groups(procs: Iterable[subprocess.Popen]) -> None:
    """SIGTERM the process groups of ``procs`` (each started with ``start_new_session``) all at
    once, so they shut down side by side; SIGKILL any still running 20 s after."""
    procs = list(procs)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 20
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc``'s process group (started with ``start_new_session``), SIGKILL after 20 s."""
    stop_groups([proc])
