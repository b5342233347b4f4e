"""Celery entry point for ``celery -A workers.app worker|beat``."""
import sys

from relay import create_app
from relay.config import ConfigError

try:
    flask_app = create_app()
except ConfigError as exc:
    sys.stderr.write(f"relay: configuration error: {exc}\n")
    raise SystemExit(3) from None
celery_app = flask_app.extensions["celery"]
