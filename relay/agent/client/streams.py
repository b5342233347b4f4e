"""The feed's Server-Sent Events stream: an incremental parser, and ``RelayClient.stream``'s reconnecting reader."""

from __future__ import annotations

import codecs
import http.client
import json
import random
import re
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from datetime import datetime
from typing import Any

import requests
import urllib3.exceptions  # requests' own transport

from relay.agent.client.errors import BadResponse, RelayConnectionError, RelayError, StreamUnavailable, error_class
from relay.agent.client.identities import Identities
from relay.agent.client.models import FeedRow, _when
from relay.agent.client.transport import RetryNotice, transport_reason

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEParser:
    """An incremental ``text/event-stream`` parser (the WHATWG HTML "event stream" rules).

    :meth:`feed` takes the body's bytes as they arrive, in chunks of any size (a chunk may
    end inside a UTF-8 sequence or between ``\\r`` and ``\\n``), and returns what they
    completed: ``("comment", text)`` for a ``:`` line and ``("event", type, data, id)``
    for each dispatched event, where ``type`` defaults to ``"message"``, ``data`` is the
    ``data:`` lines joined with ``\\n`` and ``id`` the last event ID seen so far (it
    persists across events, as the standard says). An event with no ``data`` line is not
    dispatched. ``retry`` holds the last valid ``retry:`` value, in milliseconds.
    """

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self._buffer = ""
        self._started = False
        self._type = ""
        self._data: list[str] = []
        self.last_id: str | None = None
        self.retry: int | None = None

    def feed(self, chunk: bytes) -> list[tuple]:
        text = self._decode(chunk)
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        self._buffer += text
        out: list[tuple] = []
        pos = 0
        while (m := _LINE_END.search(self._buffer, pos)) is not None:
            if m.group() == "\r" and m.end() == len(self._buffer):
                break  # a "\r\n" may be split across chunks: wait for the next one
            item = self._line(self._buffer[pos : m.start()])
            if item is not None:
                out.append(item)
            pos = m.end()
        self._buffer = self._buffer[pos:]
        return out

    def _line(self, line: str) -> tuple | None:
        if not line:
            if not self._data:
                self._type = ""
                return None
            event = ("event", self._type or "message", "\n".join(self._data), self.last_id)
            self._type, self._data = "", []
            return event
        if line.startswith(":"):
            return ("comment", line[1:].strip())
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)
        return None


def _body_chunks(resp: requests.Response) -> Iterator[bytes]:
    """The response body as it arrives: whatever the socket has, never waiting for a full buffer.

    ``iter_content(chunk_size=None)`` waits for the end of a body sent without chunked
    encoding (a proxy may de-chunk a stream), so read ``read1`` where urllib3 has it (2.x).
    """
    raw = resp.raw
    if hasattr(raw, "read1"):
        while chunk := raw.read1(65536, decode_content=True):
            yield chunk
    else:  # urllib3 1.26
        yield from resp.iter_content(chunk_size=None)


# Raised while a streamed body is read (read1 bypasses requests, so urllib3's errors arrive unwrapped).
_READ_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


class _StreamPosition:
    """Where a :meth:`RelayClient.stream` is, across its reconnects."""

    def __init__(self, url: str, after: str | None, skip: set[str], on_ready: Callable[[], None] | None):
        self.url = url
        self.last_id = after  # sent as Last-Event-ID
        self.skip = skip  # the caller's seen ids (a since replay yields them again)
        self.recent: deque[str] = deque(maxlen=1000)  # ids yielded lately: a repeat is dropped
        self.on_ready = on_ready
        self.retry_ms: int | None = None  # the relay's "retry:" field
        self.opened = False  # any connection got a 200 text/event-stream
        self.ready = False  # this connection has its start position

    def mark_ready(self) -> None:
        if not self.ready:
            self.ready = True
            if self.on_ready is not None:
                self.on_ready()

    def take(self, data: str, event_id: str | None) -> FeedRow | None:
        """The row a message event carries, or None when it was yielded or seen already."""
        try:
            row = FeedRow.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadResponse(f"{self.url} sent an event that is not a feed row: {exc}") from None
        self.last_id = event_id or row.id
        self.mark_ready()  # a relay that sends no ': ready' comment: the first event says it
        if row.id in self.skip or row.id in self.recent:
            return None
        self.recent.append(row.id)
        return row


