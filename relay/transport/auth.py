"""Bearer authentication shared by every route: ``Authorization: Bearer <key>``.

A request without an ``Authorization`` header is answered "missing Authorization header";
every key that is there but bad gets the same answer, "invalid API key", and the reason
(malformed, unknown, revoked, agent disabled) goes to the server log with the request id. Failed
authentications on authenticated routes spend a budget per client address
(``RELAY_AUTH_FAILURE_LIMIT``, default 60/minute, counted in Redis by flask-limiter's
strategy); past it a request is refused with ``rate_limited`` before any database lookup.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import time

import redis
from flask import Flask, current_app, g, request
from limits import parse

from relay.errors import DATABASE_ERRORS, RelayError, is_connection_error
from relay.extensions import KeyGenerationMoved, redis_client
from relay.models import Agent
from relay.services import agents as agent_service

_UNSET = object()
_REREAD = "_relay_key_reread"  # set on g for a view's run after KeyGenerationMoved
log = logging.getLogger("relay.transport.auth")


def bearer_token() -> str | None:
    """Return the token of an ``Authorization: Bearer`` header, or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def try_current_agent() -> Agent | None:
    """Authenticate this request once; return the agent or None, keeping the error on ``g``."""
    cached = g.get("_relay_agent", _UNSET)
    if cached is not _UNSET:
        return cached
    token = bearer_token()
    # A key this process authenticated lately is known valid: the address's failure
    # budget would not refuse it anyway (see _known_valid), so its Redis read is skipped.
    over = None if agent_service.cached_agent(token) else _over_failure_budget()
    if over is not None and not _known_valid(token):
        g._relay_agent, g._relay_agent_handle, g._relay_auth_error = None, None, over
        return None
    try:
        agent = agent_service.authenticate(token, cached=not g.get(_REREAD, False))
        g._relay_auth_error = None
        _remember_valid(token)
    except RelayError as exc:
        agent = None
        if exc.symbol == "unauthenticated":
            log.info(
                "authentication failed: %s",
                exc.message,
                extra={"request_id": g.get("request_id"), "client": client_address()},
            )
            # No header at all is a client that forgot it; every key that is there but
            # wrong gets one message, saying nothing of which part was wrong.
            absent = "Authorization" not in request.headers
            exc = RelayError("unauthenticated", MISSING_KEY if absent else INVALID_KEY)
        g._relay_auth_error = exc
    except DATABASE_ERRORS as exc:
        if not is_connection_error(exc):
            raise
        # PostgreSQL is unreachable (down, restarting): neither the caller's fault (401)
        # nor an internal error (500). Transports answer service_unavailable (503/-32603).
        _rollback()
        agent = None
        g._relay_auth_error = _unavailable()
    g._relay_agent = agent
    # Kept apart from the row: a rollback later in the request expires the Agent, and reading
    # it then would query PostgreSQL again (the request log line must not, it may be down).
    g._relay_agent_handle = agent.handle if agent is not None else None
    return agent


def guard_views(app: Flask) -> None:
    """Run each of ``app``'s views once more when the key it was served under from the cache moved.

    A request whose key came from the key cache is trusted only if its first statement
    finds the key generation unmoved (relay.extensions.GuardedCursor). When it moved (a
    key, any key, was revoked, or an agent disabled), that statement did not run and
    KeyGenerationMoved is raised: the request's session is rolled back, the key is
    looked up again (401 if it was the one revoked), and the view runs again. A view
    that returns having run no statement has the generation checked apart first.
    Register after every blueprint.
    """
    for endpoint, view in list(app.view_functions.items()):
        app.view_functions[endpoint] = _guarded(view)


class _Unverifiable(Exception):
    """The owed key guard could not be checked: PostgreSQL is unreachable."""


def _verify_owed() -> None:
    try:
        agent_service.verify_key_generation()
    except DATABASE_ERRORS as exc:
        if not is_connection_error(exc):
            raise
        raise _Unverifiable() from exc


def _guarded(view):
    @functools.wraps(view)
    def run(*args, **kwargs):
        try:
            try:
                rv = view(*args, **kwargs)
            except Exception:  # a 4xx raised before any query is an answer too
                _verify_owed()
                raise
            _verify_owed()
            return rv
        except KeyGenerationMoved:
            _rollback()
            agent_service.forget_key(bearer_token())
            for name in ("_relay_agent", "_relay_agent_handle", "_relay_auth_error"):
                g.pop(name, None)
            # The run again reads the key itself: a concurrent request may have cached it
            # anew, and a second guard failing here would have no one left to answer it.
            setattr(g, _REREAD, True)
        except _Unverifiable:
            # As when the key itself cannot be read: each transport answers its own 503.
            _rollback()
            g._relay_agent, g._relay_agent_handle, g._relay_auth_error = None, None, _unavailable()
        return view(*args, **kwargs)

    return run


