"""relay.agent.client against a live relay (gunicorn + Celery from the Procfile, real PostgreSQL and Redis).

Typed results for every method of the relay's JSON-RPC dialect (``POST /a2a``), one exception class per
error symbol, retries that never duplicate a handoff (429 with Retry-After, a
connection dropped after the relay committed), the messages feed and its catch-up
loop, and Standard Webhooks verification. Nothing is mocked: faults are made with a
real rate limit and a real TCP proxy that drops a connection.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest
import requests
import standardwebhooks
from ulid import ULID

from relay.agent import client as rc
from relay.agent.client import (
    BadResponse,
    FeedRow,
    Handoff,
    Identity,
    InvalidTransition,
    Message,
    Page,
    RelayClient,
    RelayConnectionError,
    SendResult,
    TaskSummary,
    TransitionResult,
    WebhookVerificationError,
    verify_webhook,
)
from tests.conftest import sql
from tests.live import live_relay
from tests.receiver import Receiver


class CountingSession(requests.Session):
    """A real requests session that records every exchange it makes: (verb, path, status, headers, body)."""

    def __init__(self):
        super().__init__()
        self.log: list[dict] = []

    def send(self, request, **kwargs):
        entry = {
            "verb": request.method,
            "path": request.path_url.split("?")[0],
            "body": request.body,
            "status": None,
            "headers": {},
        }
        self.log.append(entry)
        resp = super().send(request, **kwargs)
        entry["status"] = resp.status_code
        entry["headers"] = dict(resp.headers)
        return resp


@pytest.fixture
def agents(make_agent, relay_url, settled):
    """alice@acme, bob@acme and carol@acme as RelayClients on the live relay (backoff kept short)."""
    made = []

    def _client(handle, **kw):
        h, key = make_agent(handle)
        c = RelayClient(relay_url, key, backoff=0.05, **kw)
        made.append(c)
        return c

    out = {name: _client(f"{name}@acme") for name in ("alice", "bob", "carol")}
    out["new"] = _client
    yield out
    for c in made:
        c.close()


def _key_of(body: bytes) -> str:
    return json.loads(body)["params"]["metadata"]["client_idempotency_key"]


# --------------------------------------------------------------------------- round trip


def test_full_handoff_round_trip_returns_typed_results(agents):
    alice, bob = agents["alice"], agents["bob"]
    assert isinstance(alice.whoami(), Identity) and alice.handle == "alice@acme"

    sent = alice.send(
        "bob@acme",
        "Refactored /users; new shape {items, next_cursor}",
        artifacts=[{"type": "file_diff", "path": "src/api/users.py", "diff": "@@ -1 +1 @@"}],
        metadata={"ticket": "T-1"},
    )
    assert isinstance(sent, SendResult)
    assert (sent.state, sent.sequence_no, sent.task_id == sent.thread_id) == ("pending", 1, True)
    assert len(sent.idempotency_key) == 36  # the generated uuid4

    inbox = bob.inbox()
    assert isinstance(inbox, Page) and inbox.next_cursor is None
    [item] = inbox.items
    assert isinstance(item, TaskSummary)
    assert (item.task_id, item.state, item.unread_messages, item.sender.handle) == (
        sent.task_id,
        "pending",
        1,
        "alice@acme",
    )

    handoff = bob.get(sent.task_id)
    assert isinstance(handoff, Handoff) and isinstance(handoff.messages[0], Message)
    assert handoff.messages[0].payload == {"ticket": "T-1"}  # the idempotency key is not echoed
    assert handoff.artifacts[0]["path"] == "src/api/users.py"
    assert bob.inbox().items[0].unread_messages == 0  # get marked it read

    question = bob.reply(sent.task_id, "Is the cursor opaque?")
    answer = alice.reply(sent.task_id, "Yes, opaque.")
    assert (question.sequence_no, answer.sequence_no) == (2, 3)

    accepted = bob.accept(sent.task_id, session_id="s-1")
    assert isinstance(accepted, TransitionResult) and accepted.state == "accepted" and accepted.accepted_at
    done = bob.complete(sent.task_id, "client updated")
    assert (done.state, done.result_summary) == ("completed", "client updated") and done.completed_at

    final = alice.get(sent.task_id)
    assert final.state == "completed" and final.result_summary == "client updated"
    assert [(m.sequence_no, m.author, m.role) for m in final.messages] == [
        (1, "alice@acme", "caller"),
        (2, "bob@acme", "agent"),
        (3, "alice@acme", "caller"),
    ]
    assert final.raw["task_id"] == sent.task_id  # the server's JSON stays reachable


# --------------------------------------------------------------------------- errors


def _thread(c):
    return c["alice"].send("bob@acme", "please look").task_id


def _terminal(c):
    tid = _thread(c)
    c["alice"].cancel(tid)
    c["bob"].reply(tid, "too late")


def _duplicate(c):
    c["alice"].send("bob@acme", "first text", idempotency_key="dup-1")
    c["alice"].send("bob@acme", "other text", idempotency_key="dup-1")


def _blocked(c):
    c["bob"].block("alice@acme")
    c["alice"].send("bob@acme", "hello?")


def _bad_key(c):
    with RelayClient(c["alice"].base_url, "ah_live_" + "a" * 32) as stranger:
        stranger.inbox()


ERROR_CASES = {
    # name: (trigger, class, symbol, HTTP status)
    "thread_not_found": (lambda c: c["alice"].get(str(ULID())), rc.ThreadNotFound, 200),
    "recipient_not_found": (lambda c: c["alice"].send("nobody@acme", "hi"), rc.RecipientNotFound, 200),
    "not_a_participant": (lambda c: c["carol"].get(_thread(c)), rc.NotAParticipant, 200),
    "thread_terminal": (_terminal, rc.ThreadTerminal, 200),
    "invalid_transition": (lambda c: c["bob"].complete(_thread(c), "skipped accept"), rc.InvalidTransition, 200),
    "not_authorized_transition": (lambda c: c["alice"].accept(_thread(c)), rc.NotAuthorizedTransition, 200),
    "invalid_params": (lambda c: c["alice"].get("not-a-task-id"), rc.InvalidParams, 200),
    "invalid_intent_payload": (
        lambda c: c["alice"].send("bob@acme", "x", intent="propose_action"),
        rc.InvalidIntentPayload,
        200,
    ),
    "unauthenticated": (_bad_key, rc.Unauthenticated, 401),
    "duplicate_idempotency_key": (_duplicate, rc.DuplicateIdempotencyKey, 200),
    "teammate_blocked": (_blocked, rc.TeammateBlocked, 200),
    # REST (the feed): the symbol comes from {"error": {"code": ...}}
    "forbidden": (lambda c: next(c["alice"].messages("bob@acme")), rc.Forbidden, 403),
    "identity_not_found": (lambda c: next(c["alice"].messages("ghost@elsewhere")), rc.IdentityNotFound, 404),
    "invalid_params(rest)": (lambda c: next(c["alice"].messages(limit=500)), rc.InvalidParams, 422),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_each_error_raises_its_own_class(agents, case):
    from relay.errors import ERRORS

    trigger, cls, status = ERROR_CASES[case]
    symbol = case.split("(")[0]
    with pytest.raises(rc.RelayError) as info:
        trigger(agents)
    exc = info.value
    assert type(exc) is cls, repr(exc)
    assert (exc.symbol, exc.code, exc.http_status) == (symbol, ERRORS[symbol][0], status)
    assert isinstance(exc.request_id, str) and len(exc.request_id) >= 8
    assert exc.message and exc.attempts == 1


def test_invalid_params_carries_the_field_errors(agents):
    with pytest.raises(rc.InvalidParams) as info:
        agents["alice"].get("not-a-task-id")
    assert "task_id" in info.value.data["errors"]


# --------------------------------------------------------------------------- retries


def test_429_waits_retry_after_and_sends_once(base_env, make_agent, app, relay_url, settled):
    # A fresh agent's sliding window opens at its first hit, so three quick calls fill
    # it and the send's first attempt is refused until the window turns (<= 5 s).
    # This stack runs no worker: relay_url's worker takes its after-commit tasks.
    with live_relay(base_env, worker=False, RELAY_RATE_LIMIT="3/5second") as url:
        _, key = make_agent("alice@acme")
        make_agent("bob@acme")
        session = CountingSession()
        slept: list[float] = []
        alice = RelayClient(url, key, session=session, max_retries=4, backoff=0.05)
        alice._sleep = lambda s: (slept.append(s), time.sleep(s))
        for _ in range(3):
            alice.inbox()
        before = len(session.log)
        sent = alice.send("bob@acme", "once, please")
        alice.close()
        session.close()  # an open keep-alive connection would hold the stack's shutdown

    attempts = session.log[before:]
    statuses = [a["status"] for a in attempts]
    assert statuses[0] == 429 and statuses[-1] == 200 and set(statuses[:-1]) == {429}, statuses
    waits = [float(a["headers"]["Retry-After"]) for a in attempts[:-1]]
    assert len(slept) == len(waits) and all(s >= w for s, w in zip(slept, waits)), (slept, waits)
    assert len({_key_of(a["body"]) for a in attempts}) == 1  # one idempotency key on every attempt
    assert sql(app, "SELECT id FROM threads") == [(ULID.from_str(sent.task_id).to_uuid(),)]


def _close_after(request: bytes) -> bytes:
    """The request with ``Connection: close``, so the relay closes once it has answered
    (its gevent workers keep connections alive otherwise)."""
    head, _, body = request.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body


class DroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of the relay.

    For the first ``drop`` connections it forwards the request, reads the relay's whole
    answer (so the relay has committed) and then closes the client's socket without
    sending it: the client sees a dropped connection. With ``fail_with`` set, those
    connections instead get that raw HTTP answer and never reach the relay (a load
    balancer's 503). Later connections are forwarded normally. One request per
    connection (the relay answers ``Connection: close``).
    """

    def __init__(self, upstream: str, drop: int = 1, fail_with: bytes | None = None):
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.drop = drop
        self.fail_with = fail_with
        self.forwarded = 0
        self.requests: list[bytes] = []
        self.dropped_answers: list[bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            with self._lock:
                self.connections += 1
                n = self.connections
            threading.Thread(target=self._handle, args=(conn, n), daemon=True).start()

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def _handle(self, conn: socket.socket, n: int):
        conn.settimeout(30)
        try:
            request = self._read_request(conn)
            self.requests.append(request)
            if n <= self.drop and self.fail_with is not None:
                conn.sendall(self.fail_with)
                return
            self.forwarded += 1
            with socket.create_connection(self.upstream, timeout=30) as up:
                up.sendall(_close_after(request))
                answer = b""
                while chunk := up.recv(65536):  # the relay closes after its answer
                    answer += chunk
            if n <= self.drop:
                self.dropped_answers.append(answer)
                conn.shutdown(socket.SHUT_RDWR)  # drop: nothing of the answer reaches the client
            else:
                conn.sendall(answer)
        finally:
            conn.close()


def test_dropped_connection_retry_returns_the_same_thread(agents, relay_url, app):
    with DroppingProxy(relay_url, drop=1) as proxy:
        session = CountingSession()
        alice = RelayClient(proxy.url, agents["alice"].api_key, session=session, backoff=0.05)
        sent = alice.send("bob@acme", "exactly one thread")
        alice.close()

    assert proxy.connections == 2 and [e["status"] for e in session.log] == [None, 200]
    # The dropped attempt was carried out by the relay: its lost answer names the same thread.
    lost = json.loads(proxy.dropped_answers[0].partition(b"\r\n\r\n")[2])
    assert lost["result"]["task_id"] == sent.task_id
    keys = {_key_of(r.partition(b"\r\n\r\n")[2]) for r in proxy.requests}
    assert keys == {sent.idempotency_key}
    assert sql(app, "SELECT count(*) FROM threads") == [(1,)]
    assert sql(app, "SELECT count(*) FROM messages") == [(1,)]


def test_5xx_is_retried_with_the_same_key(agents, app):
    unavailable = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\nContent-Length: 13\r\n"
        b"Connection: close\r\n\r\n<h1>down</h1>"
    )
    with DroppingProxy(agents["alice"].base_url, drop=1, fail_with=unavailable) as proxy:
        session = CountingSession()
        notices: list[rc.RetryNotice] = []
        alice = RelayClient(proxy.url, agents["alice"].api_key, session=session, backoff=0.05, on_retry=notices.append)
        sent = alice.send("bob@acme", "after the outage")
        alice.close()
    assert [e["status"] for e in session.log] == [503, 200] and proxy.forwarded == 1
    # The one retry was announced before its wait.
    assert [(n.retry, n.retries, n.reason, n.connection) for n in notices] == [(1, 4, "HTTP 503", False)]
    assert {_key_of(r.partition(b"\r\n\r\n")[2]) for r in proxy.requests} == {sent.idempotency_key}
    assert sql(app, "SELECT count(*) FROM threads") == [(1,)]


