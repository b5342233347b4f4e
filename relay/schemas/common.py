"""Shared marshmallow fields and helpers: ULID ids, aware timestamps, bounded lists, flat error paths."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from itertools import chain, compress, repeat
from operator import not_
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, pre_load, utils
from marshmallow.validate import Length

from relay.errors import MAX_FIELD_ERRORS, RelayError, invalid_fields
from relay.ids import encode_cursor, format_ulid, iso, parse_ulid  # noqa: F401  (re-exported for schemas)
from relay.urls import BadUrl, parse_web_url


class Ulid(fields.Field):
    """A ULID given as 26 characters or as a UUID; loads to ``uuid.UUID``."""

    def _deserialize(self, value, attr, data, **kwargs):
        try:
            return parse_ulid(value)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def _serialize(self, value, attr, obj, **kwargs):
        return None if value is None else format_ulid(value)


class BoundedList(fields.List):
    """A list of at most ``max_items``; a longer one is refused whole, before any item is loaded.

    marshmallow's List loads every item and only then runs its Length validator, so a body
    holding 349,000 bad items cost seconds and answered one error per item. Here the
    length comes first: one error, ``must hold at most 20 parts, got 349000``. The
    Length validator stays (it checks ``min_items`` and gives the OpenAPI document
    minItems/maxItems); ``error`` is its message, for a list that is too short.
    """

    def __init__(
        self,
        cls_or_instance,
        *,
        max_items: int,
        min_items: int = 0,
        noun: str = "items",
        error: str | None = None,
        validate: Any = None,
        **kwargs,
    ):
        extra = [] if validate is None else list(validate) if isinstance(validate, (list, tuple)) else [validate]
        if error is None:
            error = (
                f"must hold {min_items}-{max_items} {noun}" if min_items else f"must hold at most {max_items} {noun}"
            )
        length = Length(min=min_items or None, max=max_items, error=error)
        super().__init__(cls_or_instance, validate=[length, *extra], **kwargs)
        self.max_items = max_items
        self.noun = noun

    def _deserialize(self, value, attr, data, **kwargs):
        if utils.is_collection(value) and len(value) > self.max_items:
            raise ValidationError(f"must hold at most {self.max_items} {self.noun}, got {len(value)}")
        return super()._deserialize(value, attr, data, **kwargs)


class WebUrl(fields.String):
    """An http(s) URL of at most ``max_length`` characters, by the relay's one URL rule; loads the string as sent.

    The length is measured first; then ``relay.urls.parse_web_url`` judges it (any
    http(s) URL a browser opens: IDNs, underscores, one-label hosts, ports, IP
    literals), and a refusal says which rule: ``scheme 'ftp' is not allowed ...`` or
    ``is not a valid URL: <what>``. Who may be called is not judged here (webhooks do
    that in the outbound service).
    """

    def __init__(self, *, max_length: int, **kwargs):
        super().__init__(validate=Length(max=max_length, error=f"must be at most {max_length} characters"), **kwargs)
        self.max_length = max_length

    def _deserialize(self, value, attr, data, **kwargs):
        value = super()._deserialize(value, attr, data, **kwargs)
        if len(value) > self.max_length:
            raise ValidationError(f"must be at most {self.max_length} characters")
        try:
            parse_web_url(value)
        except BadUrl as exc:
            raise ValidationError(str(exc)) from None
        return value


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


#: Python reads an integer of at most this many digits (sys.get_int_max_str_digits' default)
MAX_INT_DIGITS = 4300


def _bounded_int(text: str) -> int:
    # int() refuses more digits than that with a message about sys.set_int_max_str_digits,
    # which was the parse error's text; no integer field takes such a number anyway.
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise NotJson(f"a number of {digits} digits is out of range (at most {MAX_INT_DIGITS})")
    return int(text)


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
        return json.loads(
            raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int
        )
    except NotJson:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise NotJson(str(exc)[:200]) from None


# Marks a count in marshmallow's error messages: ``{_MORE: 89980}``, N errors not listed.
# A caller's member name is never it: theirs carry a list of reasons, not an int.
_MORE = "\x00more"


def _count_more(messages: Any) -> int:
    """The counts (``_MORE``) anywhere in marshmallow's nested error messages."""
    if isinstance(messages, dict):
        return sum(
            value if key == _MORE and isinstance(value, int) else _count_more(value) for key, value in messages.items()
        )
    if isinstance(messages, list):
        return sum(_count_more(value) for value in messages if isinstance(value, (dict, list)))
    return 0


