"""Artifacts from the command line: unified diffs split per file, file refs, test commands and links."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import click

from relay.agent.cli.errors import OneLineUsage

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# What follows the last ':' of a --file-ref: LINE or START-END.
_LINES = re.compile(r"(?P<start>[0-9]+)(?:-(?P<end>[0-9]+))?")


def _header_path(line: str, prefix: str) -> str | None:
    """The path of a ``--- a/x`` / ``+++ b/x`` header (timestamps after a tab dropped); None for /dev/null."""
    raw = line[4:].split("\t", 1)[0].strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        raw = raw[1:-1]
    if raw == "/dev/null" or not raw:
        return None
    return raw[len(prefix) :] if prefix and raw.startswith(prefix) else raw


def split_diff(text: str) -> list[tuple[str | None, str]]:
    """Split a unified diff into ``(path, diff)`` per file.

    A file starts at ``diff --git`` or at a ``---``/``+++`` header pair outside a hunk
    (hunk lengths from ``@@ -a,b +c,d @@`` are followed, so a removed line that starts
    with ``--`` is not taken for a header). The path is the ``+++ b/...`` file (git's
    ``a/``/``b/`` prefixes dropped), the ``---`` file for a deletion, or git's ``rename
    to``/``diff --git`` name; None when the text has no file header at all.
    """
    lines = text.splitlines(keepends=True)
    sections: list[dict] = []
    preamble: list[str] = []
    cur: dict | None = None
    old = new = 0

    def start(line: str) -> dict:
        sec = {
            "lines": preamble[:] if not sections else [],
            "git": None,
            "minus": None,
            "plus": None,
            "has_minus": False,
            "has_plus": False,
            "rename": None,
        }
        preamble.clear()
        sec["lines"].append(line)
        sections.append(sec)
        return sec

    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        if cur is not None and (old > 0 or new > 0):
            c = body[:1]
            if c in (" ", ""):
                old, new = old - 1, new - 1
            elif c == "-":
                old -= 1
            elif c == "+":
                new -= 1
            elif c != "\\":
                old = new = 0  # a malformed hunk ended early: read this line as a header
            if old > 0 or new > 0 or c in (" ", "", "-", "+", "\\"):
                cur["lines"].append(line)
                continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if body.startswith("diff --git "):
            cur = start(line)
            cur["git"] = body
            continue
        if body.startswith("--- ") and nxt.startswith("+++ ") and (cur is None or cur["has_plus"]):
            cur = start(line)
            cur["has_minus"] = True
            cur["minus_line"] = body
            continue
        if cur is None:
            preamble.append(line)
            continue
        cur["lines"].append(line)
        if body.startswith("--- ") and not cur["has_minus"]:
            cur["has_minus"], cur["minus_line"] = True, body
        elif body.startswith("+++ ") and not cur["has_plus"]:
            cur["has_plus"], cur["plus_line"] = True, body
        elif body.startswith("rename to "):
            cur["rename"] = body[len("rename to ") :].strip()
        else:
            m = _HUNK.match(body)
            if m:
                old = int(m.group(1)) if m.group(1) is not None else 1
                new = int(m.group(2)) if m.group(2) is not None else 1

    if not sections:
        return [(None, text)]
    out: list[tuple[str | None, str]] = []
    for sec in sections:
        git = sec["git"] is not None or sec.get("minus_line", "").startswith("--- a/")
        path = None
        if sec.get("plus_line"):
            path = _header_path(sec["plus_line"], "b/" if git else "")
        if path is None and sec.get("minus_line"):
            path = _header_path(sec["minus_line"], "a/" if git else "")
        if path is None and sec["rename"]:
            path = sec["rename"]
        if path is None and sec["git"]:
            m = re.match(r'^diff --git "?a/.*?"? "?b/(.*?)"?$', sec["git"])
            path = m.group(1) if m else None
        out.append((path, "".join(sec["lines"])))
    if preamble:  # trailing lines after the last file (e.g. a signature) stay with it
        path, diff = out[-1]
        out[-1] = (path, diff + "".join(preamble))
    return out


def diff_artifacts(stream: Any, fallback_path: str | None) -> list[dict]:
    """``file_diff`` artifacts for one ``--artifact-file-diff`` argument (see :func:`split_diff`)."""
    name = getattr(stream, "name", "-")
    text = stream.read()
    if not text.strip():
        raise OneLineUsage(f"--artifact-file-diff {name}: the diff is empty")
    given = None if name in ("-", "<stdin>") else name
    artifacts = []
    for path, diff in split_diff(text):
        path = path or fallback_path or given
        if not path:
            raise OneLineUsage(
                "--artifact-file-diff -: the diff on stdin has no '+++ b/PATH' header; "
                "name the file with --diff-path PATH"
            )
        artifacts.append({"type": "file_diff", "path": path, "diff": diff})
    return artifacts


def file_ref_artifact(spec: str) -> dict:
    """``PATH``, ``PATH:LINE`` or ``PATH:START-END`` as a ``file_ref`` artifact.

    What follows the last ':' is the line part, and must be ``LINE`` or ``START-END``
    (``1 <= START <= END``); ``src/x.py:abc``, ``:2x``, ``:3-`` or a bare trailing ':' are
    refused, not stored as paths. The one exception: text after the last ':' that holds a
    '/' or '\\' is the rest of the path (``C:/repo/x.py``, ``src:v2/x.py``), so such a path
    takes lines after one more ':' (``C:/repo/x.py:10``).
    """
    if not spec.strip():
        raise OneLineUsage("--file-ref: the path is empty")
    path, colon, tail = spec.rpartition(":")
    if not colon or "/" in tail or "\\" in tail:
        return {"type": "file_ref", "path": spec}
    m = _LINES.fullmatch(tail)
    if not m:
        raise OneLineUsage(
            f"--file-ref {spec}: {tail!r} after the last ':' is not a line number; "
            "give PATH, PATH:LINE or PATH:START-END (e.g. src/a.py:10-20)"
        )
    if not path.strip():
        raise OneLineUsage(f"--file-ref {spec}: the path before ':{tail}' is empty")
    start = int(m.group("start"))
    end = int(m.group("end")) if m.group("end") else start
    if start < 1 or end < start:
        raise OneLineUsage(f"--file-ref {spec}: lines must be START-END with 1 <= START <= END")
    ref = {"type": "file_ref", "path": path, "line_start": start}
    if m.group("end"):
        ref["line_end"] = end
    return ref


def _artifact_options(fn: Callable) -> Callable:
    """The artifact options shared by ``send`` and ``reply``."""
    options = [
        click.option(
            "--artifact-file-diff",
            "diffs",
            multiple=True,
            metavar="PATH",
            type=click.File("r", encoding="utf-8", errors="replace"),
            help="Attach a unified diff read from PATH ('-' for stdin) as file_diff artifacts: one per "
            "file in the diff, each named by its '+++ b/...' header (the '---' path for a deleted "
            "file); a diff without headers is named --diff-path, else PATH. Repeatable.",
        ),
        click.option(
            "--diff-path",
            metavar="PATH",
            help="The file path for a diff that has no ---/+++ headers (needed for such a diff on stdin).",
        ),
        click.option(
            "--file-ref",
            "file_refs",
            multiple=True,
            metavar="PATH[:START[-END]]",
            help="Point at a file, optionally at a line or line range: src/a.py, src/a.py:7 or "
            "src/a.py:10-20. What follows the last ':' must be START or START-END (1 <= START <= END; "
            "anything else, like src/a.py:abc, is refused) unless it contains '/' or '\\': then it is "
            "part of the path (C:/repo/a.py, or C:/repo/a.py:7 with lines). Repeatable.",
        ),
        click.option(
            "--test-command",
            "test_commands",
            multiple=True,
            metavar="CMD",
            help="A command that checks the work, e.g. 'pytest -q tests/test_users.py'. Repeatable.",
        ),
        click.option(
            "--link", "links", multiple=True, metavar="URL", help="An http(s) link (PR, issue, doc). Repeatable."
        ),
        click.option(
            "--idempotency-key",
            metavar="KEY",
            help="Make a retried command safe: the same KEY with the same message returns the first "
            "result instead of sending twice (default: a fresh key per command).",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _collect_artifacts(
    diffs: Sequence[Any],
    diff_path: str | None,
    file_refs: Sequence[str],
    test_commands: Sequence[str],
    links: Sequence[str],
) -> list[dict]:
    artifacts: list[dict] = []
    for stream in diffs:
        artifacts += diff_artifacts(stream, diff_path)
    artifacts += [file_ref_artifact(spec) for spec in file_refs]
    for cmd in test_commands:
        if not cmd.strip():
            raise OneLineUsage("--test-command: the command is empty")
        artifacts.append({"type": "test_command", "command": cmd})
    for url in links:
        if not re.match(r"^https?://", url):
            raise OneLineUsage(f"--link {url}: must be an http:// or https:// URL")
        artifacts.append({"type": "link", "url": url})
    return artifacts
