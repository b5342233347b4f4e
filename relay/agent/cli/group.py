"""The relay-agent command group, and the RelayClient its commands share (each retry told on stderr)."""

from __future__ import annotations

from collections.abc import Callable

import click

from relay.agent.cli.errors import ConfigMissing
from relay.agent.cli.state import LeaseFile
from relay.agent.client.errors import ConfigurationError
from relay.agent.client.relay_client import RelayClient
from relay.agent.client.transport import RetryNotice

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
