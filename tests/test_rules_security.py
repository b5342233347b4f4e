"""Security rules a one-line change could break with the rest of the suite green.

- An unexpected exception is -32603 (JSON-RPC) / a 500 envelope (REST) carrying the
  request id and no traceback text.
- SSRF: delivery connects to the address it checked, never re-resolving the name (DNS
  rebinding); a few non-global targets missing from tests/test_ssrf.py's table.
- API keys: ``ah_live_`` + 32 of [a-z2-7], from ``secrets.token_bytes(20)`` (160 bits).
- Webhook secrets are encrypted under a key derived from RELAY_SECRET_KEY.
"""

from __future__ import annotations

import base64
import re
import secrets
import socket

import pytest
import urllib3.util.connection

from relay import crypto
from relay.ids import parse_ulid
from relay.services import agents, outbound, threads, webhooks
from tests.conftest import bearer, extra_app, rpc, sql

OTHER_SECRET = "another-relay-secret-key"


@pytest.fixture(scope="module")
def strict(base_env, celery_app, redis_url):
    """A relay as production runs it: private targets refused (plain http allowed for the
    fake host) and its own RELAY_SECRET_KEY, unlike the session's ``app``."""
    with extra_app(
        base_env,
        celery_app,
        redis_url,
        RELAY_WEBHOOK_ALLOW_PRIVATE="0",
        RELAY_WEBHOOK_ALLOW_HTTP="1",
        RELAY_SECRET_KEY=OTHER_SECRET,
    ) as other:
        yield other


# --------------------------------------------------------------------------- rule 4

LEAK_MARKERS = ("Traceback", "RuntimeError", "secret-detail", "/work/", ".py", 'File "')


def _boom(*args, **kwargs):
    raise RuntimeError('secret-detail at File "/work/main/relay/services/threads.py", line 1')


def _assert_no_leak(text: str) -> None:
    leaked = [m for m in LEAK_MARKERS if m in text]
    assert leaked == [], f"internal error answer leaks {leaked}: {text}"


def test_unexpected_exception_answers_32603_with_request_id_and_no_traceback(app, client, alice, bob, monkeypatch):
    a_handle, a_key = alice
    task_id = rpc(
        client, a_key, "message/send", {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "hi"}]}}
    )["task_id"]
    monkeypatch.setattr(threads, "get_thread", _boom)

    resp = client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": 41, "method": "tasks/get", "params": {"task_id": task_id}},
        headers=bearer(a_key),
    )
    text = resp.get_data(as_text=True)
    assert resp.status_code == 200, text
    body = resp.get_json()
    assert body["id"] == 41 and "result" not in body, body
    assert body["error"]["code"] == -32603, body
    assert body["error"]["data"]["symbol"] == "internal_error", body
    request_id = body["error"]["data"]["request_id"]
    assert isinstance(request_id, str) and request_id, body
    assert resp.headers["X-Request-Id"] == request_id
    _assert_no_leak(text)

    resp = client.get(f"/api/v1/identities/{a_handle}/a2a/tasks/{task_id}", headers={**bearer(a_key)})
    text = resp.get_data(as_text=True)
    assert resp.status_code == 500, text
    assert resp.mimetype == "application/json", text
    error = resp.get_json()["error"]
    assert error["code"] == "internal_error", error
    assert error["details"]["request_id"] == resp.headers["X-Request-Id"], (error, resp.headers)
    assert error["details"]["request_id"], error
    _assert_no_leak(text)


# --------------------------------------------------------------------------- rule 5

REBIND_HOST = "hooks.rebind.test"
PUBLIC_IP = "93.184.216.34"