@pytest.mark.parametrize("transport", ["jsonrpc", "rest"])
def test_domain_error_is_not_retried(agents, transport):
    session = CountingSession()
    alice = RelayClient(agents["alice"].base_url, agents["alice"].api_key, session=session, max_retries=4)
    alice._sleep = lambda s: pytest.fail("a domain error must not be retried")
    with pytest.raises(rc.RelayError) as info:
        if transport == "jsonrpc":
            alice.get(str(ULID()))
        else:
            next(alice.messages("bob@acme"))
    assert info.value.symbol == ("thread_not_found" if transport == "jsonrpc" else "forbidden")
    wanted = [e for e in session.log if e["path"] != "/api/v1/identities/me"]
    assert len(wanted) == 1 and info.value.attempts == 1


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:  # a port nobody listens on once closed
        return s.getsockname()[1]


def test_a_refused_connection_is_raised_on_the_first_attempt():
    # Nothing listens at the URL (a wrong RELAY_URL, a relay that is down): no retry, no wait.
    slept: list[float] = []
    notices: list[rc.RetryNotice] = []
    c = RelayClient(f"http://127.0.0.1:{_closed_port()}", "ah_live_" + "a" * 32, on_retry=notices.append)
    c._sleep = slept.append
    with pytest.raises(rc.RelayConnectionError) as info:
        c.inbox()
    assert info.value.attempts == 1 and slept == [] and notices == []
    assert info.value.reason == "connection refused"
    assert isinstance(info.value.__cause__, requests.ConnectionError)


