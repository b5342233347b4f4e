"""Shared marshmallow fields and helpers: ULID ids, aware timestamps, flat error paths."""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import UTC, datetime
from typing import Any

from marshmallow import Schema, ValidationError, fields

from relay.errors import RelayError
from relay.ids import encode_cursor, format_ulid, iso, parse_ulid  # noqa: F401  (re-exported for schemas)


class Ulid(fields.Field):
    """A ULID given as 26 characters or as a UUID; loads to ``uuid.UUID``."""

    def _deserialize(self, value, attr, data, **kwargs):
        try:
            return parse_ulid(value)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def _serialize(self, value, attr, obj, **kwargs):
        return None if value is None else format_ulid(value)


class StrictBool(fields.Field):
    """JSON ``true`` or ``false`` only: not "off", "yes", 0 or 1."""

    def _deserialize(self, value, attr, data, **kwargs):
        if not isinstance(value, bool):
            raise ValidationError("must be true or false")
        return value


class AwareDateTime(fields.AwareDateTime):
    """An ISO 8601 time that must carry ``Z`` or an offset (a bare local time is refused)."""

    default_error_messages = {
        "invalid": "must be an ISO 8601 time such as 2026-04-20T00:00:00Z",
        "invalid_awareness": "must carry a time zone (Z or an offset such as +02:00)",
        "format": "must be an ISO 8601 time such as 2026-04-20T00:00:00Z",
    }

    def __init__(self, **kwargs):
        super().__init__(format="iso", **kwargs)

    def _deserialize(self, value, attr, data, **kwargs):
        if isinstance(value, str) and value.endswith(("z",)):
            value = value[:-1] + "Z"
        return to_utc(super()._deserialize(value, attr, data, **kwargs))


def to_utc(value: datetime) -> datetime:
    """Return an aware time in UTC; raise ValidationError when UTC has no such date.

    Python accepts offsets up to ±23:59 but PostgreSQL only up to ±15:59, so a time such
    as ``...+18:00`` must not reach the database with its own offset (it failed there
    as an internal error); ``0001-01-01T00:00:00+01:00`` is before year 1 in UTC.
    """
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValidationError("is out of range (years 1-9999 in UTC)") from None


class NotJson(ValueError):
    """The bytes are not a JSON document PostgreSQL's jsonb could store."""


def _reject_constant(name: str):
    raise NotJson(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    # 1e400 is valid JSON text but decodes to inf: jsonb cannot hold it, and json.dumps
    # would echo it back as the non-JSON token Infinity. Refuse it like NaN.
    value = float(text)
    if not math.isfinite(value):
        raise NotJson(f"{text} is out of range")
    return value


def strict_json(raw: bytes) -> Any:
    """Decode UTF-8 JSON strictly: no NaN/Infinity, no overflowing numbers, no stack overflow.

    Raises NotJson for anything else, including nesting too deep for the parser.
    """
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
    except NotJson:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotJson(str(exc)[:200]) from None


def flatten_errors(messages: Any, prefix: str = "") -> dict[str, list[str]]:
    """Turn marshmallow's nested error dict into ``{"a.0.b": [reasons]}``."""
    flat: dict[str, list[str]] = {}
    if isinstance(messages, dict):
        for key, value in messages.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "_schema":
                path = prefix or "params"
            flat.update(flatten_errors(value, path))
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        flat.setdefault(prefix or "params", []).extend(messages)
    elif isinstance(messages, list):
        for i, value in enumerate(messages):
            flat.update(flatten_errors(value, f"{prefix}.{i}" if prefix else str(i)))
    else:
        flat.setdefault(prefix or "params", []).append(str(messages))
    return flat


UNSTORABLE = "must not contain U+0000 or unpaired surrogate characters"


def _storable(text: str) -> bool:
    # PostgreSQL text and jsonb cannot hold NUL, and a lone surrogate cannot be encoded
    # as UTF-8: either would fail in the database as an internal error.
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unstorable_paths(value: Any, prefix: str = "") -> list[str]:
    """Return the paths (``a.0.b``) of strings, or of objects with such keys, PostgreSQL cannot store."""
    bad: list[str] = []
    stack = [(prefix, value)]  # iterative: loaded data may be nested as deep as the JSON parser allows
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not _storable(item):
                bad.append(path or "params")
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and not _storable(key):
                    bad.append(path or "params")
                    continue
                stack.append((f"{path}.{key}" if path else str(key), sub))
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{path}.{i}" if path else str(i), sub) for i, sub in enumerate(item))
    return sorted(set(bad))


MAX_DEPTH = 64
TOO_DEEP = f"must not be nested deeper than {MAX_DEPTH} levels"


def too_deep_path(value: Any, prefix: str = "") -> str | None:
    """Return the top-level member (``metadata``) holding a value nested past MAX_DEPTH, or None.

    Iterative, so it is safe on anything the JSON parser returned. Loading and storing
    (marshmallow, json.dumps, psycopg2's jsonb adapter) recurse once per level, and a
    document a few hundred levels deep ran out of stack there: an internal error for bad input.
    """
    stack = [(value, 0, "")]
    while stack:
        item, depth, member = stack.pop()
        if depth > MAX_DEPTH:
            return ".".join(p for p in (prefix, member) if p) or "params"
        if isinstance(item, dict):
            children = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        stack.extend((sub, depth + 1, member if depth else str(key)) for key, sub in children)
    return None


def load_or_invalid(schema: Schema, data: Any, prefix: str = "") -> dict:
    """Load ``data`` with ``schema``; raise RelayError(invalid_params) naming every bad field."""
    deep = too_deep_path(data, prefix)
    if deep is not None:
        raise RelayError("invalid_params", f"invalid params: {deep}: {TOO_DEEP}", {deep: [TOO_DEEP]})
    try:
        loaded = schema.load(data)
    except ValidationError as exc:
        errors = flatten_errors(exc.messages, prefix)
        summary = "; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items())
        raise RelayError("invalid_params", f"invalid params: {summary}", errors) from None
    bad = unstorable_paths(loaded, prefix)
    if bad:
        raise RelayError(
            "invalid_params", f"invalid params: {', '.join(bad)}: {UNSTORABLE}", {path: [UNSTORABLE] for path in bad}
        )
    return loaded


class Cursor(fields.Field):
    """An opaque keyset cursor ``(time, id)``; garbage is a validation error, never a 500."""

    def _deserialize(self, value, attr, data, **kwargs):
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > 200:
            raise ValidationError("is not a cursor returned by this API")
        try:
            padded = value + "=" * (-len(value) % 4)
            stamp, ident = json.loads(base64.urlsafe_b64decode(padded.encode()).decode())
            if not isinstance(stamp, str) or not isinstance(ident, str):
                raise ValueError
            when = datetime.fromisoformat(stamp)
            if when.tzinfo is None:
                raise ValueError
            when = when.astimezone(UTC)  # see to_utc: PostgreSQL refuses offsets past ±15:59
            import uuid

            return when, uuid.UUID(ident)
        except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
            raise ValidationError("is not a cursor returned by this API") from None
