"""Outage answers: whichever statement of a method loses the database, the answer is a 503
with ``Retry-After`` (JSON-RPC keeping ``-32603 service_unavailable``), never an HTTP 200
carrying the error and never a 500, and a retry with the same idempotency key makes exactly
one thread (docs/decisions.md, "Surviving the relay's own servers failing").

The cut is real: the app reaches PostgreSQL (or the pooler, in the pooled pass) through a
TCP proxy in this module that reads the frontend protocol's messages and, when armed,
closes both sockets at the Nth simple query (``Q``) it sees: before forwarding it (the
server never ran it) or just after (the server ran it; a COMMIT or an autocommit create
may have committed, and the client cannot know). N runs from 1 until a request completes
without reaching it, so every statement of the request is cut once.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import uuid

import pytest
from sqlalchemy.engine import make_url

from relay.config import normalize_database_url
from tests.conftest import bearer, connect, extra_app, message_params, post_a2a, rpc_doc, tcp_address

_UNTYPED_REQUESTS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: answered with one byte, then startup


class CuttingProxy:
    """A loopback TCP proxy to ``upstream`` that can cut every connection at the Nth query."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.arm_at: int | None = None
        self.after = False
        self.seen = 0
        self.fired = False
        self.cut_done = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, n: int, *, after: bool) -> None:
        with self.lock:
            self.arm_at, self.after, self.seen, self.fired = n, after, 0, False
            self.cut_done = threading.Event()

    def disarm(self) -> bool:
        """Stop cutting; return whether the armed cut fired, once its sockets are closed.

        A cut after forwarding closes 0.2 s after the query: a call started sooner would
        find its connection alive at checkout and lose it under its first query, which
        is the cut's own call losing it, not the next one.
        """
        with self.lock:
            self.arm_at = None
            fired = self.fired
        if fired:
            assert self.cut_done.wait(5), "the cut connection was never closed"
        return fired

    def close(self) -> None:
        self.listener.close()
        for s in self.conns:
            _close(s)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.conns += [client, server]
            threading.Thread(target=self._to_server, args=(client, server), daemon=True).start()
            threading.Thread(target=self._to_client, args=(server, client), daemon=True).start()

    def _to_client(self, server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        _close(client)
        _close(server)

    def _to_server(self, client: socket.socket, server: socket.socket) -> None:
        cut = False
        try:
            while True:  # untyped: SSL/GSS requests, then the startup message
                (length,) = struct.unpack("!i", _read(client, 4))
                body = _read(client, length - 4)
                server.sendall(struct.pack("!i", length) + body)
                if len(body) < 4 or struct.unpack("!i", body[:4])[0] not in _UNTYPED_REQUESTS:
                    break
            while True:
                head = _read(client, 5)
                body = _read(client, struct.unpack("!i", head[1:])[0] - 4)
                cut = False
                if head[:1] == b"Q":
                    with self.lock:
                        if self.arm_at is not None and not self.fired:
                            self.seen += 1
                            if self.seen == self.arm_at:
                                cut = self.fired = True
                if cut and not self.after:
                    break
                server.sendall(head + body)
                if cut:
                    threading.Event().wait(0.2)  # let the server run it, then lose its answer
                    break
        except OSError:
            pass
        _close(client)
        _close(server)
        if cut:
            self.cut_done.set()


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("closed")
        buf += chunk
    return buf


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@pytest.fixture
def cut_app(base_env, celery_app, redis_url):
    """An app whose every database connection runs through a CuttingProxy."""
    name = "DATABASE_CONNECTION_POOL_URL" if base_env.get("DATABASE_CONNECTION_POOL_URL") else "DATABASE_URL"
    url = make_url(normalize_database_url(base_env[name]))
    proxy = CuttingProxy(tcp_address(base_env[name]))
    proxied = url.set(host="127.0.0.1", port=proxy.port).update_query_dict({"sslmode": "disable"})
    with extra_app(base_env, celery_app, redis_url, **{name: proxied.render_as_string(hide_password=False)}) as other:
        yield other, proxy
    proxy.close()


def _send_doc(recipient: str, text: str, key: str, **extra) -> dict:
    """message/send's request document: ``text`` to ``recipient`` under the idempotency key ``key``."""
    return rpc_doc("message/send", message_params(recipient, text, **extra, metadata={"client_idempotency_key": key}))


def _threads_with(database_url: str, text: str) -> int:
    conn = connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(DISTINCT thread_id) FROM messages WHERE parts::text LIKE %s", (f"%{text}%",))
            return cur.fetchone()[0]
    finally:
        conn.close()


def _assert_outage_or_ok(resp, what: str) -> bool:
    """Assert ``resp`` is a success or a proper outage answer; return True if it was an outage."""
    body = resp.get_data(as_text=True)
    assert resp.status_code in (200, 204, 503), f"{what}: HTTP {resp.status_code}: {body}"
    if resp.status_code == 503:
        assert resp.headers.get("Retry-After") == "1", f"{what}: 503 without Retry-After"
        doc = json.loads(body)
        docs = doc if isinstance(doc, list) else [doc]
        symbols = [_symbol(d) for d in docs]
        assert "service_unavailable" in symbols, f"{what}: 503 body {body}"
        return True
    if resp.status_code == 200 and body:
        doc = json.loads(body)
        for d in doc if isinstance(doc, list) else [doc]:
            assert "error" not in d or d["error"].get("code") != -32603, f"{what}: HTTP 200 carrying -32603: {body}"
    return False


def _symbol(doc: dict) -> str | None:
    error = doc.get("error") or {}
    if error.get("code") == -32603:
        data = error.get("data")
        if isinstance(data, dict):
            return data.get("symbol")
        for item in data or ():  # A2A: a google.rpc.ErrorInfo in a list
            if isinstance(item, dict) and item.get("reason"):
                return (item.get("metadata") or {}).get("symbol") or item["reason"].lower()
    return error.get("code") if isinstance(error.get("code"), str) else None


def _cut_every_statement(proxy: CuttingProxy, call, after: bool, what: str) -> int:
    """Cut ``call()`` at its 1st, 2nd, ... query until it completes uncut; return the outages seen."""
    outages = 0
    for n in range(1, 40):
        proxy.arm(n, after=after)
        resp = call(n)
        fired = proxy.disarm()
        if not fired:
            assert resp.status_code in (200, 204), f"{what}: uncut answer {resp.status_code}"
            return outages
        outages += _assert_outage_or_ok(resp, f"{what}, cut at query {n} ({'after' if after else 'before'})")
    raise AssertionError(f"{what}: still cutting at query 40")


@pytest.mark.parametrize("after", [False, True], ids=["before-forwarding", "after-forwarding"])
def test_a_create_cut_at_each_statement_is_503_and_its_retry_makes_one_thread(cut_app, database_url, alice, bob, after):
    app, proxy = cut_app
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    run = uuid.uuid4().hex[:8]

    def call(n):
        return post_a2a(client, alice[1], _send_doc(bob[0], f"cut-{run}-{n}", f"k-{run}-{n}"))

    outages = _cut_every_statement(proxy, call, after, "message/send create")
    assert outages, "no cut reached a statement that mattered: the test proves nothing"
    for n in range(1, outages + 3):
        retry = call(n)  # the client's retry, same key, uncut
        assert retry.status_code == 200 and "result" in retry.get_json(), retry.get_data(as_text=True)
        assert _threads_with(database_url, f'cut-{run}-{n}"') == 1, f"key k-{run}-{n}: not exactly one thread"


def test_an_append_a_batch_a_feed_read_and_readyz_cut_anywhere_are_503(cut_app, alice, bob):
    app, proxy = cut_app
    client = app.test_client()
    opened = post_a2a(client, alice[1], _send_doc(bob[0], "thread to append to", "opener"))
    task_id = opened.get_json()["result"]["task_id"]
    feed = f"/api/v1/identities/{bob[0]}/a2a/messages"
    calls = {
        "append": lambda n: post_a2a(
            client, alice[1], _send_doc(bob[0], f"append {n}", f"append-{n}", task_id=task_id)
        ),
        "batch": lambda n: post_a2a(
            client,
            alice[1],
            [_send_doc(bob[0], f"batch {n}", f"batch-{n}"), rpc_doc("tasks/get", {"task_id": task_id})],
        ),
        "feed": lambda n: client.get(feed, headers=bearer(bob[1])),
        "a2a binding": lambda n: post_a2a(
            client,
            alice[1],
            rpc_doc(
                "SendMessage",
                {"message": {"messageId": f"a2a-{n}", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
            ),
            agent=bob[0],
        ),
    }
    for what, call in calls.items():
        assert _cut_every_statement(proxy, call, False, what), f"{what}: no cut answered 503"
        # A cut after forwarding loses an answer only to a query that has another after it on
        # its connection: a feed page is one query (its key guard rides in it), answered before
        # the close, so none of its cuts is an outage (each is still checked to be 200 or 503).
        outages = _cut_every_statement(proxy, call, True, what)
        assert outages or what == "feed", f"{what}: no cut after forwarding answered 503"

    # /readyz's cut also lands in teardown's rollback: it must not escape as gunicorn's 500.
    statuses = []
    for n in range(1, 6):
        proxy.arm(n, after=False)
        ready = client.get("/readyz")
        if not proxy.disarm():
            break
        statuses.append(ready.status_code)
        if ready.status_code == 503:
            assert ready.headers["Retry-After"] == "1"
            assert ready.get_json()["checks"]["database"].startswith("failed"), ready.get_json()
    assert 503 in statuses and set(statuses) <= {200, 503}, statuses
    assert client.get("/readyz").status_code == 200


def test_a_write_refused_by_a_read_only_server_is_an_outage(database_url):
    """A standby answering a write (a failover under way) is retryable, like a lost connection."""
    import psycopg2

    from relay.errors import is_connection_error

    conn = connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
            with pytest.raises(psycopg2.Error) as refused:
                cur.execute("CREATE TABLE never_made (id int)")
    finally:
        conn.close()
    assert refused.value.pgcode == "25006"
    assert is_connection_error(refused.value)


@pytest.fixture
def down_app(base_env, celery_app, redis_url):
    """An app whose database URL names a port nothing listens on: every statement fails."""
    import socket as _socket

    probe = _socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    name = "DATABASE_CONNECTION_POOL_URL" if base_env.get("DATABASE_CONNECTION_POOL_URL") else "DATABASE_URL"
    with extra_app(base_env, celery_app, redis_url, **{name: f"postgresql://postgres@127.0.0.1:{port}/relay"}) as other:
        yield other


def test_every_json_rpc_endpoint_answers_an_outage_as_json_rpc(down_app, alice, bob):
    """With PostgreSQL down for the whole request, both JSON-RPC endpoints answer 503 with a
    JSON-RPC envelope (the request's id, -32603 service_unavailable), never the REST shape."""
    client = down_app.test_client()
    message = {"messageId": "m-down", "role": "ROLE_USER", "parts": [{"text": "while it is down"}]}
    v1 = post_a2a(client, alice[1], rpc_doc("SendMessage", {"message": message}, id=7), agent=bob[0])
    seed = post_a2a(client, alice[1], {**_send_doc(bob[0], "while it is down", "k-down"), "id": 8})
    for resp, id_ in ((v1, 7), (seed, 8)):
        assert resp.status_code == 503, resp.get_data(as_text=True)
        assert resp.headers["Retry-After"] == "1"
        doc = resp.get_json()
        assert doc["jsonrpc"] == "2.0" and doc["id"] == id_, doc
        assert _symbol(doc) == "service_unavailable", doc
        assert doc["error"]["message"] == "the database is unavailable; retry shortly", doc
