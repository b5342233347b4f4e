"""Waiting on the feed: the long-poll (``wait``) and the stream of new messages
(docs/decisions.md, "Waking agents").

Both re-read the messages feed (docs/api.md) with the caller's filters whenever this process's
listener says the identity's feed may have moved (services/wakeup.py), and on a slow
tick (``RELAY_STREAM_HEARTBEAT`` seconds) when a wake-up may have been missed (see
:meth:`Held.rounds`). Between reads they hold no database connection: the session is
closed before every wait.

A stream's position is a message id (the SSE ``id:``); it resumes strictly after that
message's ``(created_at, id)``. That is exact, not approximate: every write of a message
takes its participants' feed locks before it reads the clock (services/threads/common.py), so
within one identity's feed a message never commits behind one with a later position.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from flask import current_app, has_app_context

from relay.errors import DATABASE_ERRORS, RelayError, is_connection_error
from relay.extensions import db
from relay.models import Agent
from relay.services import feed, wakeup

# A stream reads at most this many rows a query; it reads again at once when the batch was full.
STREAM_BATCH = 100
# Seconds a client is told to wait when its agent holds RELAY_STREAMS_PER_AGENT waits already.
RETRY_AFTER_SECONDS = 5
# A wait asks whether its client has gone at least this often (seconds), so a closed stream's
# slot is free again within about this long (within 2 s of the disconnect: docs/decisions.md,
# "Surviving the relay's own servers failing").
GONE_CHECK_SECONDS = 0.5
# A waiter whose listener stayed subscribed reads on a tick only every this many ticks: the
# safety net for a wake-up whose publish failed in another process (services/wakeup.py).
RECHECK_TICKS = 4


def take_slot(identity: Agent) -> wakeup.Slot:
    """One of ``identity``'s ``RELAY_STREAMS_PER_AGENT`` slots; raises rate_limited (``retry_after``) when all are held."""
    settings = current_app.config["RELAY"]
    # The process's keeper refreshes it every tick: two missed ticks and the slot is free again.
    slot = wakeup.Slot(identity.id, ttl=2 * settings.stream_heartbeat + 5)
    if not slot.acquire(settings.streams_per_agent):
        raise RelayError(
            "rate_limited",
            f"{identity.handle} already holds {settings.streams_per_agent} waits and streams "
            "(RELAY_STREAMS_PER_AGENT); close one or retry later",
            {"retry_after": RETRY_AFTER_SECONDS, "limit": settings.streams_per_agent},
        )
    return slot


def _release_connection() -> None:
    # The waiter must hold no pool slot while it sleeps (docs/decisions.md, "Waking agents").
    db.session.close()


# What a long-lived request's loop yields between its reads' items: a heartbeat is due.
HEARTBEAT = None


