"""The ``relay-agent`` command: an agent's own handoff CLI, on the public API only.

Every command talks to the relay through :class:`relay.agent.client.RelayClient` (JSON-RPC at
``POST /a2a`` and the REST feed); nothing of the server (services, models, Flask) is
used here, so this command works against any relay the agent can reach.

Configuration comes from the environment: ``RELAY_URL`` (the relay's root URL) and
``RELAY_API_KEY`` (the agent's ``ah_live_...`` key); ``--url``/``--key`` override them.

Exit status:

====  =====================================================================================
0     success
1     the relay answered an error or could not be reached (one ``error: SYMBOL: message
      (hint: ...)`` line on stderr)
2     a usage error
3     ``RELAY_URL``/``RELAY_API_KEY`` missing or malformed
4     ``wait``: the timeout ran out with no new message (one line on stderr)
====  =====================================================================================

``hook claude-code`` is the exception: it always exits 0 (a hook must never trap the
coding agent), reporting problems on stderr only.

A call the relay did not answer (timeout, dropped connection, HTTP 5xx or 429) is retried
with backoff, each retry announced by one stderr line (``relay-agent: cannot reach URL
(timed out); retry 1/4 in 0.5 s``); a refused connection (nothing listens at RELAY_URL)
is not retried: it is reported at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from relay.agent.client import (
    ConfigurationError,
    FeedRow,
    Handoff,
    InvalidParams,
    Page,
    RateLimited,
    RelayClient,
    RelayConnectionError,
    RelayError,
    RetryNotice,
    SendResult,
    StreamUnavailable,
    TaskSummary,
    TransitionResult,
    lease_refused,
    next_position,
)

STATES = ("pending", "accepted", "input_required", "completed", "cancelled", "declined", "failed", "expired")
PRIORITIES = ("low", "normal", "high", "urgent")
INTENTS = ("inform", "ask_question", "propose_action")
# The feed's oldest possible position, where `watch --from-start` begins.
BEGINNING = "1970-01-01T00:00:00+00:00"

EXIT_RELAY = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_TIMEOUT = 4


# =========================================================================== errors


class ConfigMissing(Exception):
    """RELAY_URL / RELAY_API_KEY missing or malformed: exit 3."""


class LocalError(Exception):
    """A problem on this side (state file, input), reported as one line with exit 1."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class OneLineUsage(Exception):
    """A usage error reported as one line (exit 2)."""


class NothingNew(Exception):
    """``wait`` ran out of time with no new message: one stderr line, exit 4."""


