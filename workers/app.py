"""Celery entry point for ``celery -A workers.app worker|beat``: the base app, no transports."""

import sys

from relay.config import ConfigError
from relay.context import create_base_app

try:
    flask_app = create_base_app()
except ConfigError as exc:
    sys.stderr.write(f"relay: configuration error: {exc}\n")
    raise SystemExit(3) from None
celery_app = flask_app.extensions["celery"]
