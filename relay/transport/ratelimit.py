"""Per-agent rate limits on Redis, counted by flask-limiter's strategy (docs/api.md, "Conventions").

Limits are keyed by the authenticated agent, never the client address; a JSON-RPC
batch costs one hit per element; an unreachable Redis fails open (logged). Each app
gets its own Limiter: flask-limiter keeps its storage on the Limiter object, so a
module-level one would let a second app in the same process (tests, tools) silently
repoint every app's counters at its Redis.

The API's budgets are spent by one ``before_request`` hook that calls the Limiter's
configured strategy (``RATELIMIT_STRATEGY`` on ``RATELIMIT_STORAGE_URI``: the
sliding-window counter, one ``EVALSHA``) with the keys flask-limiter's shared limits
use. flask-limiter's own per-request pass (resolving decorated, blueprint, default and
meta limits, scopes and exemptions) cost more than the Redis round trip itself: 7% of a
request's CPU. Its decorators still limit the console's sign-in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from flask import Flask, Response, current_app, request
from flask_limiter import Limiter
from limits import RateLimitItem, parse_many

from relay.transport import a2a, a2a_http, jsonrpc
from relay.transport import rest as api
from relay.transport.auth import is_unauthenticated, rate_limit_key

log = logging.getLogger("relay.transport.ratelimit")


@dataclass(frozen=True)
class Budget:
    """One shared budget: its scope (the Redis key's), its rate setting, its 429 and its cost."""

    scope: str
    rate: Callable[[], str]
    on_breach: Callable[[Breach], Response]
    cost: Callable[[], int] = lambda: 1
    methods: frozenset[str] | None = None


@dataclass(frozen=True)
class Breach:
    """What an ``on_breach`` handler is told (the fields of flask-limiter's RequestLimit it reads)."""

    limit: RateLimitItem
    window: tuple[float, int]  # (reset time, epoch seconds; remaining)


def _a2a_rate() -> str:
    return current_app.config["RELAY"].rate_limit


def _rest_rate() -> str:
    return current_app.config["RELAY"].rest_rate_limit


# By blueprint. One A2A budget per agent across both dialects and both A2A bindings (scope
# "a2a"): the JSON-RPC dialect's /a2a, the A2A v1.0 JSON-RPC binding's /a2a/agents/{handle} (POST: its
# agent cards are GETs) and its HTTP+JSON binding under /a2a/agents/{handle}/http (every
# verb: its reads are GETs). One REST budget per agent across every REST route.
_POST = frozenset({"POST"})
BUDGETS: dict[str, Budget] = {
    jsonrpc.bp.name: Budget("a2a", _a2a_rate, jsonrpc.rate_limited, jsonrpc.batch_cost, _POST),
    a2a.bp.name: Budget("a2a", _a2a_rate, a2a.rate_limited, jsonrpc.batch_cost, _POST),
    a2a_http.bp.name: Budget("a2a", _a2a_rate, a2a_http.rate_limited),
    api.bp.name: Budget("rest", _rest_rate, api.rest_rate_limited),
}


@lru_cache(maxsize=64)
def _limits(rate: str) -> tuple[RateLimitItem, ...]:
    return tuple(sorted(parse_many(rate)))


def spend(limiter: Limiter, budget: Budget) -> Response | None:
    """Spend the request's cost from the caller's budget; the 429 response when it is spent.

    As flask-limiter's shared limits count: each of the rate's limits in order, stopping
    at the first breached one (RATELIMIT_FAIL_ON_FIRST_BREACH); a cost larger than what
    is left is refused and not counted (the strategy's own rule). Redis unreachable: None
    (fail open), logged.
    """
    prefix = current_app.config.get("RATELIMIT_KEY_PREFIX", "")
    keys = (prefix, rate_limit_key(), budget.scope) if prefix else (rate_limit_key(), budget.scope)
    strategy = limiter.limiter
    cost = budget.cost()
    breach = None
    # Only the storage's calls are in the try: a fault of the relay's own (the 429's
    # builder) must not pass for an outage and open the limit.
    try:
        for item in _limits(budget.rate()):
            if not strategy.hit(item, *keys, cost=cost):
                breach = Breach(item, tuple(strategy.get_window_stats(item, *keys)))
                break
    except Exception:  # Redis unreachable: fail open, as RATELIMIT_SWALLOW_ERRORS says
        log.exception("Failed to rate limit. Swallowing error")
        return None
    if breach is None:
        return None
    log.info("ratelimit %s (%s) exceeded at %s", breach.limit, keys[-2], request.endpoint)
    return budget.on_breach(breach)


def init_app(app: Flask) -> Limiter:
    """Bind a Limiter to ``app`` and spend the /a2a and REST budgets before their views."""
    limiter = Limiter(key_func=rate_limit_key)
    limiter.init_app(app)
    # The app has no default, application or blueprint limits for flask-limiter to find
    # (the console's sign-in limits are decorators, which check themselves), so its pass
    # before every request is taken out.
    app.before_request_funcs[None].remove(limiter._check_request_limit)

    @app.before_request
    def _spend_budget() -> Response | None:
        budget = BUDGETS.get(request.blueprint or "")
        if budget is None or (budget.methods is not None and request.method not in budget.methods):
            return None
        if is_unauthenticated():  # refused by the view with 401, not counted
            return None
        return spend(limiter, budget)

    app.extensions["relay_limiter"] = limiter
    return limiter