class StrictSchema(Schema):
    """A schema that refuses unknown members, naming at most MAX_FIELD_ERRORS of them.

    marshmallow stores one error per unknown member, so 90,000 of them cost a third of a
    second before any cap could apply. Past MAX_FIELD_ERRORS this refuses the object at
    once: the first ones named, the rest counted, nothing else in it checked.
    """

    class Meta:
        unknown = RAISE

    @pre_load
    def _few_unknown(self, data, **kwargs):
        if (kwargs.get("unknown") or self.unknown) != RAISE or not isinstance(data, Mapping):
            return data
        if len(data) <= MAX_FIELD_ERRORS:
            return data
        known = {f.data_key if f.data_key is not None else name for name, f in self.load_fields.items()}
        extra = [key for key in data if key not in known]
        if len(extra) <= MAX_FIELD_ERRORS:
            return data
        errors: dict[str, Any] = {key: [self.error_messages["unknown"]] for key in extra[:MAX_FIELD_ERRORS]}
        errors[_MORE] = len(extra) - MAX_FIELD_ERRORS
        raise ValidationError(errors)


def iter_field_errors(messages: Any, prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """Yield marshmallow's nested errors as ``("a.0.b", [reasons])`` pairs, depth first.

    A generator, so a caller that keeps only the first few (``invalid_fields``) builds
    no path string it then drops; a path may come twice (``_schema`` beside a field).
    """
    if isinstance(messages, dict):
        for key, value in messages.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == _MORE and isinstance(value, int):
                continue  # a count (StrictSchema), not an error
            if key == "_schema":
                path = prefix or "params"
            yield from iter_field_errors(value, path)
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        yield prefix or "params", list(messages)
    elif isinstance(messages, list):
        for i, value in enumerate(messages):
            yield from iter_field_errors(value, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix or "params", [str(messages)]


UNSTORABLE = "must not contain U+0000 or unpaired surrogate characters"


# What PostgreSQL text and jsonb cannot hold: NUL, and a lone surrogate (not encodable as
# UTF-8); either would fail in the database as an internal error.
_UNSTORABLE_CHAR = re.compile("[\x00\ud800-\udfff]")


def _storable(text: str) -> bool:
    return _UNSTORABLE_CHAR.search(text) is None


# The scans below run on whole bodies (up to RELAY_MAX_BODY_BYTES: 524,000 items of a list),
# so they go level by level, and each level is a few passes in C (map, compress, chain,
# join, a regex search) rather than one Python step per item. An exact str, dict, list or
# tuple is judged that way; a subclass of one (never from the JSON parser) makes the
# level-by-level pass give up (_Unusual) and the item-by-item walk decide.
_DICT = frozenset({dict})
_SEQS = frozenset({list, tuple})
_JSON = frozenset({dict, list})  # the containers too_deep_path descends
_CONTAINERS = frozenset({dict, list, tuple})  # the containers find_unstorable descends
_STR = frozenset({str})
_PLAIN = frozenset({str, dict, list, tuple, int, float, bool, type(None)})


class _Unusual(Exception):
    """A subclass of str, dict, list or tuple: the exact-type passes cannot judge it."""


def _of(items: Any, kinds: frozenset) -> list:
    """The items whose exact type is in ``kinds``, chosen in C."""
    items = items if isinstance(items, list) else list(items)
    return list(compress(items, map(kinds.__contains__, map(type, items))))


def _check_kinds(items: list) -> set[type]:
    """The exact types of ``items``; raise _Unusual for a subclass of str, dict, list or tuple."""
    kinds = set(map(type, items))
    for kind in kinds - _PLAIN:
        if issubclass(kind, (str, dict, list, tuple)):
            raise _Unusual
    return kinds


def _member_values(level: list) -> tuple[list, set[type]]:
    """Every member value of the containers in ``level`` (dict values, list and tuple items), and their types."""
    if len(level) == 1 and type(level[0]) is list:
        values = level[0]  # no copy: a body's one long list
    else:
        values = list(
            chain(chain.from_iterable(map(dict.values, _of(level, _DICT))), chain.from_iterable(_of(level, _SEQS)))
        )
    return values, _check_kinds(values)


def _count_unstorable(value: Any) -> int:
    """How many strings, and objects with such keys, in ``value`` PostgreSQL cannot store (C passes per level)."""
    if type(value) is str:
        return 0 if _storable(value) else 1
    _check_kinds([value])
    level = _of([value], _CONTAINERS)
    count = 0
    while level:
        dicts = _of(level, _DICT)
        keys = list(chain.from_iterable(dicts))
        _check_kinds(keys)
        if not _storable("".join(_of(keys, _STR))):
            if set(map(type, keys)) <= _STR:
                count += sum(map(bool, map(_UNSTORABLE_CHAR.search, map("".join, dicts))))
            else:
                count += sum(1 for d in dicts if not _storable("".join(_of(d, _STR))))
        values, kinds = _member_values(level)
        if str in kinds:
            strings = _of(values, _STR)
            if not _storable("".join(strings)):
                count += sum(map(bool, map(_UNSTORABLE_CHAR.search, strings)))
        level = _of(values, _CONTAINERS) if kinds & _CONTAINERS else []
    return count


def find_unstorable(value: Any, prefix: str = "", limit: int | None = MAX_FIELD_ERRORS) -> tuple[list[str], int]:
    """Return the paths (``a.0.b``, sorted) of strings, or objects with such keys, PostgreSQL cannot store.

    At most ``limit`` paths (None: all) and the count of the others.
    Clean data costs a few C passes per nesting level; with a bad string, the walk that
    names paths takes one Python step per container (never per number or string of a
    clean container) and stops at ``limit``. The count comes from the C passes, which
    also count bad strings under a bad key (the walk names only the key's object).
    """
    try:
        total = _count_unstorable(value)
    except _Unusual:
        total = None
    if total == 0:
        return [], 0
    if isinstance(value, str):
        return ([] if _storable(value) else [prefix or "params"]), 0
    bad: set[str] = set()

    def child(path: str, key: Any) -> str:
        return f"{path}.{key}" if path else str(key)

    # Stop at ``limit``, or once every bad string is named; without the count, walk it all.
    stop = None if total is None else total if limit is None else min(limit, total)
    # (parent path, key, container): a path is built when its container is taken, not when pushed
    stack: list[tuple[str | None, Any, Any]] = [(None, None, value)] if isinstance(value, (dict, list, tuple)) else []

    def full() -> bool:
        return stop is not None and len(bad) >= stop

    while stack and not full():  # iterative: as deep as the parser allows
        parent, name, item = stack.pop()
        path = prefix if parent is None else child(parent, name)
        if isinstance(item, dict):
            keys, values = list(item.keys()), list(item.values())
            if set(map(type, keys)) <= _STR:
                if not _storable("".join(keys)):
                    keep = list(map(not_, map(_UNSTORABLE_CHAR.search, keys)))
                    keys, values = list(compress(keys, keep)), list(compress(values, keep))
            else:
                keep = [not isinstance(k, str) or _storable(k) for k in keys]
                keys, values = list(compress(keys, keep)), list(compress(values, keep))
            if len(keys) < len(item):
                bad.add(path or "params")  # a bad key names its object; what it holds is not walked
        else:
            keys, values = range(len(item)), item
        kinds = set(map(type, values))
        if not kinds <= _PLAIN:  # subclasses or other types: one step per member, isinstance decides
            for key, sub in zip(keys, values):
                if isinstance(sub, str):
                    if not _storable(sub):
                        bad.add(child(path, key))
                elif isinstance(sub, (dict, list, tuple)):
                    stack.append((path, key, sub))
            continue
        if str in kinds:
            mask = list(map(_STR.__contains__, map(type, values)))
            strings = list(compress(values, mask))
            if not _storable("".join(strings)):
                for key in compress(compress(keys, mask), map(_UNSTORABLE_CHAR.search, strings)):
                    bad.add(child(path, key))
                    if full():
                        break
        if kinds & _CONTAINERS:
            mask = list(map(_CONTAINERS.__contains__, map(type, values)))
            stack.extend(zip(repeat(path), compress(keys, mask), compress(values, mask)))
    if limit is None:
        return sorted(bad), 0
    paths = sorted(bad)[:limit]
    return paths, max((len(bad) if total is None else total) - len(paths), 0)


def unstorable_paths(value: Any, prefix: str = "") -> list[str]:
    """Every path ``find_unstorable`` would name (uncapped)."""
    return find_unstorable(value, prefix, limit=None)[0]


MAX_DEPTH = 64
TOO_DEEP = f"must not be nested deeper than {MAX_DEPTH} levels"


def _deeper_than_bound(level: list, depth: int) -> bool:
    """True if the containers in ``level``, at ``depth``, hold anything deeper than MAX_DEPTH."""
    while level:
        if depth >= MAX_DEPTH and any(map(len, level)):
            return True
        values, kinds = _member_values(level)
        level = _of(values, _JSON) if kinds & _JSON else []
        depth += 1
    return False


def _too_deep_walk(value: Any, prefix: str) -> str | None:
    # One Python step per item: only for data the level passes cannot judge (_Unusual).
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


def too_deep_path(value: Any, prefix: str = "") -> str | None:
    """Return the top-level member (``metadata``) holding a value nested past MAX_DEPTH, or None.

    Iterative, so it is safe on anything the JSON parser returned. Loading and storing
    (marshmallow, json.dumps, psycopg2's jsonb adapter) recurse once per level, and a
    document a few hundred levels deep ran out of stack there: an internal error for bad input.
    Level by level in C, so a list of 349,000 items is not walked item by item; the member
    is then found by halving the top-level members (the last one, if several are too deep).
    """
    try:
        _check_kinds([value])
        if not _deeper_than_bound(_of([value], _JSON), 0):
            return None
        if isinstance(value, dict):
            keys, values = list(value.keys()), list(value.values())
        else:
            keys, values = list(range(len(value))), list(value)
        mask = list(map(_JSON.__contains__, map(type, values)))
        keys, values = list(compress(keys, mask)), list(compress(values, mask))
        lo, hi = 0, len(values)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if _deeper_than_bound(values[mid:hi], 1):
                lo = mid
            else:
                hi = mid
    except _Unusual:
        return _too_deep_walk(value, prefix)
    return ".".join(p for p in (prefix, str(keys[lo])) if p) or "params"


def load_or_invalid(schema: Schema, data: Any, prefix: str = "") -> dict:
    """Load ``data`` with ``schema``; raise RelayError(invalid_params) naming the bad fields.

    At most MAX_FIELD_ERRORS fields are named (``details``); the error's ``omitted``
    counts the others (relay/errors.py ``invalid_fields``).
    """
    deep = too_deep_path(data, prefix)
    if deep is not None:
        raise RelayError("invalid_params", f"invalid params: {deep}: {TOO_DEEP}", {deep: [TOO_DEEP]})
    try:
        loaded = schema.load(data)
    except ValidationError as exc:
        raise invalid_fields(iter_field_errors(exc.messages, prefix), omitted=_count_more(exc.messages)) from None
    bad, omitted = find_unstorable(loaded, prefix)
    if bad:
        more = f" and {omitted} more" if omitted else ""
        raise RelayError(
            "invalid_params",
            f"invalid params: {', '.join(bad)}{more}: {UNSTORABLE}",
            {path: [UNSTORABLE] for path in bad},
            omitted=omitted,
        )
    return loaded


class Cursor(fields.Field):
    """An opaque keyset cursor ``(time, id)``; garbage is a validation error, never a 500.

    ``ident`` reads the id (a UUID by default; ``int`` for a bigint key).
    """

    def __init__(self, *args, ident=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.ident = ident

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

            return when, (self.ident or uuid.UUID)(ident)
        except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
            raise ValidationError("is not a cursor returned by this API") from None
