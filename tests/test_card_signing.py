"""Signed agent cards (relay/services/signing.py): the stock SDK verifier against a live relay.

Each card the relay serves carries JWS signatures over its RFC 8785 canonical form; the
tests verify them with ``a2a.utils.signing.create_signature_verifier`` (a2a-sdk, unmodified)
and keys fetched from the ``jku`` the signature names, as a client would. Rotation,
the grace period, storage, the CLI and the race on the first key run against the
session's PostgreSQL.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
import threading
import time

import pytest
import requests
from a2a.client.card_resolver import parse_agent_card
from a2a.utils.signing import InvalidSignaturesError, NoSignatureError, create_signature_verifier
from jwt import PyJWK
from jwt.exceptions import PyJWKError
from jwt.utils import base64url_decode

from relay.services import signing
from tests.conftest import sql, wait_until

pytestmark = [pytest.mark.timeout(180)]

ALGORITHMS = ["ES256", "EdDSA"]
# A process re-reads the active keys every ACTIVE_SECONDS: what a change may take to show.
SETTLE = signing.ACTIVE_SECONDS + 5


def card_url(base: str, handle: str | None) -> str:
    return (
        f"{base}/a2a/agents/{handle}/.well-known/agent-card.json" if handle else f"{base}/.well-known/agent-card.json"
    )


def fetch(base: str, handle: str | None = None) -> dict:
    resp = requests.get(card_url(base, handle), timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def headers_of(card: dict) -> list[dict]:
    """The decoded protected headers of a card's signatures."""
    return [json.loads(base64url_decode(s["protected"].encode())) for s in card.get("signatures", [])]


def kids(card: dict) -> set[str]:
    return {h["kid"] for h in headers_of(card)}


def verify(card: dict, trusted: str) -> None:
    """Verify ``card`` with the SDK's verifier, fetching each signature's key from its ``jku``
    (only under ``trusted``, the relay's root, as a client should). Raises what the SDK raises."""
    fetched: dict[str, dict] = {}

    def key_provider(kid: str | None, jku: str | None) -> PyJWK:
        if not jku or not jku.startswith(trusted + "/"):
            raise PyJWKError(f"untrusted jku {jku!r}")
        if jku not in fetched:
            resp = requests.get(jku, timeout=10)
            assert resp.status_code == 200, resp.text
            fetched[jku] = resp.json()
        for jwk in fetched[jku]["keys"]:
            if jwk["kid"] == kid:
                return PyJWK(jwk)
        raise PyJWKError(f"no key {kid!r} in {jku}")  # the SDK tries the card's next signature

    create_signature_verifier(key_provider, ALGORITHMS)(parse_agent_card(copy.deepcopy(card)))


def active_kids(app) -> set[str]:
    return {r[0] for r in sql(app, "SELECT kid FROM signing_keys WHERE retired_at IS NULL")}


def settled_card(app, base: str, handle: str | None = None) -> dict:
    """A card signed by exactly the keys active now. The tables are emptied between tests, and
    a live web process keeps signing with the keys it read for up to ACTIVE_SECONDS."""

    def current():
        card = fetch(base, handle)
        return card if kids(card) and kids(card) == active_kids(app) else None

    return wait_until(current, timeout=SETTLE, what="a card signed by the active keys", interval=0.2)


def card_signed_by(base: str, handle: str, expected: set[str]) -> dict:
    """The card once it is signed by exactly the keys ``expected`` (within SETTLE seconds)."""

    def current():
        card = fetch(base, handle)
        return card if kids(card) == expected else None

    return wait_until(current, timeout=SETTLE, what=f"a card signed by {sorted(expected)}", interval=0.2)


@pytest.fixture
def relay(base_env, tmp_path):
    """Run the real ``relay`` console script; return the CompletedProcess."""
    env = {**base_env, "RELAY_HOME": str(tmp_path / "relay-home")}

    def _run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "relay.ops.cli", *args], env=env, cwd=tmp_path, capture_output=True, text=True
        )

    return _run