def test_a_refused_connection_is_retried_when_asked():
    slept: list[float] = []
    notices: list[rc.RetryNotice] = []
    url = f"http://127.0.0.1:{_closed_port()}"
    c = RelayClient(
        url, "ah_live_" + "a" * 32, max_retries=2, backoff=0.01, retry_refused=True, on_retry=notices.append
    )
    c._sleep = slept.append
    with pytest.raises(rc.RelayConnectionError) as info:
        c.inbox()
    assert info.value.attempts == 3 and len(slept) == 2
    assert [(n.retry, n.retries, n.reason, n.connection) for n in notices] == [
        (1, 2, "connection refused", True),
        (2, 2, "connection refused", True),
    ]
    assert [n.delay for n in notices] == slept and all(n.url == url + "/a2a" for n in notices)


def test_a_timeout_is_retried_and_each_retry_is_announced():
    # A listening socket that never answers: the connect completes (backlog), the read times out.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        slept: list[float] = []
        notices: list[rc.RetryNotice] = []
        c = RelayClient(
            f"http://127.0.0.1:{silent.getsockname()[1]}",
            "ah_live_" + "a" * 32,
            timeout=0.2,
            max_retries=2,
            on_retry=notices.append,
        )
        c._sleep = slept.append
        with pytest.raises(rc.RelayConnectionError) as info:
            c.inbox()
    assert info.value.attempts == 3 and info.value.reason == "timed out"
    assert [(n.retry, n.reason) for n in notices] == [(1, "timed out"), (2, "timed out")] and len(slept) == 2


