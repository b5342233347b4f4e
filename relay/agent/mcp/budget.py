"""The budgeted serializer: every tool answer stays under MAX_OUTPUT characters as sent.

One mechanism bounds every answer: a value is given a budget in characters of its JSON
text, counted with non-ASCII escaped (``\\uXXXX``, what a JSON encoder that escapes puts on
the wire; never fewer than the raw text). A string over its budget is cut to a prefix, a
container shares the budget among its members (each gets what it needs, the largest the
rest, equally), and a container whose members would get too little each to be worth
showing (or a number too long) is shown as its JSON text, cut. Every cut leaves a note,
``{field, shown, total, rest[, json]}``, whose ``rest`` is the read_artifact call with
what follows; the note is paid for out of the cut value's budget, so what is shown and
its notes stay within it. ``shown`` and ``total`` count characters of the value itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from relay.agent.client.errors import InvalidParams
from relay.agent.client.models import FeedRow, TaskSummary

#: every tool's answer, the whole JSON-RPC response as sent, stays under this many characters
#: (Claude Code's default tool-output limit is 25,000 tokens)
MAX_OUTPUT = 100_000
#: feed rows (search_messages, catch_up) carry at most this much of each message's text
BODY_PREVIEW = 2000
#: artifact fields left out of feed rows (get_thread cuts them, read_artifact pages them)
BULKY_ARTIFACT_FIELDS = ("diff", "spec")
#: no string is shown longer than this, even where the answer has room (a summary repeats the brief)
STRING_CAP = 20_000
#: a container whose cut members would get less than this each is shown as its JSON text, cut
MIN_SHARE = 400
#: a message or feed row is not cut below this: the oldest messages (newest rows) are left out instead
ITEM_FLOOR = 1_500
#: read_artifact's chunk, in characters
ARTIFACT_CHUNK = 50_000


def size(value: Any) -> int:
    """Characters of ``value``'s JSON text with non-ASCII escaped: the most any encoder sends."""
    return len(json.dumps(value, ensure_ascii=True))


_size = size

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_STEP = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')


