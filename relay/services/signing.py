"""Signed A2A agent cards: the signing keys, the cards' JWS signatures, the published key set.

A card is signed the way the stock SDK verifies one (``a2a.utils.signing`` in a2a-sdk 1.3):

- the payload is the RFC 8785 (JCS) canonical form of the card without its ``signatures``
  member and with every empty string, list and object left out (the SDK drops them
  before it canonicalizes, as protobuf's JSON form of the card has none);
- each signature is a compact JWS over those bytes, ``BASE64URL(header).BASE64URL(payload)``
  signed, whose payload segment is then left out (RFC 7515 appendix F, detached content):
  the card's ``signatures`` entry is ``{"protected": <header segment>, "signature": <signature
  segment>}``, the header ``{"alg": "ES256"|"EdDSA", "kid", "jku", "typ": "JOSE"}``. A
  verifier puts ``protected.BASE64URL(JCS(card)).signature`` back together and checks it
  with the key ``kid`` of the JWK Set at ``jku`` (``/.well-known/jwks.json``).

Keys (table ``signing_keys``): every key not retired signs every card, so a card carries
one signature per active key, and two during a rotation. A retired key signs nothing
from the next re-read of the active set (at most :data:`ACTIVE_SECONDS` later in each
process) and stays in the key set for ``RELAY_SIGNING_KEY_GRACE_DAYS`` after its
retirement, so cards signed before it still verify. With no active key at all, the first
card to be signed creates one (:func:`ensure_active_key`: a transaction-scoped advisory
lock, so concurrent first requests in any number of processes make one key). Private keys
are stored encrypted under ``RELAY_SECRET_KEY`` (relay/crypto.py, as webhook secrets are).

Caching, per app (process): the active set is re-read at most every :data:`ACTIVE_SECONDS`;
a decrypted private key is kept :data:`KEY_SECONDS` at most, and dropped as soon as a
re-read no longer lists its key. So signing a card costs no query and no decryption
between re-reads: the canonical form and one signature per key (tens of microseconds).
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from flask import current_app
from jwt import api_jws
from jwt.algorithms import ECAlgorithm, OKPAlgorithm
from sqlalchemy import func, or_, select

from relay import crypto
from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.models import SIGNING_ALGORITHMS, SigningKey
from relay.services import unit_of_work

log = logging.getLogger("relay.signing")

ALGORITHMS = SIGNING_ALGORITHMS
DEFAULT_ALGORITHM = "ES256"  # what the first, automatic key uses: the JOSE algorithm every verifier has
JWKS_PATH = "/.well-known/jwks.json"
#: Seconds a process signs with the active set it last read: a retire (or a new key) takes
#: effect in every web process within this bound.
ACTIVE_SECONDS = 5.0
#: Seconds a decrypted private key stays in memory before it is decrypted again.
KEY_SECONDS = 300.0
JWS_TYPE = "JOSE"  # a2a.utils.signing.ProtectedHeader: typ SHOULD be "JOSE"

# The two-int4 advisory lock serialising key creation and retirement, a key space apart
# from the bigint locks (feeds, contexts, retention) and idempotency's class. "sign", 1.
_LOCK_CLASS, _LOCK_KEY = 0x7369676E, 1
_STATE = "relay_signing"

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@dataclass(frozen=True)
class _Signer:
    kid: str
    alg: str
    key: PrivateKey
    created_at: datetime


@dataclass
class _State:
    """One app's signing cache. Replaced whole, never edited in place by two requests."""

    signers: tuple[_Signer, ...] = ()
    read_at: float = -1e18  # time.monotonic() of the last read of the active set
    decrypted: dict[str, tuple[PrivateKey, float]] = field(default_factory=dict)  # kid -> (key, expires)


def _state() -> _State:
    return current_app.extensions.setdefault(_STATE, _State())


def forget() -> None:
    """Drop this app's cached active set and decrypted keys: the next card re-reads both."""
    current_app.extensions.pop(_STATE, None)


# --------------------------------------------------------------------------- keys


def _new_kid(now: datetime) -> str:
    # The date tells keys apart at a glance in `relay signing-keys list` and in a JWKS.
    return f"{now:%Y%m%d}-{secrets.token_hex(6)}"


