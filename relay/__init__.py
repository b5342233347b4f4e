"""The handoff relay: a Flask app factory (``create_app``) and its layers."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from flask import Flask


def create_app(env: Mapping[str, str] | None = None, **overrides: Any) -> "Flask":
    """Build the app from environment variables (``env`` defaults to ``os.environ``).

    Migrations are not run here: the Procfile's ``release`` step runs them.
    Raises relay.config.ConfigError naming a missing or malformed variable.
    """
    # Imported here, not at module level: agents' tools (relay.client, relay-agent,
    # relay-mcp) live in this package and must not load the server to import.
    from flask import Flask
    from werkzeug.exceptions import HTTPException

    from relay.config import load_settings

    settings = load_settings(env)
    app = Flask(__name__)
    app.config.update(settings.flask_config())
    app.config.update(overrides)
    from relay import observability

    observability.configure_logging(settings.log_level)

    from relay.extensions import db

    db.init_app(app)

    from relay import a2a, api, health, jsonrpc, ratelimit, requests

    requests.init_app(app)
    observability.init_app(app)
    app.register_blueprint(health.bp)
    app.register_blueprint(api.bp)
    app.register_blueprint(jsonrpc.bp)
    app.register_blueprint(a2a.bp)
    ratelimit.init_app(app)

    from workers import celery_init_app

    celery_init_app(app)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        from relay.api import error_response

        if exc.response is not None:  # e.g. flask-limiter's 429, already shaped
            return exc.response
        # Keep the exception's own headers (405's Allow, which HTTP requires) in our JSON shape.
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return error_response(exc.code or 500, (exc.name or "error").lower().replace(" ", "_"), exc.description,
                              headers=headers)

    @app.errorhandler(Exception)
    def _unhandled(exc: Exception):
        from relay.api import error_response

        from flask import g

        from relay.extensions import db

        from sqlalchemy.exc import OperationalError

        try:
            db.session.rollback()
        except Exception:  # the connection itself is gone; the pool replaces it (pre-ping)
            pass
        if isinstance(exc, OperationalError):  # PostgreSQL unreachable: retryable, not a bug
            app.logger.warning("database unavailable", extra={"request_id": g.get("request_id")})
            return error_response(503, "service_unavailable", "the database is unavailable; retry shortly",
                                  {"request_id": g.get("request_id")})
        app.logger.exception("unhandled error")
        return error_response(500, "internal_error", "internal error", {"request_id": g.get("request_id")})

    return app