def _child_path(path: str, key: Any) -> str:
    """``artifacts`` + 0 -> ``artifacts[0]``; ``payload`` + ``"a b"`` -> ``payload["a b"]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _path_steps(path: str) -> list[str | int]:
    """A path as the cut notes name it (``artifacts[0].spec``, ``payload["a b"]``) as its keys and indexes."""
    steps: list[str | int] = []
    text = path if path.startswith("[") else "." + path
    at = 0
    while at < len(text):
        match = _PATH_STEP.match(text, at)
        if match is None:
            raise InvalidParams(f"field: {path!r} is not a path such as 'artifacts[0].spec'", symbol="invalid_params")
        name, index, quoted = match.groups()
        steps.append(name if name is not None else int(index) if index is not None else json.loads(quoted))
        at = match.end()
    return steps


def lookup(value: Any, path: str, where: str) -> Any:
    for step in _path_steps(path):
        if isinstance(step, int) and isinstance(value, list) and step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict) and step in value:
            value = value[step]
        else:
            raise InvalidParams(f"field: {where} has no {path}", symbol="invalid_params")
    return value


def as_text(value: Any) -> tuple[str, bool]:
    """What read_artifact pages: a string as itself, anything else as its JSON text (True)."""
    return (value, False) if isinstance(value, str) else (json.dumps(value, ensure_ascii=False), True)


def _prefix(text: str, room: int) -> str:
    """The longest prefix of ``text`` whose JSON string (quotes and escapes included) is at most ``room`` characters."""
    hi = min(len(text), max(0, room - 2))
    if _size(text[:hi]) <= room:
        return text[:hi]
    lo = max(0, hi - (_size(text[:hi]) - room))  # each character dropped shortens it by one at least
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _size(text[:mid]) <= room:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def _fill(demands: list[int], room: int) -> list[int]:
    """Shares of ``room`` for members needing ``demands``: each what it needs, the largest an equal rest."""
    shares = [0] * len(demands)
    left = room
    order = sorted(range(len(demands)), key=demands.__getitem__)
    for k, i in enumerate(order):
        shares[i] = min(demands[i], max(0, left) // (len(order) - k))
        left -= shares[i]
    return shares


class _Cut:
    """Where the cut values of one holder (a thread, a message, a feed row) are read whole, and its bounds."""

    def __init__(self, task_id: Any, sequence_no: Any = None):
        self.task_id = task_id
        self.sequence_no = sequence_no
        self._capped: dict[tuple[int, str], tuple[Any, list[dict], int]] = {}

    def note(self, path: str, shown: int, total: int, as_json: bool) -> dict[str, Any]:
        if self.task_id is None:
            rest = "not available: the answer was over its bound"
        else:
            where = f"task_id={self.task_id!r}"
            if self.sequence_no is not None:
                where += f", sequence_no={self.sequence_no}"
            rest = f"read_artifact({where}, field={json.dumps(path, ensure_ascii=False)}, offset={shown})"
        note: dict[str, Any] = {"field": path, "shown": shown, "total": total, "rest": rest}
        if as_json:
            note["json"] = True
        return note

    def text(
        self, text: str, room: int, path: str, as_json: bool, most: int | None = None
    ) -> tuple[str, list[dict], int]:
        """``text`` cut to fit ``room`` (and ``most`` characters) with its note (over ``room`` only when not even the note fits)."""
        probe = _size(self.note(path, len(text), len(text), as_json)) + 2
        shown = _prefix(text[:most], room - probe) if room - probe >= 2 else ""
        note = self.note(path, len(shown), len(text), as_json)
        return shown, [note], _size(shown) + _size(note) + 2

    def capped(self, value: Any, path: str) -> tuple[Any, list[dict], int]:
        """``value`` with every string over STRING_CAP cut: (value, notes, cost of both)."""
        if isinstance(value, str):
            if len(value) > STRING_CAP:
                return self.text(value, 10**12, path, False, most=STRING_CAP)
            return value, [], _size(value)
        if not isinstance(value, (dict, list)) or not value:
            return value, [], _size(value)
        key = (id(value), path)
        if key not in self._capped:
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
            parts = [(k, self.capped(v, _child_path(path, k))) for k, v in items]
            shown: Any = {k: c[0] for k, c in parts} if isinstance(value, dict) else [c[0] for _, c in parts]
            notes = [n for _, c in parts for n in c[1]]
            self._capped[key] = (shown, notes, _size(shown) + sum(_size(n) + 2 for n in notes))
        return self._capped[key]

    def clip(self, value: Any, budget: int, path: str = "", root: bool = False) -> tuple[Any, list[dict], int]:
        """``value`` within ``budget`` characters, its notes included: (value, notes, cost)."""
        capped = self.capped(value, path)
        if capped[2] <= budget:
            return capped
        if isinstance(value, str):
            return self.text(value, budget, path, False)
        if isinstance(value, (dict, list)) and value:
            items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
            over = 2 * len(items) + (sum(_size(k) + 2 for k, _ in items) if isinstance(value, dict) else 0)
            demands = [self.capped(v, _child_path(path, k))[2] for k, v in items]
            shares = _fill(demands, budget - over)
            squeezed = [s for s, d in zip(shares, demands) if s < d]
            if root or (squeezed and min(squeezed) >= MIN_SHARE):
                parts = [(k, self.clip(v, s, _child_path(path, k))) for (k, v), s in zip(items, shares)]
                if root or all(c[2] <= s for (_, c), s in zip(parts, shares)):
                    shown: Any = {k: c[0] for k, c in parts} if isinstance(value, dict) else [c[0] for _, c in parts]
                    notes = [n for _, c in parts for n in c[1]]
                    return shown, notes, _size(shown) + sum(_size(n) + 2 for n in notes)
        return self.text(json.dumps(value, ensure_ascii=False), budget, path, True)


def _holder(value: dict[str, Any], budget: int, cut: _Cut) -> tuple[dict[str, Any], int]:
    """A thread, message or feed row within ``budget``, its members cut as needed; notes in its ``cut``."""
    shown, notes, _ = cut.clip(value, budget - 12, root=True)
    if notes:
        shown["cut"] = notes
    return shown, _size(shown)


def _fit_list(items: list[dict[str, Any]], budget: int, cut_of: Callable[[dict], _Cut], keep: str) -> tuple[list, int]:
    """As many of ``items`` (keeping the newest with keep="newest", else the oldest) as fit ``budget``, each cut to its share.

    Items are left out, rather than cut below ITEM_FLOOR characters each; one is always kept.
    Returns (the items shown, how many were left out).
    """
    cuts = [cut_of(item) for item in items]
    demands = [_holder(item, 10**12, c)[1] + 12 for item, c in zip(items, cuts)]

    def window(dropped: int) -> slice:
        return slice(dropped, None) if keep == "newest" else slice(0, len(items) - dropped)

    def shares(dropped: int) -> list[int]:
        kept = demands[window(dropped)]
        return _fill(kept, budget - 2 * len(kept))

    def fits(dropped: int) -> bool:
        kept = demands[window(dropped)]
        squeezed = [s for s, d in zip(shares(dropped), kept) if s < d]
        return not squeezed or min(squeezed) >= ITEM_FLOOR or len(kept) <= 1

    lo, hi = 0, max(0, len(items) - 1)  # fits(hi) always
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    kept = list(zip(items[window(lo)], cuts[window(lo)], shares(lo)))
    return [_holder(item, share, c)[0] for item, c, share in kept], lo


def bounded_thread(raw: dict[str, Any], budget: int) -> dict[str, Any]:
    """A tasks/get page within ``budget``: every member cut to its share, then the oldest messages left out.

    ``parts`` (each message's body and artifacts again) and the thread's ``artifacts``
    (its messages' again) are left out.
    """
    tid = raw.get("task_id")
    own = {k: v for k, v in raw.items() if k not in ("messages", "artifacts")}
    messages = [
        {k: v for k, v in m.items() if k != "parts"} if isinstance(m, dict) else {"value": m}
        for m in raw.get("messages") or []
    ]
    wanted = sum(_holder(m, 10**12, _Cut(tid, m.get("sequence_no")))[1] + 2 for m in messages)
    # The thread's own members have what they need, up to what leaves the messages half.
    out, used = _holder(own, max(budget // 2, budget - wanted), _Cut(tid))
    shown, dropped = _fit_list(messages, budget - used - 400, lambda m: _Cut(tid, m.get("sequence_no")), keep="newest")
    out["messages"] = shown
    if dropped:
        first = shown[0].get("sequence_no") if shown else None
        out["note"] = (
            f"the {dropped} oldest messages of this page were left out to fit; "
            f"get_thread(task_id={tid!r}, messages_after=N) pages from any point (first shown: {first})"
        )
    return out


def bounded_rows(rows: list[FeedRow], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Feed rows (oldest first) as they fit ``budget``: the oldest kept, each cut to its share; (rows, left out)."""
    return _fit_list(
        [feed_row(r) for r in rows], budget, lambda row: _Cut(row.get("task_id"), row.get("sequence_no")), "oldest"
    )


def bounded_answer(result: dict[str, Any], budget: int) -> dict[str, Any]:
    """The last guarantee, for any answer: one over ``budget`` is cut, its notes in ``cut``."""
    if _size(result) < budget:
        return result
    return _holder(result, budget, _Cut(None))[0]


def read_chunk(text: str, offset: int, room: int) -> str:
    """The piece of ``text`` from ``offset``: at most ARTIFACT_CHUNK characters and ``room`` of JSON; one at least."""
    chunk = _prefix(text[offset : offset + ARTIFACT_CHUNK], room)
    if not chunk and offset < len(text):
        chunk = text[offset]  # one character always moves the reader on
    return chunk


def _handle(ref: Any) -> str | None:
    return ref.handle if ref is not None else None


def task_row(task: TaskSummary) -> dict[str, Any]:
    """A ``tasks/list`` item, trimmed: the thread without its messages."""
    raw = task.raw
    return {
        "task_id": task.task_id,
        "context_id": task.context_id,
        "state": task.state,
        "intent": task.intent,
        "sender": _handle(task.sender),
        "recipient": _handle(task.recipient),
        "summary_preview": task.summary_preview,
        "priority": task.priority,
        "unread_messages": task.unread_messages,
        "created_at": raw.get("created_at"),
        "updated_at": raw.get("updated_at"),
    }


def _artifact_brief(artifact: Any) -> Any:
    if not isinstance(artifact, dict):
        return artifact
    return {k: v for k, v in artifact.items() if k not in BULKY_ARTIFACT_FIELDS}


def feed_row(row: FeedRow) -> dict[str, Any]:
    """A messages-feed row, trimmed: the text cut at BODY_PREVIEW, artifacts without diff/spec bodies."""
    out: dict[str, Any] = {
        "id": row.id,
        "task_id": row.task_id,
        "context_id": row.context_id,
        "task_state": row.task_state,
        "sequence_no": row.sequence_no,
        "role": row.role,
        "from": row.author,
        "caller": _handle(row.caller),
        "target": _handle(row.target),
        "body": row.body[:BODY_PREVIEW],
        "created_at": row.raw.get("created_at"),
    }
    if len(row.body) > BODY_PREVIEW:
        out["body_truncated"] = True
    if row.artifacts:
        out["artifacts"] = [_artifact_brief(a) for a in row.artifacts]
    return out


def dump(items: list[Any] | None) -> list[dict] | None:
    if items is None:
        return None
    return [a.model_dump(exclude_none=True) if isinstance(a, BaseModel) else a for a in items]
