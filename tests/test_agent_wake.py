"""Waking an agent with no public URL, from the agent's side: ``RelayClient.wait`` and
``RelayClient.stream``, ``relay-agent wait``, ``watch`` on the stream, ``hook claude-code``
and the MCP tool ``wait_for_messages``.

Everything runs against a live relay (gunicorn and a Celery worker from the Procfile,
real PostgreSQL and Redis) with real threads and subprocesses; faults are real too: an
HTTP proxy on loopback that cuts the open streams' connections, or answers 404 for the
stream like a relay that predates it. No assertion is on time: every wait is bounded and
fails naming what did not come, and "it was waiting at the relay" is read from the
relay's own per-agent slots in Redis, not assumed after a sleep.
"""

from __future__ import annotations

import http.server
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import anyio
import pytest
import redis
import requests

from relay.agent.client import (
    FeedRow,
    RelayClient,
    SSEParser,
    StreamUnavailable,
    Unauthenticated,
)
from tests.conftest import bearer, sql, wait_until
from tests.live import claimed_redis_db, live_relay
from tests.sse import SSE

CALL_TIMEOUT = 60  # seconds: the bound on any one subprocess or wait in this module
CAP = 3  # RELAY_STREAMS_PER_AGENT of this module's relay
BOUND = 90  # seconds: the bound on one MCP conversation
RELAY_MCP = Path(sys.executable).parent / "relay-mcp"


# --------------------------------------------------------------------------- the live relay


@pytest.fixture(scope="module")
def live(base_env):
    """``(base_url, redis_url)``: a relay whose streams beat (and re-authenticate) every second,
    with CAP waits and streams per agent, on a Redis database of its own, where its per-agent
    slots can be counted."""
    with (
        claimed_redis_db(base_env["REDIS_URL"]) as broker,
        live_relay(base_env, RELAY_STREAM_HEARTBEAT="1", RELAY_STREAMS_PER_AGENT=str(CAP), REDIS_URL=broker) as base,
    ):
        yield base, broker


@pytest.fixture(scope="module")
def relay_url(live):
    return live[0]


@pytest.fixture
def agents(make_agent, relay_url, settled):
    """``{"alice": (handle, key), "bob": (handle, key)}``: alice hands work to bob."""
    return {name: make_agent(f"{name}@acme", name=name.title()) for name in ("alice", "bob")}


@pytest.fixture
def clients(agents, relay_url):
    made = {name: RelayClient(relay_url, key, backoff=0.05) for name, (_, key) in agents.items()}
    yield made
    for c in made.values():
        c.close()


def slots_held(app, live, handle: str) -> int:
    """How many waits and streams ``handle`` holds at the relay now (its slots in the relay's Redis)."""
    agent_id = sql(app, "SELECT id FROM agents WHERE handle = :h", h=handle)[0][0]
    client = redis.Redis.from_url(live[1])
    try:
        return client.zcount(f"relay:waits:{uuid.UUID(str(agent_id)).hex}", time.time(), "+inf")
    finally:
        client.close()


def waiting(app, live, handle: str, count: int = 1) -> None:
    """Block until ``handle`` holds ``count`` waits or streams at the relay (fails loudly after 30 s)."""
    wait_until(lambda: slots_held(app, live, handle) == count, timeout=30, what=f"{handle} holding {count} wait(s)")


