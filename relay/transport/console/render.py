"""Turning what agents wrote into HTML, safely: every helper escapes, or returns text Jinja escapes.

Agents' text is untrusted (docs/console.md). Jinja autoescapes everything a template
prints; the only markup made here is pygments' highlighting, which escapes its input
itself. Links are offered only for http(s) URLs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup, escape
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, JsonLexer, YamlLexer

from relay.ids import iso
from relay.models import PRIORITIES, TERMINAL_STATES, THREAD_STATES
from relay.services.a2a_view import STATES as A2A_STATES
from relay.services.threads.rules import EXPIRED, LEASE_EXPIRED
from relay.urls import BadUrl, parse_web_url

# Highlighting is CPU on the web worker: a diff may be 512 KiB. Past these bounds the rest
# is shown as plain (escaped) text, and the page says so.
MAX_HIGHLIGHT_CHARS = 200_000
MAX_HIGHLIGHT_LINES = 4_000
_FORMATTER = HtmlFormatter(cssclass="hl", wrapcode=True)


def web_url(url: Any) -> str | None:
    """``url`` if it is an http(s) URL by the relay's URL rule (relay.urls; safe as a link's href), else None."""
    if not isinstance(url, str):
        return None
    try:
        parse_web_url(url.strip())
    except BadUrl:
        return None
    return url.strip()


def _bounded(source: str) -> tuple[str, str]:
    """``(head, rest)``: the part of ``source`` within the highlighting bounds, and the remainder."""
    head = source[:MAX_HIGHLIGHT_CHARS]
    cut = -1
    for _ in range(MAX_HIGHLIGHT_LINES):
        cut = head.find("\n", cut + 1)
        if cut < 0:
            break
    if cut >= 0:
        head = head[: cut + 1]
    return head, source[len(head) :]


def _highlighted(source: str, lexer) -> Markup:
    head, rest = _bounded(source)
    html = highlight(head, lexer, _FORMATTER)
    if rest:
        html += (
            f'<p class="note">The remaining {len(rest):,} characters are shown without highlighting.</p>'
            f'<pre class="plain">{escape(rest)}</pre>'
        )
    return Markup(html)  # noqa: S704  (pygments escapes its input; the rest is escaped above)


def diff_html(diff: Any) -> Markup:
    """A unified diff, highlighted (pygments' DiffLexer), as escaped HTML."""
    return _highlighted(str(diff), DiffLexer())


def spec_html(spec: Any, fmt: Any = None) -> Markup:
    """An API contract's spec: an object as indented JSON, a string as written; highlighted when JSON or YAML."""
    kind = str(fmt or "").lower()
    if not isinstance(spec, str):
        return _highlighted(json.dumps(spec, indent=2, ensure_ascii=False, sort_keys=True), JsonLexer())
    if "json" in kind:
        return _highlighted(spec, JsonLexer())
    if "yaml" in kind or "yml" in kind or "openapi" in kind:
        return _highlighted(spec, YamlLexer())
    return Markup(f'<pre class="plain">{escape(spec)}</pre>')  # noqa: S704  (escaped)


def file_ref_text(artifact: dict[str, Any]) -> str:
    """``path:10-20`` (or ``path:10``, or ``path``) of a file_ref artifact, as text."""
    path = str(artifact.get("path", ""))
    start, end = artifact.get("line_start"), artifact.get("line_end")
    if start and end and end != start:
        return f"{path}:{start}-{end}"
    if start or end:
        return f"{path}:{start or end}"
    return path


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON text (for metadata and unknown artifacts)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def relative(when: Any, now: datetime | None = None) -> str:
    """An ISO 8601 time as words from now: ``in 4 min``, ``2 h ago``, ``now`` ("" for none)."""
    if not when:
        return ""
    at = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    seconds = int((at - (now or datetime.now(UTC))).total_seconds())
    span = abs(seconds)
    if span < 5:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if span >= size:
            amount = f"{span // size} {unit}"
            break
    return f"in {amount}" if seconds > 0 else f"{amount} ago"


# A state badge's title: what the state means, and the A2A TaskState an A2A client sees for it
# (relay.services.a2a_view.STATES, the one mapping).
_MEANING = {
    "pending": "waiting for its recipient to accept it",
    "accepted": "its recipient is working on it",
    "completed": "done, with a result summary",
    "cancelled": "its sender withdrew it",
    "declined": "its recipient declined it, with a reason",
    "failed": "its recipient could not do it, with a reason",
    "expired": "its expiry passed before it was done",
    "input_required": "its recipient asked its sender a question and waits for the answer",
}
STATE_MEANING = {state: f"{_MEANING[state]} (A2A {A2A_STATES[state]})" for state in THREAD_STATES}
# The audit actions the relay's clock writes (threads.settle), as an operator reads them.
CLOCK_ACTIONS = {LEASE_EXPIRED: "lease expired", EXPIRED: "expired"}


# An hourly bar chart's geometry, in SVG user units (the SVG scales to its box).
CHART_W, CHART_H, CHART_PAD = 720, 160, 24


def bar_chart(rows: list[dict[str, Any]], series: list[tuple[str, str]], spans=()) -> dict[str, Any]:
    """Grouped bars for ``rows`` (each a dict with an ``hour`` ISO time and a count per series key).

    ``series`` is ``[(key, label), ...]``. Returns ``{"width", "height", "max", "bars":
    [{"x", "y", "w", "h", "series", "label", "value", "hour"}], "ticks": [{"x", "text"}]}``,
    numbers only: the template draws them, and Jinja escapes every text. ``spans``
    (``[{"from", "until"}]``, ISO times) become ``"bands"`` ``[{"x", "w"}]`` over the hours
    they cover, clipped to the chart.
    """
    top = max([1] + [int(r[k]) for r in rows for k, _ in series])
    inner_w, inner_h = CHART_W - 2 * CHART_PAD, CHART_H - 2 * CHART_PAD
    slot = inner_w / max(1, len(rows))
    bar_w = max(1.0, (slot - 2) / len(series))
    bars, ticks = [], []
    for i, row in enumerate(rows):
        x0 = CHART_PAD + i * slot + 1
        for j, (key, label) in enumerate(series):
            value = int(row[key])
            h = inner_h * value / top
            bars.append(
                {
                    "x": round(x0 + j * bar_w, 1),
                    "y": round(CHART_PAD + inner_h - h, 1),
                    "w": round(bar_w, 1),
                    "h": round(h, 1),
                    "series": key,
                    "label": label,
                    "value": value,
                    "hour": row["hour"],
                }
            )
        if i % 6 == 0:
            ticks.append({"x": round(x0, 1), "text": str(row["hour"])[11:16]})
    bands = []
    if rows:
        from datetime import datetime, timedelta

        start = datetime.fromisoformat(str(rows[0]["hour"]).replace("Z", "+00:00"))
        width = timedelta(hours=len(rows)).total_seconds()
        for span in spans:
            lo = (datetime.fromisoformat(span["from"].replace("Z", "+00:00")) - start).total_seconds() / width
            hi = (datetime.fromisoformat(span["until"].replace("Z", "+00:00")) - start).total_seconds() / width
            lo, hi = max(0.0, lo), min(1.0, hi)
            if hi > lo:
                bands.append({"x": round(CHART_PAD + lo * inner_w, 1), "w": round(max(1.0, (hi - lo) * inner_w), 1)})
    return {
        "width": CHART_W,
        "height": CHART_H,
        "pad": CHART_PAD,
        "max": top,
        "bars": bars,
        "ticks": ticks,
        "bands": bands,
    }


HELPERS = {
    "bar_chart": bar_chart,
    "web_url": web_url,
    "diff_html": diff_html,
    "spec_html": spec_html,
    "file_ref_text": file_ref_text,
    "pretty_json": pretty_json,
    "iso": iso,
    "relative": relative,
    "THREAD_STATES": THREAD_STATES,
    "TERMINAL_STATES": TERMINAL_STATES,
    "PRIORITIES": PRIORITIES,
    "STATE_MEANING": STATE_MEANING,
    "CLOCK_ACTIONS": CLOCK_ACTIONS,
}
