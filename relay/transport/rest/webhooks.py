"""``/api/v1/identities/{handle}/webhooks``: an agent's own webhook endpoints."""

from __future__ import annotations

from relay.schemas.rest import DeliveriesQuery, WebhookCreateBody, WebhookUpdateBody
from relay.services import webhooks
from relay.transport.rest import bp, identity, load_json, load_query

_DELIVERIES_QUERY = DeliveriesQuery()  # schemas hold no request state: built once, not per request


@bp.post("/identities/<handle>/webhooks")
def create_webhook(handle: str):
    """Subscribe a URL; the response holds the signing secret, shown this once."""
    body = load_json(WebhookCreateBody())
    return webhooks.create_endpoint(identity(handle), body["url"], body["events"], body["description"]), 201


@bp.get("/identities/<handle>/webhooks")
def list_webhooks(handle: str):
    """List this identity's webhook endpoints."""
    return {"items": webhooks.list_endpoints(identity(handle))}


@bp.get("/identities/<handle>/webhooks/<webhook_id>")
def get_webhook(handle: str, webhook_id: str):
    """Return one endpoint, including whether and why it was disabled."""
    return webhooks.get_endpoint(identity(handle), webhook_id)


@bp.patch("/identities/<handle>/webhooks/<webhook_id>")
def update_webhook(handle: str, webhook_id: str):
    """Change url, events, description or enabled."""
    body = load_json(WebhookUpdateBody())
    return webhooks.update_endpoint(identity(handle), webhook_id, body)


@bp.delete("/identities/<handle>/webhooks/<webhook_id>")
def delete_webhook(handle: str, webhook_id: str):
    """Delete an endpoint and its delivery log."""
    webhooks.delete_endpoint(identity(handle), webhook_id)
    return "", 204


@bp.post("/identities/<handle>/webhooks/<webhook_id>/rotate-secret")
def rotate_webhook_secret(handle: str, webhook_id: str):
    """Issue a new secret; the old one keeps signing beside it for 24 hours."""
    return webhooks.rotate_secret(identity(handle), webhook_id)


@bp.post("/identities/<handle>/webhooks/<webhook_id>/test")
def test_webhook(handle: str, webhook_id: str):
    """Send a ``webhook.test`` event to this endpoint now."""
    return webhooks.send_test(identity(handle), webhook_id), 202


@bp.get("/identities/<handle>/webhooks/<webhook_id>/deliveries")
def list_webhook_deliveries(handle: str, webhook_id: str):
    """Recent deliveries, newest first, with every attempt."""
    q = load_query(_DELIVERIES_QUERY)
    return webhooks.list_deliveries(identity(handle), webhook_id, limit=q["limit"], cursor=q.get("cursor"))
