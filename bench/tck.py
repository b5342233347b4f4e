"""``python -m bench tck --kit PATH``: run A2A's own compatibility kit (a2a-tck) against a live relay.

What it starts:

- a relay (gunicorn and a Celery worker, as the Procfile runs them) on a fresh database of
  ``DATABASE_URL``'s server and a claimed Redis db of ``REDIS_URL``'s; with ``DATABASE_URL``
  unset, on embedded PostgreSQL and Redis (``relay up``'s) under a temporary folder;
- two agents, ``tck-caller@tck.example`` (the kit's client) and ``tck-target@tck.example``
  (the agent under test);
- a **responder**: a thread that works the target's inbox through ``relay.client`` (the
  feed's long-poll) and answers each message by its A2A ``messageId`` prefix, as the kit's
  ``scenarios/*.feature`` say (complete, artifacts, input-required, reject, stream
  working -> artifact -> completed, a long task for resubscription);
- a loopback **reverse proxy** in front of the relay that adds ``Authorization: Bearer
  <caller key>`` to every request and keeps the ``Host`` header, so the card's URLs point
  back through it: the kit's clients send no credentials, and act as the caller agent.

The kit runs as published (``run_tck.py --sut-host <proxy>/a2a/agents/tck-target@tck.example
--transport jsonrpc``, then ``http_json``) with the kit's own interpreter (``--python``,
default ``KIT/.venv/bin/python``); its ``reports/`` are moved to ``RESULTS/<transport>/``.
docs/a2a.md ("A2A TCK") has the last run's table.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from bench.harness import base_env, celery_worker, claimed_redis_db, create_agents, fresh_database, gunicorn

CALLER = "tck-caller@tck.example"
TARGET = "tck-target@tck.example"
TRANSPORTS = ("jsonrpc", "http_json")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


# --------------------------------------------------------------------------- the proxy


class _Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int]
    key: str

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Authorization"] = f"Bearer {self.key}"
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            self.send_response_only(resp.status, resp.reason)
            for name, value in resp.getheaders():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            streaming = (resp.getheader("Content-Type") or "").startswith("text/event-stream")
            if streaming or resp.getheader("Content-Length") is None:
                # Relayed as it comes (SSE), closed at its end.
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                while chunk := resp.read1(65536):
                    self.wfile.write(chunk)
                    self.wfile.flush()
            else:
                data = resp.read()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            conn.close()

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _forward

    def log_message(self, *args) -> None:  # quiet: the kit's reports say what happened
        pass


@contextmanager
def auth_proxy(upstream: str, key: str):
    """Serve a loopback proxy to ``upstream`` that adds ``key`` as the bearer; yield its base URL."""
    parts = urlsplit(upstream)
    handler = type("Proxy", (_Proxy,), {"upstream": (parts.hostname, parts.port), "key": key})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- the responder

# The kit's messageId prefixes (scenarios/*.feature), longest first so that
# "artifact-file-url" is not taken for "artifact-file".
LONG_TASK_SECONDS = 20.0  # "wait for 2x streaming timeout": the kit's stream timeout is 10 s


def _behaviour(message_id: str) -> str:
    for prefix in (
        "tck-stream-artifact-chunked",
        "tck-stream-artifact-text",
        "tck-stream-artifact-file",
        "tck-stream-ordering",
        "tck-stream-",
        "tck-artifact-file-url",
        "tck-artifact-file",
        "tck-artifact-text",
        "tck-artifact-data",
        "tck-message-response",
        "tck-input-required",
        "tck-reject-task",
        "tck-complete-task",
        "test-resubscribe-message-id",
    ):
        if message_id.startswith(prefix):
            return prefix.removeprefix("tck-").rstrip("-")
    return "complete-task"


# What each behaviour leaves in the task besides its state: (reply text, artifacts, result summary).
# A file is a link artifact (A2A: a url part with filename and mediaType); the relay carries
# no text or free-form data artifacts, so those scenarios reply with text instead.
_LINK = {"type": "link", "url": "https://example.com/output.txt", "title": "output.txt", "mediaType": "text/plain"}
WORK = {
    "complete-task": (None, [], "Hello from TCK"),
    "artifact-text": ("Generated text content", [], "Generated text content"),
    "artifact-file": ("output.txt", [_LINK], "Generated a file"),
    "artifact-file-url": ("output.txt", [_LINK], "Generated a file url"),
    "artifact-data": ("data", [], "Generated data"),
    "message-response": (None, [], "Direct message response"),
    "stream": ("Stream hello from TCK", [_LINK], "Stream done"),
    "stream-ordering": ("Ordered output", [], "Ordered done"),
    "stream-artifact-text": ("Streamed text content", [], "Streamed done"),
    "stream-artifact-file": ("output.txt", [_LINK], "Streamed file done"),
    "stream-artifact-chunked": ("chunk-1 chunk-2", [], "Chunked done"),
    "test-resubscribe-message-id": (None, [], "Long task done"),
}


class Responder:
    """Works ``client``'s inbox (the target agent's): each caller message by its messageId prefix."""

    def __init__(self, client, log):
        self.client = client
        self.log = log
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, name="tck-responder", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=70)

    def _run(self) -> None:
        after = None
        while not self.stop.is_set():
            try:
                rows = self.client.wait(after=after, timeout=5, direction="inbound", role="caller")
            except Exception as exc:  # noqa: BLE001  (logged; the loop carries on)
                self.errors.append(f"wait: {exc!r}")
                time.sleep(0.5)
                continue
            for row in rows:
                after = row.id
                threading.Thread(target=self._answer, args=(row,), daemon=True).start()

    def _answer(self, row) -> None:
        try:
            task = self.client.get(row.task_id)
            message = next((m for m in task.messages if m.id == row.id), None)
            message_id = (message.raw.get("a2a_message_id") if message else None) or ""
            self._work(task, _behaviour(message_id))
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"{row.task_id}: {exc!r}")
            self.log(f"responder: {row.task_id}: {exc!r}")

    def _work(self, task, behaviour: str) -> None:
        c = self.client
        tid = task.task_id
        if task.state in ("completed", "cancelled", "declined", "failed", "expired"):
            return
        if behaviour == "reject-task":
            if task.state == "pending":
                c.decline(tid, "rejected")
            else:
                c.fail(tid, "rejected")
            return
        if task.state == "pending":
            c.accept(tid)
        if behaviour == "input-required":
            self._request_input(tid)
            return
        text, artifacts, summary = WORK.get(behaviour, WORK["complete-task"])
        if text or artifacts:
            c.reply(tid, text or "see the artifacts", artifacts=artifacts)
        if behaviour == "test-resubscribe-message-id":
            self.stop.wait(LONG_TASK_SECONDS)
        c.complete(tid, summary)

    def _request_input(self, tid: str) -> None:
        # The relay's input_required state: asked for through ``POST /a2a``'s
        # request_input transition; a relay without it leaves the task accepted (WORKING).
        try:
            self.client._transition(  # noqa: SLF001  (no public wrapper for this transition yet)
                tid,
                "input_required",
                "tasks/update",
                {"task_id": tid, "transition": "request_input", "question": "More input, please"},
            )
        except Exception as exc:  # noqa: BLE001
            self.log(f"responder: request_input not available ({exc.__class__.__name__}); task stays WORKING")


# --------------------------------------------------------------------------- the run


@contextmanager
def _servers():
    """Yield (DATABASE_URL, REDIS_URL) of the servers to use: the environment's, else embedded ones."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"], os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        return
    from relay.ops import embedded

    home = Path(tempfile.mkdtemp(prefix="relay-tck-"))
    pg, pg_url = embedded.start_postgres(home)
    redis_client, redis_url = embedded.start_redis(home)
    try:
        yield pg_url, redis_url
    finally:
        embedded.stop_redis(redis_client)
        pg.cleanup()
        shutil.rmtree(home, ignore_errors=True)