# A short hint per common error symbol: what the agent should do next.
HINTS: dict[str, str] = {
    "unauthenticated": "check RELAY_API_KEY: it must be the ah_live_... key the operator printed with "
    "'relay agents create'; it may have been revoked or the agent disabled",
    "forbidden": "a key reads only its own identity's feed",
    "recipient_not_found": "check the handle (local@org, e.g. bob@acme); the operator creates agents with "
    "'relay agents create'",
    "not_a_participant": "only the thread's sender and recipient may read or reply to it; check the task id "
    "and that RELAY_API_KEY is the right agent's key",
    "thread_not_found": "check the task id: 'relay-agent inbox' and 'relay-agent inbox --sent' list yours",
    "thread_terminal": "start a new handoff with relay-agent send",
    "invalid_transition": "see the thread's state with 'relay-agent show TASK_ID': accept, decline and cancel "
    "need pending; complete, fail, release, renew and request-input need accepted (complete, fail and release "
    "also input_required, which the sender's reply ends); completed, cancelled, declined, failed and expired "
    "are final",
    "not_authorized_transition": "the recipient accepts, declines, completes, fails, releases, renews and "
    "requests input on a handoff; only the sender cancels it",
    "state_changed": "someone changed the thread first; check it with 'relay-agent show TASK_ID' and retry",
    "duplicate_idempotency_key": "that --idempotency-key was already used with a different message; use a new key",
    "invalid_intent_payload": "--intent propose_action needs --proposed-description, --target-file and "
    "--rationale; other intents take none of them",
    "teammate_blocked": "the recipient has blocked you; ask its owner",
    "recipient_disabled": "the other agent is disabled; ask the operator to re-enable it (relay agents enable)",
    "invalid_params": "fix the named field and retry",
    "payload_too_large": "send less: split the diff or link to it with --link",
    "identity_not_found": "check the handle",
    "internal_error": "a relay bug: retry later, and quote the request id to the operator",
    "service_unavailable": "the relay's database is unavailable: retry shortly",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _lease_hint(exc: RelayError) -> str:
    """What to do when the relay refused a call's lease token (``state_changed`` on ``lease_token``)."""
    task = getattr(exc, "task_id", None) or "TASK_ID"
    if "no lease_token" in (exc.message or ""):
        return (
            f"the handoff is leased and relay-agent has no lease token for it (another session accepted it): "
            f"pass --lease-token TOKEN (the lease_token its accept answered), or once it is pending again, "
            f"accept it again (relay-agent accept {task} --lease SECONDS)"
        )
    return (
        f"the saved lease token is stale: the lease lapsed, or the handoff was released or accepted again since; "
        f"check it with 'relay-agent show {task}' and accept it again (relay-agent accept {task} --lease SECONDS), "
        "which saves a new token"
    )


def format_error(exc: RelayError, url: str | None = None) -> str:
    """The one stderr line for a relay error: ``error: SYMBOL: message (hint: ...)``."""
    symbol = exc.symbol or "error"
    message = exc.message
    if isinstance(exc, RelayConnectionError):
        reason = _one_line(getattr(exc, "reason", "") or "no answer")
        attempts = f"{exc.attempts} attempt{'' if exc.attempts == 1 else 's'}"
        message = f"cannot reach the relay at {url or 'RELAY_URL'} ({reason}, {attempts})"
        hint = "is RELAY_URL right, and is the relay up? ('curl $RELAY_URL/healthz' should answer)"
    elif isinstance(exc, RateLimited):
        wait = f"{int(exc.retry_after + 0.999)} s" if exc.retry_after is not None else "a minute"
        hint = f"wait {wait} and retry"
    elif lease_refused(exc):
        hint = _lease_hint(exc)
    else:
        hint = HINTS.get(symbol, "")
        fields = [f for f in exc.field_errors() if f not in (message or "")]
        if fields:
            message = f"{message}: {'; '.join(fields)}" if message else "; ".join(fields)
        if symbol in ("internal_error", "service_unavailable") and exc.request_id:
            hint = f"{hint}; request id {exc.request_id}"
    if exc.idempotency_key and symbol in ("connection_error", "service_unavailable", "internal_error", "bad_response"):
        # The send may have gone through: only a retry with the same key is safe.
        hint = f"{hint}; repeat it with --idempotency-key {exc.idempotency_key} so it cannot be sent twice"
    line = f"error: {symbol}: {_one_line(message)}"
    return f"{line} (hint: {hint})" if hint else line


# =========================================================================== output helpers


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


# =========================================================================== artifacts

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


# =========================================================================== the client

# The URL in use, for the connection-error line main() prints after the context is gone.
_SEEN: dict[str, str] = {}


def retry_line(url: str, notice: RetryNotice) -> str:
    """The stderr line for one retry: a call the relay did not answer is not waited on silently."""
    what = f"cannot reach {url} ({notice.reason})" if notice.connection else f"{url} answered {notice.reason}"
    return f"relay-agent: {what}; retry {notice.retry}/{notice.retries} in {notice.delay:.1f} s"


def _say_retry(url: str) -> Callable[[RetryNotice], None]:
    def say(notice: RetryNotice) -> None:
        click.echo(retry_line(url, notice), err=True)

    return say


def _client(ctx: click.Context) -> RelayClient:
    """The RelayClient for RELAY_URL/RELAY_API_KEY (or --url/--key); exit 3 when either is missing."""
    obj = ctx.find_root().ensure_object(dict)
    if obj.get("client") is None:
        url, key = obj.get("url"), obj.get("key")
        missing = [name for name, value in (("RELAY_URL", url), ("RELAY_API_KEY", key)) if not value]
        if missing:
            example = {
                "RELAY_URL": "RELAY_URL=https://your-relay.example.com",
                "RELAY_API_KEY": "RELAY_API_KEY=<the ah_live_... key 'relay agents create' printed>",
            }
            flags = "/".join({"RELAY_URL": "--url", "RELAY_API_KEY": "--key"}[m] for m in missing)
            raise ConfigMissing(
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set "
                f"(hint: export {' and '.join(example[m] for m in missing)}, or pass {flags})"
            )
        try:
            obj["client"] = RelayClient(url, key, on_retry=_say_retry(url))
        except ConfigurationError as exc:
            raise ConfigMissing(str(exc)) from None
        # Lease tokens outlive this process: accept saves them, complete/fail/release/renew read them.
        obj["client"].leases = LeaseFile(obj["client"])
        _SEEN["url"] = url
        ctx.find_root().call_on_close(obj["client"].close)
    return obj["client"]


# =========================================================================== commands


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    envvar="RELAY_URL",
    metavar="URL",
    show_envvar=True,
    help="The relay's root URL, e.g. http://127.0.0.1:8000 (default: $RELAY_URL).",
)
@click.option(
    "--key",
    envvar="RELAY_API_KEY",
    metavar="KEY",
    show_envvar=True,
    help="This agent's API key, ah_live_... (default: $RELAY_API_KEY).",
)
@click.pass_context
def cli(ctx: click.Context, url: str | None, key: str | None) -> None:
    """Hand work to other agents, and take work from them, through a handoff relay.

    \b
    Set RELAY_URL and RELAY_API_KEY (your key, from 'relay agents create'), then:
      relay-agent whoami                                  # check the key
      relay-agent send bob@acme "Please add pagination" --file-ref src/api.py:10-20
      relay-agent inbox                                   # handoffs sent to you
      relay-agent show TASK_ID                            # read one (marks it read)
      relay-agent reply TASK_ID "Question: ..."           # either side, while open
      relay-agent accept TASK_ID [--lease 3600]           # recipient: pending -> accepted (leased)
      relay-agent renew TASK_ID                           # recipient: extend the lease
      relay-agent complete TASK_ID --summary "Done: ..."  # recipient: accepted -> completed
      relay-agent decline TASK_ID --reason "..."          # recipient: pending -> declined
      relay-agent fail TASK_ID --reason "..."             # recipient: accepted -> failed
      relay-agent release TASK_ID [--reason "..."]        # recipient: accepted -> pending
      relay-agent cancel TASK_ID                          # sender: pending or input_required -> cancelled
      relay-agent watch                                   # print new messages as they come
      relay-agent wait --timeout 300                      # block until someone writes to you

    \b
    Every command takes --json for scripts (one JSON document; watch, wait: one per line).
    Exit status: 0 ok; 1 the relay refused or could not be reached (one 'error:
    SYMBOL: message (hint: ...)' line on stderr); 2 usage error; 3 RELAY_URL or
    RELAY_API_KEY missing; 4 wait: nothing new before --timeout. 'relay-agent hook
    claude-code' always exits 0.
    """
    ctx.ensure_object(dict).update(url=url, key=key, client=None)


@cli.command(short_help="Print the agent your key belongs to.")
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def whoami(ctx: click.Context, as_json: bool) -> None:
    """Print the agent RELAY_API_KEY belongs to (handle, name, role, org).

    Use it to check the key and the URL before anything else.
    """
    ident = _client(ctx).whoami()
    if as_json:
        _dump(ident.raw)
        return
    _block(
        [
            ("handle", ident.handle),
            ("name", ident.name or "-"),
            ("role", ident.role or "-"),
            ("org", ident.org or "-"),
            ("relay", _client(ctx).base_url),
        ]
    )


@cli.command(short_help="Open a new handoff to another agent.")
@click.argument("handle")
@click.argument("text")
@click.option(
    "--intent",
    type=click.Choice(INTENTS),
    default="inform",
    show_default=True,
    help="inform (FYI), ask_question (you expect an answer) or propose_action (you propose a change the "
    "recipient should make; needs the three --proposed/--target/--rationale options).",
)
@click.option("--proposed-description", metavar="TEXT", help="propose_action: what the change is.")
@click.option(
    "--target-file",
    "target_files",
    multiple=True,
    metavar="PATH",
    help="propose_action: a file the recipient will touch. Repeatable.",
)
@click.option("--rationale", metavar="TEXT", help="propose_action: why the change is needed.")
@click.option(
    "--context-id",
    metavar="ID",
    help="Join an existing context (one in which you already have a thread) instead of starting a new one.",
)
@click.option(
    "--priority",
    type=click.Choice(PRIORITIES),
    default=None,
    help="low, normal (the relay's default), high or urgent; the recipient can filter its inbox on it.",
)
@click.option(
    "--expires-in",
    "expires_in",
    type=click.IntRange(10, 2_592_000),
    metavar="SECONDS",
    help="If still pending after SECONDS (10-2592000), the handoff becomes expired (final).",
)
@_artifact_options
@click.pass_context
def send(
    ctx: click.Context,
    handle: str,
    text: str,
    intent: str,
    proposed_description: str | None,
    target_files: tuple[str, ...],
    rationale: str | None,
    context_id: str | None,
    priority: str | None,
    expires_in: int | None,
    diffs,
    diff_path,
    file_refs,
    test_commands,
    links,
    idempotency_key,
    as_json: bool,
) -> None:
    """Open a new handoff to HANDLE (local@org) with TEXT as its brief.

    Prints the new task id (the thread starts 'pending'). Attach the work with
    --artifact-file-diff, --file-ref, --test-command and --link.

    \b
    Example:
      relay-agent send bob@acme "Refactored /users; please update the client" \\
        --artifact-file-diff users.diff --file-ref src/api/users.py:10-20 \\
        --test-command "pytest -q tests/test_users.py" --link https://example.com/pr/1
    """
    proposal = {
        "--proposed-description": proposed_description,
        "--target-file": target_files or None,
        "--rationale": rationale,
    }
    if intent == "propose_action":
        missing = [name for name, value in proposal.items() if not value]
        if missing:
            raise OneLineUsage(
                f"--intent propose_action needs --proposed-description, --target-file and "
                f"--rationale; missing: {', '.join(missing)}"
            )
        proposed_action = {
            "description": proposed_description,
            "target_files": list(target_files),
            "rationale": rationale,
        }
    else:
        given = [name for name, value in proposal.items() if value]
        if given:
            raise OneLineUsage(f"{', '.join(given)}: only for --intent propose_action (the intent is {intent})")
        proposed_action = None
    artifacts = _collect_artifacts(diffs, diff_path, file_refs, test_commands, links)
    if proposed_action is not None and diffs:
        proposed_action["suggested_diff"] = "".join(a["diff"] for a in artifacts if a["type"] == "file_diff")
    result = _client(ctx).send(
        handle,
        text,
        intent=intent,
        artifacts=artifacts,
        proposed_action=proposed_action,
        context_id=context_id,
        idempotency_key=idempotency_key,
        priority=priority,
        expires_in_seconds=expires_in,
    )
    if as_json:
        _dump(result.raw)
    else:
        _print_sent(result, handle.strip().lower())


