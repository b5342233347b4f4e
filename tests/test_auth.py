"""Bearer authentication on GET /api/v1/identities/me and handle normalisation."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from relay.errors import RelayError
from relay.extensions import db
from relay.models import ApiKey
from relay.services.agents import create_key, disable_agent, key_digest, normalize_handle, revoke_key
from tests.conftest import bearer

ME = "/api/v1/identities/me"
WELL_FORMED_UNKNOWN = "ah_live_" + "a" * 32


def _key_id(app, key: str):
    with app.app_context():
        return db.session.scalar(select(ApiKey.id).where(ApiKey.digest == key_digest(key)))


def _assert_unauthenticated(resp):
    assert resp.status_code == 401
    assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")
    body = resp.get_json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == "unauthenticated"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def test_me_returns_exactly_the_identity_fields(client, make_agent):
    handle, key = make_agent("frank@acme", name="Frank", role="frontend")
    resp = client.get(ME, headers=bearer(key))
    assert resp.status_code == 200
    body = resp.get_json()
    assert set(body) == {"handle", "name", "role", "org", "created_at"}
    assert body["handle"] == "frank@acme"
    assert body["name"] == "Frank"
    assert body["role"] == "frontend"
    assert body["org"] == "acme"
    assert datetime.fromisoformat(body["created_at"]).tzinfo is not None


def test_missing_authorization_header_is_401(client):
    _assert_unauthenticated(client.get(ME))


def test_non_bearer_scheme_is_401(client, make_agent):
    _handle, key = make_agent("frank@acme")
    _assert_unauthenticated(client.get(ME, headers={"Authorization": "Basic ZnJhbms6c2VjcmV0"}))
    # even a valid key is refused when presented under another scheme
    _assert_unauthenticated(client.get(ME, headers={"Authorization": f"Token {key}"}))


def test_malformed_key_is_401(client):
    _assert_unauthenticated(client.get(ME, headers=bearer("not-a-key")))


def test_well_formed_unknown_key_is_401(client, make_agent):
    make_agent("frank@acme")
    _assert_unauthenticated(client.get(ME, headers=bearer(WELL_FORMED_UNKNOWN)))


def test_revoked_key_is_401(app, client, make_agent):
    _handle, key = make_agent("frank@acme")
    assert client.get(ME, headers=bearer(key)).status_code == 200
    with app.app_context():
        revoke_key(_key_id(app, key))
    _assert_unauthenticated(client.get(ME, headers=bearer(key)))


def test_disabled_agent_is_401(app, client, make_agent):
    handle, key = make_agent("frank@acme")
    assert client.get(ME, headers=bearer(key)).status_code == 200
    with app.app_context():
        disable_agent(handle)
    _assert_unauthenticated(client.get(ME, headers=bearer(key)))


def test_second_key_keeps_working_after_first_revoked(app, client, make_agent):
    handle, first = make_agent("frank@acme")
    with app.app_context():
        second = create_key(handle, "second")
    first_id = _key_id(app, first)
    assert first_id is not None and first_id != second.key_id
    with app.app_context():
        revoke_key(first_id)
    _assert_unauthenticated(client.get(ME, headers=bearer(first)))
    resp = client.get(ME, headers=bearer(second.api_key))
    assert resp.status_code == 200
    assert resp.get_json()["handle"] == "frank@acme"


def test_upper_case_handle_is_lower_cased(client, make_agent):
    handle, key = make_agent("Frank@ACME")
    assert handle == "frank@acme"
    assert normalize_handle("  BOB@Acme.Example ") == "bob@acme.example"
    assert client.get(ME, headers=bearer(key)).get_json()["handle"] == "frank@acme"


@pytest.mark.parametrize(
    "raw", ["frankacme", "frank @acme", "frank@ac me", "@acme", "", "   ", "fränk@acme", "frank@acmé"]
)
def test_malformed_handle_is_invalid_params(raw):
    with pytest.raises(RelayError) as info:
        normalize_handle(raw)
    assert info.value.symbol == "invalid_params"


def test_create_agent_with_malformed_handle_is_invalid_params(make_agent):
    with pytest.raises(RelayError) as info:
        make_agent("frank@")
    assert info.value.symbol == "invalid_params"
