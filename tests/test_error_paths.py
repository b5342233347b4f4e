"""One unexpected-error path for every surface, JSON for every refusal, nothing private in the logs.

Against a live stack (gunicorn and a Celery worker, tests/live.py):

- a database error carrying a message body (a trigger in the test database refuses any
  row holding a marker, quoting the row in its error) through every surface answers the
  surface's 500 envelope, and the marker is in no log line of the web process or the
  worker (relay/transport/errors.py, relay.errors.log_unexpected, workers.FlaskTask);
- requests gunicorn refuses before the app sees them (a 10 KB header, a negative
  Content-Length, Content-Length with Transfer-Encoding, a request line too long) are
  answered over a raw socket in the JSON envelope of their path's surface, naming the
  problem (relay/transport/server.py).
"""

from __future__ import annotations

import re
import secrets
import socket
import uuid
from urllib.parse import urlsplit

import orjson
import pytest
import requests
from celery import Celery

from relay.ids import parse_ulid
from tests.conftest import bearer, rpc, sql, wait_until
from tests.console import csrf_from, make_operator

pytestmark = pytest.mark.timeout(180)

TOKEN = secrets.token_hex(6)
WEB_MARKER = f"zqweb{TOKEN}"  # refused when written
WORK_MARKER = f"zqwork{TOKEN}"  # written, then refused when the worker indexes it

_INSTALL = f"""
CREATE OR REPLACE FUNCTION relay_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (TG_OP = 'INSERT' AND row_to_json(NEW)::text LIKE '%{WEB_MARKER}%')
       OR (TG_OP = 'UPDATE' AND row_to_json(NEW)::text LIKE '%{WORK_MARKER}%') THEN
        RAISE EXCEPTION 'refused row %', row_to_json(NEW)::text;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER relay_test_refuse BEFORE INSERT OR UPDATE ON messages
    FOR EACH ROW EXECUTE FUNCTION relay_test_refuse();
CREATE TRIGGER relay_test_refuse BEFORE INSERT OR UPDATE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION relay_test_refuse();
"""
_REMOVE = """
DROP TRIGGER IF EXISTS relay_test_refuse ON messages;
DROP TRIGGER IF EXISTS relay_test_refuse ON api_keys;
DROP FUNCTION IF EXISTS relay_test_refuse();
"""


@pytest.fixture(scope="module")
def refusing(app, relay_url):
    """The live relay, its database refusing rows that hold the markers (removed after the module)."""
    sql(app, _INSTALL)
    try:
        yield relay_url
    finally:
        sql(app, _REMOVE)


@pytest.fixture
def pair(make_agent):
    alice = make_agent("alice@acme", role="frontend")
    bob = make_agent("bob@acme")
    return alice, bob


def _text(text: str) -> dict:
    return {"parts": [{"type": "text", "text": text}]}


def _a2a_message(text: str) -> dict:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}


def _no_marker_logged(stack) -> None:
    for name in ("web", "worker"):
        lines = [line for line in stack.log(name).splitlines() if WEB_MARKER in line or WORK_MARKER in line]
        assert lines == [], f"{len(lines)} lines of the {name} log hold a message body, as: {lines[0][:600]}"


def _logged_failure(stack, request_id: str) -> dict:
    """The web log's error line for ``request_id``: class and SQLSTATE P0001 (the trigger's)."""

    def find():
        for line in stack.log("web").splitlines():
            if request_id in line and '"P0001"' in line:
                return orjson.loads(line)
        return None

    record = wait_until(find, timeout=10, what=f"the error line of request {request_id}")
    assert record["pgcode"] == "P0001" and "RaiseException" in record["error_class"], record
    return record


# --------------------------------------------------------------------------- one unexpected-error path


def test_seed_jsonrpc_answers_internal_error_and_logs_no_body(refusing, pair):
    (_alice, alice_key), (bob, _) = pair
    resp = requests.post(
        f"{refusing}/a2a",
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "message/send",
            "params": {"recipient": bob, "message": _text(WEB_MARKER)},
        },
        headers=bearer(alice_key),
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"] == 7 and body["error"]["code"] == -32603, body
    assert body["error"]["data"] == {"symbol": "internal_error", "request_id": resp.headers["X-Request-Id"]}, body
    assert WEB_MARKER not in resp.text
    _logged_failure(refusing.stack, resp.headers["X-Request-Id"])
    _no_marker_logged(refusing.stack)