@cli.command(short_help="List handoffs sent to you (--sent: opened by you).")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(STATES),
    help="Only threads in this state. Repeatable (default: all states).",
)
@click.option(
    "--priority",
    "priorities",
    multiple=True,
    type=click.Choice(PRIORITIES),
    help="Only threads of this priority. Repeatable (default: all).",
)
@click.option("--sent", is_flag=True, help="List the handoffs you opened instead of those sent to you.")
@click.option(
    "--limit",
    type=click.IntRange(1, 200),
    default=50,
    show_default=True,
    help="At most this many threads, newest activity first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the relay's tasks/list answer.")
@click.pass_context
def inbox(
    ctx: click.Context, statuses: tuple[str, ...], priorities: tuple[str, ...], sent: bool, limit: int, as_json: bool
) -> None:
    """List handoffs sent to you (or, with --sent, opened by you), newest activity first.

    UNREAD counts the other side's messages you have not read yet; 'relay-agent show
    TASK_ID' reads a thread and marks it read. Typical loop for a recipient: inbox
    --status pending, show, accept, work, complete.
    """
    client = _client(ctx)
    status = list(statuses) or None
    page: Page[TaskSummary] = (client.sent if sent else client.inbox)(
        status=status, limit=limit, priority=list(priorities) or None
    )
    if as_json:
        _dump(page.raw)
        return
    if not page.items:
        click.echo(
            "no handoffs"
            + (" opened by you" if sent else " in your inbox")
            + (f" ({', '.join(statuses + priorities)})" if statuses or priorities else "")
        )
        return
    rows = []
    for t in page.items:
        other = t.recipient if sent else t.sender
        rows.append(
            [
                t.task_id,
                t.state,
                t.priority or "-",
                other.handle if other else "-",
                str(t.unread_messages),
                _when(t.updated_at),
                t.intent or "-",
                t.summary_preview or "",
            ]
        )
    _table(["TASK_ID", "STATE", "PRIORITY", "TO" if sent else "FROM", "UNREAD", "UPDATED", "INTENT", "SUMMARY"], rows)
    if page.next_cursor:
        click.echo(f"(more threads than --limit {limit}; filter with --status or raise --limit)")


@cli.command(short_help="Print a handoff and its messages (marks it read).")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the relay's tasks/get answer.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=None,
    help="Only this many messages: the newest, or those after --after.",
)
@click.option(
    "--after",
    type=click.IntRange(0, 2**31 - 1),
    default=None,
    help="Only the messages after this #sequence_no (0: from the start).",
)
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool, limit: int | None, after: int | None) -> None:
    """Print a handoff with its messages and artifacts (diffs in full); marks what it prints read.

    The header gives the state, both participants, the intent, the priority, when a
    pending handoff expires and a lease ends, any proposed action, the reason of a
    decline or fail and, once completed, the result summary. Each message's line ends
    with its read receipt: 'read TIME' (when the other side first read it) or 'unread'. Every message by default; --limit N the
    newest N, --after S (with --limit, a page) those after #S, as tasks/get pages them.
    """
    client = _client(ctx)
    if after is None and limit is not None:
        handoff: Handoff = client.get_newest(task_id, limit)
    else:
        handoff = client.get(task_id, messages_limit=limit, messages_after=after)
    if as_json:
        _dump(handoff.raw)
        return
    _block(
        [
            ("task_id", handoff.task_id),
            ("state", handoff.state),
            ("from", _agent(handoff.sender)),
            ("to", _agent(handoff.recipient)),
            ("intent", handoff.intent or "-"),
            ("context_id", handoff.context_id),
            ("created", _when(handoff.created_at)),
            ("accepted", _when(handoff.accepted_at) if handoff.accepted_at else None),
            ("completed", _when(handoff.completed_at) if handoff.completed_at else None),
            ("cancelled", _when(handoff.cancelled_at) if handoff.cancelled_at else None),
            ("declined", _when(handoff.declined_at) if handoff.declined_at else None),
            ("failed", _when(handoff.failed_at) if handoff.failed_at else None),
            ("expired", _when(handoff.expired_at) if handoff.expired_at else None),
            ("priority", handoff.priority),
            ("expires", _when(handoff.expires_at) if handoff.expires_at else None),
            ("lease ends", _when(handoff.lease_expires_at) if handoff.lease_expires_at else None),
            ("reason", handoff.reason),
            ("question", handoff.question),
            ("asked", _when(handoff.input_requested_at) if handoff.input_requested_at else None),
            ("result", handoff.result_summary),
        ]
    )
    action = handoff.proposed_action
    if action:
        click.echo("proposed action:")
        click.echo(f"    description: {action.get('description')}")
        click.echo(f"    target files: {', '.join(action.get('target_files') or [])}")
        click.echo(f"    rationale: {action.get('rationale')}")
        suggested = action.get("suggested_diff")
        if suggested:
            first = handoff.messages[0].artifacts if handoff.messages else []
            if suggested == "".join(a.get("diff", "") for a in first if a.get("type") == "file_diff"):
                click.echo("    suggested diff: the file_diff artifacts of message #1")
            else:
                click.echo("    suggested diff:")
                click.echo(_indent(suggested, "      "))
    click.echo("")
    total = handoff.raw.get("messages_total")
    if total is None or not handoff.messages:
        click.echo(f"messages ({len(handoff.messages)}{f' of {total}' if total is not None else ''}):")
    else:
        first, last = handoff.messages[0].sequence_no, handoff.messages[-1].sequence_no
        click.echo(f"messages #{first}-#{last} of {total}:")
    for m in handoff.messages:
        receipt = f"read {_when(m.read_at)}" if m.read_at else "unread"
        click.echo(f"  #{m.sequence_no}  {m.author}  ({m.role or '-'})  {_when(m.created_at)}  {receipt}")
        _print_message_body(m.body, m.artifacts, m.payload)
    if handoff.raw.get("messages_next") is not None:
        click.echo(f"(more: --after {handoff.raw['messages_next']})")


