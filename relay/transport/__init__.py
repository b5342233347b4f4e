"""Transports: JSON-RPC (``jsonrpc``), the A2A v1.0 bindings (``a2a``: JSON-RPC; ``a2a_http``: HTTP+JSON), REST (``rest``),
the operator console (``console``), and their plumbing (auth, rate limits, body reading, health, logs and metrics).

Each transport loads its input through ``relay.schemas`` and calls ``relay.services``;
none holds a business rule.
"""

from __future__ import annotations

from flask import Flask, g
from sqlalchemy.exc import DBAPIError
from werkzeug.exceptions import HTTPException

from relay.errors import UNAVAILABLE_RETRY_AFTER, error_cause, is_connection_error
from relay.extensions import db


def init_app(app: Flask) -> None:
    """Register every blueprint, the rate limiter and the one JSON error envelope on ``app``."""
    from relay.encoding import OrjsonProvider
    from relay.transport import a2a, a2a_http, health, jsonrpc, observability, ratelimit, requests, rest

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

    @app.after_request
    def _retry_after_on_503(resp):
        # Every outage answer says when to come back, whichever surface built it (REST,
        # JSON-RPC, A2A, console, readiness): a pool wait, a restart, a failover.
        if resp.status_code == 503 and "Retry-After" not in resp.headers:
            resp.headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
        return resp

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        if exc.response is not None:  # e.g. flask-limiter's 429, already shaped
            return exc.response
        # Keep the exception's own headers (405's Allow, which HTTP requires) in our JSON shape.
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return rest.error_response(
            exc.code or 500, (exc.name or "error").lower().replace(" ", "_"), exc.description, headers=headers
        )

    @app.errorhandler(Exception)
    def _unhandled(exc: Exception):
        try:
            db.session.rollback()
        except Exception:  # the connection itself is gone; the pool replaces it (pre-ping)
            pass
        # Only a connection-level error (a disconnect, SQLSTATE class 08/53/57P, or no SQLSTATE
        # at all) is an outage: retryable, not a bug. psycopg2 makes other statement errors
        # OperationalErrors too (54000 program_limit_exceeded, 57014 query_canceled, 40P01
        # deadlock_detected): those are a 500 logged with their cause.
        if is_connection_error(exc):
            app.logger.warning("database unavailable", extra={"request_id": g.get("request_id")})
            return rest.error_response(
                503,
                "service_unavailable",
                "the database is unavailable; retry shortly",
                {"request_id": g.get("request_id")},
            )
        if isinstance(exc, DBAPIError):
            # The SQLSTATE and the server's first line only: the statement's parameters may be message text.
            code, first_line = error_cause(exc)
            app.logger.error(
                "database statement failed: %s %s: %s",
                code,
                type(exc.orig).__name__,
                first_line,
                extra={"request_id": g.get("request_id"), "pgcode": code},
            )
            return rest.error_response(500, "internal_error", "internal error", {"request_id": g.get("request_id")})
        app.logger.exception("unhandled error")
        return rest.error_response(500, "internal_error", "internal error", {"request_id": g.get("request_id")})
