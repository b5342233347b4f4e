"""Hooks for coding agents: ``relay-agent hook claude-code``, a Claude Code Stop hook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from relay.agent.cli.errors import LocalError, _one_line, format_error
from relay.agent.cli.group import cli
from relay.agent.cli.state import _parse_since, _state_file_option, advance, default_state_file, load_state, save_state
from relay.agent.client.errors import ConfigurationError, RelayError
from relay.agent.client.models import FeedRow, TaskSummary
from relay.agent.client.relay_client import RelayClient

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