@cli.command(short_help="Add a message to a handoff.")
@click.argument("task_id")
@click.argument("text")
@_artifact_options
@click.pass_context
def reply(
    ctx: click.Context,
    task_id: str,
    text: str,
    diffs,
    diff_path,
    file_refs,
    test_commands,
    links,
    idempotency_key,
    as_json: bool,
) -> None:
    """Add a message (TEXT, plus any artifacts) to handoff TASK_ID.

    Either participant may reply while the thread is pending or accepted; a thread in a final
    state (completed, cancelled, declined, failed, expired) takes no more messages (start a new one with send).
    """
    artifacts = _collect_artifacts(diffs, diff_path, file_refs, test_commands, links)
    result = _client(ctx).reply(task_id, text, artifacts=artifacts, idempotency_key=idempotency_key)
    if as_json:
        _dump(result.raw)
    else:
        _print_sent(result, None)


def _lease_token_option(fn: Callable) -> Callable:
    return click.option(
        "--lease-token",
        metavar="TOKEN",
        help="The lease's token (default: the one 'relay-agent accept --lease' saved for TASK_ID, if any).",
    )(fn)


def _lease_option(what: str) -> Callable:
    return click.option(
        "--lease",
        "lease_seconds",
        type=click.IntRange(10, 86_400),
        metavar="SECONDS",
        help=what,
    )


def _reason(reason: str | None, verb: str, required: bool) -> str | None:
    """``--reason`` checked here, so a missing one is one clear line and nothing is sent."""
    if reason is None:
        if required:
            raise OneLineUsage(f"{verb} needs --reason TEXT: say why, for the sender to read (1-2000 characters)")
        return None
    if not reason.strip():
        raise OneLineUsage("--reason: the reason is empty (1-2000 characters)")
    return reason


def _fenced(task_id: str, call: Callable[[], TransitionResult]) -> TransitionResult:
    """Run a lease-fenced transition; a refused lease token names the task in its hint."""
    try:
        return call()
    except RelayError as exc:
        if lease_refused(exc):
            exc.task_id = task_id  # type: ignore[attr-defined]
        raise


def _print_lease(result: TransitionResult, client: RelayClient) -> None:
    if result.lease_expires_at is None:
        return
    where = client.leases.path if isinstance(client.leases, LeaseFile) else None
    saved = f"; its token is saved in {where}" if where is not None and result.lease_token else ""
    click.echo(f"lease ends {_when(result.lease_expires_at)}{saved} (relay-agent renew {result.task_id} extends it)")


@cli.command(short_help="Accept a pending handoff (recipient), optionally leased.")
@click.argument("task_id")
@click.option("--session-id", metavar="ID", help="Your session's id, recorded in the thread's audit trail.")
@_lease_option(
    "Lease the work for SECONDS (10-86400): until then only this lease's token completes, fails, releases or "
    "renews it (relay-agent saves the token and sends it); past it the handoff is pending again."
)
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def accept(ctx: click.Context, task_id: str, session_id: str | None, lease_seconds: int | None, as_json: bool) -> None:
    """Accept a pending handoff sent to you (recipient only): pending -> accepted.

    Accept before working on it; finish with 'relay-agent complete' (or 'fail', or give
    it back with 'release'). With --lease SECONDS the handoff goes back to pending if you
    neither finish nor renew it in time; the lease token is saved (privately, in
    $XDG_STATE_HOME/relay-agent/HANDLE.leases.json) and used by complete, fail, release
    and renew for this task.
    """
    client = _client(ctx)
    result = client.accept(task_id, session_id=session_id, lease_seconds=lease_seconds)
    if as_json:
        _dump(result.raw)
        return
    _print_transition("accepted", result)
    _print_lease(result, client)


@cli.command(short_help="Complete an accepted handoff (recipient).")
@click.argument("task_id")
@click.option(
    "--summary",
    required=True,
    metavar="TEXT",
    help="What was done (the sender reads it as the result; at most 8192 characters).",
)
@_lease_token_option
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def complete(ctx: click.Context, task_id: str, summary: str, lease_token: str | None, as_json: bool) -> None:
    """Complete an accepted handoff (recipient only): accepted -> completed.

    The thread is then closed: no more messages. A leased handoff needs its lease token:
    the one accept saved is sent unless --lease-token is given.
    """
    client = _client(ctx)
    result = _fenced(task_id, lambda: client.complete(task_id, summary, lease_token=lease_token))
    _dump(result.raw) if as_json else _print_transition("completed", result)


@cli.command(short_help="Decline a pending handoff (recipient), saying why.")
@click.argument("task_id")
@click.option("--reason", metavar="TEXT", help="Why you will not take it (required; 1-2000 characters).")
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def decline(ctx: click.Context, task_id: str, reason: str | None, as_json: bool) -> None:
    """Decline a pending handoff sent to you (recipient only): pending -> declined.

    --reason is required; the sender reads it. Declined is final: no more messages.
    """
    why = _reason(reason, "decline", required=True)
    result = _client(ctx).decline(task_id, why)  # type: ignore[arg-type]
    _dump(result.raw) if as_json else _print_transition("declined", result)


@cli.command(short_help="Fail an accepted handoff (recipient), saying why.")
@click.argument("task_id")
@click.option("--reason", metavar="TEXT", help="Why the work could not be done (required; 1-2000 characters).")
@_lease_token_option
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def fail(ctx: click.Context, task_id: str, reason: str | None, lease_token: str | None, as_json: bool) -> None:
    """Give up on an accepted handoff (recipient only): accepted -> failed.

    --reason is required; the sender reads it. Failed is final. A leased handoff's
    token is sent as for complete.
    """
    why = _reason(reason, "fail", required=True)
    client = _client(ctx)
    result = _fenced(task_id, lambda: client.fail(task_id, why, lease_token=lease_token))  # type: ignore[arg-type]
    _dump(result.raw) if as_json else _print_transition("failed", result)