def one_line_error(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# --------------------------------------------------------------------------- verifying


def test_served_cards_verify_with_the_sdk_verifier_and_keys_from_the_jwks(app, make_agent, relay_url):
    bob = make_agent("bob@sign", name="Bób ✓", role="backend")[0]  # non-ASCII: JCS is UTF-8, not \\u escapes
    card = settled_card(app, relay_url, bob)
    verify(card, relay_url)
    verify(settled_card(app, relay_url), relay_url)  # the relay's own card too

    (header,) = headers_of(card)
    assert header == {
        "alg": "ES256",  # the automatic first key's
        "kid": header["kid"],
        "jku": f"{relay_url}/.well-known/jwks.json",
        "typ": "JOSE",
    }
    assert set(card["signatures"][0]) == {"protected", "signature"}  # detached: no payload in the card

    resp = requests.get(f"{relay_url}/.well-known/jwks.json", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("application/jwk-set+json")
    assert resp.headers["Cache-Control"] == "public, max-age=60"
    (jwk,) = resp.json()["keys"]
    assert set(jwk) == {"kty", "crv", "x", "y", "kid", "alg", "use"}  # public members only: no "d"
    assert (jwk["kty"], jwk["crv"], jwk["kid"], jwk["alg"], jwk["use"]) == (
        "EC",
        "P-256",
        header["kid"],
        "ES256",
        "sig",
    )


def test_a_tampered_card_fails_verification(app, make_agent, relay_url):
    bob = make_agent("bob@sign", name="Bob")[0]
    carol = make_agent("carol@sign", name="Carol")[0]
    card = settled_card(app, relay_url, bob)
    verify(card, relay_url)

    for change in (
        lambda c: c.update(description=c["description"] + "."),
        lambda c: c["supportedInterfaces"][0].update(url="https://evil.example/a2a"),
        lambda c: c["skills"][0]["tags"].append("extra"),
        lambda c: c["capabilities"].update(streaming=False),
    ):
        tampered = copy.deepcopy(card)
        change(tampered)
        with pytest.raises(InvalidSignaturesError):
            verify(tampered, relay_url)

    other = settled_card(app, relay_url, carol)  # a genuine signature, of another card
    with pytest.raises(InvalidSignaturesError):
        verify({**copy.deepcopy(card), "signatures": other["signatures"]}, relay_url)
    with pytest.raises(NoSignatureError):
        verify({k: v for k, v in card.items() if k != "signatures"}, relay_url)


# --------------------------------------------------------------------------- rotation and grace


def test_rotation_signs_with_the_new_key_and_old_cards_verify_until_the_grace_ends(app, make_agent, relay, relay_url):
    bob = make_agent("bob@sign", name="Bob")[0]
    before = settled_card(app, relay_url, bob)  # fetched before the rotation: the old key only
    (old,) = kids(before)

    created = relay("signing-keys", "create", "--alg", "EdDSA", "--json")
    assert created.returncode == 0, created.stderr
    new = json.loads(created.stdout)["kid"]
    # Both sign while both are active, so a verifier whose cached key set lacks the new key still verifies.
    both = card_signed_by(relay_url, bob, {old, new})
    verify(both, relay_url)

    retired = relay("signing-keys", "retire", old)
    assert retired.returncode == 0, retired.stderr
    assert retired.stdout.startswith(f"retired {old}; it stays in the key set until ")
    after = card_signed_by(relay_url, bob, {new})  # within ACTIVE_SECONDS of the retire
    assert [h["alg"] for h in headers_of(after)] == ["EdDSA"]
    verify(after, relay_url)
    published = {k["kid"] for k in requests.get(f"{relay_url}/.well-known/jwks.json", timeout=10).json()["keys"]}
    assert published == {old, new}
    verify(before, relay_url)  # within the grace period (7 days by default)

    listed = {r["kid"]: r for r in json.loads(relay("signing-keys", "list", "--json").stdout)}
    assert (listed[old]["state"], listed[new]["state"]) == ("retired", "active")

    # The grace is over: the old key leaves the key set, and what it alone signed no longer verifies.
    sql(app, "UPDATE signing_keys SET retired_at = now() - interval '7 days 1 second' WHERE kid = :k", k=old)
    published = {k["kid"] for k in requests.get(f"{relay_url}/.well-known/jwks.json", timeout=10).json()["keys"]}
    assert published == {new}
    with pytest.raises(InvalidSignaturesError):
        verify(before, relay_url)
    verify(fetch(relay_url, bob), relay_url)
    assert json.loads(relay("signing-keys", "list", "--json").stdout)[1]["state"] == "expired"

    # A grace of 0 days takes a retired key out of the set at once (a leaked key).
    sql(app, "UPDATE signing_keys SET retired_at = now() - interval '1 hour' WHERE kid = :k", k=old)
    with app.app_context():
        settings = app.config["RELAY"]
        app.config["RELAY"] = dataclasses.replace(settings, signing_key_grace_days=0)
        try:
            assert [k["kid"] for k in signing.key_set()["keys"]] == [new]
        finally:
            app.config["RELAY"] = settings
        assert [k["kid"] for k in signing.key_set()["keys"]] == [old, new]


# --------------------------------------------------------------------------- storage


def test_private_keys_are_stored_encrypted_under_the_secret_key(app):
    from cryptography.hazmat.primitives import serialization
    from jwt.algorithms import ECAlgorithm

    from relay import crypto

    with app.app_context():
        made = signing.create_key("ES256")
    ((kid, alg, public_jwk, stored),) = sql(
        app, "SELECT kid, alg, public_jwk, private_key_encrypted FROM signing_keys WHERE kid = :k", k=made.kid
    )
    assert alg == "ES256" and "d" not in public_jwk
    assert "PRIVATE KEY" not in stored and "MII" not in stored  # not PEM, nor base64 DER
    with app.app_context():
        pem = crypto.decrypt(stored)
        private = serialization.load_pem_private_key(pem.encode(), password=None)
        assert ECAlgorithm.to_jwk(private.public_key(), as_dict=True).items() <= public_jwk.items()
        d = ECAlgorithm.to_jwk(private, as_dict=True)["d"]
    assert d not in stored
    settings = app.config["RELAY"]
    app.config["RELAY"] = dataclasses.replace(settings, secret_key="another-secret")
    try:
        with app.app_context(), pytest.raises(ValueError, match="RELAY_SECRET_KEY"):
            crypto.decrypt(stored)
    finally:
        app.config["RELAY"] = settings


def test_a_key_that_no_longer_decrypts_is_skipped_and_the_others_sign(app, client, make_agent, caplog):
    bob = make_agent("bob@sign", name="Bob")[0]
    with app.app_context():
        good = signing.create_key("EdDSA")
        bad = signing.create_key("ES256")
    sql(app, "UPDATE signing_keys SET private_key_encrypted = 'gAAAAAnot-fernet' WHERE kid = :k", k=bad.kid)
    with app.app_context():
        signing.forget()
    card = client.get(f"/a2a/agents/{bob}/.well-known/agent-card.json").get_json()
    assert kids(card) == {good.kid}
    assert f"cannot decrypt signing key {bad.kid}" in caplog.text


# --------------------------------------------------------------------------- the CLI


def test_signing_keys_cli_creates_lists_and_retires_with_one_line_errors(app, relay):
    assert relay("signing-keys", "list").stdout == ""
    made = relay("signing-keys", "create")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("created signing key ") and made.stdout.rstrip().endswith("(ES256)")
    first = made.stdout.split()[3]
    second = json.loads(relay("signing-keys", "create", "--alg", "EdDSA", "--json").stdout)
    assert set(second) == {"kid", "alg", "created_at"} and second["alg"] == "EdDSA"

    rows = json.loads(relay("signing-keys", "list", "--json").stdout)
    assert [(r["kid"], r["alg"], r["state"]) for r in rows] == [
        (second["kid"], "EdDSA", "active"),
        (first, "ES256", "active"),
    ]
    assert set(rows[0]) == {"kid", "alg", "state", "created_at", "retired_at", "published_until"}
    text = relay("signing-keys", "list").stdout.splitlines()
    assert len(text) == 2 and text[0].split()[:3] == [second["kid"], "EdDSA", "active"]

    assert one_line_error(relay("signing-keys", "retire", "nope")) == (
        "error: no signing key 'nope' (relay signing-keys list shows them)"
    )
    assert relay("signing-keys", "retire", first).returncode == 0
    # The last active key is refused: cards must never go unsigned, nor fall back on an automatic key.
    line = one_line_error(relay("signing-keys", "retire", second["kid"]))
    assert line == (
        f"error: {second['kid']} is the only active signing key: create another first"
        " (relay signing-keys create), then retire it"
    )
    assert active_kids(app) == {second["kid"]}
    again = relay("signing-keys", "retire", first)  # retiring a retired key changes nothing
    assert again.returncode == 0 and again.stdout.startswith(f"{first} was already retired at ")

    rows = {r["kid"]: r for r in json.loads(relay("signing-keys", "list", "--json").stdout)}
    assert rows[first]["state"] == "retired" and rows[first]["published_until"] > rows[first]["retired_at"]
    assert relay("signing-keys", "create", "--alg", "RS256").returncode == 2  # a usage error, from click


def test_the_grace_setting_is_validated_and_printed(relay, base_env):
    from relay.config import ConfigError, load_settings

    assert load_settings(base_env).signing_key_grace_days == 7
    assert load_settings({**base_env, "RELAY_SIGNING_KEY_GRACE_DAYS": "0"}).signing_key_grace_days == 0
    with pytest.raises(ConfigError, match="RELAY_SIGNING_KEY_GRACE_DAYS must be at least 0"):
        load_settings({**base_env, "RELAY_SIGNING_KEY_GRACE_DAYS": "-1"})
    checked = relay("config", "check")
    assert "signing_key_grace_days     7" in checked.stdout.splitlines()


# --------------------------------------------------------------------------- the first key


ROUNDS, THREADS = 5, 5  # THREADS within the test app's pool (RELAY_DB_POOL_SIZE 5, no overflow)


def test_concurrent_first_requests_create_one_key(app, make_agent):
    """Requests that all find no active key at once (real threads, each its own connection) make one."""
    bob = make_agent("bob@sign", name="Bob")[0]
    for _ in range(ROUNDS):
        sql(app, "DELETE FROM signing_keys")
        with app.app_context():
            signing.forget()
        barrier = threading.Barrier(THREADS)
        cards: list = [None] * THREADS

        def get(i: int) -> None:
            c = app.test_client()
            barrier.wait()
            cards[i] = c.get(f"/a2a/agents/{bob}/.well-known/agent-card.json").get_json()

        threads = [threading.Thread(target=get, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        made = sql(app, "SELECT kid FROM signing_keys")
        assert len(made) == 1, made
        assert all(card is not None and kids(card) == {made[0][0]} for card in cards), cards


def test_cards_sign_with_the_cached_keys_between_rereads(app, client, make_agent, monkeypatch):
    """Signing costs no query while the active set is fresh; a re-read comes after ACTIVE_SECONDS."""
    bob = make_agent("bob@sign", name="Bob")[0]
    url = f"/a2a/agents/{bob}/.well-known/agent-card.json"
    with app.app_context():
        signing.forget()  # an earlier test's keys are gone from the tables
    first = kids(client.get(url).get_json())
    reads = []
    real = signing._active_rows
    monkeypatch.setattr(signing, "_active_rows", lambda: reads.append(1) or real())
    with app.app_context():
        newer = signing.create_key("EdDSA")
    for _ in range(3):
        assert kids(client.get(url).get_json()) == first
    assert reads == []
    clock = time.monotonic
    monkeypatch.setattr(signing.time, "monotonic", lambda: clock() + signing.ACTIVE_SECONDS)
    assert kids(client.get(url).get_json()) == first | {newer.kid}
    assert reads == [1]
