"""Agents and their API keys: provisioning, lookup, revocation, authentication."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flask import current_app
from sqlalchemy import select, update
from sqlalchemy.orm import make_transient_to_detached

from relay.errors import RelayError, invalid
from relay.extensions import KeyGenerationMoved, db, expect_key_generation, key_guard_pending
from relay.models import Agent, ApiKey, Generation
from relay.services import after_commit, dispatch, statement_cursor, unit_of_work

# A handle is ``local@org`` (docs/decisions.md, "Handles"): new agents and recipients follow
# the grammar of handle_problem; LEGACY_HANDLE_RE (also the database's handle_format check)
# is the looser pattern of rows made before it, which are still found, listed and disabled.
LEGACY_HANDLE_RE = re.compile(r"[a-z0-9._-]+@[a-z0-9.-]+")
MAX_HANDLE = 320
MAX_ORG = 255  # agents.org
_LOCAL_RE = re.compile(r"[a-z0-9._-]+")
_LABEL_RE = re.compile(r"[a-z0-9-]+")
_ORG_RULE = "the org must be dot-separated labels of a-z, 0-9 and '-'"
KEY_PREFIX = "ah_live_"
KEY_RE = re.compile(r"^ah_live_[a-z2-7]{32}$")
# Throttle for last_used_at: one write per key per minute at most, not one per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def handle_problem(handle: str) -> str | None:
    """Return the rule of the handle grammar that a lower-cased ``handle`` breaks, or None.

    ``local@org``: the local part is a-z, 0-9, '.', '_' and '-' with no leading, trailing
    or doubled '.'; the org is dot-separated labels of a-z, 0-9 and '-', none empty and
    none starting or ending with '-'. So ``x@org.``, ``x@.org``, ``.x@org`` ... are not
    look-alikes of ``x@org`` but refused.
    """
    if len(handle) > MAX_HANDLE:
        return f"must be at most {MAX_HANDLE} characters"
    if handle.count("@") != 1:
        return "must be local@org with exactly one '@'"
    local, org = handle.split("@")
    if not local:
        return "the local part (before '@') is empty"
    if not _LOCAL_RE.fullmatch(local):
        return "the local part may hold only a-z, 0-9, '.', '_' and '-'"
    if local.startswith(".") or local.endswith("."):
        return "the local part must not start or end with '.'"
    if ".." in local:
        return "the local part must not contain '..'"
    if not org:
        return f"{_ORG_RULE}; the org (after '@') is empty"
    if len(org) > MAX_ORG:
        return f"{_ORG_RULE}; the org is longer than {MAX_ORG} characters"
    for label in org.split("."):
        if not label:
            return f"{_ORG_RULE}; a label is empty"
        if not _LABEL_RE.fullmatch(label):
            return f"{_ORG_RULE}; label {label!r} holds another character"
        if label.startswith("-") or label.endswith("-"):
            return f"{_ORG_RULE}; label {label!r} starts or ends with '-'"
    return None


def _refused(raw: str, field: str, problem: str | None) -> RelayError:
    shown = repr(raw) if len(raw) <= MAX_HANDLE else f"{raw[:40]!r}..."
    return invalid(field, f"handle {shown}: {problem}")


def normalize_handle(raw: object, field: str = "handle") -> str:
    """Lower-case a handle used to look an agent up (docs/api.md, "Conventions": handles are lower-cased).

    Accepts every handle an existing row may have (LEGACY_HANDLE_RE); a new agent or a
    recipient must also pass check_handle. Raises RelayError(invalid_params) naming
    ``field`` and the broken rule when malformed.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise invalid(field, "must be a handle such as frank@acme")
    handle = raw.strip().lower()
    if len(handle) > MAX_HANDLE or not LEGACY_HANDLE_RE.fullmatch(handle):
        raise _refused(raw, field, handle_problem(handle))
    return handle


def check_handle(raw: object, field: str = "handle") -> str:
    """Lower-case a handle that names a new agent or a message's recipient; enforce the grammar.

    Raises RelayError(invalid_params) naming ``field`` and the broken rule (handle_problem).
    """
    handle = normalize_handle(raw, field)
    problem = handle_problem(handle)
    if problem is not None:
        raise _refused(raw, field, problem)
    return handle


def generate_api_key() -> str:
    """Return a new key: ``ah_live_`` + 32 lower-case base32 characters (160 random bits)."""
    return KEY_PREFIX + base64.b32encode(secrets.token_bytes(20)).decode("ascii").lower()


def key_digest(key: str) -> bytes:
    """Return the SHA-256 digest under which a key is stored."""
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True)
class IssuedKey:
    """A key as shown once at creation: the plaintext never comes back."""

    key_id: uuid.UUID
    api_key: str
    created_at: datetime