class Call(threading.Thread):
    """``fn()`` on a thread; ``result()`` joins it within a bound and re-raises what it raised."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.value, self.error = fn, None, None
        self.start()

    def run(self):
        try:
            self.value = self.fn()
        except BaseException as exc:  # re-raised by result()
            self.error = exc

    def result(self, timeout: float = CALL_TIMEOUT):
        self.join(timeout)
        assert not self.is_alive(), f"{self.fn} had not returned within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.value


class StreamProxy:
    """An HTTP proxy on loopback in front of the live relay.

    It forwards every request. A stream (``.../messages/stream``) is relayed as its bytes
    arrive, with its request headers recorded in ``streams``; :meth:`cut` shuts the
    client side of every open stream's connection (a real drop: the client reads EOF). With
    ``no_stream`` it answers the stream path 404 in the relay's error envelope instead, as a
    relay from before the stream does.
    """

    def __init__(self, upstream: str, *, no_stream: bool = False):
        outer = self
        self.upstream = upstream
        self.no_stream = no_stream
        self.streams: list[dict[str, str]] = []
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                wanted = ("Authorization", "Accept", "Content-Type", "Last-Event-ID")
                headers = {k: self.headers[k] for k in wanted if self.headers.get(k) is not None}
                is_stream = self.path.split("?")[0].endswith("/messages/stream")
                if is_stream and outer.no_stream:
                    return self._answer(404, {"error": {"code": "not_found", "message": "no such route"}})
                if is_stream:
                    with outer.lock:
                        outer.streams.append(headers)
                up = requests.request(
                    self.command,
                    outer.upstream + self.path,
                    headers=headers,
                    data=body,
                    stream=is_stream,
                    timeout=(5, 90),
                    allow_redirects=False,
                )
                self.send_response(up.status_code)
                for name in ("Content-Type", "Retry-After", "X-Request-Id", "Cache-Control"):
                    if up.headers.get(name) is not None:
                        self.send_header(name, up.headers[name])
                self.send_header("Connection", "close")
                if not is_stream or up.status_code != 200:
                    payload = up.content
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.end_headers()  # a body delimited by the connection's close, as a de-chunking proxy sends it
                with outer.lock:
                    outer.open.add(self.connection)
                try:
                    while chunk := up.raw.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except OSError:
                    pass  # cut: the client side is gone
                finally:
                    with outer.lock:
                        outer.open.discard(self.connection)
                    up.close()

            def _answer(self, status, doc):
                payload = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def cut(self) -> int:
        """Drop every open stream's connection; return how many there were."""
        with self.lock:
            socks = list(self.open)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(socks)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.cut()
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- the SSE parser


def test_the_sse_parser_reads_events_split_anywhere():
    raw = (
        "\ufeffretry: 2000\r\n: ready\r\n\r\n"
        'event: message\r\nid: 7\r\ndata: {"a":\r\ndata: "café"}\r\n\r\n'
        "data: no id line\rdata: second\r\r"
        "event: error\nid\ndata: {}\n\n"
        "event: ping\n\n"  # no data: not dispatched
    ).encode()
    whole = SSEParser().feed(raw)
    for size in (1, 2, 3, 5):
        parser, got = SSEParser(), []
        for i in range(0, len(raw), size):
            got += parser.feed(raw[i : i + size])
        assert got == whole, size
        assert parser.retry == 2000
    assert whole == [
        ("comment", "ready"),
        ("event", "message", '{"a":\n"café"}', "7"),
        ("event", "message", "no id line\nsecond", "7"),  # the last event ID persists
        ("event", "error", "{}", ""),  # a bare "id" line sets it empty
    ]


# --------------------------------------------------------------------------- RelayClient.wait


def test_client_wait_wakes_on_a_message_sent_while_it_waits(app, live, agents, clients):
    first = clients["alice"].send("bob@acme", "first")
    call = Call(lambda: clients["bob"].wait(after=first.message_id, timeout=CALL_TIMEOUT))
    waiting(app, live, "bob@acme")
    second = clients["alice"].send("bob@acme", "second")
    rows = call.result()
    assert [r.id for r in rows] == [second.message_id], "the wait ran out instead of answering the message"
    assert isinstance(rows[0], FeedRow) and rows[0].body == "second"


def test_client_wait_returns_the_backlog_oldest_first_across_pages_without_seen(clients):
    sent = [clients["alice"].send("bob@acme", f"backlog {i}") for i in range(4)]
    first = clients["bob"].get(sent[0].task_id).messages[0]
    rows = clients["bob"].wait(since=first.raw["created_at"], seen=[first.id], timeout=CALL_TIMEOUT, limit=1)
    assert [r.id for r in rows] == [s.message_id for s in sent[1:]]


def test_client_wait_from_a_position_whose_rows_were_all_seen_waits_for_the_next(app, live, agents, clients):
    first = clients["alice"].send("bob@acme", "seen already")
    at = clients["bob"].get(first.task_id).messages[0].raw["created_at"]
    call = Call(lambda: clients["bob"].wait(since=at, seen=[first.message_id], timeout=CALL_TIMEOUT))
    waiting(app, live, "bob@acme")  # waiting at the relay, not answering the seen row again and again
    nxt = clients["alice"].send("bob@acme", "the next one")
    assert [r.id for r in call.result()] == [nxt.message_id]