# --------------------------------------------------------------------------- feed


def test_catch_up_returns_every_message_once_across_pages(agents):
    alice, bob = agents["alice"], agents["bob"]
    checkpoint = alice.send("bob@acme", "last thing before going offline")
    since = checkpoint.created_at  # a time the server wrote, not this machine's clock

    sent_ids = []
    threads = []
    for i in range(8):  # bob opens threads to alice...
        r = bob.send("alice@acme", f"new work {i}")
        threads.append(r.task_id)
        sent_ids.append(r.message_id)
    for i in range(10):  # ...and replies on them, and on alice's checkpoint thread
        tid = threads[i % len(threads)] if i < 8 else checkpoint.task_id
        sent_ids.append(bob.reply(tid, f"more detail {i}").message_id)
    for i in range(8):  # alice's own replies
        sent_ids.append(alice.reply(threads[i], f"ack {i}").message_id)
    for i in range(4):  # and threads alice opens
        sent_ids.append(alice.send("bob@acme", f"alice asks {i}").message_id)
    assert len(sent_ids) == 30

    session = CountingSession()
    reader = RelayClient(alice.base_url, alice.api_key, session=session)
    rows = reader.catch_up(since, limit=7)
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)) == 31
    assert set(ids) == set(sent_ids) | {checkpoint.message_id}  # since is inclusive
    assert ids[0] == checkpoint.message_id and all(isinstance(r, FeedRow) for r in rows)
    assert [r.created_at for r in rows] == sorted(r.created_at for r in rows)  # oldest first
    feed_pages = [e for e in session.log if e["path"].endswith("/a2a/messages")]
    assert len(feed_pages) >= 5  # 31 rows at 7 per page

    # The checkpoint's id passed as seen is dropped: only the 30 new ones come back.
    assert {r.id for r in reader.catch_up(since, seen=[checkpoint.message_id], limit=7)} == set(sent_ids)


