"""Identifier forms: thread and context ids are ULIDs, accepted as 26 characters or a UUID."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from ulid import ULID


def new_ulid() -> uuid.UUID:
    """Return a new ULID in its UUID form (the form stored in PostgreSQL)."""
    return ULID().to_uuid()


class SentId(uuid.UUID):
    """A UUID parsed from a caller's text, which it keeps as ``text`` so errors can echo it."""

    __slots__ = ("text",)

    def __init__(self, value: uuid.UUID, text: str):
        super().__init__(int=value.int)
        object.__setattr__(self, "text", text)

    def __reduce__(self):
        return (SentId, (uuid.UUID(int=self.int), self.text))


def parse_ulid(value: object) -> uuid.UUID:
    """Parse a ULID given as 26 Crockford base32 characters or as a UUID string.

    Returns a SentId, which names the id as the caller wrote it (as_sent). Raises
    ValueError with a reason when the value is neither (docs/decisions.md).
    """
    if not isinstance(value, str):
        raise ValueError("must be a string")
    text = value.strip()
    if len(text) == 26:
        try:
            return SentId(ULID.from_str(text.upper()).to_uuid(), text)
        except ValueError:
            raise ValueError("is not a valid ULID") from None
    if len(text) in (32, 36):
        try:
            return SentId(uuid.UUID(text), text)
        except ValueError:
            raise ValueError("is not a valid UUID") from None
    raise ValueError("must be a 26-character ULID or a UUID")


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [_CROCKFORD[i >> 5] + _CROCKFORD[i & 31] for i in range(1024)]


def format_ulid(value: uuid.UUID) -> str:
    """Return the 26-character ULID string of a UUID-stored ULID (Crockford base32 of its 128 bits).

    Ten bits a step through a table: a page of the feed formats a hundred of these, and
    python-ulid's ``str(ULID.from_uuid(...))`` took twice as long.
    """
    return _ulid_of_int(value.int)


@lru_cache(maxsize=4096)
def ulid_of_uuid_text(text: str) -> str:
    """:func:`format_ulid` of a UUID's text (``uuid::text`` in a query), without building a UUID.

    psycopg2 reading a uuid column builds a ``uuid.UUID`` from its text, which cost more
    than formatting the ULID. Memoized (a pure function of an immutable id; about 1 MB
    for 4,096): an inbox or feed read again shows the same threads and contexts, and
    their hundred ULIDs were a tenth of a page's CPU. A new id costs 1.2 us.
    """
    return _ulid_of_int(int(text.replace("-", ""), 16))


def _ulid_of_int(n: int) -> str:
    p = _PAIRS
    return (
        _CROCKFORD[n >> 125]
        + p[(n >> 115) & 1023] + p[(n >> 105) & 1023] + p[(n >> 95) & 1023] + p[(n >> 85) & 1023]
        + p[(n >> 75) & 1023] + p[(n >> 65) & 1023] + p[(n >> 55) & 1023] + p[(n >> 45) & 1023]
        + p[(n >> 35) & 1023] + p[(n >> 25) & 1023] + p[(n >> 15) & 1023] + p[(n >> 5) & 1023]
        + _CROCKFORD[n & 31]
    )  # fmt: skip


def as_sent(value: uuid.UUID) -> str:
    """Name an id for an error message: as the caller sent it (a SentId), else as a ULID."""
    text = getattr(value, "text", None)
    return text if isinstance(text, str) else format_ulid(value)


def iso(value: datetime | None) -> str | None:
    """Format a time as ISO 8601 UTC with microseconds and ``Z``: ``2026-12-01T20:11:07.833036Z``.

    ``isoformat`` rather than ``strftime``: half the cost, and a page of 50 threads
    formats a hundred of these (a seventh of tasks/list's CPU). Times from PostgreSQL
    are already UTC, so most need no conversion.
    """
    if value is None:
        return None
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="microseconds")[:-6] + "Z"


# iso()'s format in PostgreSQL's to_char, applied to a time at UTC: the hot pages format
# their times in the query (relay.services.iso_text), a tenth of what building their rows
# cost in Python. tests/test_hot_paths.py holds the two forms equal.
ISO_SQL_FORMAT = 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'


def encode_cursor(*parts: Any) -> str:
    """Return an opaque keyset cursor for a sort key."""
    raw = json.dumps([p.isoformat() if isinstance(p, datetime) else str(p) for p in parts])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
