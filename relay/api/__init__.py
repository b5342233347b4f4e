"""REST transport under ``/api/v1``: one JSON error shape ``{"error": {code, message, details}}``."""
from __future__ import annotations

from flask import Blueprint, jsonify

from relay.errors import RelayError

bp = Blueprint("api_v1", __name__, url_prefix="/api/v1")


def error_response(status: int, code: str, message: str, details=None):
    """Return the REST error envelope with ``status``."""
    resp = jsonify({"error": {"code": code, "message": message, "details": details}})
    resp.status_code = status
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="relay"'
    return resp


@bp.errorhandler(RelayError)
def _relay_error(exc: RelayError):
    return error_response(exc.http_status, exc.symbol, exc.message, exc.details)


from relay.api import identities  # noqa: E402,F401  (routes register on bp)
