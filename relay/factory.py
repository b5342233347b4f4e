"""The web app: the base context (``relay.context``) plus every transport.

Only entry points import this module (``app.py``, the ``relay`` CLI's ``up``, tests,
bench); an import-linter contract keeps the layers and the workers from doing so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Flask

from relay import transport
from relay.context import create_base_app


def create_app(env: Mapping[str, str] | None = None, **overrides: Any) -> Flask:
    """Build the web app from environment variables (``env`` defaults to ``os.environ``).

    The base context (settings, logging, the database, Celery), then the transports'
    registration steps, one flat named list in order (``relay.transport.steps``).
    Raises relay.config.ConfigError naming a missing or malformed variable.
    """
    app = create_base_app(env, **overrides)
    transport.init_app(app)
    return app
