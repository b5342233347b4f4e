"""REST transport under ``/api/v1``: one JSON error shape ``{"error": {code, message, details}}``."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request
from marshmallow import Schema, fields

from relay.errors import RelayError, invalid
from relay.models import Agent
from relay.schemas.common import NotJson, load_or_invalid, strict_json
from relay.transport import errors
from relay.transport.auth import bearer_token, current_agent, retry_after_seconds
from relay.transport.requests import BodyTooLarge, read_body

bp = Blueprint("api_v1", __name__, url_prefix="/api/v1")


def error_response(
    status: int, code: str, message: str, details=None, headers: dict | None = None, details_omitted: int = 0
):
    """Return the REST error envelope with ``status``.

    ``details_omitted``: field errors left out of ``details`` (relay/errors.py caps them);
    the envelope names it only when some were.
    """
    error: dict[str, Any] = {"code": code, "message": message, "details": details}
    if details_omitted:
        error["details_omitted"] = details_omitted
    resp = jsonify({"error": error})
    resp.status_code = status
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


@bp.errorhandler(RelayError)
def _relay_error(exc: RelayError):
    if exc.symbol == "rate_limited" and isinstance(exc.details, dict) and "retry_after" in exc.details:
        errors.retry_later(exc.details["retry_after"])
    return error_response(
        exc.http_status, exc.symbol, exc.message, exc.details, details_omitted=getattr(exc, "omitted", 0)
    )


def rest_rate_limited(limit):
    """429 in the REST error shape with a whole-second Retry-After."""
    retry = errors.retry_later(retry_after_seconds(limit))
    return error_response(
        429, "rate_limited", f"rate limit exceeded: {limit.limit}; retry in {retry} s", {"retry_after": retry}
    )


def identity(handle: str) -> Agent:
    """Return the caller if ``handle`` names it; 401/403/404 otherwise (docs/api.md, "The messages feed")."""
    from relay.services.feed import resolve_identity

    return resolve_identity(current_agent(), handle)


def still_allowed(handle: str):
    """A check that the request's key may still read ``handle``'s feed (raises RelayError when not).

    For requests that outlive their authentication (a wait, a stream): it authenticates
    the same bearer key again, so a revocation since the request began is seen.
    """
    from relay.services import agents
    from relay.services.feed import resolve_identity

    token = bearer_token()

    def check() -> None:
        resolve_identity(agents.reauthenticate(token), handle)

    return check


def load_query(schema: Schema) -> dict:
    """Load the query string with ``schema``; 422 naming each bad parameter.

    A parameter given twice is a list only where the schema takes one (``status``);
    elsewhere it is refused as given more than once, not as a bad value.
    """
    data = {k: (vals[0] if len(vals) == 1 else vals) for k, vals in request.args.lists()}
    for name, value in data.items():
        field = schema.fields.get(name)
        if isinstance(value, list) and field is not None and not isinstance(field, fields.List):
            raise invalid(name, "is given more than once; give it once")
    return load_or_invalid(schema, data)


def json_body() -> Any:
    """The body as a JSON document PostgreSQL could store.

    Raises ``payload_too_large`` (413) past RELAY_MAX_BODY_BYTES and ``parse_error`` (400,
    details ``{"reason"}``) for a body that is not such a document: not JSON, NaN,
    Infinity, a number that overflows to infinity (jsonb refuses them), or nesting too
    deep for the parser.
    """
    try:
        raw = read_body()
    except BodyTooLarge:
        limit = current_app.config["RELAY"].max_body_bytes
        raise RelayError(
            "payload_too_large", f"the request body is larger than {limit} bytes", {"limit_bytes": limit}
        ) from None
    # Any Content-Type: curl -d sends form-urlencoded, and /a2a does not insist either.
    try:
        return strict_json(raw)
    except NotJson as exc:
        reason = str(exc) or "not a JSON document"
        raise RelayError("parse_error", f"the body is not JSON: {reason}", {"reason": reason}) from None


def load_json(schema: Schema) -> dict:
    """Load the JSON body with ``schema``: 400 parse_error when it is not JSON, 422 naming each bad field."""
    body = json_body()
    if not isinstance(body, dict):
        raise RelayError("invalid_params", "the body must be a JSON object", {"body": ["must be a JSON object"]})
    return load_or_invalid(schema, body)


from relay.transport.rest import blocks, identities, keys, openapi, streams, tasks, webhooks  # noqa: E402,F401  (routes register on bp)
