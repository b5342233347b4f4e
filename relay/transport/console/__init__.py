"""The operator console: server-rendered pages for the humans behind the agents (docs/console.md).

A third transport over the same services as JSON-RPC and REST: views load their input
through ``relay.schemas.console`` and call ``relay.services`` (``org`` for what one org may
see, ``operators`` for sign-in, and the API's own services for every action). Nothing here
holds a business rule.

- Sessions are Flask's signed cookie (``RELAY_SECRET_KEY``): HttpOnly, SameSite=Lax, Secure
  under ``RELAY_ENV=production``, scoped to ``/console``, ending ``RELAY_CONSOLE_SESSION_HOURS``
  after the sign-in. The session holds the operator's id and its ``session_version``, so a
  password reset, a disable or a sign-out ends it everywhere.
- Every POST carries flask-wtf's CSRF token; a missing or wrong one is a 400 page.
- Sign-in attempts are limited per email and per client address (flask-limiter on Redis).
- Agent-written text is untrusted: Jinja escapes it, links open only for http(s), diffs are
  highlighted by pygments (which escapes too), and every response carries a
  Content-Security-Policy that allows no inline script or style.
"""

from __future__ import annotations

from datetime import timedelta

from flask import Blueprint, Flask
from flask_wtf.csrf import CSRFProtect

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)
csrf = CSRFProtect()

# No inline script or style anywhere: htmx, time.js and the CSS are static files of this package.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def init_app(app: Flask) -> None:
    """Register the console on ``app``: its blueprint, session cookie, CSRF and sign-in limits.

    Runs after ``relay.transport.ratelimit.init_app``: the sign-in limits live on its Limiter.
    """
    from relay.transport.console import views

    settings = app.config["RELAY"]
    app.config.update(
        SESSION_COOKIE_NAME="relay_console",
        SESSION_COOKIE_PATH="/console",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.env == "production",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=settings.console_session_hours),
        # The sign-in time in the session decides expiry; a request does not extend it.
        SESSION_REFRESH_EACH_REQUEST=False,
        # Checked by the blueprint itself, after it has re-seated the body that
        # relay.transport.requests read first (flask-wtf's own hook would find it consumed).
        WTF_CSRF_CHECK_DEFAULT=False,
        # A token lives as long as its session: a page left open an hour must still work.
        WTF_CSRF_TIME_LIMIT=None,
    )
    csrf.init_app(app)
    app.register_blueprint(bp)
    views.limit_sign_in(app)