def _summary(report: dict, transport: str) -> dict:
    """The kit's summary, and per level (MUST, SHOULD, MAY) how many requirements passed, failed
    and were skipped on ``transport`` (the card's own requirements, checked once, included)."""
    counts: dict[str, dict[str, int]] = {}
    failed: list[str] = []
    for rid, entry in (report.get("per_requirement") or {}).items():
        transports = entry.get("transports") or {}
        status = transports.get(transport) or transports.get("agent_card")
        if status is None:
            continue
        level = counts.setdefault(entry.get("level", "?"), {"PASS": 0, "FAIL": 0, "SKIP": 0})
        level[status] = level.get(status, 0) + 1
        if status == "FAIL":
            failed.append(f"{entry.get('level')} {rid}")
    return {**report.get("summary", {}), "levels": counts, "failed": sorted(failed)}


def tck(kit: Path, results: Path, transports: list[str], python: str | None, extra: list[str]) -> dict:
    """Run the kit against a fresh relay for each transport; return {transport: {exit, report}}."""
    kit = kit.resolve()
    results.mkdir(parents=True, exist_ok=True)
    if not (kit / "run_tck.py").is_file():
        raise SystemExit(f"error: {kit} holds no run_tck.py (give --kit the a2a-tck checkout)")
    python = python or str(kit / ".venv" / "bin" / "python")
    if not Path(python).exists():
        raise SystemExit(f"error: no interpreter at {python}; make the kit's venv or pass --python")
    commit = subprocess.run(["git", "-C", str(kit), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "kit": str(kit),
        "kit_commit": commit,
        "transports": {},
    }
    with ExitStack() as stack:
        database, redis_url = stack.enter_context(_servers())
        os.environ["DATABASE_URL"], os.environ["REDIS_URL"] = database, redis_url
        db = stack.enter_context(fresh_database("relay_tck"))
        broker = stack.enter_context(claimed_redis_db(redis_url))
        env = base_env(db, {"REDIS_URL": broker, **{k: v for k, v in os.environ.items() if k.startswith("RELAY_A2A")}})
        keys = create_agents(env, [CALLER, TARGET])
        web, relay_url = gunicorn("app:app", env, workers=2)
        stack.callback(web.stop)
        worker = celery_worker(env)
        stack.callback(worker.stop)
        proxy = stack.enter_context(auth_proxy(relay_url, keys[CALLER]))
        from relay.agent.client import RelayClient

        client = stack.enter_context(RelayClient(relay_url, keys[TARGET], timeout=30))
        responder = Responder(client, lambda line: print(line, file=sys.stderr))
        responder.start()
        stack.callback(responder.close)
        sut = f"{proxy}/a2a/agents/{TARGET}"
        for transport in transports:
            reports = kit / "reports"
            shutil.rmtree(reports, ignore_errors=True)
            command = [python, "run_tck.py", "--sut-host", sut, "--transport", transport, *extra]
            print("$", " ".join(command), flush=True)
            started = time.monotonic()
            proc = subprocess.run(command, cwd=kit)
            folder = results / transport
            shutil.rmtree(folder, ignore_errors=True)
            if reports.is_dir():
                shutil.move(str(reports), str(folder))
            report_file = folder / "compatibility.json"
            report = json.loads(report_file.read_text()) if report_file.is_file() else {}
            out["transports"][transport] = {
                "exit": proc.returncode,
                "seconds": round(time.monotonic() - started, 1),
                "command": " ".join(
                    ["run_tck.py", "--sut-host", "<proxy>/a2a/agents/" + TARGET, "--transport", transport]
                ),
                "summary": _summary(report, transport),
            }
        out["responder_errors"] = responder.errors[:50]
    return out


def print_tck(results: dict) -> None:
    print(f"a2a-tck {results['kit_commit']}")
    for transport, run in results["transports"].items():
        summary = run["summary"]
        print(f"{transport}: exit {run['exit']} in {run['seconds']} s; MUST {summary.get('must_compatibility')}")
        for level, counts in sorted(summary.get("levels", {}).items()):
            print(f"  {level}: {counts}")
        for line in summary.get("failed", []):
            print(f"  failed: {line}")
    for line in results.get("responder_errors") or []:
        print("responder:", line)
