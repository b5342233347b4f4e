"""The waiters of ``python -m bench wake``: long-polls and SSE streams on raw asyncio sockets.

Usage: ``python -m bench.wake_clients SCENARIO_JSON OUT_JSON``. The scenario names the
host, port and ``waiters``: a list of ``{"kind": "poll"|"sse", "handle", "key"}``. Each
waiter holds one connection: a poll re-asks ``GET .../a2a/messages?direction=inbound&wait=W&after=<newest seen>``
as soon as it is answered; a stream reads ``.../messages/stream?direction=inbound`` events.
For every message received it records ``now - created_at`` (the commit is after
``created_at``, so this overstates the commit->client latency a little). It writes
``{"ready": ...}`` to OUT_JSON.ready once every stream has said ``: ready`` and every poll
has been sent, and the results when SIGTERM arrives.

One process, one thread, one event loop: 500 waiters cost it a few percent of a core,
which it reports (``cpu_seconds``), so the figures can be read against the two cores.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import signal
import sys
import time
from datetime import datetime
from urllib.parse import urlencode


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Stats:
    def __init__(self, timed_prefix: str = ""):
        self.timed_prefix = timed_prefix
        self.latency: dict[str, list[float]] = {"poll": [], "sse": []}
        self.received: dict[str, set[str]] = {}  # handle -> message ids (a poll and a stream each see it)
        self.duplicates = 0
        self.errors: dict[str, int] = {}
        self.connected = {"poll": 0, "sse": 0}

    def got(self, kind: str, handle: str, row: dict, seen: set[str]) -> None:
        if row["id"] in seen:
            self.duplicates += 1
            return
        seen.add(row["id"])
        if row["body"].startswith(self.timed_prefix):
            self.latency[kind].append(time.time() - _stamp(row["created_at"]))
            self.received.setdefault(handle, set()).add(row["id"])

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


def _retry_after(headers: dict[str, str]) -> float:
    """Seconds to wait before asking again, as a well-behaved client does: the answer's
    ``Retry-After`` (1 s without one), spread by up to half again so refused clients do
    not come back together."""
    try:
        base = max(1.0, float(headers.get("retry-after", "1")))
    except ValueError:
        base = 1.0
    return base * random.uniform(1.0, 1.5)


def _request(host: str, path: str, key: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\nConnection: keep-alive\r\n\r\n"
    ).encode()


async def poll(host: str, port: int, waiter: dict, wait: int, stats: Stats, ready: asyncio.Event) -> None:
    path = f"/api/v1/identities/{waiter['handle']}/a2a/messages"
    after, seen, first = None, set(), True
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            stats.connected["poll"] += 1
            try:
                while True:
                    query = {"direction": "inbound", "wait": wait, "limit": 100}
                    if after:
                        query["after"] = after
                    writer.write(_request(host, f"{path}?{urlencode(query)}", waiter["key"]))
                    await writer.drain()
                    if first:
                        first = False
                        ready.set()
                    status, headers = await _read_head(reader)
                    body = await reader.readexactly(int(headers.get("content-length", "0")))
                    if status != 200:
                        stats.error(f"poll HTTP {status}")
                        await asyncio.sleep(_retry_after(headers))
                        continue
                    items = json.loads(body)["items"]
                    for row in reversed(items):
                        stats.got("poll", waiter["handle"], row, seen)
                    if items:
                        after = items[0]["id"]
                    if headers.get("connection", "").lower() == "close":
                        break
            finally:
                stats.connected["poll"] -= 1
                writer.close()
        except (OSError, asyncio.IncompleteReadError) as exc:
            stats.error(f"poll {type(exc).__name__}")
            await asyncio.sleep(0.5)


async def _chunks(reader: asyncio.StreamReader):
    """The body of a chunked response, chunk by chunk."""
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def sse(host: str, port: int, waiter: dict, stats: Stats, ready: asyncio.Event) -> None:
    path = f"/api/v1/identities/{waiter['handle']}/a2a/messages/stream?direction=inbound"
    last_id, seen, announced = None, set(), False
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            request = _request(host, path, waiter["key"])
            if last_id:
                request = request[:-2] + f"Last-Event-ID: {last_id}\r\n\r\n".encode()
            writer.write(request)
            await writer.drain()
            status, headers = await _read_head(reader)
            if status != 200:
                stats.error(f"sse HTTP {status}")
                writer.close()
                await asyncio.sleep(_retry_after(headers))
                continue
            stats.connected["sse"] += 1
            try:
                buffer = b""
                async for chunk in _chunks(reader):
                    buffer += chunk
                    while b"\n\n" in buffer:
                        block, buffer = buffer.split(b"\n\n", 1)
                        event, data = "message", None
                        for line in block.split(b"\n"):
                            if line == b": ready" and not announced:
                                announced = True
                                ready.set()
                            elif line.startswith(b"event: "):
                                event = line[7:].decode()
                            elif line.startswith(b"id: "):
                                last_id = line[4:].decode()
                            elif line.startswith(b"data: "):
                                data = line[6:]
                        if event == "message" and data is not None:
                            stats.got("sse", waiter["handle"], json.loads(data), seen)
            finally:
                stats.connected["sse"] -= 1
                writer.close()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            stats.error(f"sse {type(exc).__name__}")
            await asyncio.sleep(0.5)


async def main_async(scenario: dict, out: str) -> None:
    stats = Stats(scenario.get("timed_prefix", ""))
    host, port = scenario["host"], scenario["port"]
    readies = []
    tasks = []
    for i, waiter in enumerate(scenario["waiters"]):
        ready = asyncio.Event()
        readies.append(ready)
        if waiter["kind"] == "poll":
            tasks.append(asyncio.create_task(poll(host, port, waiter, scenario.get("wait", 30), stats, ready)))
        else:
            tasks.append(asyncio.create_task(sse(host, port, waiter, stats, ready)))
        if i % 50 == 49:
            # A ramp, not a SYN flood at the listen backlog: 1,000 a second, or spread over
            # ``ramp_seconds`` (a fleet's waiters do not all start, so re-ask, together).
            await asyncio.sleep(max(0.05, 50 * scenario.get("ramp_seconds", 0) / len(scenario["waiters"])))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), timeout=scenario.get("ready_within", 120))
    except TimeoutError:
        ready_n = sum(r.is_set() for r in readies)
        print(f"waiters: {ready_n} of {len(readies)} ready; connected {stats.connected}; errors {stats.errors}",
              file=sys.stderr, flush=True)  # fmt: skip
        raise
    with open(out + ".ready", "w") as f:
        json.dump({"ready": time.time(), "connected": stats.connected}, f)
    await stop.wait()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(out, "w") as f:
        json.dump(
            {
                "latency_s": stats.latency,
                "received": {h: sorted(ids) for h, ids in stats.received.items()},
                "duplicates": stats.duplicates,
                "errors": stats.errors,
                "connected": stats.connected,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
            },
            f,
        )
    for task in tasks:
        task.cancel()


def main() -> None:
    scenario = json.loads(open(sys.argv[1]).read())
    asyncio.run(main_async(scenario, sys.argv[2]))


if __name__ == "__main__":
    main()