class Streams(Identities):
    """:class:`RelayClient`'s ``stream``: the feed's new messages as they commit, across reconnects."""

    def stream(
        self,
        *,
        after: str | None = None,
        since: datetime | str | None = None,
        seen: Iterable[str] = (),
        handle: str | None = None,
        idle_timeout: float = 45.0,
        max_failures: int | None = 5,
        on_ready: Callable[[], None] | None = None,
        **filters: Any,
    ) -> Iterator[FeedRow]:
        """The feed's new messages as they commit, **oldest first**, each once: an endless iterator.

        Reads ``GET .../a2a/messages/stream`` (Server-Sent Events; ``filters`` as
        :meth:`messages`'s, e.g. ``direction="inbound"``). Where it starts:

        * ``after``: a message id; messages after it (sent as ``Last-Event-ID``).
        * ``since`` (inclusive) with ``seen`` (ids at exactly that time to leave out): a
          replay from that time, then new messages. Ignored when ``after`` is given.
        * neither: new messages only, from the newest one when the relay takes the position.

        When the connection drops, the relay closes it, no byte (not even the relay's
        heartbeat, every 15 s by default) arrives for ``idle_timeout`` seconds, or the
        relay answers 5xx or 429, the iterator reconnects with ``Last-Event-ID`` set to the
        last message it yielded, so nothing is skipped and nothing repeated. It first
        waits the relay's ``retry:`` time (2 s), doubling after each failed attempt in a
        row up to ``max_backoff`` (30 s), with jitter, or the ``Retry-After`` of a 429 if
        longer; ``on_retry`` (see the class) hears of each reconnect. When ``max_failures``
        reconnects in a row have failed (no stream opened; None: no limit) the last error
        is raised: :class:`RelayConnectionError`, :class:`RateLimited`,
        :class:`ServiceUnavailable`, :class:`InternalError`. A refused connection on the
        very first attempt is raised at once unless ``retry_refused``.

        ``on_ready`` is called each time a connection is open and the relay has taken its
        start position (its ``: ready`` comment): a message committed from then on will be
        yielded.

        Lazy: nothing is sent until the first ``next()``. Raises :class:`StreamUnavailable`
        (no stream at this relay: HTTP 404/405/501, or not ``text/event-stream``; poll
        instead), :class:`Unauthenticated`/:class:`Forbidden`/:class:`IdentityNotFound`/
        :class:`InvalidParams` as the relay answers them, and, mid-stream, the class of the
        relay's final ``event: error`` (``unauthenticated`` once the key is revoked or the
        agent disabled). Closing the iterator (``close()``, or leaving a ``for`` loop)
        closes the connection.
        """
        return self._stream_rows(
            handle,
            after,
            _when(since, "since") if after is None else None,
            set(seen),
            idle_timeout,
            max_failures,
            on_ready,
            {k: v for k, v in filters.items() if v is not None},
        )

    def _stream_rows(
        self,
        handle: str | None,
        after: str | None,
        since: str | None,
        skip: set[str],
        idle_timeout: float,
        max_failures: int | None,
        on_ready: Callable[[], None] | None,
        filters: dict[str, Any],
    ) -> Iterator[FeedRow]:
        path = f"{self._identity_path(handle)}/a2a/messages/stream"
        at = _StreamPosition(self.base_url + path, after, skip, on_ready)
        failures = 0  # connections in a row that ended before the stream was open and ready
        while True:
            at.ready = False
            error, asked = yield from self._stream_once(path, at, since, idle_timeout, filters)
            failures = 1 if at.ready else failures + 1
            if not at.opened and getattr(error, "reason", "") == "connection refused" and not self.retry_refused:
                raise error  # nothing listens at the URL: said at once, as for every other call
            if max_failures is not None and failures > max_failures:
                error.attempts = failures
                raise error
            base = at.retry_ms / 1000 if at.retry_ms is not None else max(self.backoff, 0.1)
            delay = min(self.max_backoff, base * 2 ** (failures - 1))
            delay = max(delay + random.uniform(0, delay / 4), asked or 0.0)
            if self.on_retry is not None:
                reason = getattr(error, "reason", None) or error.symbol or "error"
                connection = error.symbol == "connection_error"
                self.on_retry(RetryNotice("GET", at.url, failures, max_failures or 0, delay, reason, connection))
            self._sleep(delay)

    def _stream_once(
        self, path: str, at: _StreamPosition, since: str | None, idle_timeout: float, filters: dict[str, Any]
    ) -> Generator[FeedRow, None, tuple[RelayError, float | None]]:
        """One connection of :meth:`stream`: yield its rows; return ``(error, retry_after)`` once it
        ends in a way a reconnect may mend. Errors no reconnect mends are raised."""
        headers = {**self._headers(), "Accept": "text/event-stream", "Cache-Control": "no-cache"}
        params = dict(filters)
        if at.last_id is not None:
            headers["Last-Event-ID"] = at.last_id
        elif since is not None:
            params["since"] = since
        try:
            resp = self.session.get(
                at.url,
                params=params,
                headers=headers,
                stream=True,
                timeout=(self.timeout, idle_timeout),
                allow_redirects=False,
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            error = RelayConnectionError(f"GET {at.url} failed: {exc}", reason=transport_reason(exc))
            error.__cause__ = exc
            return error, None
        try:
            request_id = resp.headers.get("X-Request-Id")
            if resp.status_code != 200:
                error = self._answer_error(resp, 1, "GET", path)
                if resp.status_code == 429:
                    error.reason = "rate limited (HTTP 429)"  # type: ignore[attr-defined]
                    return error, getattr(error, "retry_after", None)
                if resp.status_code >= 500:
                    error.reason = f"HTTP {resp.status_code}"  # type: ignore[attr-defined]
                    return error, None
                if resp.status_code in (404, 405, 501) and error.symbol != "identity_not_found":
                    raise StreamUnavailable(
                        f"{at.url} answered HTTP {resp.status_code}: this relay has no message stream",
                        http_status=resp.status_code,
                        request_id=request_id,
                    )
                raise error
            kind = resp.headers.get("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                raise StreamUnavailable(
                    f"{at.url} answered {kind or 'no Content-Type'}, not text/event-stream",
                    http_status=resp.status_code,
                    request_id=request_id,
                )
            at.opened = True
            parser = SSEParser()
            chunks = _body_chunks(resp)
            while True:
                try:
                    chunk = next(chunks, b"")
                except _READ_ERRORS as exc:
                    error = RelayConnectionError(f"the stream from {at.url} broke: {exc}", reason=transport_reason(exc))
                    error.__cause__ = exc
                    return error, None
                if not chunk:
                    return RelayConnectionError(
                        f"{at.url} ended the stream", reason="the relay closed the stream"
                    ), None
                for item in parser.feed(chunk):
                    if item[0] == "comment":
                        if item[1] == "ready":
                            at.mark_ready()
                        continue
                    _, event, data, event_id = item
                    if event == "error":
                        raise self._stream_error(resp, data)
                    if event == "message":
                        row = at.take(data, event_id)
                        if row is not None:
                            yield row
                if parser.retry is not None:
                    at.retry_ms = parser.retry
        finally:
            resp.close()

    def _stream_error(self, resp: requests.Response, data: str) -> RelayError:
        """The exception for a stream's final ``event: error`` (``data: {"code", "message"}``)."""
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return BadResponse(f"the stream ended with an error event that is not JSON: {data[:200]}")
        symbol = doc.get("code") if isinstance(doc.get("code"), str) else None
        return error_class(symbol)(
            str(doc.get("message") or "the relay ended the stream"),
            symbol=symbol,
            data=doc,
            request_id=resp.headers.get("X-Request-Id"),
            http_status=resp.status_code,
        )
