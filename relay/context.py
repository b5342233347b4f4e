"""The application context every process needs: settings, logging, the database, Celery.

Workers, beat and the ``relay`` CLI run inside this app; the web process adds the
transports on top of it (``relay.factory``). Nothing here imports a transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask

from relay.config import load_settings
from relay.extensions import db, install_checkout_ping
from relay.logs import configure_logging


def create_base_app(env: Mapping[str, str] | None = None, **overrides: Any) -> Flask:
    """Build the app from environment variables (``env`` defaults to ``os.environ``).

    Migrations are not run here: the Procfile's ``release`` step runs them.
    Raises relay.config.ConfigError naming a missing or malformed variable.
    """
    settings = load_settings(env)
    app = Flask("relay")
    app.config.update(settings.flask_config())
    app.config.update(overrides)
    configure_logging(settings.log_level)
    db.init_app(app)
    with app.app_context():
        install_checkout_ping(db.engine)

    from workers import celery_init_app

    celery_init_app(app)
    return app
