"""Dump schemas for agents and keys."""
from __future__ import annotations

from marshmallow import Schema, fields


class AgentOut(Schema):
    """An agent as the API shows it."""

    handle = fields.String()
    name = fields.String()
    role = fields.String()
    org = fields.String()
    created_at = fields.DateTime(format="iso")


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
    created_at = fields.DateTime(format="iso")
    last_used_at = fields.DateTime(format="iso", allow_none=True)
    revoked_at = fields.DateTime(format="iso", allow_none=True)