def _new_key(alg: str) -> SigningKey:
    if alg not in ALGORITHMS:
        raise invalid("alg", f"must be one of {', '.join(ALGORITHMS)}")
    if alg == "ES256":
        private: PrivateKey = ec.generate_private_key(ec.SECP256R1())
        public = ECAlgorithm.to_jwk(private.public_key(), as_dict=True)
    else:
        private = ed25519.Ed25519PrivateKey.generate()
        public = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
    kid = _new_kid(datetime.now(UTC))
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")
    return SigningKey(
        kid=kid,
        alg=alg,
        public_jwk={**public, "kid": kid, "alg": alg, "use": "sig"},
        private_key_encrypted=crypto.encrypt(pem),
    )


def _lock(session) -> None:
    session.execute(select(func.pg_advisory_xact_lock(_LOCK_CLASS, _LOCK_KEY)))


def _active_count(session, *, besides: str | None = None) -> int:
    query = select(func.count()).select_from(SigningKey).where(SigningKey.retired_at.is_(None))
    if besides is not None:
        query = query.where(SigningKey.kid != besides)
    return session.scalar(query)


def create_key(alg: str = DEFAULT_ALGORITHM) -> SigningKey:
    """Create a signing key (``alg``: ES256 or EdDSA) and return its row; it signs at once.

    "At once": in a process that already signs, from its next re-read of the active set
    (at most ACTIVE_SECONDS). Raises invalid_params for another ``alg``.
    """
    key = _new_key(alg)
    with unit_of_work() as session:
        _lock(session)
        session.add(key)
    return key


def ensure_active_key() -> SigningKey | None:
    """Create a DEFAULT_ALGORITHM key if no key is active; return it, or None when one was.

    Race-safe across threads and processes: a transaction-scoped advisory lock (no session
    state, so it holds behind a transaction-mode pooler) makes the check and the insert
    one step, and whoever waited on the lock sees the key the first one committed.
    """
    with unit_of_work() as session:
        _lock(session)
        if _active_count(session):
            return None
        key = _new_key(DEFAULT_ALGORITHM)
        session.add(key)
    log.info("created signing key %s (%s): no key was active", key.kid, key.alg)
    return key


def retire_key(kid: str) -> tuple[SigningKey, bool]:
    """Retire the key ``kid``: it stops signing (within ACTIVE_SECONDS in each process) and
    stays in the key set for the grace period. Returns ``(row, whether it was active)``;
    retiring a retired key changes nothing.

    Raises not_found for an unknown kid, and invalid_request for the only active key:
    create another first, so the cards never go unsigned (and never fall back on a key
    made automatically that nobody asked for).
    """
    with unit_of_work() as session:
        _lock(session)  # two retires at once cannot both see the other key still active
        key = session.get(SigningKey, kid)
        if key is None:
            raise RelayError("not_found", f"no signing key {kid[:64]!r} (relay signing-keys list shows them)")
        if key.retired_at is not None:
            return key, False
        if not _active_count(session, besides=kid):
            raise RelayError(
                "invalid_request",
                f"{kid} is the only active signing key: create another first (relay signing-keys create), then retire it",
            )
        key.retired_at = datetime.now(UTC)
    return key, True


def grace() -> timedelta:
    """How long a retired key stays in the key set (RELAY_SIGNING_KEY_GRACE_DAYS)."""
    return timedelta(days=current_app.config["RELAY"].signing_key_grace_days)


def list_keys() -> list[dict[str, Any]]:
    """Every signing key, newest first: ``{kid, alg, state, created_at, retired_at, published_until}``.

    ``state`` is ``active`` (signs, published), ``retired`` (published until
    ``published_until``, signs nothing) or ``expired`` (past its grace: neither).
    Times are aware datetimes; ``retired_at`` and ``published_until`` None while active.
    """
    now = datetime.now(UTC)
    rows = db.session.scalars(select(SigningKey).order_by(SigningKey.created_at.desc(), SigningKey.kid)).all()
    out = []
    for key in rows:
        until = key.retired_at + grace() if key.retired_at is not None else None
        state = "active" if until is None else "retired" if until > now else "expired"
        out.append(
            {
                "kid": key.kid,
                "alg": key.alg,
                "state": state,
                "created_at": key.created_at,
                "retired_at": key.retired_at,
                "published_until": until,
            }
        )
    db.session.commit()  # end the read's transaction: nothing of it is kept
    return out


def key_set() -> dict[str, list[dict[str, Any]]]:
    """The RFC 7517 JWK Set to publish: ``{"keys": [public JWK, ...]}``, oldest first.

    The active keys and those retired less than the grace period ago; public members only
    (``kty``, ``crv``, ``x``, ``y`` for EC, ``kid``, ``alg``, ``use: sig``).
    """
    cutoff = func.now() - grace()
    rows = db.session.scalars(
        select(SigningKey.public_jwk)
        .where(or_(SigningKey.retired_at.is_(None), SigningKey.retired_at > cutoff))
        .order_by(SigningKey.created_at, SigningKey.kid)
    ).all()
    return {"keys": list(rows)}


