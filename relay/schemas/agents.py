"""Dump schemas for agents and keys."""

from __future__ import annotations

from marshmallow import Schema, fields

from relay.schemas.common import iso


class Timestamp(fields.Field):
    """A time as ISO 8601 UTC with ``Z``, like every other time the API shows."""

    def _serialize(self, value, attr, obj, **kwargs):
        return iso(value)


class AgentOut(Schema):
    """An agent as the API shows it."""

    handle = fields.String()
    name = fields.String()
    role = fields.String()
    org = fields.String()
    created_at = Timestamp()


class AgentRef(Schema):
    """An agent named inside another resource: ``{handle, name, role}``."""

    handle = fields.String()
    name = fields.String()
    role = fields.String()


class KeyOut(Schema):
    """A key's public record; the secret is never shown again."""

    key_id = fields.UUID(attribute="id")
    label = fields.String()
    hint = fields.String()
    created_at = Timestamp()
    last_used_at = Timestamp(allow_none=True)
    revoked_at = Timestamp(allow_none=True)
