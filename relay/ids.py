"""Identifier forms: thread and context ids are ULIDs, accepted as 26 characters or a UUID."""
from __future__ import annotations

import uuid

from ulid import ULID


def new_ulid() -> uuid.UUID:
    """Return a new ULID in its UUID form (the form stored in PostgreSQL)."""
    return ULID().to_uuid()


def parse_ulid(value: object) -> uuid.UUID:
    """Parse a ULID given as 26 Crockford base32 characters or as a UUID string.

    Raises ValueError with a reason when the value is neither (DESIGN.md, "Decisions").
    """
    if not isinstance(value, str):
        raise ValueError("must be a string")
    text = value.strip()
    if len(text) == 26:
        try:
            return ULID.from_str(text.upper()).to_uuid()
        except ValueError:
            raise ValueError("is not a valid ULID") from None
    if len(text) in (32, 36):
        try:
            return uuid.UUID(text)
        except ValueError:
            raise ValueError("is not a valid UUID") from None
    raise ValueError("must be a 26-character ULID or a UUID")


def format_ulid(value: uuid.UUID) -> str:
    """Return the 26-character ULID string of a UUID-stored ULID."""
    return str(ULID.from_uuid(value))
