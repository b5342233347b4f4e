"""Helpers shared by the A2A tests against a live relay: the stock SDK client, the
recipient's calls of the relay's JSON-RPC dialect (``POST /a2a``) (also from a thread, one step per event seen) and a
Server-Sent Events reader for plain-HTTP streams."""

from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import requests
from a2a.client import ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest

from tests.conftest import bearer, rpc

JSONRPC = "JSONRPC"
HTTP_JSON = "HTTP+JSON"


def run(coro):
    return asyncio.run(coro)


@asynccontextmanager
async def sdk_client(
    relay_url: str, handle: str, key: str, *, streaming: bool = False, binding: str = JSONRPC, **headers: str
):
    """A stock SDK client built from the agent's card URL, with the caller's bearer key,
    speaking ``binding`` (the card's interface of that protocolBinding)."""
    async with httpx.AsyncClient(headers={**bearer(key), **headers}, timeout=20) as http:
        config = ClientConfig(streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding])
        client = await ClientFactory(config).create_from_url(f"{relay_url}/a2a/agents/{handle}")
        try:
            yield client
        finally:
            await client.close()


async def send_text(client, text: str, **message_fields):
    """SendMessage (a non-streaming client): one event, the task; returns it."""
    request = SendMessageRequest(
        message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)], **message_fields)
    )
    events = [event async for event in client.send_message(request)]
    assert len(events) == 1 and events[0].HasField("task"), events
    return events[0].task


def seed(relay_url: str, key: str, method: str, params: dict) -> dict:
    """One call of ``POST /a2a``, the relay's JSON-RPC dialect (the recipient's side), over HTTP; fails on an error."""
    return rpc(relay_url, key, method, params)


class Recipient(threading.Thread):
    """The recipient, in a thread: one ``POST /a2a`` call per ``(method, params)`` put on ``.steps``; None stops it."""

    def __init__(self, base: str, key: str):
        super().__init__(daemon=True)
        self.base, self.key = base, key
        self.steps: queue.Queue = queue.Queue()
        self.done: list[str] = []
        self.error: BaseException | None = None
        self.start()

    def run(self):
        try:
            while (step := self.steps.get(timeout=60)) is not None:
                seed(self.base, self.key, *step)
                self.done.append(step[0] + ":" + step[1].get("transition", "reply"))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self):
        self.steps.put(None)
        self.join(30)
        assert not self.is_alive(), "the recipient thread did not stop"
        assert self.error is None, self.error


REPLY = "On it: the client is updated."
RESULT = "Client uses { items, next_cursor }."


def next_step(task_id: str, seen: int) -> tuple[str, dict] | None:
    """The recipient's step after the client saw ``seen`` events: accept, reply, complete."""
    return (
        [
            ("tasks/update", {"task_id": task_id, "transition": "accept", "session_id": "s-1"}),
            ("message/send", {"task_id": task_id, "message": {"parts": [{"type": "text", "text": REPLY}]}}),
            ("tasks/update", {"task_id": task_id, "transition": "complete", "result_summary": RESULT}),
        ][seen - 1]
        if seen <= 3
        else None
    )


@dataclass
class Event:
    kind: str  # "data", "error" (the SSE event named error) or "comment"
    data: str


def sse_events(response: requests.Response) -> Iterator[Event]:
    """The events of a streamed ``text/event-stream`` response, comments (heartbeats) included."""
    kind, data = "data", []
    for raw in response.iter_lines(chunk_size=None, decode_unicode=False):
        line = raw.decode()
        if line == "":
            if data:
                yield Event(kind, "\n".join(data))
            kind, data = "data", []
        elif line.startswith(":"):
            yield Event("comment", line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event" and value == "error":
                kind = "error"
            elif name == "data":
                data.append(value)