def test_messages_iterates_every_page_newest_first(agents):
    alice = agents["alice"]
    tid = alice.send("bob@acme", "message 0").task_id
    for i in range(1, 12):
        alice.reply(tid, f"message {i}")
    session = CountingSession()
    reader = RelayClient(alice.base_url, alice.api_key, session=session)
    rows = list(reader.messages(limit=5))
    assert [r.body for r in rows] == [f"message {i}" for i in range(11, -1, -1)]
    assert {(r.task_id, r.caller.handle, r.target.handle, r.task_state) for r in rows} == {
        (tid, "alice@acme", "bob@acme", "pending")
    }
    assert len([e for e in session.log if e["path"].endswith("/a2a/messages")]) == 3


def test_iter_inbox_and_messages_page_follow_cursors(agents):
    alice, bob = agents["alice"], agents["bob"]
    opened = {alice.send("bob@acme", f"handoff {i}").task_id for i in range(5)}
    assert {t.task_id for t in bob.iter_inbox(limit=2)} == opened
    assert {t.task_id for t in alice.iter_sent(limit=2)} == opened
    first = bob.messages_page(limit=3)
    assert len(first) == 3 and first.next_cursor
    rest = bob.messages_page(limit=3, cursor=first.next_cursor)
    assert len(rest) == 2 and rest.next_cursor is None
    assert {r.task_id for r in [*first, *rest]} == opened


def test_search_finds_the_one_message_with_a_word(agents):
    alice, bob = agents["alice"], agents["bob"]
    tid = alice.send("bob@acme", "the deploy checklist").task_id
    for i in range(6):
        bob.reply(tid, f"routine note {i}")
    target = bob.reply(tid, "the flux capacitor needs recalibration")
    alice.reply(tid, "thanks")

    hits = list(alice.search("capacitor", limit=2))
    assert [r.id for r in hits] == [target.message_id]
    assert len(list(alice.search("routine", limit=2))) == 6  # several pages of hits


# --------------------------------------------------------------------------- webhooks


def _signed(secret: str, body: str) -> dict:
    msg_id = f"msg_{secrets.token_hex(8)}"
    now = datetime.now(UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": standardwebhooks.Webhook(secret).sign(msg_id, now, body),
    }


def test_verify_webhook_accepts_a_signed_payload_and_refuses_a_tampered_one():
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    body = json.dumps({"type": "message.created", "timestamp": "2026-01-01T00:00:00Z", "data": {"id": "m1"}})
    headers = _signed(secret, body)
    assert verify_webhook(secret, headers, body.encode())["data"] == {"id": "m1"}
    with pytest.raises(WebhookVerificationError):
        verify_webhook(secret, headers, body.replace("m1", "m2").encode())
    with pytest.raises(WebhookVerificationError):  # a mangled header is a verification failure too
        verify_webhook(secret, {**headers, "webhook-signature": "garbage"}, body)