def _rollback() -> None:
    from relay.extensions import db

    try:
        db.session.rollback()
    except Exception:  # the connection itself is gone; the pool replaces it
        pass


def _unavailable() -> RelayError:
    log.warning("database unavailable during authentication", extra={"request_id": g.get("request_id")})
    return RelayError(
        "service_unavailable", "the database is unavailable; retry shortly", {"request_id": g.get("request_id")}
    )


def current_agent() -> Agent:
    """Return the authenticated agent or raise RelayError.

    Raises ``unauthenticated`` (MISSING_KEY without an Authorization header, INVALID_KEY
    for any bad key), counting one failure
    against the client address; ``rate_limited`` (details ``retry_after``, seconds) when
    the address is over RELAY_AUTH_FAILURE_LIMIT; ``service_unavailable`` when PostgreSQL
    is unreachable. Only routes that need a caller call this, so public routes never count.
    """
    agent = try_current_agent()
    if agent is None:
        error = g._relay_auth_error
        if error.symbol == "unauthenticated" and not g.get("_relay_auth_failure_counted"):
            g._relay_auth_failure_counted = True
            _spend_failure()
        raise error
    return agent


INVALID_KEY = "invalid API key"
MISSING_KEY = "missing Authorization header: send 'Authorization: Bearer <API key>'"


def client_address() -> str:
    """The client's address: the last hop a trusted proxy (FORWARDED_ALLOW_IPS) appended, or the peer."""
    peer = request.remote_addr or "unknown"
    trusted = current_app.config["RELAY"].forwarded_allow_ips
    forwarded = request.headers.get("X-Forwarded-For", "")
    if forwarded and ("*" in trusted or peer in trusted):
        hops = [h.strip() for h in forwarded.split(",") if h.strip()]
        if hops:
            return hops[-1]
    return peer


def _failure_budget():
    limiter = current_app.extensions.get("relay_limiter")
    if limiter is None:
        return None
    prefix = current_app.config.get("RATELIMIT_KEY_PREFIX", "")
    return (
        limiter.limiter,
        parse(current_app.config["RELAY"].auth_failure_limit),
        (prefix, "authfail", client_address()),
    )


def _over_failure_budget() -> RelayError | None:
    budget = _failure_budget()
    if budget is None:
        return None
    strategy, item, key = budget
    try:
        if strategy.test(item, *key):
            return None
        reset = strategy.get_window_stats(item, *key).reset_time
    except Exception:  # Redis unreachable: fail open, as the per-agent limits do
        return None
    retry = max(1, math.ceil(reset - time.time()))
    return RelayError(
        "rate_limited",
        f"too many failed authentications from this address; retry in {retry} s",
        {"retry_after": retry},
    )


# Keys that authenticated lately, by SHA-256 digest in Redis: an address over its failure
# budget (a NAT, a proxy, every agent of `relay up` on 127.0.0.1) still serves them, so one
# client retrying a revoked key cannot lock its neighbours out. A key never seen before
# waits out the budget like any other. Recorded at most once a minute per key and process.
_VALID_FOR_SECONDS = 600
_recorded: dict[str, float] = {}


def _valid_key_name(token: str) -> str:
    prefix = current_app.config.get("RATELIMIT_KEY_PREFIX", "")
    return f"relay:{prefix}:authok:{hashlib.sha256(token.encode()).hexdigest()}"


def _remember_valid(token: str | None) -> None:
    if not token:
        return
    name = _valid_key_name(token)
    now = time.monotonic()
    if now - _recorded.get(name, float("-inf")) < 60:
        return
    if len(_recorded) > 10_000:
        _recorded.clear()
    try:
        redis_client().set(name, 1, ex=_VALID_FOR_SECONDS)
        _recorded[name] = now
    except redis.RedisError:
        pass


def _known_valid(token: str | None) -> bool:
    if not token:
        return False
    try:
        return bool(redis_client().exists(_valid_key_name(token)))
    except redis.RedisError:
        return False


def _spend_failure() -> None:
    budget = _failure_budget()
    if budget is None:
        return
    strategy, item, key = budget
    try:
        strategy.hit(item, *key)
    except Exception:  # Redis unreachable: fail open
        pass


def rate_limit_key() -> str:
    """Key rate limits by the authenticated agent, never by the client address (docs/api.md, "Conventions")."""
    agent = try_current_agent()
    return f"agent:{agent.id}" if agent is not None else "unauthenticated"


def is_unauthenticated() -> bool:
    """True when the request carries no valid key; such requests are refused, not counted."""
    return try_current_agent() is None


def retry_after_seconds(limit) -> int:
    """Whole seconds until a breached flask-limiter limit resets (at least 1).

    ``window[0]`` is the exact reset time; ``reset_at`` is already rounded up by a
    second, and rounding it again would say 61 s for a 60 s window.
    """
    return max(1, math.ceil(limit.window[0] - time.time()))
