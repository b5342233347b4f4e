"""What relay-agent prints for people: aligned tables and blocks, messages with their artifacts, JSON dumps."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from relay.agent.cli.errors import _one_line
from relay.agent.client.models import FeedRow, SendResult, TransitionResult


def _dump(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, ensure_ascii=False))


def _when(dt: datetime | None) -> str:
    """A time as ``2026-04-25 10:00:03Z`` (UTC), or ``-``."""
    if dt is None:
        return "-"
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _agent(ref: Any) -> str:
    if ref is None:
        return "-"
    extra = ", ".join(x for x in (ref.name, ref.role) if x)
    return f"{ref.handle} ({extra})" if extra else ref.handle


def _width() -> int:
    return max(60, shutil.get_terminal_size((120, 24)).columns)


def _table(headers: Sequence[str], rows: list[Sequence[str]]) -> None:
    """Aligned columns; the last column is cut to the terminal width."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    used = sum(widths) + 2 * len(widths)
    # Cut to the terminal; piped (an agent reading the output) the last column is left whole.
    room = max(20, _width() - used) if sys.stdout.isatty() else 10_000

    def line(cells: Sequence[str]) -> str:
        last = _one_line(cells[-1])
        if len(last) > room:
            last = last[: room - 1] + "…"
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + "  " + last

    click.echo(line(headers).rstrip())
    for r in rows:
        click.echo(line(r).rstrip())


def _block(pairs: Iterable[tuple[str, Any]]) -> None:
    """``key  value`` lines with the keys aligned; None values are skipped."""
    pairs = [(k, v) for k, v in pairs if v is not None]
    width = max(len(k) for k, _ in pairs)
    for k, v in pairs:
        click.echo(f"{k.ljust(width)}  {v}")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else prefix.rstrip() for line in str(text).splitlines()) or prefix.rstrip()


def _artifact_lines(artifact: dict) -> list[str]:
    kind = artifact.get("type")
    if kind == "file_diff":
        diff = str(artifact.get("diff", ""))
        plus = sum(1 for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
        minus = sum(1 for ln in diff.splitlines() if ln.startswith("-") and not ln.startswith("---"))
        return [f"[file_diff] {artifact.get('path')}  (+{plus} -{minus})", _indent(diff, "      ")]
    if kind == "file_ref":
        where = str(artifact.get("path"))
        if artifact.get("line_start") is not None:
            where += f":{artifact['line_start']}"
            if artifact.get("line_end") not in (None, artifact["line_start"]):
                where += f"-{artifact['line_end']}"
        extra = "  ".join(str(artifact[k]) for k in ("ref", "description") if artifact.get(k))
        return [f"[file_ref] {where}" + (f"  {extra}" if extra else "")]
    if kind == "test_command":
        cwd = f"  (in {artifact['cwd']})" if artifact.get("cwd") else ""
        desc = f"  {artifact['description']}" if artifact.get("description") else ""
        return [f"[test_command] {artifact.get('command')}{cwd}{desc}"]
    if kind == "link":
        title = f"  {artifact['title']}" if artifact.get("title") else ""
        return [f"[link] {artifact.get('url')}{title}"]
    if kind == "api_contract":
        spec = artifact.get("spec")
        spec_text = spec if isinstance(spec, str) else json.dumps(spec, indent=2, ensure_ascii=False)
        fmt = f" ({artifact['format']})" if artifact.get("format") else ""
        return [f"[api_contract] {artifact.get('name')}{fmt}", _indent(spec_text, "      ")]
    return [f"[{kind}] {json.dumps(artifact, ensure_ascii=False)}"]


def _print_message_body(text: str, artifacts: list, metadata: dict | None = None) -> None:
    click.echo(_indent(text))
    for artifact in artifacts:
        for ln in _artifact_lines(artifact if isinstance(artifact, dict) else {"type": "?", "value": artifact}):
            click.echo(ln if ln.startswith("      ") else "    " + ln)
    if metadata:
        click.echo(f"    metadata: {json.dumps(metadata, ensure_ascii=False)}")


def _print_sent(result: SendResult, to: str | None) -> None:
    _block(
        [
            ("task_id", result.task_id),
            ("state", result.state),
            ("to", to),
            ("message", f"#{result.sequence_no}" if result.sequence_no is not None else None),
            ("message_id", result.message_id),
            ("context_id", result.context_id),
            ("priority", result.priority),
            ("expires", _when(result.expires_at) if result.expires_at else None),
            ("created", _when(result.created_at) if result.created_at else None),
        ]
    )


def _print_transition(verb: str, result: TransitionResult) -> None:
    click.echo(f"{verb} {result.task_id}: state is now {result.state}")


def _row_line(row: FeedRow) -> str:
    other = None
    if row.caller and row.target:
        other = row.target.handle if row.author == row.caller.handle else row.caller.handle
    return (
        f"{_when(row.created_at)}  {row.author} -> {other or '-'}  task {row.task_id} #{row.sequence_no}"
        f"  [{row.task_state}]"
    )


def _print_row(row: FeedRow, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(row.raw, ensure_ascii=False))
    else:
        click.echo(_row_line(row))
        _print_message_body(row.body, row.artifacts, row.metadata)
    sys.stdout.flush()