def _issue_key(session, agent: Agent, label: str) -> IssuedKey:
    plaintext = generate_api_key()
    key = ApiKey(agent_id=agent.id, digest=key_digest(plaintext), label=label, hint=plaintext[-4:])
    session.add(key)
    session.flush()
    return IssuedKey(key.id, plaintext, key.created_at)


def get_agent(handle: str) -> Agent | None:
    """Return the agent with this (normalised) handle, or None."""
    return db.session.scalar(select(Agent).where(Agent.handle == handle))


def require_agent(handle: str, field: str = "handle") -> Agent:
    """Return the agent for ``handle``; raise identity_not_found if there is none."""
    agent = get_agent(normalize_handle(handle, field))
    if agent is None:
        raise RelayError("identity_not_found", f"no agent {handle!r}")
    return agent


def create_agent(handle: str, name: str, role: str = "", label: str = "initial") -> tuple[Agent, IssuedKey]:
    """Create an agent with its first key; raise agent_exists or invalid_params (check_handle)."""
    handle = check_handle(handle)
    if not name or len(name) > 200:
        raise invalid("name", "must be 1-200 characters")
    if len(role) > 200:
        raise invalid("role", "must be at most 200 characters")
    with unit_of_work() as session:
        if get_agent(handle) is not None:
            raise RelayError("agent_exists", f"agent {handle} already exists")
        agent = Agent(handle=handle, org=handle.split("@", 1)[1], name=name, role=role)
        session.add(agent)
        session.flush()
        issued = _issue_key(session, agent, label)
    return agent, issued


def list_agents() -> list[Agent]:
    """Return every agent ordered by handle."""
    return list(db.session.scalars(select(Agent).order_by(Agent.handle)))


def disable_agent(handle: str) -> Agent:
    """Disable an agent: its keys stop authenticating, deliveries to its endpoints are held,
    and the other party of its threads can append no more (``recipient_disabled``).

    Raise identity_not_found.
    """
    with unit_of_work():
        agent = require_agent(handle)
        if agent.disabled_at is None:
            agent.disabled_at = datetime.now(UTC)
            # Its waits and streams re-authenticate at once and end (services/streams.py).
            after_commit(lambda agent_id=agent.id: dispatch.wake([agent_id]))
    return agent


def mark_enabled(handle: str) -> Agent:
    """Clear an agent's ``disabled_at`` in the caller's unit of work; return it.

    The use case is ``webhooks.enable_agent``, which also releases the agent's held
    deliveries in the same transaction (the ledger side never calls the outbound side).
    Raise identity_not_found.
    """
    agent = require_agent(handle)
    agent.disabled_at = None
    return agent


def create_key(handle: str, label: str = "") -> IssuedKey:
    """Issue one more key for an agent; the plaintext is returned once.

    ``label`` is a note of at most 200 characters (longer is invalid_params naming
    ``label``); raises identity_not_found for an unknown handle.
    """
    if len(label) > 200:
        raise invalid("label", "must be at most 200 characters")
    with unit_of_work() as session:
        agent = require_agent(handle)
        issued = _issue_key(session, agent, label)
    return issued


def list_keys(agent: Agent) -> list[ApiKey]:
    """Return an agent's keys, newest first."""
    return list(
        db.session.scalars(
            select(ApiKey).where(ApiKey.agent_id == agent.id).order_by(ApiKey.created_at.desc(), ApiKey.id)
        )
    )


def revoke_key(key_id: str | uuid.UUID, owner: Agent | None = None) -> ApiKey:
    """Revoke a key by id (optionally only one of ``owner``'s); raise key_not_found."""
    try:
        kid = key_id if isinstance(key_id, uuid.UUID) else uuid.UUID(str(key_id))
    except ValueError:
        raise invalid("key_id", "must be a UUID") from None
    with unit_of_work() as session:
        key = session.get(ApiKey, kid)
        if key is None or (owner is not None and key.agent_id != owner.id):
            raise RelayError("key_not_found", f"no key {kid}")
        if key.revoked_at is None:
            key.revoked_at = datetime.now(UTC)
            # Waits and streams on the key re-authenticate at once and end (services/streams.py).
            after_commit(lambda agent_id=key.agent_id: dispatch.wake([agent_id]))
    return key


@dataclass(frozen=True)
class _Cached:
    agent: Agent  # a detached copy, shared read-only by the process's requests
    key_id: uuid.UUID
    last_used_at: datetime | None
    generation: int
    expires: float  # time.monotonic()