def test_a2a_jsonrpc_answers_internal_error_and_logs_no_body(refusing, pair):
    (_alice, alice_key), (bob, _) = pair
    resp = requests.post(
        f"{refusing}/a2a/agents/{bob}",
        json={"jsonrpc": "2.0", "id": "s", "method": "SendMessage", "params": {"message": _a2a_message(WEB_MARKER)}},
        headers={**bearer(alice_key), "A2A-Version": "1.0"},
        timeout=30,
    )
    assert resp.status_code == 200, resp.text
    error = resp.json()["error"]
    assert error["code"] == -32603, error
    [info] = error["data"]
    assert info["reason"] == "INTERNAL_ERROR" and info["metadata"]["symbol"] == "internal_error", info
    assert info["metadata"]["request_id"] == resp.headers["X-Request-Id"], info
    assert WEB_MARKER not in resp.text
    _logged_failure(refusing.stack, resp.headers["X-Request-Id"])
    _no_marker_logged(refusing.stack)


def test_a2a_http_answers_500_internal_and_logs_no_body(refusing, pair):
    (_alice, alice_key), (bob, _) = pair
    resp = requests.post(
        f"{refusing}/a2a/agents/{bob}/http/message:send",
        json={"message": _a2a_message(WEB_MARKER)},
        headers={**bearer(alice_key), "A2A-Version": "1.0"},
        timeout=30,
    )
    assert resp.status_code == 500, resp.text
    error = resp.json()["error"]
    assert error["code"] == 500 and error["status"] == "INTERNAL", error
    assert error["details"][0]["metadata"]["request_id"] == resp.headers["X-Request-Id"], error
    assert WEB_MARKER not in resp.text
    _logged_failure(refusing.stack, resp.headers["X-Request-Id"])
    _no_marker_logged(refusing.stack)


def test_rest_answers_500_internal_error_and_logs_no_body(refusing, pair, client):
    (alice, alice_key), (bob, _) = pair
    task = rpc(client, alice_key, "message/send", {"recipient": bob, "message": _text("a first message")})["task_id"]
    resp = requests.post(
        f"{refusing}/api/v1/identities/{alice}/a2a/tasks/{task}/messages",
        json={"message": _text(WEB_MARKER)},
        headers=bearer(alice_key),
        timeout=30,
    )
    assert resp.status_code == 500, resp.text
    error = resp.json()["error"]
    assert error["code"] == "internal_error", error
    assert error["details"] == {"request_id": resp.headers["X-Request-Id"]}, error
    assert WEB_MARKER not in resp.text
    _logged_failure(refusing.stack, resp.headers["X-Request-Id"])
    _no_marker_logged(refusing.stack)


def test_console_answers_a_500_page_and_logs_no_body(refusing, pair, app):
    _alice, (bob, _) = pair
    email = f"ops-{TOKEN}@acme.test"
    password = make_operator(app, email, "acme")
    session = requests.Session()
    token = csrf_from(session.get(f"{refusing}/console/login", timeout=30).text)
    signed_in = session.post(
        f"{refusing}/console/login",
        data={"email": email, "password": password, "csrf_token": token},
        allow_redirects=False,
        timeout=30,
    )
    assert signed_in.status_code == 303, signed_in.text
    token = csrf_from(session.get(f"{refusing}/console/agents/{bob}/keys", timeout=30).text)
    resp = session.post(
        f"{refusing}/console/agents/{bob}/keys", data={"label": WEB_MARKER, "csrf_token": token}, timeout=30
    )
    assert resp.status_code == 500, resp.text
    assert resp.headers["Content-Type"].startswith("text/html"), resp.headers
    assert resp.headers["X-Request-Id"] in resp.text
    assert WEB_MARKER not in resp.text
    _logged_failure(refusing.stack, resp.headers["X-Request-Id"])
    _no_marker_logged(refusing.stack)


