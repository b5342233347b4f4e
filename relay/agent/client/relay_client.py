"""RelayClient: one agent's client of one relay, its calls gathered from the modules beside this one."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, MutableMapping

import requests

from relay.agent.client.feed import Feed
from relay.agent.client.handoffs import Handoffs
from relay.agent.client.streams import Streams
from relay.agent.client.transport import RetryNotice, check_settings


class RelayClient(Handoffs, Feed, Streams):
    """A client of one relay for one agent (its API key).

    Args:
        base_url: the relay's root, e.g. ``"https://relay.example.com"``.
        api_key: the agent's key (``ah_live_...``), sent as ``Authorization: Bearer``.
        timeout: seconds to wait for a connection and, separately, for the answer.
        max_retries: retries after the first attempt of one call (so at most
            ``max_retries + 1`` HTTP requests).
        backoff: seconds before the first retry; doubles each retry (capped at
            ``max_backoff``) with up to 25 % random jitter so many clients do not retry
            in step.
        session: a ``requests.Session`` to use (closed by :meth:`close` only if the
            client made it itself).
        retry_refused: retry a refused connection too (default: raise it at once).
        on_retry: called with a :class:`RetryNotice` before each retry's wait, e.g. to
            tell a user why a call is taking long; what it raises propagates.
        leases: where the client keeps the lease tokens its accepts and renews got,
            ``task_id -> token`` (default: a dict of its own, for this process only).

    Leases (docs/decisions.md, "The work lifecycle"). ``accept(..., lease_seconds=N)`` answers a ``lease_token``; the
    client remembers it per task and sends it on :meth:`complete`, :meth:`fail`,
    :meth:`release` and :meth:`renew` unless the call gives ``lease_token`` itself. Only
    tokens this client got from its own accept or renew are remembered (a :meth:`get`
    shows the current token but does not adopt it: that would defeat the fencing between
    two sessions of one agent). A token is forgotten when the lease ends through this
    client (complete, fail, release) or the relay refuses it as stale.

    Retries. A call is retried when the relay could not answer it: a connection reset
    or dropped before the answer, a timeout, an HTTP 5xx, a JSON-RPC
    ``service_unavailable`` error, or HTTP 429 (after the ``Retry-After`` seconds; a
    wait longer than ``max_retry_wait`` is not slept but raised as :class:`RateLimited`).
    A refused connection (nothing listens at ``base_url``: a wrong URL, or the relay is
    down) is raised as :class:`RelayConnectionError` on the first attempt, since waiting
    seconds for a port to open rarely helps; pass ``retry_refused=True`` to retry it
    like the rest (say, while a relay restarts). Domain errors (4xx, JSON-RPC errors other
    than ``service_unavailable``) are raised at once. A refused connection never reached
    the relay; any other attempt that failed in transit may still have been carried out:

    * ``send``/``reply`` are safe to retry because every call carries a
      ``client_idempotency_key`` (generated unless given) that stays the same across
      the client's retries of that call; the relay answers a replay with the first
      result (docs/api.md, "Conventions"), so a retry never makes a second thread.
    * transitions (``accept``, ``complete``, ``cancel``, ``decline``, ``fail``,
      ``release``, ``renew``) are not idempotent at the relay. If an attempt
      was carried out but its answer was lost, the retry answers
      :class:`InvalidTransition` (the thread already moved) or :class:`StateChanged`;
      the client raises that as it is (``attempts > 1`` on the exception tells you a
      retry happened): read the thread with :meth:`get` to see where it stands.
    * reads are always safe to retry.

    Tests may replace ``_sleep`` (``time.sleep`` by default) to observe or skip waits.
    The client is a context manager; leaving it closes its session. Use one client per
    thread: a ``requests.Session`` is not guaranteed to be thread-safe.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 10.0,
        max_retries: int = 4,
        backoff: float = 0.5,
        session: requests.Session | None = None,
        *,
        retry_refused: bool = False,
        on_retry: Callable[[RetryNotice], None] | None = None,
        leases: MutableMapping[str, str] | None = None,
    ):
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        check_settings(base_url, api_key)
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.retry_refused = retry_refused
        self.on_retry = on_retry
        self._own_session = session is None
        self.session = session if session is not None else requests.Session()
        self._sleep: Callable[[float], None] = time.sleep
        self._ids = itertools.count(1)
        self._handle: str | None = None
        #: task_id -> the lease token an accept (or renew) answered this client; sent on
        #: complete/fail/release/renew when no ``lease_token`` is given. In-process unless
        #: ``leases`` (any mutable mapping, such as relay-agent's file) was passed.
        self.leases: MutableMapping[str, str] = leases if leases is not None else {}

    def __repr__(self) -> str:
        return f"RelayClient({self.base_url!r}, handle={self._handle!r})"
