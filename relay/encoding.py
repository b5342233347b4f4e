"""JSON with orjson, falling back to the standard library where orjson cannot (any layer may use it).

orjson encodes a page of the feed several times faster than ``json.dumps``, which was a
tenth of the feed's CPU. It refuses integers past 64 bits, which an agent's metadata may
hold (PostgreSQL's jsonb keeps them exactly), so such a document is encoded by ``json``
instead: never an error, never a changed number. Keys are sorted and datetimes are
formatted as Flask's own provider does, so the bytes mean what Flask's would, except
inside :func:`raw_json` fragments: those are written as PostgreSQL gives them (jsonb's key
order and spacing, its number text such as ``0.0000001`` for ``1e-7``), same values.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from flask.json.provider import DefaultJSONProvider

_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME


def raw_json(text: str | None) -> orjson.Fragment | None:
    """JSON text (as PostgreSQL gives a jsonb column) that :func:`dumps_bytes` writes out as it is.

    For what the relay passes through without reading (an agent's parts, artifacts and
    metadata on a feed page): parsing it only to encode it again was a tenth of a page's
    CPU. Its number text is kept exactly, so a big integer needs no fallback.
    """
    return None if text is None else orjson.Fragment(text)


def _default(value: Any) -> Any:
    # json's fallback meets raw_json's fragments too: it writes their parsed value. A
    # Fragment does not give its text back, but orjson writes it out as it is.
    if isinstance(value, orjson.Fragment):
        return loads(orjson.dumps(value))
    return DefaultJSONProvider.default(value)


def dumps_bytes(value: Any) -> bytes:
    """``value`` as compact JSON bytes (Flask's ``default`` for other types; :func:`raw_json` as it is)."""
    try:
        return orjson.dumps(value, default=DefaultJSONProvider.default, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, default=_default, sort_keys=True, separators=(",", ":")).encode()


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (the feed's page budget)."""
    return len(dumps_bytes(value))


class OrjsonProvider(DefaultJSONProvider):
    """Flask's JSON provider with :func:`dumps_bytes` for ``jsonify`` and ``json.dumps``."""

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        if kwargs:  # a caller asked for stdlib options (indent, ...): honour them
            return super().dumps(obj, **kwargs)
        return dumps_bytes(obj).decode()

    def response(self, *args: Any, **kwargs: Any):
        obj = self._prepare_response_obj(args, kwargs)
        return self._app.response_class(dumps_bytes(obj) + b"\n", mimetype=self.mimetype)


# orjson.loads reads an integer past 64 bits as a float (a changed number, silently), so a
# document with a run of 19 digits anywhere, in a number or in a string, goes to json.
_LONG_DIGITS = re.compile(r"\d{19}")


def loads(text: str | bytes | None) -> Any:
    """Parse JSON as ``json.loads`` does, with orjson where it gives the same value (3-4x faster).

    Falls back to ``json`` for long digit runs (big integers) and for what orjson refuses
    (a lone surrogate, a number past a double's range), so every document reads back as
    before. ``None`` (SQL NULL, as psycopg2 passes it) is None.
    """
    if text is None:
        return None
    if _LONG_DIGITS.search(text if isinstance(text, str) else text.decode("utf-8", "replace")) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)
