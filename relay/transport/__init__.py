"""Transports: JSON-RPC (``jsonrpc``), the A2A v1.0 bindings (``a2a``: JSON-RPC; ``a2a_http``: HTTP+JSON), REST (``rest``),
the operator console (``console``), MCP (``mcp``), and their plumbing (auth, rate limits, body reading, health, logs
and metrics).

Each transport loads its input through ``relay.schemas`` and calls ``relay.services``;
none holds a business rule.
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask

# One registration step: what it installs, and the call that installs it on the app.
Step = tuple[str, Callable[[Flask], None]]


def steps() -> tuple[Step, ...]:
    """The web app's registration steps, in the order ``init_app`` runs them.

    The order matters in three places, each said on its step: the console's sign-in
    limits live on the rate limiter; the key guard wraps the views registered before it;
    the error answers come last so they cover every view.
    """
    from relay.encoding import OrjsonProvider
    from relay.transport import (
        a2a,
        a2a_http,
        console,
        errors,
        health,
        jsonrpc,
        mcp,
        observability,
        ratelimit,
        requests,
        rest,
    )
    from relay.transport.auth import guard_views

    def orjson(app: Flask) -> None:
        app.json = OrjsonProvider(app)

    def blueprint(bp) -> Callable[[Flask], None]:
        return lambda app: app.register_blueprint(bp)

    return (
        ("JSON answers through orjson", orjson),
        ("bounded request bodies", requests.init_app),
        ("request log line and /metrics", observability.init_app),
        ("/healthz and /readyz", blueprint(health.bp)),
        ("REST under /api/v1", blueprint(rest.bp)),
        ("POST /a2a, the relay's JSON-RPC dialect", blueprint(jsonrpc.bp)),
        ("A2A v1.0 JSON-RPC binding and agent cards", blueprint(a2a.bp)),
        ("A2A v1.0 HTTP+JSON binding", blueprint(a2a_http.bp)),
        ("per-agent rate limits", ratelimit.init_app),
        ("the operator console (after the rate limits: its sign-in limits live on that Limiter)", console.init_app),
        (
            "the key guard (after every view it covers: it wraps each one; relay/transport/auth.py guard_views)",
            guard_views,
        ),
        # After the guard on purpose: /mcp runs no statement itself; every tool call is an
        # in-process request of the public API, which the guard covers.
        ("POST /mcp", blueprint(mcp.bp)),
        ("error answers for every surface (relay/transport/errors.py)", errors.init_app),
    )


def init_app(app: Flask) -> None:
    """Run every registration step of :func:`steps` on ``app``, in order."""
    for _name, install in steps():
        install(app)
