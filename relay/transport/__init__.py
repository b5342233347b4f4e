"""Transports: JSON-RPC (``jsonrpc``), the A2A v1.0 bindings (``a2a``: JSON-RPC; ``a2a_http``: HTTP+JSON), REST (``rest``),
the operator console (``console``), and their plumbing (auth, rate limits, body reading, health, logs and metrics).

Each transport loads its input through ``relay.schemas`` and calls ``relay.services``;
none holds a business rule.
"""

from __future__ import annotations

from flask import Flask


def init_app(app: Flask) -> None:
    """Register every blueprint, the rate limiter and the error answers (relay/transport/errors.py) on ``app``."""
    from relay.encoding import OrjsonProvider
    from relay.transport import a2a, a2a_http, errors, health, jsonrpc, observability, ratelimit, requests, rest

    app.json = OrjsonProvider(app)
    requests.init_app(app)
    observability.init_app(app)
    app.register_blueprint(health.bp)
    app.register_blueprint(rest.bp)
    app.register_blueprint(jsonrpc.bp)
    app.register_blueprint(a2a.bp)
    app.register_blueprint(a2a_http.bp)
    ratelimit.init_app(app)
    from relay.transport import console  # after ratelimit: its sign-in limits live on that Limiter

    console.init_app(app)
    from relay.transport.auth import guard_views

    guard_views(app)  # after every blueprint: it wraps each view

    errors.init_app(app)