# --------------------------------------------------------------------------- signing


def _active_rows() -> list[tuple[str, str, str, datetime]]:
    return db.session.execute(
        select(SigningKey.kid, SigningKey.alg, SigningKey.private_key_encrypted, SigningKey.created_at)
        .where(SigningKey.retired_at.is_(None))
        .order_by(SigningKey.created_at, SigningKey.kid)
    ).all()


def active_stamp() -> tuple[tuple[str, ...], datetime | None]:
    """The kids of the keys that sign cards now (oldest first) and when the newest of them was
    made (None: no key): what, beside a card's content, changes the card a client is served
    (its ETag, Last-Modified). The same cached set :func:`sign_card` signs with."""
    signers = _signers()
    return tuple(s.kid for s in signers), max((s.created_at for s in signers), default=None)


def _signers() -> tuple[_Signer, ...]:
    """The active keys, decrypted: from the cache, re-read when older than ACTIVE_SECONDS."""
    state = _state()
    now = time.monotonic()
    if now - state.read_at < ACTIVE_SECONDS:
        return state.signers
    rows = _active_rows()
    if not rows:
        ensure_active_key()
        rows = _active_rows()
    decrypted: dict[str, tuple[PrivateKey, float]] = {}
    signers = []
    for kid, alg, encrypted, created_at in rows:
        hit = state.decrypted.get(kid)
        if hit is None or hit[1] <= now:
            try:
                pem = crypto.decrypt(encrypted)
            except ValueError:
                # Not a reason to refuse the card: its other keys still sign it. Rotate:
                # create a key under the current secret, retire this one.
                log.error("cannot decrypt signing key %s: was RELAY_SECRET_KEY changed? It signs nothing", kid)
                continue
            hit = (serialization.load_pem_private_key(pem.encode("ascii"), password=None), now + KEY_SECONDS)
        decrypted[kid] = hit
        signers.append(_Signer(kid, alg, hit[0], created_at))
    # Keys no longer active leave memory here; a concurrent request may still finish
    # signing with the state it read, which is the ACTIVE_SECONDS bound again.
    current_app.extensions[_STATE] = _State(tuple(signers), now, decrypted)
    return tuple(signers)


def _without_empty(value: Any) -> Any:
    """``value`` less its empty strings, lists and objects (recursively; None when all empty).

    What a2a.utils.signing._clean_empty does before canonicalizing: the signed bytes must
    be the ones the SDK's verifier computes from the card it parsed.
    """
    if isinstance(value, dict):
        kept = {k: v for k, v in ((k, _without_empty(v)) for k, v in value.items()) if v is not None}
        return kept or None
    if isinstance(value, list):
        kept_items = [v for v in (_without_empty(v) for v in value) if v is not None]
        return kept_items or None
    if isinstance(value, str) and not value:
        return None
    return value


def signed_payload(card: dict[str, Any]) -> bytes:
    """The bytes a card's signatures sign: RFC 8785 JCS of the card without ``signatures`` and empties.

    Raises rfc8785's errors (CanonicalizationError and its kin) for a value JSON cannot
    hold exactly (a float NaN, an integer past 2**53).
    """
    return rfc8785.dumps(_without_empty({k: v for k, v in card.items() if k != "signatures"}) or {})


def sign_card(card: dict[str, Any], jku: str) -> dict[str, Any]:
    """Return ``card`` with ``signatures``: one ``{"protected", "signature"}`` per active key.

    ``jku`` is the absolute URL of the key set (``<public root>/.well-known/jwks.json``).
    With no active key one is created first (:func:`ensure_active_key`); a key that cannot
    be decrypted is skipped (logged), and with none left the card goes out unsigned.
    Raises the database's errors when the active set must be re-read and cannot be.
    """
    payload = signed_payload(card)
    signatures = []
    for signer in _signers():
        token = api_jws.encode(
            payload, signer.key, algorithm=signer.alg, headers={"kid": signer.kid, "jku": jku, "typ": JWS_TYPE}
        )
        protected, _, signature = token.split(".")
        signatures.append({"protected": protected, "signature": signature})
    out = {k: v for k, v in card.items() if k != "signatures"}
    if signatures:
        out["signatures"] = signatures
    return out
