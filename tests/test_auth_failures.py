"""Bad keys: one 401 message for every reason, and a per-address budget of failures.

A stranger must not learn a key's state from the answer ("unknown", "revoked",
"malformed", "agent disabled" were all distinct), and a flood of well-formed unknown
keys cost a database lookup each, never a 429.
"""

from __future__ import annotations

import logging
import secrets

import pytest
from sqlalchemy import event

from relay.extensions import db
from tests.conftest import bearer, extra_app

RPC = {"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {}}


@pytest.fixture
def bad_keys(app, make_agent):
    """One key per failure reason: missing, malformed, unknown, revoked, agent disabled."""
    from relay.services.agents import create_key, disable_agent, revoke_key

    make_agent("rev@acme")
    with app.app_context():
        issued = create_key("rev@acme", "to revoke")
        revoke_key(issued.key_id)
    revoked = issued.api_key
    _, disabled = make_agent("dis@acme")
    with app.app_context():
        disable_agent("dis@acme")
    return {
        "missing": None,
        "malformed": "not-a-key",
        "unknown": "ah_live_" + "a" * 32,
        "revoked": revoked,
        "disabled": disabled,
    }


def _headers(key):
    return bearer(key) if key else {}


def test_every_bad_key_gets_the_same_401_and_the_reason_goes_to_the_log(client, bad_keys, caplog):
    caplog.set_level(logging.INFO, logger="relay.transport.auth")
    answers = {}
    for reason, key in bad_keys.items():
        rpc = client.post("/a2a", json=RPC, headers=_headers(key))
        rest = client.get("/api/v1/identities/me", headers=_headers(key))
        assert rpc.status_code == 401 and rest.status_code == 401, reason
        answers[reason] = (rpc.get_json()["error"]["message"], rest.get_json()["error"]["message"])
    missing = answers.pop("missing")
    assert set(answers.values()) == {("invalid API key", "invalid API key")}, answers
    assert missing == (MISSING, MISSING), missing
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "relay.transport.auth")
    for reason in ("missing", "malformed", "unknown", "revoked", "disabled"):
        assert reason in logged, (reason, logged)
    assert all(getattr(r, "request_id", None) for r in caplog.records if r.name == "relay.transport.auth")


MISSING = "missing Authorization header: send 'Authorization: Bearer <API key>'"


