"""Commands on the messages feed: search, watch (its stream, else polling) and wait (a long-poll)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import click

from relay.agent.cli.errors import NothingNew, OneLineUsage, format_error
from relay.agent.cli.group import _client, cli
from relay.agent.cli.output import _dump, _print_row, _table, _when
from relay.agent.cli.state import (
    _position,
    _stale_after,
    _start_state,
    _state_file_option,
    _without_after,
    advance,
    default_state_file,
    save_state,
)
from relay.agent.client.errors import RelayError, StreamUnavailable
from relay.agent.client.models import FeedRow
from relay.agent.client.relay_client import RelayClient


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


# Errors a long-running watch reports and outlives; anything else ends it.
_TRANSIENT = ("connection_error", "rate_limited", "service_unavailable", "internal_error")


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
