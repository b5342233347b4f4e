"""Load schemas for the REST API's query strings and bodies."""

from __future__ import annotations

import re

from marshmallow import RAISE, ValidationError, fields, pre_load, validate, validates_schema

from relay.models import THREAD_STATES
from relay.schemas.common import AwareDateTime, BoundedList, Cursor, StrictBool, StrictSchema, Ulid
from relay.schemas.handoffs import (
    MAX_ARTIFACTS,
    MAX_STATUS_FILTER,
    MESSAGES_AFTER_RANGE,
    MESSAGES_LIMIT_RANGE,
    PRIORITY_CHOICE,
    Artifact,
    MessageIn,
    Metadata,
    TransitionFields,
)
from relay.urls import URL_PATTERN

# "2026-07-21T18:00:00 02:00": a '+' offset that arrived unencoded in a query string.
_PLUS_AS_SPACE = re.compile(r"^\d{4}-\d{2}-\d{2}T[\d:.]+ \d{2}:?\d{2}$")


class QueryTime(AwareDateTime):
    """An aware ISO 8601 time in a query string; explains a '+' that became a space."""

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str) and _PLUS_AS_SPACE.match(value):
            raise ValidationError("the '+' of the offset arrived as a space: URL-encode it as %2B (or use Z)")
        return super()._deserialize(value, attr, data, **kwargs)


class FeedFilters(StrictSchema):
    """The filters of the messages feed (docs/api.md), shared by a page, a wait and a stream."""

    class Meta:
        unknown = RAISE

    direction = fields.String(load_default="both", validate=validate.OneOf(("inbound", "outbound", "both")))
    requester_handle = fields.String(validate=validate.Length(min=1, max=320))
    worker_handle = fields.String(validate=validate.Length(min=1, max=320))
    task_id = Ulid()
    context_id = Ulid()
    role = fields.String(validate=validate.OneOf(("caller", "agent")))
    q = fields.String(validate=validate.Length(min=1, max=500, error="must be 1-500 characters"))
    since = QueryTime()
    # A message id of this feed: only rows after it (a stream's position).
    after = fields.UUID(error_messages={"invalid_uuid": "is not a message id"})


MAX_WAIT_SECONDS = 60


class FeedQuery(FeedFilters):
    """Query parameters of ``GET /identities/{handle}/a2a/messages`` (docs/api.md, "The messages feed")."""

    cursor = Cursor()
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=100, error="must be 1-100"))
    wait = fields.Integer(
        validate=validate.Range(min=1, max=MAX_WAIT_SECONDS, error=f"must be 1-{MAX_WAIT_SECONDS} seconds"),
        metadata={"description": "seconds to wait for a message when the page would be empty"},
    )

    @validates_schema
    def _wait_looks_forward(self, data, **kwargs):
        if data.get("wait") is not None and data.get("cursor") is not None:
            # A cursor pages back in time: no message committed from now on can match it.
            raise ValidationError({"wait": ["cannot be combined with cursor (new messages never match a cursor)"]})


class StreamQuery(FeedFilters):
    """Query parameters of ``GET /identities/{handle}/a2a/messages/stream``: the feed's filters, no paging."""


class TaskGetQuery(StrictSchema):
    """Query parameters of ``GET /identities/{handle}/a2a/tasks/{task_id}``: tasks/get's message page."""

    class Meta:
        unknown = RAISE

    messages_limit = fields.Integer(load_default=None, validate=MESSAGES_LIMIT_RANGE)
    messages_after = fields.Integer(load_default=None, validate=MESSAGES_AFTER_RANGE)


class TaskListQuery(StrictSchema):
    """Query parameters of ``GET /identities/{handle}/a2a/tasks`` (same rules as tasks/list)."""

    class Meta:
        unknown = RAISE

    role = fields.String(load_default="recipient", validate=validate.OneOf(("recipient", "sender")))
    status = BoundedList(
        fields.String(validate=validate.OneOf(THREAD_STATES, error=f"must be one of {', '.join(THREAD_STATES)}")),
        max_items=MAX_STATUS_FILTER,
        noun="states",
    )
    priority = BoundedList(fields.String(validate=PRIORITY_CHOICE), max_items=MAX_STATUS_FILTER, noun="priorities")
    since = QueryTime()
    cursor = Cursor()
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200, error="must be 1-200"))

    @pre_load
    def _split_status(self, data, **kwargs):
        data = dict(data)
        for name in ("status", "priority"):  # comma-separated in a query string
            if isinstance(data.get(name), str):
                data[name] = [s for s in data[name].split(",") if s]
        return data


class ReplyBody(StrictSchema):
    """Body of ``POST .../tasks/{task_id}/messages``: an append (reply)."""

    class Meta:
        unknown = RAISE

    message = fields.Nested(MessageIn, required=True)
    artifacts = BoundedList(Artifact(), load_default=list, max_items=MAX_ARTIFACTS, noun="artifacts")
    metadata = Metadata(load_default=dict)


class TransitionBody(TransitionFields):
    """Body of ``POST .../tasks/{task_id}/transitions``: the fields of ``tasks/update`` but ``task_id``."""


class KeyCreateBody(StrictSchema):
    """Body of ``POST .../keys``."""

    class Meta:
        unknown = RAISE

    label = fields.String(load_default="", validate=validate.Length(max=200))


WEBHOOK_EVENTS = ("message.created", "task.updated", "message.read")
MAX_EVENTS = 20  # events in one webhook's list (there are 2; repeats are harmless)
# For the OpenAPI document only: the service checks the URL (relay.urls) and the target itself.
WEBHOOK_URL_DOC = {"format": "uri", "pattern": URL_PATTERN}


class WebhookCreateBody(StrictSchema):
    """Body of ``POST .../webhooks``."""

    class Meta:
        unknown = RAISE

    url = fields.String(required=True, validate=validate.Length(min=1, max=2048), metadata=WEBHOOK_URL_DOC)
    events = BoundedList(
        fields.String(validate=validate.OneOf(WEBHOOK_EVENTS, error=f"must be one of {', '.join(WEBHOOK_EVENTS)}")),
        load_default=None,
        min_items=1,
        max_items=MAX_EVENTS,
        noun="events",
        error="must name at least one event",
    )
    description = fields.String(load_default="", validate=validate.Length(max=500))


class WebhookUpdateBody(StrictSchema):
    """Body of ``PATCH .../webhooks/{id}``: any of url, events, description, enabled."""

    class Meta:
        unknown = RAISE

    url = fields.String(validate=validate.Length(min=1, max=2048), metadata=WEBHOOK_URL_DOC)
    events = BoundedList(
        fields.String(validate=validate.OneOf(WEBHOOK_EVENTS, error=f"must be one of {', '.join(WEBHOOK_EVENTS)}")),
        min_items=1,
        max_items=MAX_EVENTS,
        noun="events",
        error="must name at least one event",
    )
    description = fields.String(validate=validate.Length(max=500))
    enabled = StrictBool()

    @validates_schema
    def _changes_something(self, data, **kwargs):
        if not data:
            raise ValidationError({"body": ["must change at least one of url, events, description, enabled"]})


class DeliveriesQuery(StrictSchema):
    """Query of ``GET .../webhooks/{id}/deliveries``."""

    class Meta:
        unknown = RAISE

    cursor = Cursor()
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=100, error="must be 1-100"))