class Held:
    """What a long-lived request holds while it waits: one of its agent's slots and a waiter.

    Creating it takes the slot (rate_limited past ``RELAY_STREAMS_PER_AGENT``) and
    registers the waiter for ``identity``'s wake-ups; :meth:`close` gives both back
    (calling it twice is harmless). :meth:`rounds` is the loop streams share.
    ``client_gone`` (relay.transport.disconnect.probe) is asked every
    :data:`GONE_CHECK_SECONDS` while it waits; once it answers True the wait ends.
    """

    def __init__(
        self,
        identity: Agent,
        still_allowed: Callable[[], Any],
        waiter: wakeup.Waiter | None = None,
        client_gone: Callable[[], bool] | None = None,
    ):
        self.still_allowed = still_allowed
        self.client_gone = client_gone
        self.gone = False
        self.tick = current_app.config["RELAY"].stream_heartbeat
        self.listener = wakeup.listener()
        try:
            self.slot = take_slot(identity)
        except RelayError:
            if waiter is not None:
                self.listener.unregister(waiter)
            raise
        self.waiter = waiter or self.listener.register((identity.id,))
        # The first tick comes after a random part of one: waiters opened together (a deploy,
        # a reconnecting fleet) would otherwise re-read and re-authenticate all at once.
        self.first_tick = self.tick * random.uniform(0.5, 1.0)
        self._closed = False
        self._readable_seen = False

    def finished(self) -> bool:
        """True once the stream has said everything (a subclass's end, e.g. a terminal task)."""
        return False

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True if woken. Sets :attr:`gone` (and returns False)
        as soon as the client is found to have left.

        When ``client_gone`` can ``watch`` its socket, the wait is told the moment the
        socket turns readable (its client closing, or sending a pipelined request) and
        peeks then; otherwise it peeks every :data:`GONE_CHECK_SECONDS`. A socket found
        readable but not closed is peeked in slices from then on.
        """
        if self.client_gone is None:
            return self.waiter.wait(timeout)
        watch = None if self._readable_seen else getattr(self.client_gone, "watch", None)
        if watch is not None:
            readable: list[bool] = []

            def told() -> None:
                readable.append(True)
                self.waiter.wake()

            cancel = watch(told)
            if cancel is not None:
                try:
                    woken = self.waiter.wait(timeout)
                finally:
                    cancel()
                if readable:
                    if self.client_gone():
                        self.gone = True
                        return False
                    self._readable_seen = True
                return woken
        deadline = time.monotonic() + timeout
        while not (gone := self.client_gone()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.waiter.wait(min(remaining, GONE_CHECK_SECONDS)):
                return True
        self.gone = gone
        return False

    def rounds(self, read: Callable[[], tuple[list, bool]]) -> Iterator[Any]:
        """Yield the items of each ``read()`` (``(items, read_again_at_once)``), waiting between reads.

        A read follows every wake-up. A tick (every ``RELAY_STREAM_HEARTBEAT`` seconds)
        yields :data:`HEARTBEAT`, and reads only when a wake-up may have been missed:
        the process's listener re-subscribed (or is down) since the last read, the last
        read failed, or :data:`RECHECK_TICKS` ticks passed without one (a publish that
        failed in another process is caught there). The caller is re-authenticated
        before every read after the first, so a revoked key or a disabled agent is never
        sent another event; a revocation wakes the agent's waiters, so it ends their
        streams at once. A RelayError (from ``read`` or the re-authentication) is yielded
        last and ends it. A read or check that cannot reach PostgreSQL is tried again on
        the next round. The session is closed after each, so no connection is held
        while waiting.
        """
        next_beat = time.monotonic() + self.first_tick
        check = False  # the request itself was just authenticated
        read_now, ticks_unread, subscription = True, 0, None
        while True:
            items, again = [], False
            if read_now:
                try:
                    if check:
                        self.still_allowed()
                    subscription = self.listener.subscription()
                    items, again = read()
                    read_now, ticks_unread = False, 0
                except DATABASE_ERRORS as exc:
                    if not is_connection_error(exc):
                        raise
                    db.session.rollback()  # PostgreSQL restarting: checked and read again next round
                except RelayError as exc:
                    yield exc
                    return
                finally:
                    _release_connection()
                check = not again  # the next page of this round needs no second check
            yield from items
            if self.finished():
                return
            if again:
                read_now = True
                continue
            remaining = next_beat - time.monotonic()
            if remaining > 0 and self.wait(remaining):
                read_now = True
                continue
            if self.gone:
                return  # nobody to write to: the response closes and the slot goes back now
            next_beat = time.monotonic() + self.tick
            ticks_unread += 1
            if subscription is None or self.listener.subscription() != subscription or ticks_unread >= RECHECK_TICKS:
                read_now = True
            yield HEARTBEAT

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.listener.unregister(self.waiter)
        self.slot.release()
        # gunicorn closes the response (and so this) after the request's context is gone;
        # the context's teardown has closed the session already.
        if has_app_context():
            _release_connection()


def wait_for_messages(
    identity: Agent,
    *,
    wait: float,
    still_allowed: Callable[[], Any],
    cursor: tuple[datetime, uuid.UUID] | None = None,
    after: uuid.UUID | None = None,
    limit: int = 50,
    client_gone: Callable[[], bool] | None = None,
    **filter_params: Any,
) -> dict[str, Any]:
    """The feed's ``wait``: :func:`feed.list_messages`'s arguments, answered as :func:`wait_for_page` does."""
    position = feed.position_of(identity, after) if after is not None else None
    return wait_for_page(
        identity,
        feed.filters(**filter_params),
        wait=wait,
        still_allowed=still_allowed,
        cursor=cursor,
        after=position,
        limit=limit,
        client_gone=client_gone,
    )


def open_stream(
    identity: Agent,
    *,
    still_allowed: Callable[[], Any],
    after: uuid.UUID | None = None,
    after_field: str = "after",
    client_gone: Callable[[], bool] | None = None,
    **filter_params: Any,
) -> Stream:
    """A :class:`Stream` of the feed with :func:`feed.filters`' keywords, resuming after message ``after``.

    Raises invalid_params naming ``after_field`` (``after`` or ``Last-Event-ID``) when that
    message is not in the feed, rate_limited past ``RELAY_STREAMS_PER_AGENT``.
    """
    position = feed.position_of(identity, after, after_field) if after is not None else None
    flt = feed.filters(**filter_params)
    return Stream(identity, flt, after=position, still_allowed=still_allowed, client_gone=client_gone)


def wait_for_page(
    identity: Agent,
    flt: feed.Filters,
    *,
    wait: float,
    still_allowed: Callable[[], Any],
    cursor: tuple[datetime, uuid.UUID] | None = None,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int = 50,
    client_gone: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """One feed page, waiting up to ``wait`` seconds for it to hold a row (the feed's ``wait``).

    A page with rows is answered at once; otherwise the request waits until a message
    matching ``flt`` commits, and answers the page then, or the empty page when ``wait``
    runs out. ``still_allowed()`` re-authenticates the caller (it raises RelayError once
    the key is revoked or the agent disabled) after every wake-up. Raises rate_limited
    (``retry_after`` in details) past ``RELAY_STREAMS_PER_AGENT``, service_unavailable if
    the database could not be read when the time ran out. A client found gone
    (``client_gone``) ends the wait at once with the page read last.
    """
    deadline = time.monotonic() + wait
    # The waiter is registered before the first read, so a message committed after that
    # read wakes it; the slot (a Redis round trip) is taken only if the page is empty.
    listener = wakeup.listener()
    early = listener.register((identity.id,))
    subscription = listener.subscription()
    try:
        result = feed.page(identity, flt, cursor=cursor, after=after, limit=limit)
        if result["items"]:
            return result
        held = Held(identity, still_allowed, waiter=early, client_gone=client_gone)
    except BaseException:
        listener.unregister(early)
        raise
    failed, ticks_unread = False, 0
    try:
        while True:
            _release_connection()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if failed:
                    raise RelayError("service_unavailable", "the database is unavailable; retry shortly")
                return result
            woken = held.wait(min(remaining, held.first_tick))
            if held.gone:
                return result  # nobody reads it; the slot goes back now
            held.first_tick = held.tick
            if not woken and not failed:  # a tick (or the end): read only as Held.rounds says
                ticks_unread += 1
                if (
                    subscription is not None
                    and listener.subscription() == subscription
                    and ticks_unread < RECHECK_TICKS
                ):
                    continue
            try:
                still_allowed()
                subscription = listener.subscription()
                result = feed.page(identity, flt, cursor=cursor, after=after, limit=limit)
                failed, ticks_unread = False, 0
            except DATABASE_ERRORS as exc:
                if not is_connection_error(exc):
                    raise
                db.session.rollback()
                failed = True  # PostgreSQL restarting: wait and read again
            if not failed and result["items"]:
                return result
    finally:
        held.close()


class Stream(Held):
    """An open stream of one identity's new messages; create it before the response starts.

    Creating it takes a slot (see :class:`Held`) and the starting position; :meth:`events`
    then yields until the caller is no longer allowed or the client goes away, and
    :meth:`close` (always call it) gives the slot back.
    """

    def __init__(
        self,
        identity: Agent,
        flt: feed.Filters,
        *,
        after: tuple[datetime, uuid.UUID] | None,
        still_allowed: Callable[[], Any],
        client_gone: Callable[[], bool] | None = None,
    ):
        super().__init__(identity, still_allowed, client_gone=client_gone)
        self.identity, self.flt = identity, flt
        try:
            if after is None and flt.since is None:
                # From now: after the newest matching row. Taken once registered, so any
                # message committed after this read wakes the stream.
                newest = feed.page_rows(identity, flt, limit=1)
                after = feed.row_position(newest[0]) if newest else None
        except BaseException:
            self.close()
            raise
        self.position = after
        _release_connection()

    def events(self) -> Iterator[tuple[str, dict] | RelayError | None]:
        """Yield ``(message id, feed row)`` oldest first, :data:`HEARTBEAT` (None) every tick, and a
        last RelayError when the caller's key stops being valid."""
        return self.rounds(self._read)

    def _read(self) -> tuple[list[tuple[str, dict]], bool]:
        rows = feed.page_rows(self.identity, self.flt, after=self.position, limit=STREAM_BATCH, ascending=True)
        if rows:
            self.position = feed.row_position(rows[-1])
        return [(str(feed.row_position(r)[1]), feed.feed_row(r)) for r in rows], len(rows) == STREAM_BATCH
