"""Webhook deliveries checked on the receiving side: their Standard Webhooks signature."""

from __future__ import annotations

from collections.abc import Mapping

from relay.agent.client.errors import WebhookVerificationError


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes | str) -> dict:
    """Verify a webhook delivery and return its parsed payload.

    ``secret`` is the endpoint's ``whsec_...`` secret (shown once when the endpoint is
    created or its secret rotated); ``headers`` the delivery's HTTP headers (any case:
    ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``); ``body`` the raw request
    body exactly as received (bytes or str; re-serialised JSON will not verify).

    The relay signs per Standard Webhooks (docs/webhooks.md): HMAC-SHA256
    over ``id.timestamp.body``, ``v1,<base64>``, and during a secret rotation with both
    secrets (either verifies). A timestamp more than 5 minutes from now is refused, which
    stops replays. Dedupe deliveries on ``webhook-id``: it is the same on every attempt.

    Returns the payload ``{"type": "message.created" | "task.updated", "timestamp", "data"}``.
    Raises :class:`WebhookVerificationError` for a bad or missing signature, a stale
    timestamp, a malformed header or secret, or a body that is not JSON.
    """
    import standardwebhooks

    try:
        payload = standardwebhooks.Webhook(secret).verify(body, dict(headers))
    except Exception as exc:  # the library also lets ValueError/binascii.Error out of malformed headers
        raise WebhookVerificationError(f"webhook did not verify: {exc}") from exc
    if not isinstance(payload, dict):
        raise WebhookVerificationError("webhook payload is not a JSON object")
    return payload
