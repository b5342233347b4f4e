"""Per-request plumbing: the request id (``X-Request-Id`` accepted and echoed)."""
from __future__ import annotations

import re
import uuid

from flask import Flask, g, request

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def init_app(app: Flask) -> None:
    """Register the request-id hooks on ``app``."""

    @app.before_request
    def _assign_request_id() -> None:
        supplied = request.headers.get("X-Request-Id", "")
        g.request_id = supplied if _SAFE_ID.match(supplied) else uuid.uuid4().hex

    @app.after_request
    def _echo_request_id(response):
        response.headers["X-Request-Id"] = g.get("request_id", "")
        return response