@cli.command(short_help="Give an accepted handoff back (recipient): it is pending again.")
@click.argument("task_id")
@click.option("--reason", metavar="TEXT", help="Why you give it back (optional; 1-2000 characters).")
@_lease_token_option
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def release(ctx: click.Context, task_id: str, reason: str | None, lease_token: str | None, as_json: bool) -> None:
    """Give an accepted handoff back (recipient only): accepted -> pending, its lease ended.

    It can then be accepted again (by you, another session, or not at all). A leased
    handoff's token is sent as for complete.
    """
    why = _reason(reason, "release", required=False)
    client = _client(ctx)
    result = _fenced(task_id, lambda: client.release(task_id, reason=why, lease_token=lease_token))
    _dump(result.raw) if as_json else _print_transition("released", result)


@cli.command(short_help="Extend the lease of an accepted handoff (recipient).")
@click.argument("task_id")
@_lease_option(
    "The lease runs SECONDS (10-86400) from now (default: the accept's length). Needed for a handoff "
    "accepted without a lease: renew then starts one."
)
@_lease_token_option
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def renew(ctx: click.Context, task_id: str, lease_seconds: int | None, lease_token: str | None, as_json: bool) -> None:
    """Extend the lease of an accepted handoff (recipient only): it stays accepted, the token stays.

    Renew before lease_expires_at ('relay-agent show' prints it); a reply of yours renews
    it too. The saved token is sent unless --lease-token is given.
    """
    client = _client(ctx)
    result = _fenced(task_id, lambda: client.renew(task_id, lease_seconds=lease_seconds, lease_token=lease_token))
    if as_json:
        _dump(result.raw)
        return
    _print_transition("renewed", result)
    _print_lease(result, client)


@cli.command("request-input", short_help="Ask the sender a question before going on (recipient).")
@click.argument("task_id")
@click.option(
    "--question", metavar="TEXT", help="What you need to know (required; 1-2000 characters; the sender reads it)."
)
@_lease_token_option
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def request_input(
    ctx: click.Context, task_id: str, question: str | None, lease_token: str | None, as_json: bool
) -> None:
    """Ask the sender of an accepted handoff a question (recipient only): accepted -> input_required.

    The sender's next message ('relay-agent reply' on their side) answers it and the
    handoff is accepted again. A lease stays yours: its clock stops while you wait and
    runs its full length again from the answer. A leased handoff's token is sent as for
    complete.
    """
    if question is None:
        raise OneLineUsage("request-input needs --question TEXT: what the sender should answer (1-2000 characters)")
    if not question.strip():
        raise OneLineUsage("--question: the question is empty (1-2000 characters)")
    client = _client(ctx)
    result = _fenced(task_id, lambda: client.request_input(task_id, question, lease_token=lease_token))
    _dump(result.raw) if as_json else _print_transition("asked", result)