def test_a_worker_task_and_the_pump_log_no_body(refusing, pair, app):
    (_alice, alice_key), (bob, _) = pair
    # Sent through the live relay: its worker's webhook pump indexes the message, and fails.
    resp = requests.post(
        f"{refusing}/a2a",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": bob, "message": _text(WORK_MARKER)},
        },
        headers=bearer(alice_key),
        timeout=30,
    )
    task = resp.json()["result"]["task_id"]
    [(message_id,)] = sql(app, "SELECT id::text FROM messages WHERE thread_id = :t", t=str(parse_ulid(task)))
    # The live worker's own broker: the task runs there, its search update refused.
    broker = Celery(broker=refusing.stack.env["REDIS_URL"])
    try:
        broker.send_task("workers.tasks.index_message", [message_id])
    finally:
        broker.close()
    stack = refusing.stack

    def failed() -> bool:
        log = stack.log("worker")
        return "webhook pump cycle failed" in log and re.search(r"index_message\[.*raised unexpected", log)

    wait_until(failed, timeout=30, what="the index task's failure in the worker log")
    _no_marker_logged(stack)
    record = next(
        orjson.loads(line)
        for line in stack.log("worker").splitlines()
        if '"task workers.tasks.index_message failed' in line
    )
    assert record["pgcode"] == "P0001" and record["task_id"], record
    pump = next(orjson.loads(line) for line in stack.log("worker").splitlines() if "webhook pump cycle failed" in line)
    assert pump["pgcode"] == "P0001", pump
    assert re.search(r"raised unexpected: TaskFailed\('\S+RaiseException P0001'\)", stack.log("worker"))


# --------------------------------------------------------------------------- server-level refusals

# One path per surface, and how to read its envelope: (symbol, message) of the error.
SURFACES = {
    "seed": "/a2a",
    "a2a": "/a2a/agents/bob@acme",
    "a2a_http": "/a2a/agents/bob@acme/http/message:send",
    "rest": "/api/v1/identities/alice@acme/a2a/tasks",
    "console": "/console/login",
}