def test_only_a_request_without_an_authorization_header_is_told_so(client):
    no_header = client.post("/a2a", json=RPC)
    assert no_header.status_code == 401, no_header.get_data(as_text=True)
    assert no_header.get_json()["error"]["message"] == MISSING
    assert no_header.headers["WWW-Authenticate"] == 'Bearer realm="relay"'
    # A header that is there but names no usable key, whatever is wrong with it: one message.
    for header in ("Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "ah_live_" + "a" * 32):
        resp = client.get("/api/v1/identities/me", headers={"Authorization": header})
        assert resp.status_code == 401, header
        assert resp.get_json()["error"]["message"] == "invalid API key", header
        assert resp.headers["WWW-Authenticate"] == 'Bearer realm="relay"'


@pytest.fixture
def strict_app(base_env, celery_app, redis_url):
    with extra_app(base_env, celery_app, redis_url, RELAY_AUTH_FAILURE_LIMIT="5/minute") as app:
        yield app


def _count_queries(app):
    counter = {"n": 0}

    def before(*_args, **_kw):
        counter["n"] += 1

    with app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", before)
    return counter, lambda: event.remove(engine, "before_cursor_execute", before)


def test_failed_authentications_are_throttled_per_address_before_any_lookup(strict_app):
    client = strict_app.test_client()
    unknown = {"Authorization": "Bearer ah_live_" + "b" * 32}
    addr = {"REMOTE_ADDR": f"127.0.{secrets.randbelow(250)}.{secrets.randbelow(250) + 1}"}
    codes = [client.post("/a2a", json=RPC, headers=unknown, environ_base=addr).status_code for _ in range(5)]
    assert codes == [401] * 5
    counter, stop = _count_queries(strict_app)
    try:
        over = client.post("/a2a", json=RPC, headers=unknown, environ_base=addr)
        rest = client.get("/api/v1/identities/me", headers=unknown, environ_base=addr)
    finally:
        stop()
    assert over.status_code == 429 and rest.status_code == 429
    assert int(over.headers["Retry-After"]) >= 1 and int(rest.headers["Retry-After"]) >= 1
    assert over.get_json()["error"]["code"] == -32003
    assert rest.get_json()["error"]["code"] == "rate_limited"
    assert counter["n"] == 0, "a throttled request still looked its key up"
    # Another address still has its whole budget.
    other = {"REMOTE_ADDR": "127.0.251.9"}
    assert client.post("/a2a", json=RPC, headers=unknown, environ_base=other).status_code == 401


def test_valid_keys_and_public_routes_do_not_spend_the_budget(strict_app):
    from relay.services.agents import create_agent

    with strict_app.app_context():
        _, issued = create_agent(f"ok{secrets.token_hex(3)}@acme", "Ok", "")
    key = issued.api_key
    client = strict_app.test_client()
    addr = {"REMOTE_ADDR": "127.0.252.7"}
    for _ in range(10):
        assert client.post("/a2a", json=RPC, headers=bearer(key), environ_base=addr).status_code == 200
        assert client.get("/healthz", environ_base=addr).status_code == 200
        assert client.get("/api/v1/openapi.json", environ_base=addr).status_code == 200
        assert client.get("/.well-known/agent-card.json", environ_base=addr).status_code == 200
    unknown = {"Authorization": "Bearer ah_live_" + "c" * 32}
    assert client.post("/a2a", json=RPC, headers=unknown, environ_base=addr).status_code == 401


def test_the_budget_follows_the_address_a_trusted_proxy_forwarded(strict_app):
    client = strict_app.test_client()
    unknown = {"Authorization": "Bearer ah_live_" + "d" * 32}
    # The test client's peer is 127.0.0.1, which FORWARDED_ALLOW_IPS trusts by default.
    for _ in range(5):
        h = {**unknown, "X-Forwarded-For": "203.0.113.5"}
        assert client.post("/a2a", json=RPC, headers=h).status_code == 401
    assert client.post("/a2a", json=RPC, headers={**unknown, "X-Forwarded-For": "203.0.113.5"}).status_code == 429
    assert client.post("/a2a", json=RPC, headers={**unknown, "X-Forwarded-For": "203.0.113.6"}).status_code == 401


def test_a_key_that_worked_lately_is_served_from_a_throttled_address(strict_app):
    from relay.services.agents import create_agent

    with strict_app.app_context():
        _, issued = create_agent(f"nat{secrets.token_hex(3)}@acme", "Nat", "")
    client = strict_app.test_client()
    addr = {"REMOTE_ADDR": "127.0.253.4"}  # one address for many agents: a NAT, or relay up
    assert client.post("/a2a", json=RPC, headers=bearer(issued.api_key), environ_base=addr).status_code == 200
    unknown = {"Authorization": "Bearer ah_live_" + "e" * 32}
    for _ in range(5):
        client.post("/a2a", json=RPC, headers=unknown, environ_base=addr)
    assert client.post("/a2a", json=RPC, headers=unknown, environ_base=addr).status_code == 429
    # The neighbour whose key worked a moment ago is not locked out by the other's failures.
    assert client.post("/a2a", json=RPC, headers=bearer(issued.api_key), environ_base=addr).status_code == 200
    # A key never seen working waits out the budget like any other.
    with strict_app.app_context():
        _, fresh = create_agent(f"new{secrets.token_hex(3)}@acme", "New", "")
    assert client.post("/a2a", json=RPC, headers=bearer(fresh.api_key), environ_base=addr).status_code == 429