def test_delivery_connects_to_the_checked_address_not_a_rebound_name(strict, alice, monkeypatch):
    """DNS rebinding: the name is public when the relay checks it and loopback right after.
    The delivery must connect to the address it checked, without resolving the name again."""
    handle, key = alice
    real_getaddrinfo = socket.getaddrinfo
    answers: list[str] = []  # what the next look-ups of REBIND_HOST answer; loopback once used up
    lookups: list[str] = []

    def rebinding_getaddrinfo(host, port, *args, **kwargs):
        if host != REBIND_HOST:
            return real_getaddrinfo(host, port, *args, **kwargs)
        ip = answers.pop(0) if answers else "127.0.0.1"
        lookups.append(ip)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))]

    connects: list[tuple[str, int, list[str]]] = []

    def recording_create_connection(address, *args, **kwargs):
        # Where urllib3 would connect: the host it was given, resolved as it would resolve it.
        host, port = address
        resolved = [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
        connects.append((host, port, resolved))
        raise ConnectionRefusedError(f"test: no connection to {host}:{port}")

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_getaddrinfo)
    monkeypatch.setattr(urllib3.util.connection, "create_connection", recording_create_connection)

    client = strict.test_client()
    url = f"http://{REBIND_HOST}:8080/hook"
    answers[:] = [PUBLIC_IP]
    resp = client.post(f"/api/v1/identities/{handle}/webhooks", json={"url": url}, headers=bearer(key))
    assert resp.status_code == 201, resp.get_data(as_text=True)
    hook_id = resp.get_json()["id"]
    resp = client.post(f"/api/v1/identities/{handle}/webhooks/{hook_id}/test", headers=bearer(key))
    assert resp.status_code == 202, resp.get_data(as_text=True)
    with strict.app_context():
        [delivery_id] = webhooks.fan_out(parse_ulid(resp.get_json()["event_id"].removeprefix("evt_")))

    lookups.clear()
    answers[:] = [PUBLIC_IP]  # the check at delivery sees the public address; any later look-up, loopback
    with strict.app_context():
        status = webhooks.deliver(delivery_id)

    assert lookups == [PUBLIC_IP], f"the delivery resolved {REBIND_HOST} again: {lookups}"
    assert connects == [(PUBLIC_IP, 8080, [PUBLIC_IP])], connects
    assert not any("127.0.0.1" in resolved for _h, _p, resolved in connects), connects
    [(error,)] = sql(strict, "SELECT error FROM webhook_attempts WHERE delivery_id = :d", d=str(delivery_id))
    assert status == "pending" and error is not None and not error.startswith("refused"), (status, error)


# Already in tests/test_ssrf.py's TARGETS: http://224.0.0.1/ and http://[fe80::1]/.
NOT_IN_THE_SSRF_TABLE = [
    ("http://100.100.100.200/latest/meta-data/", "100.100.100.200"),  # a cloud metadata address
    ("http://[fd00::1]/", "fd00::1"),
]


@pytest.mark.parametrize(("url", "address"), NOT_IN_THE_SSRF_TABLE)
def test_resolve_refuses_non_global_targets(url, address):
    with pytest.raises(outbound.TargetRefused) as exc:
        outbound.resolve(url, allow_private=False, allow_http=True)
    assert address in str(exc.value), str(exc.value)
    outbound.resolve(url, allow_private=True, allow_http=True)  # refused for the address alone


# --------------------------------------------------------------------------- rule 6

KEY_FORMAT = re.compile(r"ah_live_[a-z2-7]{32}")


def test_api_keys_are_160_bits_from_secrets_token_bytes(app, make_agent, monkeypatch):
    asked: list[int | None] = []
    given: list[bytes] = []
    real_token_bytes = secrets.token_bytes

    def recording_token_bytes(nbytes=None):
        asked.append(nbytes)
        value = real_token_bytes(nbytes)
        given.append(value)
        return value

    def key_of(raw: bytes) -> str:
        return "ah_live_" + base64.b32encode(raw).decode("ascii").lower()

    monkeypatch.setattr(secrets, "token_bytes", recording_token_bytes)
    _handle, key = make_agent("keys@acme")
    assert asked == [20]
    assert key == key_of(given[0])
    with app.app_context():
        issued = agents.create_key("keys@acme", "second")
    assert asked == [20, 20]
    assert issued.api_key == key_of(given[1])

    monkeypatch.setattr(secrets, "token_bytes", real_token_bytes)
    keys = {agents.generate_api_key() for _ in range(200)}
    assert len(keys) == 200
    assert all(KEY_FORMAT.fullmatch(k) for k in keys), sorted(keys)[:3]


# --------------------------------------------------------------------------- rule 7


def test_webhook_secrets_are_encrypted_under_relay_secret_key(app, strict, base_env):
    with app.app_context():
        token = crypto.encrypt("whsec_c2VjcmV0")
        assert "whsec_c2VjcmV0" not in token and "c2VjcmV0" not in token
        assert crypto.decrypt(token) == "whsec_c2VjcmV0"
    with strict.app_context():
        with pytest.raises(ValueError, match="RELAY_SECRET_KEY"):
            crypto.decrypt(token)
        theirs = crypto.encrypt("whsec_c2VjcmV0")
        assert crypto.decrypt(theirs) == "whsec_c2VjcmV0"
    with app.app_context():
        with pytest.raises(ValueError, match="RELAY_SECRET_KEY"):
            crypto.decrypt(theirs)
    # The key is derived from the setting itself: any process with the same RELAY_SECRET_KEY reads it.
    assert crypto._fernet(base_env["RELAY_SECRET_KEY"]).decrypt(token.encode("ascii")) == b"whsec_c2VjcmV0"
    assert crypto._fernet(OTHER_SECRET).decrypt(theirs.encode("ascii")) == b"whsec_c2VjcmV0"
