"""Per-agent rate limits with flask-limiter on Redis (DESIGN.md, "Rate limit").

Limits are keyed by the authenticated agent, never the client address; a JSON-RPC
batch costs one hit per element; an unreachable Redis fails open (logged). Each app
gets its own Limiter: flask-limiter keeps its storage on the Limiter object, so a
module-level one would let a second app in the same process (tests, tools) silently
repoint every app's counters at its Redis.
"""

from __future__ import annotations

from flask import Flask, current_app
from flask_limiter import Limiter

from relay.transport import a2a, jsonrpc
from relay.transport import rest as api
from relay.transport.auth import is_unauthenticated, rate_limit_key


def _a2a_rate() -> str:
    return current_app.config["RELAY"].rate_limit


def _rest_rate() -> str:
    return current_app.config["RELAY"].rest_rate_limit


def init_app(app: Flask) -> Limiter:
    """Bind a Limiter to ``app`` and put the /a2a and REST budgets on their routes."""
    limiter = Limiter(key_func=rate_limit_key)
    limiter.init_app(app)
    # One JSON-RPC budget per agent across both dialects (scope "a2a"): the seed's /a2a
    # and the A2A v1.0 binding's /a2a/agents/{handle}. On the blueprints, not the views:
    # flask-limiter checks a blueprint's limits in its before_request pass, which runs for
    # every request anyway, where a view's decorator is a second pass (a tenth of a send's
    # CPU went to the two). POST only: the binding's agent cards are GETs.
    for blueprint, on_breach in ((jsonrpc.bp, jsonrpc.rate_limited), (a2a.bp, a2a.rate_limited)):
        limiter.shared_limit(
            _a2a_rate,
            scope="a2a",
            methods=["POST"],
            exempt_when=is_unauthenticated,
            cost=jsonrpc.batch_cost,
            on_breach=on_breach,
        )(blueprint)
    # shared_limit: one budget per agent across every REST route, not one per endpoint.
    limiter.shared_limit(_rest_rate, scope="rest", exempt_when=is_unauthenticated, on_breach=api.rest_rate_limited)(
        api.bp
    )
    app.extensions["relay_limiter"] = limiter
    return limiter
