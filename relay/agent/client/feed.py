"""The messages feed over REST: pages, search, the catch-up loop and its resume position, and the long-poll wait."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from relay.agent.client.identities import Identities
from relay.agent.client.models import FeedRow, Page, _next_cursor, _ts, _when

#: the feed's longest single wait, seconds (the relay refuses more)
MAX_WAIT_SECONDS = 60


def next_position(rows: Sequence[FeedRow], since: datetime | str, seen: Iterable[str] = ()) -> tuple[str, list[str]]:
    """Where a catch-up loop resumes after ``rows`` (oldest first, as :meth:`RelayClient.catch_up` returns).

    Returns ``(since, seen_ids)`` for the next ``catch_up(since, seen=seen_ids)``: the
    newest ``created_at`` of ``rows`` and the ids at exactly that time (the feed's
    ``since`` is inclusive, so they would come back). When no row is newer than ``since``,
    the earlier ``seen`` ids are kept too.
    """
    previous = since if isinstance(since, str) else since.isoformat()
    if not rows:
        return previous, list(seen)
    newest = max(rows, key=lambda r: r.created_at)
    at_newest = [r.id for r in rows if r.created_at == newest.created_at]
    if _ts(previous) == newest.created_at:
        at_newest = list(dict.fromkeys([*seen, *at_newest]))
    return newest.raw.get("created_at") or newest.created_at.isoformat(), at_newest


class Feed(Identities):
    """:class:`RelayClient`'s feed calls: ``messages``, ``messages_page``, ``search``, ``catch_up`` and ``wait``."""

    def messages(
        self,
        handle: str | None = None,
        *,
        direction: str | None = None,
        q: str | None = None,
        since: datetime | str | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
        role: str | None = None,
        requester_handle: str | None = None,
        worker_handle: str | None = None,
        limit: int = 100,
    ) -> Iterator[FeedRow]:
        """Every feed row matching the filters, newest first, across all pages.

        ``GET /api/v1/identities/{handle}/a2a/messages``, following ``next_cursor`` until
        it is null (a short page is not the end: pages also stop at a byte budget).
        ``handle`` defaults to the caller's own (a key reads only its own identity).
        Filters: ``direction`` ``inbound``/``outbound``/``both`` (who owns the task);
        ``role`` ``caller``/``agent`` (who wrote the message); ``q`` full-text search,
        1-500 characters; ``since`` inclusive on ``created_at``; ``task_id``,
        ``context_id``, ``requester_handle``, ``worker_handle``; ``limit`` rows per page, 1-100.

        Lazy: requests are made as the iterator is consumed, so errors
        (:class:`Forbidden`, :class:`IdentityNotFound`, :class:`InvalidParams`) surface on
        the first ``next()``.
        """
        query: dict[str, Any] = {
            "direction": direction,
            "q": q,
            "since": _when(since, "since"),
            "task_id": task_id,
            "context_id": context_id,
            "role": role,
            "requester_handle": requester_handle,
            "worker_handle": worker_handle,
            "limit": limit,
        }
        query = {k: v for k, v in query.items() if v is not None}
        return self._iter_feed(handle, query)

    def messages_page(self, handle: str | None = None, *, cursor: str | None = None, **filters: Any) -> Page[FeedRow]:
        """One page of the feed (filters as :meth:`messages`); ``next_cursor`` None on the last page."""
        if "since" in filters:
            filters["since"] = _when(filters["since"], "since")
        query = {k: v for k, v in {**filters, "cursor": cursor}.items() if v is not None}
        body = self._rest("GET", f"{self._identity_path(handle)}/a2a/messages", params=query)
        return Page(
            items=tuple(FeedRow.from_json(r) for r in body.get("items", [])),
            next_cursor=body.get("next_cursor"),
            raw=body,
        )

    def search(self, q: str, **filters: Any) -> Iterator[FeedRow]:
        """Feed rows whose text matches ``q`` (PostgreSQL ``websearch_to_tsquery``: any text is
        valid; quotes, ``-word``, ``or``), newest first, all pages. Same as ``messages(q=q, ...)``."""
        return self.messages(q=q, **filters)

    def catch_up(self, since: datetime | str, *, seen: Iterable[str] = (), **filters: Any) -> list[FeedRow]:
        """Every message at or after ``since``, each once, **oldest first** (docs/api.md, "Catching up after downtime").

        The feed's recovery loop: page the feed with ``since`` (inclusive, so the message
        at the saved time comes back: pass ids already processed in ``seen`` to drop
        them), follow ``next_cursor`` until it is null (a short page does not mean the
        end), and deduplicate on message ``id``. The feed walks newest first; the result
        is reversed so it can be processed in order and its last row's ``created_at``
        saved as the next ``since``. ``filters`` are :meth:`messages`'s (e.g.
        ``direction="inbound"``, ``limit=100``).
        """
        skip = set(seen)
        rows: list[FeedRow] = []
        for row in self.messages(since=since, **filters):
            if row.id in skip:
                continue
            skip.add(row.id)
            rows.append(row)
        rows.reverse()
        return rows

    def wait(
        self,
        *,
        after: str | None = None,
        since: datetime | str | None = None,
        seen: Iterable[str] = (),
        timeout: float = 60.0,
        handle: str | None = None,
        limit: int = 100,
        **filters: Any,
    ) -> list[FeedRow]:
        """Block until messages arrive after a position; return them **oldest first**, [] on timeout.

        A long-poll of the feed (``GET .../a2a/messages?wait=N``): the relay holds each
        request until a matching message commits (at most 60 s a request, so a longer
        ``timeout`` is several requests in a row) and answers at once when one is already
        there. The position is one of:

        * ``after``: a message id; only messages after it in the feed (exclusive).
        * ``since`` (an aware datetime or ISO 8601 string; inclusive) with ``seen``, the ids
          already processed at exactly that time, as :func:`next_position` returns them.
          Ignored when ``after`` is given.
        * neither: "now", the newest message matching ``filters`` when the call starts (one
          extra request).

        ``timeout`` is in seconds (the relay waits in whole seconds, so the call may end up
        to a second late; the client's retries of a failed request come on top); 0 reads
        once without waiting. What is returned is :meth:`catch_up`'s: every
        page followed, each message once, ``seen`` left out. The next position is the last
        row's ``id`` (or :func:`next_position` of the rows). ``filters`` are
        :meth:`messages`'s (``direction``, ``role``, ``task_id``, ...); ``limit`` is rows
        per page (1-100).

        Raises :class:`InvalidParams` (``after`` is not a message of this feed, a bad
        filter), :class:`RateLimited` (the agent already holds the relay's limit of waits
        and streams, ``RELAY_STREAMS_PER_AGENT``, still so after the client's retries),
        :class:`Unauthenticated` (the key was revoked, even mid-wait), or a transport error.
        """
        if timeout < 0:
            raise ValueError("timeout must be >= 0 seconds")
        deadline = time.monotonic() + timeout
        path = f"{self._identity_path(handle)}/a2a/messages"
        query: dict[str, Any] = {k: v for k, v in filters.items() if v is not None}
        if "cursor" in query:
            raise TypeError("wait takes no cursor: it waits for what comes after a position")
        query["limit"] = limit
        if after is not None:
            query["after"] = after
        elif since is not None:
            query["since"] = _when(since, "since")
        else:
            newest = self._rest("GET", path, params={**query, "limit": 1}).get("items") or []
            if newest:
                query["after"] = newest[0]["id"]
        skip = set(seen)
        while True:
            remaining = deadline - time.monotonic()
            seconds = min(MAX_WAIT_SECONDS, math.ceil(remaining)) if remaining > 0 else 0
            first = {**query, "wait": seconds} if seconds else query
            # The read timeout outlasts the relay's wait; the connect timeout stays the client's.
            body = self._rest("GET", path, params=first, timeout=(self.timeout, seconds + self.timeout))
            items = body.get("items") or []
            if items:
                rows = [FeedRow.from_json(r) for r in items]
                cursor, used = body.get("next_cursor"), set()
                while cursor:  # a short page is not the end
                    cursor = _next_cursor(cursor, used)
                    page = self._rest("GET", path, params={**query, "cursor": cursor})
                    rows += [FeedRow.from_json(r) for r in page.get("items") or []]
                    cursor = page.get("next_cursor")
                fresh: list[FeedRow] = []
                for row in rows:
                    if row.id not in skip:
                        skip.add(row.id)
                        fresh.append(row)
                if fresh:
                    fresh.reverse()
                    return fresh
                # Only rows already seen (since is inclusive): wait after the newest of them.
                query.pop("since", None)
                query["after"] = rows[0].id
            if remaining <= 0:
                return []

    def _iter_feed(self, handle: str | None, query: dict[str, Any]) -> Iterator[FeedRow]:
        path = f"{self._identity_path(handle)}/a2a/messages"
        cursor, used = None, set()
        while True:
            body = self._rest("GET", path, params={**query, **({"cursor": cursor} if cursor else {})})
            for r in body.get("items", []):
                yield FeedRow.from_json(r)
            if not body.get("next_cursor"):  # null only on the last page: a short page is not the end
                return
            cursor = _next_cursor(body["next_cursor"], used)
