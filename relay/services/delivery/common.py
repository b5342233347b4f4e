"""What every delivery step shares: the webhook-id, the fixed error texts, and the settings."""

from __future__ import annotations

import logging
import uuid

from flask import current_app

from relay.ids import format_ulid

log = logging.getLogger("relay.webhooks")

TEST_EVENT = "webhook.test"
HELD = "held: the agent is disabled; sent when it is re-enabled"
# An attempt row's error until its outcome is recorded, and after its pump died unrecorded.
IN_FLIGHT = "in flight: the outcome is not recorded yet"
OUTCOME_UNKNOWN = "outcome unknown: the worker stopped before recording it (the receiver may have it)"


def _settings():
    return current_app.config["RELAY"]


def event_id_text(event_id: uuid.UUID) -> str:
    """The ``webhook-id`` of an event: the same for every endpoint and every attempt."""
    return "evt_" + format_ulid(event_id)