def test_client_wait_that_runs_out_returns_nothing(clients):
    first = clients["alice"].send("bob@acme", "only this")
    assert clients["bob"].wait(after=first.message_id, timeout=1) == []


# --------------------------------------------------------------------------- RelayClient.stream


def test_client_stream_reconnects_with_last_event_id_and_yields_every_message_once(relay_url, agents, clients):
    first = clients["alice"].send("bob@acme", "before the stream")
    rows: queue.Queue = queue.Queue()
    with StreamProxy(relay_url) as proxy:
        bob = RelayClient(proxy.url, agents["bob"][1])

        def consume():
            stream = bob.stream(after=first.message_id)
            for row in stream:
                rows.put(row)
                if row.body == "the last one":
                    break
            stream.close()

        consumer = Call(consume)

        def next_row() -> FeedRow:
            try:
                return rows.get(timeout=CALL_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no row from the stream within {CALL_TIMEOUT} s") from None

        sent = [clients["alice"].send("bob@acme", f"on the stream {i}").message_id for i in range(2)]
        got = [next_row().id for _ in range(2)]
        assert proxy.cut() == 1
        sent.append(clients["alice"].send("bob@acme", "while it was cut").message_id)
        wait_until(lambda: len(proxy.streams) == 2, timeout=CALL_TIMEOUT, what="the client reconnecting")
        assert proxy.streams[0].get("Last-Event-ID") == first.message_id
        assert proxy.streams[1].get("Last-Event-ID") == got[-1], proxy.streams
        sent.append(clients["alice"].send("bob@acme", "after the reconnect").message_id)
        sent.append(clients["alice"].send("bob@acme", "the last one").message_id)
        got += [next_row().id for _ in range(3)]
        consumer.result()
        bob.close()
    assert got == sent  # in order, none twice, none missing (the last one was sent after the others)


def test_client_stream_ends_with_the_relays_error_event(app, live, agents, relay_url):
    handle, key = agents["bob"]
    bob = RelayClient(relay_url, key)
    opened = threading.Event()
    call = Call(lambda: list(bob.stream(on_ready=opened.set)))
    assert opened.wait(CALL_TIMEOUT), "the stream never opened"
    keys = requests.get(f"{relay_url}/api/v1/identities/{handle}/keys", headers=bearer(key), timeout=30).json()
    revoked = requests.delete(
        f"{relay_url}/api/v1/identities/{handle}/keys/{keys['items'][0]['key_id']}", headers=bearer(key), timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    with pytest.raises(Unauthenticated) as info:
        call.result()
    assert info.value.symbol == "unauthenticated" and info.value.http_status == 200  # the stream's last event
    bob.close()


def test_client_stream_waits_out_retry_after_when_the_agent_holds_its_limit(app, live, agents, clients, relay_url):
    handle, key = agents["bob"]
    held = [SSE(f"{relay_url}/api/v1/identities/{handle}/a2a/messages/stream", headers=bearer(key)) for _ in range(CAP)]
    for s in held:
        s.until_ready()
    bob = RelayClient(relay_url, key)
    slept: list[float] = []

    def sleep(delay: float) -> None:  # the client's documented seam: record the wait, free a slot instead
        slept.append(delay)
        held.pop().close()
        waiting(app, live, handle, CAP - 1)

    bob._sleep = sleep
    opened = threading.Event()
    first = clients["alice"].send("bob@acme", "a position")
    stream = bob.stream(after=first.message_id, on_ready=opened.set)
    call = Call(lambda: next(stream))
    assert opened.wait(CALL_TIMEOUT), "the stream never opened once a slot was free"
    sent = clients["alice"].send("bob@acme", "after the 429")
    assert call.result().id == sent.message_id
    assert len(slept) == 1 and slept[0] >= 5  # the relay's Retry-After (5 s), not the 2 s reconnect delay
    stream.close()
    for s in held:
        s.close()
    bob.close()


def test_client_stream_on_a_relay_without_it_raises_stream_unavailable(relay_url, agents):
    with StreamProxy(relay_url, no_stream=True) as proxy, RelayClient(proxy.url, agents["bob"][1]) as bob:
        with pytest.raises(StreamUnavailable) as info:
            next(bob.stream())
    assert info.value.http_status == 404


# --------------------------------------------------------------------------- relay-agent


@pytest.fixture
def env(tmp_path):
    """The environment relay-agent runs in: none of the test's RELAY_*/DATABASE_URL/REDIS_URL, a private state dir."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("RELAY_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    clean["XDG_STATE_HOME"] = str(tmp_path / "state")
    return clean


def agent_cmd(env: dict, url: str, key: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relay.agent.cli", *args],
        env={**env, "RELAY_URL": url, "RELAY_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        input=input,
    )


class Running:
    """relay-agent as a background process whose stdout lines are read as they come."""

    def __init__(self, env: dict, url: str, key: str, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relay.agent.cli", *args],
            env={**env, "RELAY_URL": url, "RELAY_API_KEY": key},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A suite started in the background inherits SIGINT ignored; the child must see Ctrl-C.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def line(self) -> str:
        try:
            return self.lines.get(timeout=CALL_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"no output line within {CALL_TIMEOUT} s (exit {self.proc.poll()})") from None

    def stop(self) -> tuple[int, str]:
        """Ctrl-C; the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            err = self.proc.stderr.read()
            return self.proc.wait(timeout=CALL_TIMEOUT), err
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def state_of(tmp_path: Path, handle: str, kind: str = "") -> Path:
    return tmp_path / "state" / "relay-agent" / f"{handle}{'.' + kind if kind else ''}.json"


def test_cli_wait_prints_a_message_sent_after_it_started_and_saves_the_position(
    app, live, agents, clients, env, relay_url, tmp_path
):
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay.agent.cli", "wait", "--timeout", str(CALL_TIMEOUT), "--json"],
        env={**env, "RELAY_URL": relay_url, "RELAY_API_KEY": agents["bob"][1]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waiting(app, live, "bob@acme")
        sent = clients["alice"].send("bob@acme", "wake up, bob")
        out, err = proc.communicate(timeout=CALL_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert [json.loads(line)["id"] for line in out.splitlines()] == [sent.message_id]
    assert json.loads(state_of(tmp_path, "bob@acme").read_text())["after"] == sent.message_id


def test_cli_wait_exits_4_when_nothing_comes_in_time(agents, env, relay_url):
    proc = agent_cmd(env, relay_url, agents["bob"][1], "wait", "--timeout", "1")
    assert proc.returncode == 4, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == ["relay-agent: no new messages within 1 s"]


def test_cli_wait_is_not_woken_by_your_own_messages(app, live, agents, clients, env, relay_url):
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay.agent.cli", "wait", "--timeout", str(CALL_TIMEOUT), "--json"],
        env={**env, "RELAY_URL": relay_url, "RELAY_API_KEY": agents["bob"][1]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        waiting(app, live, "bob@acme")
        clients["bob"].send("alice@acme", "bob's own handoff")
        theirs = clients["alice"].send("bob@acme", "alice's")
        out, err = proc.communicate(timeout=CALL_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (out, err)
    assert [json.loads(line)["id"] for line in out.splitlines()] == [theirs.message_id]


def test_cli_wait_resumes_from_a_state_file_without_after(agents, clients, env, relay_url, tmp_path):
    old = clients["alice"].send("bob@acme", "printed by an older watch")
    at = clients["bob"].get(old.task_id).messages[0].raw["created_at"]
    path = state_of(tmp_path, "bob@acme")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"since": at, "seen": [old.message_id]}))  # as watch wrote it before "after"
    new = clients["alice"].send("bob@acme", "new since then")
    proc = agent_cmd(env, relay_url, agents["bob"][1], "wait", "--timeout", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [new.message_id]
    assert json.loads(path.read_text())["after"] == new.message_id


def test_cli_watch_prints_from_the_stream(app, live, agents, clients, env, relay_url, tmp_path):
    # Polling every hour could print nothing in this test's bounds: what is printed came on the stream.
    watch = Running(env, relay_url, agents["bob"][1], "watch", "--json", "--interval", "3600")
    try:
        wait_until(state_of(tmp_path, "bob@acme").exists, timeout=CALL_TIMEOUT, what="the stream open (state saved)")
        waiting(app, live, "bob@acme")
        sent = clients["alice"].send("bob@acme", "on the stream")
        assert json.loads(watch.line())["id"] == sent.message_id
        wait_until(
            lambda: json.loads(state_of(tmp_path, "bob@acme").read_text()).get("after") == sent.message_id,
            what="the position saved after the message",
        )
    finally:
        code, err = watch.stop()
    assert code == 0 and err == "", err


def test_cli_watch_resumes_the_stream_after_the_saved_message(agents, clients, env, relay_url, tmp_path):
    first = clients["alice"].send("bob@acme", "before")
    ok = agent_cmd(env, relay_url, agents["bob"][1], "watch", "--once", "--json", "--from-start")
    assert [json.loads(line)["id"] for line in ok.stdout.splitlines()] == [first.message_id], ok.stderr
    missed = [clients["alice"].send("bob@acme", f"while no watch ran {i}").message_id for i in range(2)]
    watch = Running(env, relay_url, agents["bob"][1], "watch", "--json", "--interval", "3600")
    try:
        got = [json.loads(watch.line())["id"] for _ in range(2)]
        last = clients["alice"].send("bob@acme", "live")
        got.append(json.loads(watch.line())["id"])
    finally:
        code, err = watch.stop()
    assert got == [*missed, last.message_id]  # not "before" again
    assert code == 0 and err == "", err


def test_cli_watch_falls_back_to_polling_with_one_notice(relay_url, agents, clients, env):
    # A first watch starts at now: the position is saved before the message, not raced.
    assert agent_cmd(env, relay_url, agents["bob"][1], "watch", "--once", "--json").stdout == ""
    with StreamProxy(relay_url, no_stream=True) as proxy:
        watch = Running(env, proxy.url, agents["bob"][1], "watch", "--json", "--interval", "0.2")
        try:
            sent = clients["alice"].send("bob@acme", "found by polling")
            assert json.loads(watch.line())["id"] == sent.message_id
        finally:
            code, err = watch.stop()
    assert code == 0
    assert err.splitlines() == [
        f"relay-agent: the relay at {proxy.url} has no message stream (HTTP 404); polling every 0.2 s instead"
    ]


# --------------------------------------------------------------------------- relay-agent hook claude-code


def hook(env, url, key, given: dict | None = None) -> subprocess.CompletedProcess:
    data = json.dumps({"session_id": "s1", "hook_event_name": "Stop", "stop_hook_active": False, **(given or {})})
    return agent_cmd(env, url, key, "hook", "claude-code", input=data)


def test_hook_blocks_with_a_summary_of_the_new_work(agents, clients, env, relay_url):
    key = agents["bob"][1]
    first = hook(env, relay_url, key)  # the first run records where the feed is
    assert (first.returncode, first.stdout) == (0, ""), first.stderr
    sent = clients["alice"].send("bob@acme", "Please add pagination to /users\nDetails: cursor-based.")
    proc = hook(env, relay_url, key)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["decision"] == "block"
    reason = answer["reason"]
    assert sent.task_id in reason and "alice@acme" in reason and "new handoff" in reason
    assert "Please add pagination to /users" in reason and "Details" not in reason  # the first line only
    assert f"relay-agent show {sent.task_id}" in reason


def test_hooks_first_run_reports_what_the_relay_counts_unread(agents, clients, env, relay_url):
    key = agents["bob"][1]
    waiting = clients["alice"].send("bob@acme", "Sent before bob installed the hook\nmore")
    opened = clients["alice"].send("bob@acme", "Already opened by bob")
    clients["bob"].get(opened.task_id)  # read: not news any more
    proc = hook(env, relay_url, key)
    assert proc.returncode == 0, proc.stderr
    reason = json.loads(proc.stdout)["reason"]
    assert waiting.task_id in reason and "Sent before bob installed the hook" in reason and "more" not in reason
    assert opened.task_id not in reason
    again = hook(env, relay_url, key)  # the position is recorded: reported once
    assert (again.returncode, again.stdout) == (0, ""), again.stderr


def test_hook_prints_nothing_when_nothing_is_new(agents, clients, env, relay_url):
    key = agents["bob"][1]
    assert hook(env, relay_url, key).stdout == ""
    clients["alice"].send("bob@acme", "reported once")
    assert json.loads(hook(env, relay_url, key).stdout)["decision"] == "block"
    clients["bob"].send("alice@acme", "bob's own message is no news to bob")
    again = hook(env, relay_url, key)
    assert (again.returncode, again.stdout) == (0, ""), again.stderr


def test_hook_stands_down_while_stop_hook_active_and_reports_later(agents, clients, env, relay_url):
    key = agents["bob"][1]
    hook(env, relay_url, key)
    sent = clients["alice"].send("bob@acme", "arrived during a continuation")
    active = hook(env, relay_url, key, {"stop_hook_active": True})
    assert (active.returncode, active.stdout) == (0, ""), active.stderr
    later = hook(env, relay_url, key)
    assert sent.task_id in json.loads(later.stdout)["reason"]  # not lost: reported at the next stop


def test_hook_with_the_relay_unreachable_lets_the_agent_stop(agents, env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = hook(env, closed, agents["bob"][1])
    assert proc.returncode == 0 and proc.stdout == ""
    assert "relay-agent hook:" in proc.stderr and "connection_error" in proc.stderr


def test_hook_does_not_make_watch_skip_what_it_reported(agents, clients, env, relay_url):
    key = agents["bob"][1]
    assert agent_cmd(env, relay_url, key, "watch", "--once", "--json").stdout == ""  # watch's position: now
    hook(env, relay_url, key)
    sent = clients["alice"].send("bob@acme", "seen by the hook and by watch")
    assert sent.task_id in hook(env, relay_url, key).stdout
    watched = agent_cmd(env, relay_url, key, "watch", "--once", "--json")
    assert [json.loads(line)["id"] for line in watched.stdout.splitlines()] == [sent.message_id], watched.stderr


def test_a_mistyped_hook_command_does_not_exit_2(agents, env, relay_url):
    # Exit 2 from a Claude Code Stop hook blocks the stop and feeds stderr to the model.
    proc = agent_cmd(env, relay_url, agents["bob"][1], "hook", "claude-cod")
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr


# --------------------------------------------------------------------------- MCP: wait_for_messages


def mcp_bob(relay_url: str, key: str):
    from tests.test_mcp import stdio_session

    return stdio_session(relay_url, key)


def mcp_run(test) -> None:
    async def bounded():
        with anyio.fail_after(BOUND):
            await test()

    anyio.run(bounded)


def test_mcp_wait_for_messages_wakes_on_a_message_and_returns_it_once(app, live, agents, clients, relay_url):
    from tests.test_mcp import ok

    async def test():
        async with mcp_bob(relay_url, agents["bob"][1]) as bob:
            result: dict = {}

            async def call():
                result.update(ok(await bob.call_tool("wait_for_messages", {"timeout_seconds": CALL_TIMEOUT})))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.to_thread.run_sync(waiting, app, live, "bob@acme")
                sent = await anyio.to_thread.run_sync(clients["alice"].send, "bob@acme", "for the MCP agent")
            assert result["timed_out"] is False
            assert [m["id"] for m in result["messages"]] == [sent.message_id]
            assert result["messages"][0]["from"] == "alice@acme" and result["count"] == 1
            again = ok(await bob.call_tool("wait_for_messages", {"timeout_seconds": 1}))
            again.pop("next_after", None)
            assert again == {"messages": [], "count": 0, "timed_out": True}

    mcp_run(test)


def test_mcp_wait_for_messages_refuses_a_timeout_out_of_bounds(agents, relay_url):
    from tests.test_mcp import err

    async def test():
        async with mcp_bob(relay_url, agents["bob"][1]) as bob:
            for bad in (0, 601):
                line = err(await bob.call_tool("wait_for_messages", {"timeout_seconds": bad}))
                assert line.startswith("invalid_params: timeout_seconds: "), line
            line = err(await bob.call_tool("wait_for_messages", {"timeout_seconds": 2.5}))
            assert "timeout_seconds: must be an integer" in line, line

    mcp_run(test)