def _raw(relay_url: str, head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (a whole request) on a new connection; return the status, headers and body."""
    parts = urlsplit(relay_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body


def _error_of(surface: str, status: int, headers: dict, body: bytes) -> tuple[str, str]:
    """The envelope's (symbol, message), after checking it is ``surface``'s shape for ``status``."""
    if surface == "console":
        assert headers["content-type"].startswith("text/html"), headers
        text = body.decode()
        assert f"<h1>{status}</h1>" in text, text
        return "", re.sub(r"<[^>]+>", " ", text)
    doc = orjson.loads(body)
    if surface in ("seed", "a2a"):
        assert headers["content-type"] == "application/json", headers
        assert doc["jsonrpc"] == "2.0" and doc["id"] is None and doc["error"]["code"] == -32600, doc
        data = doc["error"]["data"]
        symbol = data["symbol"] if surface == "seed" else data[0]["metadata"]["symbol"]
        return symbol, doc["error"]["message"]
    if surface == "a2a_http":
        assert headers["content-type"] == "application/json", headers
        error = doc["error"]
        assert error["code"] == status and error["status"] == "INVALID_ARGUMENT", error
        return error["details"][0]["metadata"]["symbol"], error["message"]
    assert headers["content-type"] == "application/json", headers
    return doc["error"]["code"], doc["error"]["message"]


def _head(path: str, *lines: str) -> bytes:
    return "\r\n".join([f"POST {path} HTTP/1.1", "Host: relay.test", *lines, "", ""]).encode()


@pytest.mark.parametrize("surface", SURFACES)
def test_a_10kb_header_is_431_in_the_surfaces_json(relay_url, surface):
    status, headers, body = _raw(relay_url, _head(SURFACES[surface], f"Authorization: Bearer {'k' * 10_240}"))
    assert status == 431, body
    symbol, message = _error_of(surface, status, headers, body)
    assert symbol in ("headers_too_large", ""), symbol
    assert "header fields are too large" in message, message


@pytest.mark.parametrize("surface", SURFACES)
def test_a_negative_content_length_is_400_in_the_surfaces_json(relay_url, surface):
    status, headers, body = _raw(relay_url, _head(SURFACES[surface], "Content-Length: -1"))
    assert status == 400, body
    symbol, message = _error_of(surface, status, headers, body)
    assert symbol in ("invalid_request", ""), symbol
    assert "Content-Length header must be a non-negative" in message, message


@pytest.mark.parametrize("surface", SURFACES)
def test_content_length_with_transfer_encoding_is_400_in_the_surfaces_json(relay_url, surface):
    head = _head(SURFACES[surface], "Content-Length: 5", "Transfer-Encoding: chunked") + b"0\r\n\r\n"
    status, headers, body = _raw(relay_url, head)
    assert status == 400, body
    symbol, message = _error_of(surface, status, headers, body)
    assert symbol in ("invalid_request", ""), symbol
    assert "Content-Length and Transfer-Encoding together are refused" in message, message


@pytest.mark.parametrize("surface", SURFACES)
def test_a_request_line_too_long_is_414_in_the_surfaces_json(relay_url, surface):
    status, headers, body = _raw(relay_url, _head(f"{SURFACES[surface]}?q={'x' * 9000}"))
    assert status == 414, body
    symbol, message = _error_of(surface, status, headers, body)
    assert symbol in ("request_line_too_long", ""), symbol
    assert "request line is longer than 8190 bytes" in message, message


# --------------------------------------------------------------------------- the root page


def test_the_root_page_links_the_console_the_api_document_and_health(client):
    resp = client.get("/")
    assert resp.status_code == 200 and resp.mimetype == "text/html", resp.get_data(as_text=True)
    links = re.findall(r'href="([^"]+)"', resp.get_data(as_text=True))
    assert {"/console/", "/api/v1/openapi.json", "/healthz"} <= set(links), links
    for link in links:  # each one answers, none is a 404
        answer = client.get(link)
        assert answer.status_code in (200, 302, 503), (link, answer.status_code)


def test_a_rest_body_that_is_not_json_is_400_parse_error(client, pair):
    (alice, alice_key), (bob, _) = pair
    task = rpc(client, alice_key, "message/send", {"recipient": bob, "message": _text("hello")})["task_id"]
    url = f"/api/v1/identities/{alice}/a2a/tasks/{task}/messages"
    for body in (b'{"message":', b"NaN", b""):
        resp = client.post(url, data=body, headers={**bearer(alice_key), "Content-Type": "application/json"})
        assert resp.status_code == 400, (body, resp.get_data(as_text=True))
        error = resp.get_json()["error"]
        assert error["code"] == "parse_error" and error["details"]["reason"], error
    # JSON that is not an object is still a bad params body: 422 naming it.
    resp = client.post(url, json=[1], headers=bearer(alice_key))
    assert resp.status_code == 422 and resp.get_json()["error"]["details"] == {"body": ["must be a JSON object"]}


# --------------------------------------------------------------------------- the app's own refusals and outages


@pytest.mark.parametrize(
    ("verb", "path", "surface"),
    [
        ("GET", "/a2a", "seed"),
        ("GET", "/a2a/agents/bob@acme", "a2a"),
        ("PUT", "/api/v1/identities/alice@acme/a2a/tasks", "rest"),
    ],
)
def test_a_method_not_allowed_is_405_in_the_surfaces_json(client, verb, path, surface):
    resp = client.open(path, method=verb)
    assert resp.status_code == 405, resp.get_data(as_text=True)
    assert "POST" in resp.headers["Allow"] or "GET" in resp.headers["Allow"], resp.headers
    headers = {k.lower(): v for k, v in resp.headers.items()}
    symbol, _message = _error_of(surface, 405, headers, resp.get_data())
    assert symbol == "method_not_allowed", symbol


def test_a_redis_outage_in_a_method_is_503_with_retry_after(client, pair, monkeypatch):
    import redis

    from relay.services import threads

    (alice, alice_key), (bob, _) = pair
    task = rpc(client, alice_key, "message/send", {"recipient": bob, "message": _text("hello")})["task_id"]

    def unreachable(*args, **kwargs):
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr(threads, "get_thread", unreachable)
    resp = client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"task_id": task}},
        headers=bearer(alice_key),
    )
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1", resp.get_data(as_text=True)
    assert resp.get_json()["error"]["data"]["symbol"] == "service_unavailable"
    resp = client.get(f"/api/v1/identities/{alice}/a2a/tasks/{task}", headers=bearer(alice_key))
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1", resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["code"] == "service_unavailable" and "Redis" in error["message"], error


def test_a_feed_stream_that_fails_ends_with_an_error_event_and_logs_no_body(client, pair, monkeypatch, caplog):
    from relay.services import streams

    (alice, alice_key), _bob = pair

    def failing(self):
        raise RuntimeError(f"a failure quoting {WEB_MARKER}")

    monkeypatch.setattr(streams.Stream, "_read", failing)
    resp = client.get(f"/api/v1/identities/{alice}/a2a/messages/stream", headers=bearer(alice_key), buffered=False)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    text = b"".join(resp.response).decode()  # the stream ends after its error event
    resp.close()
    event = text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0]
    assert orjson.loads(event) == {"code": "internal_error", "message": "internal error"}, text
    assert WEB_MARKER not in text
    assert [r for r in caplog.records if r.name == "relay.errors"], caplog.text
    assert WEB_MARKER not in caplog.text
