"""A minimal Server-Sent Events reader over ``requests``, for tests and the bench's checks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import requests


@dataclass
class Event:
    """One SSE event: ``event`` (default "message"), ``id``, ``data`` (joined lines), comments seen before it."""

    event: str = "message"
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    def json(self):
        return json.loads(self.data)


class SSE:
    """An open ``text/event-stream`` response; iterate :meth:`events` (comments arrive as events of kind ``comment``)."""

    def __init__(self, url: str, *, headers: dict | None = None, params: dict | None = None, read_timeout: float = 20):
        self.response = requests.get(url, headers=headers, params=params, stream=True, timeout=(5, read_timeout))
        self._events = self._read()  # one reader: lines it has buffered must not be lost between calls

    @property
    def status_code(self) -> int:
        return self.response.status_code

    def events(self) -> Iterator[Event]:
        """Events and comments in order, continuing where the last call stopped; ends at EOF.
        A silence past ``read_timeout`` raises."""
        return self._events

    def _read(self) -> Iterator[Event]:
        current = Event()
        has_fields = False
        for raw in self.response.iter_lines(chunk_size=None, decode_unicode=False):
            line = raw.decode()
            if line == "":
                if has_fields:
                    yield current
                current, has_fields = Event(), False
                continue
            if line.startswith(":"):
                yield Event(event="comment", data=line[1:].strip())
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                current.event = value
            elif name == "id":
                current.id = value
            elif name == "data":
                current.data = f"{current.data}\n{value}" if has_fields and current.data else value
            has_fields = has_fields or name in ("event", "id", "data")

    def messages(self, count: int) -> list[Event]:
        """The next ``count`` message events (comments skipped); fails naming what came instead if the stream ends."""
        got: list[Event] = []
        for event in self.events():
            if event.event == "message":
                got.append(event)
                if len(got) == count:
                    return got
            elif event.event != "comment":
                raise AssertionError(f"expected {count} messages, got {len(got)} then {event}")
        raise AssertionError(f"the stream ended after {len(got)} of {count} messages")

    def until_ready(self) -> None:
        """Read up to the stream's ``: ready`` comment (its starting position is taken from then on)."""
        for event in self.events():
            if event.event == "comment" and event.data == "ready":
                return
        raise AssertionError("the stream ended before it was ready")

    def close(self) -> None:
        self.response.close()
