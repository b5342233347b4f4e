"""Commands that open, list, read and answer handoffs: whoami, send, inbox, show and reply."""

from __future__ import annotations

import click

from relay.agent.cli.artifacts import _artifact_options, _collect_artifacts
from relay.agent.cli.errors import OneLineUsage
from relay.agent.cli.group import _client, cli
from relay.agent.cli.output import _agent, _block, _dump, _indent, _print_message_body, _print_sent, _table, _when
from relay.agent.client.models import Handoff, Page, TaskSummary

STATES = ("pending", "accepted", "input_required", "completed", "cancelled", "declined", "failed", "expired")
PRIORITIES = ("low", "normal", "high", "urgent")
INTENTS = ("inform", "ask_question", "propose_action")


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