def test_verify_webhook_accepts_a_real_delivery(agents, relay_url):
    bob = agents["bob"]
    with Receiver() as rx:
        resp = requests.post(
            f"{relay_url}/api/v1/identities/bob@acme/webhooks",
            headers={"Authorization": f"Bearer {bob.api_key}"},
            json={"url": rx.url("/hook"), "events": ["message.created"]},
            timeout=10,
        )
        assert resp.status_code == 201, resp.text
        secret = resp.json()["secret"]
        sent = agents["alice"].send("bob@acme", "ping over a webhook")
        [delivery] = rx.wait_for(1, timeout=30, path="/hook")
    payload = verify_webhook(secret, delivery.headers, delivery.body)
    assert (payload["type"], payload["data"]["id"]) == ("message.created", sent.message_id)


# --------------------------------------------------------------------------- drift


def test_client_error_table_matches_the_server():
    from relay.errors import ERRORS

    assert rc.ERROR_SYMBOLS == ERRORS
    classes = {sym: rc.error_class(sym) for sym in ERRORS}
    assert all(cls is not rc.RelayError and cls.default_symbol == sym for sym, cls in classes.items())
    assert len(set(classes.values())) == len(ERRORS)  # one class per symbol
    assert all(getattr(rc, cls.__name__) is cls and cls.__name__ in rc.__all__ for cls in classes.values())


def test_transition_whose_answer_was_lost_reports_success(agents, app):
    task = agents["alice"].send("bob@acme", "accept me once").task_id
    with DroppingProxy(agents["bob"].base_url, drop=1) as proxy:
        bob = RelayClient(proxy.url, agents["bob"].api_key, backoff=0.05)
        accepted = bob.accept(task, session_id="s-lost")
        bob.close()
    # The first attempt went through (its answer was dropped); the retry was refused as
    # invalid_transition, and the client read the thread instead of raising.
    assert json.loads(proxy.dropped_answers[0].partition(b"\r\n\r\n")[2])["result"]["status"]["state"] == "accepted"
    assert accepted.state == "accepted" and accepted.task_id == task
    assert sql(app, "SELECT count(*) FROM audit_events WHERE action = 'accept'") == [(1,)]


def test_transition_refused_on_its_only_attempt_still_raises(agents):
    task = agents["alice"].send("bob@acme", "accept me twice").task_id
    agents["bob"].accept(task)
    with pytest.raises(InvalidTransition) as info:
        agents["bob"].accept(task)
    assert info.value.attempts == 1