# Authenticated keys by digest, per app: a hit costs no query of its own. An entry is
# trusted only as far as the request's first statement, which carries a check that the
# key generation is still the one it was cached under (relay.extensions.GuardedCursor,
# migration 0018); a request that runs none checks it apart (verify_key_generation).
# Migration 0006's triggers change that generation in the same transaction as any
# revocation, disable or deletion, so a revoked key is refused by every process as soon
# as the revocation commits. The age bound only limits memory and how long an agent's
# name or role can look stale.
KEY_CACHE_SECONDS = 300
KEY_CACHE_SIZE = 10_000


def _key_cache() -> dict[bytes, _Cached]:
    return current_app.extensions.setdefault("relay_key_cache", {})


def _detached_copy(agent: Agent) -> Agent:
    copy = Agent(**{c.key: getattr(agent, c.key) for c in Agent.__table__.columns})
    make_transient_to_detached(copy)  # persistent identity, no session: added nowhere by accident
    return copy


def authenticate(raw_key: str | None, *, cached: bool = True) -> Agent:
    """Return the agent owning an active key; raise unauthenticated saying why not.

    Missing, malformed, unknown or revoked keys and disabled agents are all refused
    (docs/api.md, "Conventions"). A key that authenticated lately is answered from
    an in-process cache checked against the key generation (see ``_Cached``): the
    revocation rule is the same as without it. ``cached=False`` reads the key whatever
    the cache holds, and owes no guard: a view run again after KeyGenerationMoved must
    not be served from an entry another request cached meanwhile.
    """
    if not raw_key:
        raise RelayError("unauthenticated", "missing bearer API key")
    if not KEY_RE.match(raw_key):
        raise RelayError("unauthenticated", "malformed API key")
    digest = key_digest(raw_key)
    cache = _key_cache()
    now_mono = time.monotonic()
    hit = cache.get(digest)
    now = datetime.now(UTC)
    if cached and hit is not None and hit.expires > now_mono:
        if hit.last_used_at is not None and now - hit.last_used_at <= LAST_USED_RESOLUTION:
            # Trusted only if the request's first statement finds the generation unmoved
            # (relay.extensions.GuardedCursor); else the view runs again after forget_key.
            expect_key_generation(hit.generation)
            return hit.agent
    cache.pop(digest, None)  # stale or absent: a key that now fails must not count as known valid
    session = db.session
    # The generation in the key's own statement: one snapshot, so a revocation that
    # commits after it moves the generation this entry is cached under.
    generation_now = select(Generation.value).where(Generation.name == "api_keys").scalar_subquery()
    row = session.execute(
        select(ApiKey, Agent, generation_now).join(Agent, ApiKey.agent_id == Agent.id).where(ApiKey.digest == digest)
    ).first()
    if row is None:
        raise RelayError("unauthenticated", "unknown API key")
    key, agent, generation = row
    if key.revoked_at is not None:
        raise RelayError("unauthenticated", "API key revoked")
    if agent.disabled_at is not None:
        raise RelayError("unauthenticated", "agent disabled")
    last_used = key.last_used_at
    if last_used is None or now - last_used > LAST_USED_RESOLUTION:
        with unit_of_work() as s:
            s.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now))
        last_used = now
    if generation is not None:
        if len(cache) >= KEY_CACHE_SIZE:
            cache.clear()
        cache[digest] = _Cached(_detached_copy(agent), key.id, last_used, generation, now_mono + KEY_CACHE_SECONDS)
    return agent


def forget_key(raw_key: str | None) -> None:
    """Drop ``raw_key`` from this process's key cache: its next authentication reads the key."""
    if raw_key:
        _key_cache().pop(key_digest(raw_key), None)


def verify_key_generation() -> None:
    """Check the key guard a request still owes when it ran no statement; raise KeyGenerationMoved.

    One round trip, only for a request served from the key cache that touched no table
    (an error before any query, a stream whose queries come later): no cached key
    answers a request unchecked.
    """
    if key_guard_pending():
        with statement_cursor(db.session, alone=True) as cur:
            cur.execute("SELECT 1")


def reauthenticate(raw_key: str | None) -> Agent:
    """Authenticate ``raw_key`` again in a request that outlives its authentication (a wait, a stream).

    Like :func:`authenticate`, but a cache hit is checked against the key generation at
    once (one round trip) rather than in the next statement: a stream's next statement
    runs outside the view, where no one would answer KeyGenerationMoved. When the
    generation moved, the key is read again, so a revoked key raises unauthenticated.
    """
    agent = authenticate(raw_key)
    if not key_guard_pending():
        return agent
    try:
        verify_key_generation()
    except KeyGenerationMoved:
        db.session.rollback()
        forget_key(raw_key)
        agent = authenticate(raw_key)
    return agent


def cached_agent(raw_key: str | None) -> bool:
    """True when ``raw_key`` is in this process's key cache (whatever the generation): it authenticated lately."""
    return bool(raw_key) and key_digest(raw_key) in _key_cache()
