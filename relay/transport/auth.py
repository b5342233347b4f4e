"""Bearer authentication shared by every route: ``Authorization: Bearer <key>``."""

from __future__ import annotations

import logging

from flask import g, request
from sqlalchemy.exc import OperationalError

from relay.errors import RelayError
from relay.models import Agent
from relay.services import agents as agent_service

_UNSET = object()
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
    try:
        agent = agent_service.authenticate(bearer_token())
        g._relay_auth_error = None
    except RelayError as exc:
        agent = None
        g._relay_auth_error = exc
    except OperationalError:
        # PostgreSQL is unreachable (down, restarting): neither the caller's fault (401)
        # nor an internal error (500). Transports answer service_unavailable (503/-32603).
        from relay.extensions import db

        try:
            db.session.rollback()
        except Exception:
            pass
        log.warning("database unavailable during authentication", extra={"request_id": g.get("request_id")})
        agent = None
        g._relay_auth_error = RelayError(
            "service_unavailable", "the database is unavailable; retry shortly", {"request_id": g.get("request_id")}
        )
    g._relay_agent = agent
    # Kept apart from the row: a rollback later in the request expires the Agent, and reading
    # it then would query PostgreSQL again (the request log line must not, it may be down).
    g._relay_agent_handle = agent.handle if agent is not None else None
    return agent


def current_agent() -> Agent:
    """Return the authenticated agent or raise RelayError(unauthenticated)."""
    agent = try_current_agent()
    if agent is None:
        raise g._relay_auth_error
    return agent


def rate_limit_key() -> str:
    """Key rate limits by the authenticated agent, never by the client address (DESIGN.md)."""
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
    import math
    import time

    return max(1, math.ceil(limit.window[0] - time.time()))