class RepeatingCursorServer:
    """A loopback HTTP server that answers every feed page with the same ``next_cursor``."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.hits = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits += 1
                body = json.dumps({"items": [], "next_cursor": "same"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_cursor_returned_twice_stops_paging_instead_of_looping():
    with RepeatingCursorServer() as server:
        with RelayClient(server.url, "ah_live_" + "a" * 32) as client:
            with pytest.raises(BadResponse):
                list(client.messages("alice@acme"))
    assert server.hits == 2


def test_a_failed_send_carries_its_idempotency_key():
    with RelayClient("http://127.0.0.1:9", "ah_live_" + "a" * 32, max_retries=0) as client:
        with pytest.raises(RelayConnectionError) as info:
            client.send("bob@acme", "lost", idempotency_key="k-keep")
    assert info.value.idempotency_key == "k-keep"


def test_next_position_keeps_the_ids_at_a_time_that_did_not_move():
    from relay.agent.client import next_position

    def row(id_, at):
        return FeedRow.from_json({"id": id_, "task_id": "t", "sequence_no": 1, "body": "", "created_at": at})

    at = "2026-07-21T18:00:00.000000Z"
    assert next_position([], at, ["a"]) == (at, ["a"])
    assert next_position([row("b", at)], at, ["a"]) == (at, ["a", "b"])
    later = "2026-07-21T18:00:01.000000Z"
    assert next_position([row("b", at), row("c", later)], at, ["a"]) == (later, ["c"])


def test_the_agent_tools_import_no_server_code():
    code = (
        "import sys, relay.agent.client, relay.agent.cli, relay.agent.mcp; "
        "print(sorted(m for m in ('flask', 'sqlalchemy', 'relay.services', 'relay.models') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the work lifecycle


def test_decline_sends_its_reason_and_the_result_is_typed(agents):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    declined = bob.decline(task, "not my area")
    assert isinstance(declined, TransitionResult)
    assert (declined.state, declined.reason) == ("declined", "not my area")
    assert declined.declined_at is not None
    assert alice.get(task).reason == "not my area"


def test_accept_with_a_lease_remembers_its_token_and_complete_sends_it(agents):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    accepted = bob.accept(task, lease_seconds=60)
    assert accepted.lease_token and accepted.lease_expires_at is not None
    assert bob.leases[task] == accepted.lease_token
    done = bob.complete(task, "done")  # no token given: the remembered one is sent
    assert done.state == "completed" and task not in bob.leases


def test_fail_and_release_send_the_remembered_token(agents):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    bob.accept(task, lease_seconds=60)
    released = bob.release(task, reason="out of time")
    assert (released.state, released.lease_token, released.accepted_at) == ("pending", None, None)
    bob.accept(task, lease_seconds=60)
    failed = bob.fail(task, "the tests will not pass")
    assert (failed.state, failed.reason) == ("failed", "the tests will not pass")


def test_renew_extends_the_lease_with_the_remembered_token_and_keeps_it(agents):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    accepted = bob.accept(task, lease_seconds=30)
    renewed = bob.renew(task, lease_seconds=600)
    assert renewed.lease_token == accepted.lease_token == bob.leases[task]
    assert (renewed.lease_expires_at - datetime.now(UTC)).total_seconds() > 590


def test_request_input_keeps_the_lease_and_the_senders_reply_answers_it(agents):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    accepted = bob.accept(task, lease_seconds=60)
    asked = bob.request_input(task, "which branch?")
    assert isinstance(asked, TransitionResult)
    assert (asked.state, asked.question, asked.lease_expires_at) == ("input_required", "which branch?", None)
    assert bob.leases[task] == accepted.lease_token  # the lease is still this session's
    seen = alice.get(task)
    assert (seen.state, seen.question, seen.input_requested_at is not None) == ("input_required", "which branch?", True)
    alice.reply(task, "main")
    assert bob.get(task).state == "accepted"
    assert bob.complete(task, "done on main").state == "completed"


def test_a_token_lost_to_another_sessions_accept_is_state_changed_and_forgotten(agents, relay_url):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    first = bob.accept(task, lease_seconds=60)
    with RelayClient(relay_url, bob.api_key) as other:  # bob's second session takes the work over
        other.release(task, lease_token=first.lease_token)
        second = other.accept(task, lease_seconds=60)
    with pytest.raises(rc.StateChanged) as caught:
        bob.complete(task, "done")
    assert rc.lease_refused(caught.value) and task not in bob.leases
    assert bob.complete(task, "done", lease_token=second.lease_token).state == "completed"


def test_send_takes_priority_and_expiry_and_the_list_filters_on_priority(agents):
    alice, bob = agents["alice"], agents["bob"]
    urgent = alice.send("bob@acme", "now please", priority="urgent", expires_in_seconds=3600)
    alice.send("bob@acme", "whenever")
    assert urgent.priority == "urgent" and urgent.expires_at is not None
    assert [t.task_id for t in bob.inbox(priority="urgent")] == [urgent.task_id]
    assert {t.priority for t in bob.inbox(priority=["urgent", "normal"])} == {"urgent", "normal"}
    assert [t.task_id for t in bob.iter_inbox(priority="urgent")] == [urgent.task_id]
    assert bob.get(urgent.task_id).expires_at == urgent.expires_at


def test_messages_carry_their_read_receipts(agents):
    alice, bob = agents["alice"], agents["bob"]
    task = alice.send("bob@acme", "please do it").task_id
    assert alice.get(task).messages[0].read_at is None
    bob.get(task)
    assert alice.get(task).messages[0].read_at is not None
