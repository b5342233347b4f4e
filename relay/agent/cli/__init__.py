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

Modules, one concern each: ``entry`` (``main``, the console script), ``group`` (the
command group and its RelayClient), the commands by kind (``handoffs``, ``lifecycle``,
``feed``, ``hook``), ``state`` (positions and lease tokens on disk), ``artifacts``,
``output`` and ``errors`` (exit statuses, one-line error reports).
"""

from relay.agent.cli.entry import main
from relay.agent.cli.group import cli

__all__ = ["cli", "main"]