@cli.command(short_help="Cancel a handoff you sent (sender).")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the relay's JSON answer.")
@click.pass_context
def cancel(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """Cancel a handoff you opened while it is pending or waits on your answer (sender only): -> cancelled."""
    result = _client(ctx).cancel(task_id)
    _dump(result.raw) if as_json else _print_transition("cancelled", result)


def _row_line(row: FeedRow) -> str:
    other = None
    if row.caller and row.target:
        other = row.target.handle if row.author == row.caller.handle else row.caller.handle
    return (
        f"{_when(row.created_at)}  {row.author} -> {other or '-'}  task {row.task_id} #{row.sequence_no}"
        f"  [{row.task_state}]"
    )


@cli.command(short_help="Full-text search over your messages.")
@click.argument("query")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="At most this many messages, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"items": [feed rows]}.')
@click.pass_context
def search(ctx: click.Context, query: str, limit: int, as_json: bool) -> None:
    """Full-text search over every message you can see (yours and those sent to you).

    QUERY is web-search syntax: words, "quoted phrases", -excluded, or. Artifact text
    (diffs, paths, commands) is searched too. Newest first; 'relay-agent show TASK_ID'
    opens a hit's thread.
    """
    if not 1 <= len(query) <= 500:
        raise OneLineUsage("QUERY must be 1-500 characters")
    rows: list[FeedRow] = []
    for row in _client(ctx).search(query, limit=min(limit, 100)):
        rows.append(row)
        if len(rows) >= limit:
            break
    if as_json:
        _dump({"items": [r.raw for r in rows]})
        return
    if not rows:
        click.echo(f"no messages match {query!r}")
        return
    _table(
        ["TASK_ID", "#", "FROM", "STATE", "TIME", "TEXT"],
        [
            [r.task_id, str(r.sequence_no), r.author or "-", r.task_state or "-", _when(r.created_at), r.body]
            for r in rows
        ],
    )


# --------------------------------------------------------------------------- watch, wait: the saved position


def default_state_file(handle: str, kind: str = "") -> Path:
    """``$XDG_STATE_HOME/relay-agent/<handle>[.kind].json``, else under ``~/.local/state/relay-agent/``.

    ``watch`` and ``wait`` share ``<handle>.json``; ``hook claude-code`` keeps ``<handle>.hook.json``.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "relay-agent" / f"{handle}{'.' + kind if kind else ''}.json"


def load_state(path: Path) -> dict | None:
    """The saved position, or None if there is none.

    ``{"since": ISO, "seen": [ids at exactly since], "after": message id}``: ``after`` is the
    last message taken (the stream's ``Last-Event-ID``; absent in files written before it
    existed, which then resume from ``since`` and ``seen``).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LocalError(f"cannot read the state file {path}: {exc.strerror}", "check its permissions") from None
    try:
        state = json.loads(text)
        datetime.fromisoformat(state["since"])
        if not isinstance(state.get("seen", []), list):
            raise ValueError("seen")
        if not isinstance(state.get("after", ""), str | None):
            raise ValueError("after")
    except (ValueError, KeyError, TypeError):
        raise LocalError(
            f"the state file {path} is not a relay-agent watch state", "delete it to start over, or pass --state-file"
        ) from None
    return state


def save_state(path: Path, state: dict) -> None:
    """Write the state atomically (a crash never leaves half a file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(state, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise LocalError(
            f"cannot write the state file {path}: {exc.strerror}",
            "check the directory's permissions or pass --state-file",
        ) from None


#: a saved lease token older than this is dropped (a lease runs at most 86,400 s; a renew saves it again)
LEASE_KEEP_SECONDS = 2 * 86_400


class LeaseFile(MutableMapping):
    """The lease tokens relay-agent's accepts got, ``task_id -> token``, kept across processes.

    ``$XDG_STATE_HOME/relay-agent/HANDLE.leases.json`` (beside watch's state), private: the
    directory is made 0700 and the file is written 0600. Each entry also records the
    relay's URL (a token is only sent back to the relay that issued it) and when it was
    saved (entries older than LEASE_KEEP_SECONDS are dropped on the next write). Every
    access reads the file again, so two relay-agent processes see each other's tokens; a
    write replaces the file atomically under an advisory lock.
    """

    def __init__(self, client: RelayClient, path: Path | None = None):
        self._client = client
        self._path = path

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = default_state_file(self._client.handle, "leases")
        return self._path

    def _read(self) -> dict[str, dict]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise LocalError(
                f"cannot read the lease file {self.path}: {exc.strerror}", "check its permissions"
            ) from None
        except ValueError:
            raise LocalError(
                f"the lease file {self.path} is not JSON", "delete it (saved lease tokens are lost: pass --lease-token)"
            ) from None
        leases = doc.get("leases") if isinstance(doc, dict) else None
        return {
            k: v for k, v in (leases or {}).items() if isinstance(v, dict) and isinstance(v.get("lease_token"), str)
        }

    def _mine(self) -> dict[str, str]:
        return {k: v["lease_token"] for k, v in self._read().items() if v.get("url") == self._client.base_url}

    def _update(self, change: Callable[[dict[str, dict]], None]) -> None:
        path = self.path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with _locked(path.with_name(path.name + ".lock")):
                leases = self._read()
                change(leases)
                cutoff = time.time() - LEASE_KEEP_SECONDS
                leases = {k: v for k, v in leases.items() if v.get("saved_at", 0) >= cutoff}
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
                with os.fdopen(fd, "w") as out:
                    json.dump({"handle": self._client.handle, "leases": leases}, out, indent=2)
                    out.write("\n")
                os.replace(tmp, path)
        except OSError as exc:
            raise LocalError(
                f"cannot write the lease file {path}: {exc.strerror}", "check the directory's permissions"
            ) from None

    def __getitem__(self, task_id: str) -> str:
        return self._mine()[task_id]

    def __setitem__(self, task_id: str, token: str) -> None:
        entry = {"lease_token": token, "url": self._client.base_url, "saved_at": time.time()}
        self._update(lambda leases: leases.__setitem__(task_id, entry))

    def __delitem__(self, task_id: str) -> None:
        if task_id not in self._mine():
            raise KeyError(task_id)
        self._update(lambda leases: leases.pop(task_id, None))

    def __iter__(self) -> Iterator[str]:
        return iter(self._mine())

    def __len__(self) -> int:
        return len(self._mine())


class _locked:
    """An advisory lock on ``path`` (``fcntl.flock``; nothing where fcntl does not exist)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover (Windows)
            return
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock


def advance(state: dict, rows: list[FeedRow]) -> dict:
    """The state after ``rows`` (oldest first): next_position's ``since``/``seen``, and the last row as ``after``."""
    since, seen = next_position(rows, state["since"], state.get("seen", []))
    moved = {"after": rows[-1].id} if rows else {}
    return {**state, "since": since, "seen": seen, **moved}


def _position(state: dict) -> dict:
    """The state as RelayClient.wait/stream arguments: ``after`` when it is known, else ``since`` and ``seen``."""
    if state.get("after"):
        return {"after": state["after"]}
    return {"since": state["since"], "seen": state.get("seen", [])}


def _stale_after(exc: RelayError, state: dict) -> bool:
    """The relay no longer knows the saved ``after`` message (its agent was deleted, say): resume from ``since``."""
    fields = exc.data if isinstance(exc.data, dict) else {}
    return (
        isinstance(exc, InvalidParams) and bool(state.get("after")) and ("after" in fields or "Last-Event-ID" in fields)
    )


def _without_after(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "after"}


def _parse_since(value: str, client: RelayClient) -> dict:
    if value == "now":
        # Skip everything already in the feed: start at its newest row, which is then 'seen'.
        newest = next(iter(client.messages(limit=1)), None)
        if newest is None:
            return {"since": BEGINNING, "seen": []}
        return {
            "since": newest.raw.get("created_at") or newest.created_at.isoformat(),
            "seen": [newest.id],
            "after": newest.id,
        }
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise OneLineUsage(f"--since {value}: not an ISO 8601 time (e.g. 2026-04-25T10:00:00Z) or 'now'") from None
    if when.tzinfo is None:
        raise OneLineUsage(f"--since {value}: give a time zone (e.g. 2026-04-25T10:00:00Z)")
    return {"since": when.isoformat(), "seen": []}


def _start_state(client: RelayClient, path: Path, since: str | None, from_start: bool = False) -> dict:
    """Where watch and wait begin: --from-start, else --since, else the saved position,
    else now (a first run skips what is already in the feed: docs/decisions.md)."""
    if from_start:
        if since is not None:
            raise OneLineUsage("--from-start and --since both give the start: give one")
        return {"since": BEGINNING, "seen": []}
    if since is not None:
        return _parse_since(since, client)
    return load_state(path) or _parse_since("now", client)


def _print_row(row: FeedRow, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(row.raw, ensure_ascii=False))
    else:
        click.echo(_row_line(row))
        _print_message_body(row.body, row.artifacts, row.metadata)
    sys.stdout.flush()


# Errors a long-running watch reports and outlives; anything else ends it.
_TRANSIENT = ("connection_error", "rate_limited", "service_unavailable", "internal_error")


def _state_file_option(kind: str = "") -> Callable:
    name = f"HANDLE.{kind}.json" if kind else "HANDLE.json"
    return click.option(
        "--state-file",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="PATH",
        help=f"Where the position is saved (default: $XDG_STATE_HOME/relay-agent/{name}, "
        f"else ~/.local/state/relay-agent/{name}).",
    )


@cli.command(short_help="Print new messages as they arrive.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="Seconds between polls, when polling (--poll, --once, or a relay without the stream).",
)
@_state_file_option()
@click.option(
    "--since",
    metavar="TIME",
    help="Start at TIME (ISO 8601 with a zone) or 'now' instead of the saved position "
    "(without one, watch starts at now, as wait does).",
)
@click.option(
    "--from-start",
    is_flag=True,
    help="Print the whole feed first, from its oldest message (ignores the saved position).",
)
@click.option("--include-own", is_flag=True, help="Print your own messages too (default: only the other sides').")
@click.option("--once", is_flag=True, help="Poll once, print what is new, save the position and exit (cron, scripts).")
@click.option("--poll", is_flag=True, help="Poll the feed every --interval seconds instead of reading its stream.")
@click.option("--json", "as_json", is_flag=True, help="Print each message as one JSON object per line (a feed row).")
@click.pass_context
def watch(
    ctx: click.Context,
    interval: float,
    state_file: Path | None,
    since: str | None,
    from_start: bool,
    include_own: bool,
    once: bool,
    poll: bool,
    as_json: bool,
) -> None:
    """Print new messages on your threads as they arrive, oldest first, each once.

    Reads the feed's stream (Server-Sent Events): a message is printed as soon as it is
    written. After every message the position (its id, its time and the ids at exactly
    that time) is saved to the state file, so a restarted watch resumes where it stopped:
    nothing is printed twice and nothing is missed. A dropped stream is reopened from
    there. Without a saved position it starts at now, as wait does (--from-start prints
    the feed so far first). If the relay has no stream (an older relay: HTTP 404/405/501) or it keeps
    failing, watch says so in one stderr line and polls the feed every --interval seconds
    instead. Ctrl-C stops it (exit 0). Transient relay errors are reported on stderr and
    retried; with --once they end the command (exit 1).
    """
    client = _client(ctx)
    me = client.handle
    path = state_file or default_state_file(me)
    state = {"handle": me, "url": client.base_url, **_start_state(client, path, since, from_start)}

    def show(rows: list[FeedRow]) -> None:
        for row in rows:
            if include_own or row.author != me:
                _print_row(row, as_json)

    try:
        if not (once or poll):
            state, why = _watch_stream(client, state, path, show)
            click.echo(f"relay-agent: {why}; polling every {interval:g} s instead", err=True)
        _watch_poll(client, state, path, show, interval, once)
    except KeyboardInterrupt:
        return


def _watch_stream(client: RelayClient, state: dict, path: Path, show: Callable) -> tuple[dict, str]:
    """Print from the stream, saving the position after each message, until it gives way to
    polling: return the position and why (the stream never ends by itself)."""
    holder = [state]
    for _ in range(2):  # the second time without a stale `after`
        try:
            for row in client.stream(**_position(holder[0]), on_ready=lambda: save_state(path, holder[0])):
                show([row])
                holder[0] = advance(holder[0], [row])
                save_state(path, holder[0])
        except StreamUnavailable as exc:
            return holder[0], f"the relay at {client.base_url} has no message stream (HTTP {exc.http_status})"
        except RelayError as exc:
            if _stale_after(exc, holder[0]):
                holder[0] = _without_after(holder[0])
                continue
            if exc.symbol not in _TRANSIENT:
                raise
            return holder[
                0
            ], f"the message stream failed ({format_error(exc, client.base_url).removeprefix('error: ')})"
    raise AssertionError("unreachable: the stream ends only by raising")  # pragma: no cover


def _watch_poll(client: RelayClient, state: dict, path: Path, show: Callable, interval: float, once: bool) -> None:
    """The polling watch: catch_up every ``interval`` seconds (or once); since/seen only, which every relay reads."""
    while True:
        try:
            rows = client.catch_up(state["since"], seen=state.get("seen", []), limit=100)
        except RelayError as exc:
            if once or exc.symbol not in _TRANSIENT:
                raise
            click.echo(
                format_error(exc, client.base_url).replace("error:", "warning:", 1) + f" [retrying in {interval:g} s]",
                err=True,
            )
            rows = None
        if rows is not None:
            show(rows)
            state = advance(state, rows)
            save_state(path, state)
        if once:
            return
        time.sleep(interval)


@cli.command(short_help="Block until someone writes to you; print it and exit.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up after this long: exit 4, nothing printed. 0 checks once without waiting.",
)
@_state_file_option()
@click.option(
    "--since",
    metavar="TIME",
    help="Start at TIME (ISO 8601 with a zone) or 'now' instead of the saved position "
    "(without one, wait starts at now).",
)
@click.option("--include-own", is_flag=True, help="Wake on your own messages too (default: only the other sides').")
@click.option("--json", "as_json", is_flag=True, help="Print each message as one JSON object per line (a feed row).")
@click.pass_context
def wait(
    ctx: click.Context,
    timeout: float,
    state_file: Path | None,
    since: str | None,
    include_own: bool,
    as_json: bool,
) -> None:
    """Block until new messages arrive on your threads, print them (as watch does) and exit.

    Waits on the relay (a long-poll: no polling, no delay) for the other side's next
    message after the saved position, the one watch keeps too: a new handoff to you, a
    reply, a result. Everything new is printed oldest first and the position saved, so
    the next wait or watch goes on from there. Your own messages move the position but
    do not wake it. Without a saved position it starts at now.

    \b
    Exit status: 0 messages printed; 4 --timeout ran out with nothing new (one line on
    stderr, nothing on stdout); 1 the relay refused or could not be reached; 2 usage
    error; 3 RELAY_URL or RELAY_API_KEY missing.

    \b
    Example, an agent with no public URL waiting for its reviewer:
      relay-agent send bob@acme "Please review" && relay-agent wait --timeout 600
    """
    client = _client(ctx)
    me = client.handle
    path = state_file or default_state_file(me)
    state = {"handle": me, "url": client.base_url, **_start_state(client, path, since)}
    deadline = time.monotonic() + timeout
    while True:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            rows = client.wait(**_position(state), timeout=remaining)
        except RelayError as exc:
            if not _stale_after(exc, state):
                raise
            state = _without_after(state)
            continue
        state = advance(state, rows)
        shown = [r for r in rows if include_own or r.author != me]
        if rows:
            for row in shown:
                _print_row(row, as_json)
            save_state(path, state)
        if shown:
            return
        if time.monotonic() >= deadline:
            save_state(path, state)
            raise NothingNew(f"no new messages within {timeout:g} s")


# --------------------------------------------------------------------------- hook

HOOK_LIST = 10  # messages listed one by one in a hook's reason; the rest are counted


def _first_line(text: str, width: int = 160) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


def hook_reason(me: str, rows: list[FeedRow]) -> str:
    """What a Stop hook tells the agent about ``rows`` (the other side's new messages, oldest first)."""
    lines = [f"New work arrived on the handoff relay for {me} while you were busy ({len(rows)} new message(s)):"]
    for row in rows[:HOOK_LIST]:
        new = row.sequence_no == 1 and row.target is not None and row.target.handle == me
        what = "new handoff" if new else f"message #{row.sequence_no}"
        state = f", {row.task_state}" if row.task_state else ""
        lines.append(
            f"- {what} from {row.author or '?'} on task {row.task_id}{state}: "
            f'"{_first_line(row.body)}" (open it: relay-agent show {row.task_id})'
        )
    if len(rows) > HOOK_LIST:
        lines.append(f"- and {len(rows) - HOOK_LIST} more: relay-agent inbox lists them")
    lines.append(
        "Read each one with 'relay-agent show TASK_ID', then act on it (relay-agent accept / decline / reply / complete) "
        "or tell the user why not, before you stop."
    )
    return "\n".join(lines)


# Threads that can still ask something of the agent (input_required: its sender owes an answer).
OPEN_STATES = ("pending", "accepted", "input_required")


def unread_reason(me: str, threads: list[TaskSummary]) -> str:
    """What a first Stop hook run tells the agent about open threads with unread messages."""
    lines = [f"Unread work is waiting on the handoff relay for {me} ({len(threads)} thread(s)):"]
    for t in threads[:HOOK_LIST]:
        other = t.sender if t.recipient is not None and t.recipient.handle == me else t.recipient
        lines.append(
            f"- task {t.task_id} ({t.state}) with {other.handle if other else '?'}, {t.unread_messages} unread: "
            f'"{_first_line(t.summary_preview or "")}" (open it: relay-agent show {t.task_id})'
        )
    if len(threads) > HOOK_LIST:
        lines.append(f"- and {len(threads) - HOOK_LIST} more: relay-agent inbox lists them")
    lines.append(
        "Read each one with 'relay-agent show TASK_ID', then act on it (relay-agent accept / decline / reply / complete) "
        "or tell the user why not, before you stop."
    )
    return "\n".join(lines)


def _hook_input() -> dict:
    """The hook's JSON object from stdin ({} when there is none, say run by hand); ValueError when it is not one."""
    if sys.stdin is None or sys.stdin.isatty():
        return {}
    text = sys.stdin.read()
    if not text.strip():
        return {}
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


@cli.group(short_help="Hooks for coding agents (Claude Code's Stop hook).")
def hook() -> None:
    """Commands a coding agent runs as a hook, so new handoffs reach it without a public URL."""


@hook.command("claude-code", short_help="Claude Code Stop hook: keep going when new work has arrived.")
@_state_file_option("hook")
@click.pass_context
def hook_claude_code(ctx: click.Context, state_file: Path | None) -> None:
    """A Claude Code Stop hook: when the agent is about to stop and new messages have arrived
    for it since the hook last looked, print {"decision": "block", "reason": ...} so it reads
    them and carries on. Otherwise print nothing.

    Reads Claude Code's hook input (JSON) on stdin. When "stop_hook_active" is true (the
    agent is already continuing because of a Stop hook) it does nothing, so it can never
    keep the agent in a loop; what arrived is reported at the next stop.

    The hook keeps its own position (HANDLE.hook.json next to watch's state), so it never
    makes 'relay-agent watch' or 'wait' skip a message; each message is reported by the
    hook once. Its first run reports the open threads the relay still counts unread
    (handoffs not yet opened, replies not yet read), then records where the feed is.

    Always exits 0: when the relay cannot be reached, or RELAY_URL/RELAY_API_KEY are not
    set, it prints one line on stderr and lets the agent stop.

    \b
    In .claude/settings.json:
      {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "relay-agent hook claude-code"}]}]}}
    """
    obj = ctx.find_root().ensure_object(dict)
    try:
        try:
            given = _hook_input()
        except (ValueError, UnicodeDecodeError) as exc:
            click.echo(f"relay-agent hook: the hook input on stdin is not JSON ({exc}); not checking", err=True)
            return
        if given.get("stop_hook_active") is True:
            return
        url, key = obj.get("url"), obj.get("key")
        if not url or not key:
            click.echo("relay-agent hook: RELAY_URL and RELAY_API_KEY must be set; not checking", err=True)
            return
        # Quick and quiet: the agent waits on this hook, and an answer later than a few seconds helps no one.
        with RelayClient(url, key, timeout=5.0, max_retries=1, backoff=0.2) as client:
            me = client.handle
            path = state_file or default_state_file(me, "hook")
            state = load_state(path)
            if state is None:
                # First run: from here on the position says what is new; what came before is
                # reported if the relay still counts it unread (threads not yet opened).
                save_state(path, {"handle": me, "url": client.base_url, **_parse_since("now", client)})
                unread = [
                    t
                    for page in (client.inbox(status=OPEN_STATES, limit=50), client.sent(status=OPEN_STATES, limit=50))
                    for t in page.items
                    if t.unread_messages
                ]
                if unread:
                    click.echo(
                        json.dumps({"decision": "block", "reason": unread_reason(me, unread)}, ensure_ascii=False)
                    )
                    sys.stdout.flush()
                return
            rows = client.catch_up(state["since"], seen=state.get("seen", []), limit=100)
            work = [r for r in rows if r.author != me]
            if work:
                click.echo(json.dumps({"decision": "block", "reason": hook_reason(me, work)}, ensure_ascii=False))
                sys.stdout.flush()
            if rows:
                save_state(path, advance(state, rows))
    except RelayError as exc:
        click.echo(f"relay-agent hook: {format_error(exc, obj.get('url'))} (not checking)", err=True)
    except (ConfigurationError, LocalError) as exc:
        click.echo(f"relay-agent hook: {getattr(exc, 'message', exc)} (not checking)", err=True)
    except Exception as exc:  # a bug here must not trap the agent either
        click.echo(f"relay-agent hook: internal: {type(exc).__name__}: {_one_line(str(exc))[:300]}", err=True)


# =========================================================================== entry point


def _is_hook(args: Sequence[str]) -> bool:
    """Whether ``args`` run the ``hook`` group (its first word once --url/--key and their values are skipped)."""
    words = iter(args)
    for word in words:
        if word in ("--url", "--key"):
            next(words, None)
        elif not word.startswith("-"):
            return word == "hook"
    return False


def main(argv: Sequence[str] | None = None) -> None:
    """The ``relay-agent`` console script: run the command, map every failure to one stderr line."""
    code = 0
    args = list(argv) if argv is not None else sys.argv[1:]
    try:
        cli.main(args=args, prog_name="relay-agent", standalone_mode=False, obj={})
    except NothingNew as exc:
        click.echo(f"relay-agent: {exc}", err=True)
        code = EXIT_TIMEOUT
    except RelayError as exc:
        click.echo(format_error(exc, _SEEN.get("url")), err=True)
        code = EXIT_RELAY
    except ConfigMissing as exc:
        click.echo(f"error: {exc}", err=True)
        code = EXIT_CONFIG
    except OneLineUsage as exc:
        click.echo(f"error: {exc}", err=True)
        code = EXIT_USAGE
    except LocalError as exc:
        click.echo(f"error: {exc.message}" + (f" (hint: {exc.hint})" if exc.hint else ""), err=True)
        code = EXIT_RELAY
    except click.ClickException as exc:
        where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "relay-agent"
        hint = f" (hint: {where} --help)" if isinstance(exc, click.UsageError) else ""
        click.echo(f"error: {_one_line(exc.format_message())}{hint}", err=True)
        code = exc.exit_code
        if code == EXIT_USAGE and _is_hook(args):
            # Exit 2 from a Claude Code Stop hook blocks the stop: a mistyped hook command must not trap the agent.
            code = EXIT_RELAY
    except (click.Abort, KeyboardInterrupt):
        code = 130
    except BrokenPipeError:
        # The reader went away (relay-agent inbox | head): nothing more to say.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        code = 0
    except Exception as exc:  # never a traceback: one line, with what to report
        click.echo(
            f"error: internal: {type(exc).__name__}: {_one_line(str(exc))[:300]} "
            "(hint: a relay-agent bug; rerun with --json or report this line)",
            err=True,
        )
        code = EXIT_RELAY
    sys.exit(code)


if __name__ == "__main__":
    main()
