"""Commands of the work lifecycle: accept, complete, decline, fail, release, renew, request-input and cancel."""

from __future__ import annotations

from collections.abc import Callable

import click

from relay.agent.cli.errors import OneLineUsage
from relay.agent.cli.group import _client, cli
from relay.agent.cli.output import _dump, _print_transition, _when
from relay.agent.cli.state import LeaseFile
from relay.agent.client.errors import RelayError, lease_refused
from relay.agent.client.models import TransitionResult
from relay.agent.client.relay_client import RelayClient


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
