"""The relay-agent console script: run a command, and map every failure to one stderr line and an exit status."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import click

# The command modules register their commands on the group as they are imported.
from relay.agent.cli import feed, handoffs, hook, lifecycle  # noqa: F401
from relay.agent.cli.errors import (
    EXIT_CONFIG,
    EXIT_RELAY,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    ConfigMissing,
    LocalError,
    NothingNew,
    OneLineUsage,
    _one_line,
    format_error,
)
from relay.agent.cli.group import _SEEN, cli
from relay.agent.client.errors import RelayError


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
