"""WSGI entry point: ``gunicorn app:app``."""

import sys

from relay.config import ConfigError
from relay.factory import create_app

try:
    app = create_app()
except ConfigError as exc:
    sys.stderr.write(f"relay: configuration error: {exc}\n")
    # gunicorn stops the whole server (not just this worker) on exit code 3.
    raise SystemExit(3) from None
