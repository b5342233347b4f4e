"""``python -m bench webhooks``: webhook delivery under load, commit->received.

One live stack started from the Procfile (gunicorn with 2 workers, a Celery worker, celery
beat) on a fresh database and a Redis db of its own, with rate limits raised out of the way.
Web, worker, beat, PostgreSQL and the load generator share this machine's 2 cores, so the
load generator is lean: a few threads, each with one keep-alive ``http.client`` connection to
gunicorn, sending JSON-RPC ``message/send`` on an open-loop schedule (send ``i`` is due at
``start + i / rate`` whatever the server does; its lateness is recorded). The receivers are
one asyncio loop speaking HTTP/1.1 with keep-alive, one port per endpoint.

Latency is the arrival time at the receiver minus ``data.created_at`` of the payload (the
message's commit time stamp), as ``bench run``'s webhook figure.

Endpoint groups, one recipient agent each (sender agents send to them round-robin):

- ``healthy`` (``--endpoints``): answer 200 at once; they share what the others leave.
- ``slow`` (``--slow``): answer 200 after ``--slow-delay`` s; ``--slow-share`` of the messages.
- ``refusing`` (``--refusing``): a port nothing listens on; ``blackhole`` (``--blackhole``):
  accept, read, never answer, so the relay waits out its timeout. Together they get
  ``--bad-share`` of the messages. Their deliveries never succeed; the run records what
  arrived and the relay's delivery log, and waits for no retry.

Modes: one ``steady`` phase (default); ``--saturation`` steps the rate until p99 > 1 s, a
delivery is lost or the senders fall behind; ``--tenant``: org A's agent has 20 endpoints
(the most allowed) on a receiver holding every request ``--tenant-hold`` s and is sent
``--tenant-rate`` messages/s; org B's agent has one healthy endpoint and gets one message a
second; org B's latencies are reported, alone first, then beside org A.

After the sends of a phase, the run waits until every expected delivery to the healthy and
slow endpoints arrived, or ``--drain-timeout`` s; the missing ones are reported as lost. CPU
seconds of each process group are sampled over the send window and the drain.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import re
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

import psutil
import requests

from bench import harness
from bench.run import git_commit

LOAD_GENERATOR = "threads + http.client keep-alive, open loop"
RECEIVER = "one asyncio loop, HTTP/1.1 keep-alive, one port per endpoint (tenant drill: one port, 20 paths)"
MACHINE_NOTE = "shared machine: 2 cores, other work running beside the bench; figures are indicative"
SATURATION_RATES = (50, 100, 150, 200, 250, 300, 400, 500, 600, 800, 1000)
P99_LIMIT_MS = 1000.0
SENDER_AGENTS = 4
# gunicorn's keepalive is 5 s: a connection idle longer may be closed under a request.
IDLE_RECONNECT_S = 4.0
SETTLE_S = 15.0
TENANT_ENDPOINTS = 20  # MAX_ENDPOINTS_PER_AGENT in relay/services/webhooks.py
ANSWER_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
ANSWER_OK_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)], 1)


def _stats(values: list[float], *qs: float) -> dict:
    out = {f"p{round(q * 100)}": _pct(values, q) for q in qs}
    out["max"] = round(max(values), 1) if values else None
    return out


# --- receivers ---------------------------------------------------------------------------------


class Receivers:
    """Loopback HTTP/1.1 webhook receivers on one asyncio loop; record when each request arrived."""

    def __init__(self):
        # (time.time() when the body was read, path, webhook-id, body); parsed later, off the loop.
        self.arrivals: list[tuple[float, str, str, bytes]] = []
        self.answered = 0
        self.unanswered: Counter[str] = Counter()  # path -> requests read, answer not yet written
        self.connections = 0
        # With keep_signatures (bench nodes): (path, webhook-id, webhook-timestamp, webhook-signature, body).
        self.keep_signatures = False
        self.signed: list[tuple[str, str, str, str, bytes]] = []
        self._servers: list[asyncio.base_events.Server] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="bench-receivers", daemon=True)
        self._thread.start()
        self.native_id = self._call(self._native_id())

    async def _native_id(self) -> int:
        return threading.get_native_id()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def listen(self, behaviour: str, delay: float = 0.0) -> int:
        """Open a port that answers ``ok`` (after ``delay`` s) or never (``blackhole``); return it."""

        async def start() -> int:
            server = await asyncio.start_server(partial(self._serve, behaviour, delay), "127.0.0.1", 0)
            self._servers.append(server)
            return server.sockets[0].getsockname()[1]

        return self._call(start())

    async def _serve(self, behaviour: str, delay: float, reader, writer) -> None:
        self._writers.add(writer)
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method_path_version = lines[0].split(" ")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    body = await self._chunked(reader)
                else:
                    body = await reader.readexactly(int(headers.get("content-length") or 0))
                self.arrivals.append((time.time(), method_path_version[1], headers.get("webhook-id", ""), body))
                if self.keep_signatures:
                    self.signed.append(
                        (
                            method_path_version[1],
                            *(headers.get(f"webhook-{h}", "") for h in ("id", "timestamp", "signature")),
                            body,
                        )
                    )
                if behaviour == "blackhole":
                    continue  # keep reading: the relay gives up at its timeout and closes
                path = method_path_version[1]
                self.unanswered[path] += 1
                try:
                    if delay:
                        await asyncio.sleep(delay)
                    close = headers.get("connection", "").lower() == "close" or method_path_version[-1] == "HTTP/1.0"
                    writer.write(ANSWER_OK_CLOSE if close else ANSWER_OK)
                    await writer.drain()
                    self.answered += 1
                finally:
                    self.unanswered[path] -= 1
                if close:
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError, IndexError):
            return  # the peer closed (or sent something that is not HTTP): done with this connection
        except asyncio.CancelledError:
            return  # shutting down; returning keeps asyncio from logging each held connection
        finally:
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _chunked(reader) -> bytes:
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)

    def thread_cpu_s(self) -> float:
        """CPU seconds the receivers' loop thread has used so far."""
        for t in psutil.Process().threads():
            if t.id == self.native_id:
                return t.user_time + t.system_time
        return 0.0

    def close(self) -> None:
        """Close every server and connection; stop the loop."""

        async def shutdown():
            for server in self._servers:
                server.close()
            for writer in list(self._writers):
                writer.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self._call(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def refusing_port() -> int:
    """A loopback port nothing listens on: bound, read, closed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@dataclass
class Endpoint:
    group: str
    recipient: str
    url: str
    path: str
    relay_id: str = ""


class ArrivalIndex:
    """The arrivals parsed into (path, message id) -> first arrival, webhook-id counts per path."""

    def __init__(self, receivers: Receivers):
        self.receivers = receivers
        self.first: dict[tuple[str, str], float] = {}
        self.created: dict[tuple[str, str], float] = {}
        self.requests: Counter[str] = Counter()
        self.webhook_ids: Counter[tuple[str, str]] = Counter()
        self.unparsed = 0
        self._done = 0

    def update(self) -> None:
        """Parse the arrivals recorded since the last call."""
        new = self.receivers.arrivals[self._done :]
        self._done += len(new)
        for arrived, path, webhook_id, body in new:
            self.requests[path] += 1
            self.webhook_ids[(path, webhook_id)] += 1
            try:
                payload = json.loads(body)
                data = payload["data"]
                key = (path, data["id"])
                created = datetime.fromisoformat(data["created_at"].replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError, TypeError):
                self.unparsed += 1
                continue
            if key not in self.first:
                self.first[key] = arrived
                self.created[key] = created

    def duplicates(self, paths: set[str]) -> int:
        """Requests beyond the first with one webhook-id at one endpoint."""
        return sum(n - 1 for (path, _), n in self.webhook_ids.items() if path in paths and n > 1)


# --- load generator ------------------------------------------------------------------------------


@dataclass
class Send:
    scheduled: float  # monotonic
    started: float
    done: float
    group: str
    recipient: str
    message_id: str | None
    error: str | None


@dataclass
class Stream:
    """Open-loop sends at ``rate``/s for ``duration`` s; ``plan(i)`` gives send i's (key, recipient, group)."""

    name: str
    rate: float
    duration: float
    plan: Callable[[int], tuple[str, str, str]]
    threads: int
    sends: list[Send] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)


def _sender(host: str, port: int, stream: Stream, t0: float, counter: list[int], lock: threading.Lock) -> None:
    conn: http.client.HTTPConnection | None = None
    last_used = 0.0
    end = t0 + stream.duration
    while True:
        with lock:
            i = counter[0]
            counter[0] += 1
        scheduled = t0 + i / stream.rate
        if scheduled >= end:
            break
        wait = scheduled - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        key, recipient, group = stream.plan(i)
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": i,
                "method": "message/send",
                "params": {
                    "recipient": recipient,
                    "message": {"parts": [{"type": "text", "text": f"bench webhook {stream.name} {i}"}]},
                },
            }
        ).encode()
        started = time.monotonic()
        if conn is not None and started - last_used > IDLE_RECONNECT_S:
            conn.close()
            conn = None
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=30)
        message_id = error = None
        try:
            conn.request(
                "POST",
                "/a2a",
                body=body,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            answer = resp.read()
            if resp.status != 200:
                error = f"HTTP {resp.status}"
            else:
                reply = json.loads(answer)
                if "result" in reply:
                    message_id = reply["result"]["message_id"]
                else:
                    error = f"rpc {reply.get('error', {}).get('code')}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            error = type(exc).__name__
            conn.close()
            conn = None
        last_used = done = time.monotonic()
        stream.sends.append(Send(scheduled, started, done, group, recipient, message_id, error))
    if conn is not None:
        conn.close()
    stream.cpu_s.append(time.thread_time())


def run_streams(host: str, port: int, streams: list[Stream]) -> float:
    """Send every stream to its end on its own threads; return the monotonic start time."""
    t0 = time.monotonic() + 0.2  # every thread is waiting before the first send is due
    threads = []
    for stream in streams:
        counter, lock = [0], threading.Lock()
        for n in range(stream.threads):
            threads.append(
                threading.Thread(
                    target=_sender, args=(host, port, stream, t0, counter, lock), name=f"sender-{stream.name}-{n}"
                )
            )
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return t0


def weighted_plan(
    groups: list[tuple[str, float, list[str]]], senders: list[str], keys: dict[str, str]
) -> Callable[[int], tuple[str, str, str]]:
    """Spread sends over groups by share (smooth weighted round-robin), round-robin within a group."""
    groups = [(g, w, members) for g, w, members in groups if w > 0 and members]
    total = sum(w for _, w, _ in groups)
    current = dict.fromkeys((g for g, _, _ in groups), 0.0)
    counters: Counter[str] = Counter()
    choices: list[tuple[str, str, str]] = []

    def plan(i: int) -> tuple[str, str, str]:
        # Deterministic and computed in order: each sender thread asks under the stream's lock.
        while len(choices) <= i:
            for g, w, _ in groups:
                current[g] += w
            best = max(current, key=current.get)
            current[best] -= total
            members = next(m for g, _, m in groups if g == best)
            recipient = members[counters[best] % len(members)]
            counters[best] += 1
            choices.append((keys[senders[len(choices) % len(senders)]], recipient, best))
        return choices[i]

    lock = threading.Lock()

    def locked(i: int) -> tuple[str, str, str]:
        with lock:
            return plan(i)

    return locked


# --- CPU ---------------------------------------------------------------------------------------


class CpuSampler:
    """CPU seconds of process groups, summed from samples every second (and at every mark)."""

    def __init__(self, groups: dict[str, Callable[[], list[psutil.Process]]]):
        self.groups = groups
        self.totals = dict.fromkeys(groups, 0.0)
        self._seen: dict[tuple[int, float], float] = {}
        self._started = time.time()
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-cpu")

    def _sample(self) -> None:
        for name, find in self.groups.items():
            for p in find():
                try:
                    key = (p.pid, p.create_time())
                    t = p.cpu_times()
                except psutil.Error:
                    continue
                cpu = t.user + t.system
                # A process that started while we watch counts from zero; an older one from now.
                base = self._seen.get(key, 0.0 if key[1] >= self._started else cpu)
                self.totals[name] += cpu - base
                self._seen[key] = cpu

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(1.0):
            with self._lock:
                self._sample()

    def mark(self) -> dict[str, float]:
        """Sample now; return the running totals."""
        with self._lock:
            self._sample()
            return dict(self.totals)

    def stop(self) -> None:
        """Stop sampling."""
        self._halt.set()
        self._thread.join(5)


def _postgres_groups(dbname: str) -> dict[str, Callable[[], list[psutil.Process]]]:
    own = f" {dbname} "
    backend = re.compile(r"\d+\.\d+\.\d+\.\d+\(\d+\)|\[local\]")

    def classify() -> dict[str, list[psutil.Process]]:
        out: dict[str, list[psutil.Process]] = {"this_db": [], "server": [], "other_dbs": [], "redis": []}
        for p in psutil.process_iter(["name"]):
            name = p.info["name"] or ""
            if name == "redis-server":
                out["redis"].append(p)
            elif name in ("postgres", "postmaster"):
                try:
                    cmd = " ".join(p.cmdline()) + " "
                except psutil.Error:
                    continue
                if own in cmd:
                    out["this_db"].append(p)
                elif backend.search(cmd):
                    out["other_dbs"].append(p)
                else:
                    out["server"].append(p)
        return out

    cache: dict[str, tuple[float, dict]] = {}

    def part(kind: str) -> list[psutil.Process]:
        # One process scan serves the four groups of a sample.
        now = time.monotonic()
        if "scan" not in cache or now - cache["scan"][0] > 0.2:
            cache["scan"] = (now, classify())
        return cache["scan"][1][kind]

    return {
        "postgres_this_db": partial(part, "this_db"),
        "postgres_server": partial(part, "server"),
        "postgres_other_dbs (not ours)": partial(part, "other_dbs"),
        "redis (shared)": partial(part, "redis"),
    }


def _machine_busy_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


# Parts of another figure (threads of the bench process) or the machine itself.
_NOT_STACK = {"bench receivers thread", "bench sender threads", "machine busy (2 cores)"}


class Cpu:
    """Per-window CPU seconds: the stack's process groups, this process, its threads, the machine."""

    def __init__(self, sampler: CpuSampler, receivers: Receivers):
        self.sampler, self.receivers = sampler, receivers

    def mark(self) -> dict[str, float]:
        """Take a reading of every counter."""
        reading = self.sampler.mark()
        me = psutil.Process().cpu_times()
        reading["bench (whole process)"] = me.user + me.system
        reading["bench receivers thread"] = self.receivers.thread_cpu_s()
        reading["machine busy (2 cores)"] = _machine_busy_s()
        return reading

    @staticmethod
    def window(a: dict[str, float], b: dict[str, float], sender_cpu: float | None = None) -> dict[str, float]:
        """CPU seconds between two readings (with the sender threads' own total when given)."""
        out = {k: round(b[k] - a[k], 2) for k in a}
        if sender_cpu is not None:
            out["bench sender threads"] = round(sender_cpu, 2)
        accounted = sum(v for k, v in out.items() if k not in _NOT_STACK and "not ours" not in k)
        out["machine other (not this stack)"] = round(out["machine busy (2 cores)"] - accounted, 2)
        return out


# --- the run --------------------------------------------------------------------------------------


@dataclass
class Stack:
    url: str
    host: str
    port: int
    keys: dict[str, str]
    receivers: Receivers
    index: ArrivalIndex
    cpu: Cpu
    endpoints: list[Endpoint] = field(default_factory=list)
    # (figures of a group in a phase, its deliveries missing at the drain's end)
    missing: list[tuple[dict, list[tuple[str, str]]]] = field(default_factory=list)

    def of(self, recipient: str) -> list[Endpoint]:
        """The endpoints of one recipient."""
        return [e for e in self.endpoints if e.recipient == recipient]

    def paths(self, *groups: str) -> set[str]:
        """The paths of the endpoints in ``groups``."""
        return {e.path for e in self.endpoints if e.group in groups}


def _create_agents(env: dict, handles: list[str]) -> dict[str, str]:
    # The CLI costs a second or so an agent; two at a time on two cores.
    halves = [handles[0::2], handles[1::2]]
    with ThreadPoolExecutor(2) as pool:
        keys: dict[str, str] = {}
        for part in pool.map(lambda hs: harness.create_agents(env, hs) if hs else {}, halves):
            keys.update(part)
    return keys


def register(stack: Stack, group: str, recipient: str, port: int, name: str) -> Endpoint:
    """Subscribe ``http://127.0.0.1:port/hook/name`` to the recipient's ``message.created``."""
    path = f"/hook/{name}"
    endpoint = Endpoint(group, recipient, f"http://127.0.0.1:{port}{path}", path)
    r = requests.post(
        f"{stack.url}/api/v1/identities/{recipient}/webhooks",
        json={"url": endpoint.url, "events": ["message.created"]},
        headers={"Authorization": f"Bearer {stack.keys[recipient]}"},
        timeout=30,
    )
    r.raise_for_status()
    endpoint.relay_id = r.json()["id"]
    stack.endpoints.append(endpoint)
    return endpoint


def warm_up(stack: Stack, sender: str, recipients: list[str], timeout: float) -> dict:
    """Send one message to each recipient and wait for its deliveries: the pipeline works before measuring."""
    expected = []
    for recipient in recipients:
        r = requests.post(
            f"{stack.url}/a2a",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "message/send",
                "params": {"recipient": recipient, "message": {"parts": [{"type": "text", "text": "warm-up"}]}},
            },
            headers={"Authorization": f"Bearer {stack.keys[sender]}"},
            timeout=30,
        )
        reply = r.json()
        if "result" not in reply:
            raise RuntimeError(f"warm-up message/send to {recipient} failed: {reply}")
        expected += [(e.path, reply["result"]["message_id"]) for e in stack.of(recipient)]
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        stack.index.update()
        if all(k in stack.index.first for k in expected):
            break
        time.sleep(0.1)
    arrived = sum(k in stack.index.first for k in expected)
    return {"expected": len(expected), "arrived": arrived, "seconds": round(time.monotonic() - started, 1)}


def _group_figures(stack: Stack, expected: dict[str, list[tuple[str, str]]], group: str, t0_wall: float) -> dict:
    keys = expected.get(group, [])
    got = [k for k in keys if k in stack.index.first]
    lat = [(stack.index.first[k] - stack.index.created[k]) * 1000 for k in got]
    missing = [k for k in keys if k not in stack.index.first]
    paths = stack.paths(group)
    out = {
        "endpoints": len(paths),
        "expected": len(keys),
        "received": len(got),
        "lost": len(missing),
        "lost_sample": [{"endpoint": p, "message_id": m} for p, m in missing[:10]],
        "duplicates": stack.index.duplicates(paths),
        "latency_ms": _stats(lat, 0.50, 0.95, 0.99),
    }
    if got:
        out["last_arrival_s_after_start"] = round(max(stack.index.first[k] for k in got) - t0_wall, 1)
    if missing:
        stack.missing.append((out, missing))
    return out


def count_late(stack: Stack) -> None:
    """Add to each lost count how many of those deliveries arrived after the drain, before the stack stopped."""
    stack.index.update()
    for figures, missing in stack.missing:
        figures["arrived_after_drain"] = sum(k in stack.index.first for k in missing)


def run_phase(stack: Stack, name: str, streams: list[Stream], wait_groups: tuple[str, ...], drain_timeout: float):
    """Send the streams, drain, and return the phase's figures."""
    cpu0 = stack.cpu.mark()
    t0_wall_offset = time.time() - time.monotonic()
    t0 = run_streams(stack.host, stack.port, streams)
    t0_wall = t0 + t0_wall_offset
    cpu1 = stack.cpu.mark()
    sends_done = time.monotonic()
    sends = [s for st in streams for s in st.sends]
    expected: dict[str, list[tuple[str, str]]] = {}
    for s in sends:
        if s.message_id:
            for e in stack.of(s.recipient):
                expected.setdefault(e.group, []).append((e.path, s.message_id))
    waiting = [k for g in wait_groups for k in expected.get(g, [])]
    while True:
        stack.index.update()
        waiting = [k for k in waiting if k not in stack.index.first]
        if not waiting or time.monotonic() - sends_done > drain_timeout:
            break
        time.sleep(0.25)
    drain_s = time.monotonic() - sends_done
    # A slow endpoint's last requests have arrived but not been answered: let the answers go
    # out, so the relay records successes, not a cut connection, before what comes next.
    slow_paths = stack.paths("slow")
    settle_until = time.monotonic() + SETTLE_S
    while any(stack.receivers.unanswered[p] for p in slow_paths) and time.monotonic() < settle_until:
        time.sleep(0.1)
    cpu2 = stack.cpu.mark()
    sender_cpu = sum(c for st in streams for c in st.cpu_s)
    phase: dict = {
        "offered_rate": round(sum(st.rate for st in streams), 2),
        "duration_s": max(st.duration for st in streams),
        "sender_threads": sum(st.threads for st in streams),
        "drained": not waiting,
        "drain_s": round(drain_s, 1),
        "streams": {},
    }
    for st in streams:
        ok = [s for s in st.sends if s.message_id]
        end = max((s.done for s in st.sends), default=t0)
        lag = [(s.started - s.scheduled) * 1000 for s in st.sends]
        # Over the scheduled span at least: n sends due over duration s is the offered rate.
        achieved = len(ok) / max(st.duration, end - t0)
        phase["streams"][st.name] = {
            "offered_rate": st.rate,
            "scheduled": len(st.sends),
            "ok": len(ok),
            "failed": len(st.sends) - len(ok),
            "errors": dict(Counter(s.error for s in st.sends if s.error)),
            "achieved_rate": round(achieved, 1),
            # From the scheduled time: what an open-loop client waits, the generator's own lag included.
            "send_ms": _stats([(s.done - s.scheduled) * 1000 for s in ok], 0.50, 0.99),
            "service_ms": _stats([(s.done - s.started) * 1000 for s in ok], 0.50, 0.99),
            "lag_ms": _stats(lag, 0.99),
            "kept_up": achieved >= 0.95 * st.rate and (_pct(lag, 0.99) or 0) <= 200,
        }
    groups = sorted({e.group for e in stack.endpoints})
    phase["messages_by_group"] = dict(Counter(s.group for s in sends if s.message_id))
    for group in groups:
        if group == "org_a" and group not in phase["messages_by_group"]:
            continue  # org A sends nothing in org B's baseline
        if group in ("refusing", "blackhole", "org_a"):
            paths = stack.paths(group)
            keys = expected.get(group, [])
            phase[group] = {
                "endpoints": len(paths),
                "expected_deliveries": len(keys),
                "requests_received": sum(stack.index.requests[p] for p in paths),
                "distinct_deliveries_received": sum(k in stack.index.first for k in keys),
                "repeat_requests": stack.index.duplicates(paths),
            }
        else:
            phase[group] = _group_figures(stack, expected, group, t0_wall)
    arrivals = [stack.index.first[k] for g in wait_groups for k in expected.get(g, []) if k in stack.index.first]
    send_end_wall = t0_wall + max(st.duration for st in streams)
    phase["deliveries_per_s"] = {
        "during_sends": round(sum(a <= send_end_wall for a in arrivals) / (send_end_wall - t0_wall), 1),
        "start_to_last_arrival": round(len(arrivals) / (max(arrivals) - t0_wall), 1) if arrivals else 0.0,
    }
    phase["cpu_s"] = {
        "sends": Cpu.window(cpu0, cpu1, sender_cpu),
        "drain": Cpu.window(cpu1, cpu2),
    }
    print(f"  {name}: {_phase_line(phase)}", flush=True)
    return phase


def delivery_log(stack: Stack, endpoint: Endpoint, pages: int = 10) -> dict:
    """Summarise the relay's own delivery log of an endpoint (its REST API, newest first)."""
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    attempts, rows, unattempted, cursor = 0, 0, 0, None
    for _ in range(pages):
        r = requests.get(
            f"{stack.url}/api/v1/identities/{endpoint.recipient}/webhooks/{endpoint.relay_id}/deliveries",
            params={"limit": 100, **({"cursor": cursor} if cursor else {})},
            headers={"Authorization": f"Bearer {stack.keys[endpoint.recipient]}"},
            timeout=30,
        )
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}"}
        body = r.json()
        for item in body["items"]:
            rows += 1
            unattempted += item["attempt_count"] == 0
            statuses[item["status"] + (" (held)" if item.get("held") else "")] += 1
            attempts += item["attempt_count"]
            for a in item["attempts"]:
                errors[a["error"] or f"HTTP {a['status_code']}"] += 1
        cursor = body.get("next_cursor")
        if not cursor:
            break
    return {
        "deliveries_read": rows,
        "complete": cursor is None,
        "statuses": dict(statuses),
        "attempts": attempts,
        "not_yet_attempted": unattempted,
        "attempt_outcomes": dict(errors),
    }


def settled_logs(stack: Stack) -> dict:
    """The refusing and blackhole endpoints' delivery logs once each delivery had a first attempt (or 15 s)."""
    bad = [e for e in stack.endpoints if e.group in ("refusing", "blackhole")]
    # A first attempt at a blackhole ends at the relay's timeout (10 s by default); later
    # retries are minutes away and are not waited for.
    deadline = time.monotonic() + SETTLE_S
    while True:
        logs = {e.path: {"group": e.group, **delivery_log(stack, e)} for e in bad}
        if time.monotonic() > deadline or not any(log.get("not_yet_attempted") for log in logs.values()):
            return logs
        time.sleep(1.0)


def _working_tree() -> dict:
    # The commit alone does not say what ran when the relay's code is being changed uncommitted.
    import hashlib
    import subprocess

    status = subprocess.run(
        ["git", "status", "--porcelain", "--", "relay", "workers", "migrations", "Procfile", "gunicorn.conf.py"],
        cwd=harness.ROOT,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    digest = hashlib.sha256()
    for folder in ("relay", "workers", "migrations"):
        for path in sorted((harness.ROOT / folder).rglob("*.py")):
            digest.update(str(path.relative_to(harness.ROOT)).encode() + b"\0" + path.read_bytes())
    for name in ("Procfile", "gunicorn.conf.py"):
        digest.update(name.encode() + b"\0" + (harness.ROOT / name).read_bytes())
    return {"uncommitted_changes": status, "source_sha256": digest.hexdigest()[:16]}


def _procfile() -> dict[str, str]:
    from honcho.environ import parse_procfile

    lines = parse_procfile((harness.ROOT / "Procfile").read_text()).processes
    return {name: lines[name] for name in ("web", "worker", "beat")}


def _start_stack(env: dict, cleanup: ExitStack) -> dict:
    web, url = harness.gunicorn("app:app", env, 2)
    cleanup.callback(web.stop)
    worker = harness.celery_worker(env)
    cleanup.callback(worker.stop)
    beat = harness.celery_beat(env)
    cleanup.callback(beat.stop)
    return {"web": web, "worker": worker, "beat": beat, "url": url}


def webhooks(args) -> dict:
    """Run the mode ``args`` asks for; return the results document (see the module docstring)."""
    mode = "tenant" if args.tenant else "saturation" if args.saturation else "steady"
    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "mode": mode,
        "machine": {"cpus": os.cpu_count(), "note": MACHINE_NOTE},
        "load_generator": LOAD_GENERATOR,
        "receiver": RECEIVER,
        "stack": "web (WEB_CONCURRENCY=2), worker and beat from the Procfile, as read at the start of the run",
        "procfile": _procfile(),
        "working_tree": _working_tree(),
        "latency": "receiver arrival time.time() - data.created_at (commit time stamp)",
        "settings": {
            k: getattr(args, k)
            for k in (
                "rate",
                "duration",
                "endpoints",
                "slow",
                "slow_delay",
                "slow_share",
                "refusing",
                "blackhole",
                "bad_share",
                "drain_timeout",
                "senders",
                "tenant_rate",
                "tenant_hold",
            )
        },
        "phases": {},
    }
    if args.tenant:
        handles = ["sender@orga", "busy@orga", "sender@orgb", "quiet@orgb"]
    else:
        handles = (
            [f"sender{i}@bench" for i in range(SENDER_AGENTS)]
            + [f"hook{i}@bench" for i in range(args.endpoints)]
            + [f"slow{i}@bench" for i in range(args.slow)]
            + [f"refuse{i}@bench" for i in range(args.refusing)]
            + [f"hole{i}@bench" for i in range(args.blackhole)]
        )
    with (
        harness.fresh_database("relay_bench_wh") as database_url,
        harness.claimed_redis_db() as redis_url,
        tempfile.TemporaryDirectory(prefix="relay-bench-beat-") as beat_home,
    ):
        # RELAY_HOME only places beat's schedule file: a folder of its own, no other beat's file.
        env = harness.base_env(database_url, {"REDIS_URL": redis_url, "RELAY_HOME": beat_home})
        results["redis_db"] = int(redis_url.rsplit("/", 1)[1])
        # Everything started here stops when the block ends, each step whether or not another
        # failed, before the database is dropped and the Redis db emptied.
        with ExitStack() as cleanup:
            keys = _create_agents(env, handles)
            receivers = Receivers()
            cleanup.callback(receivers.close)
            procs = _start_stack(env, cleanup)
            url = procs["url"]
            dbname = database_url.rsplit("/", 1)[1].split("?")[0]
            sampler = CpuSampler(
                {"web": procs["web"].tree, "worker": procs["worker"].tree, "beat": procs["beat"].tree}
                | _postgres_groups(dbname)
            )
            sampler.start()
            cleanup.callback(sampler.stop)
            host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
            stack = Stack(url, host, port, keys, receivers, ArrivalIndex(receivers), Cpu(sampler, receivers))
            if args.tenant:
                _tenant(stack, args, results)
            else:
                _steady_or_saturation(stack, args, results)
            results["relay_delivery_log"] = settled_logs(stack)
            count_late(stack)
            results["receiver_totals"] = {
                "requests": len(receivers.arrivals),
                "answered": receivers.answered,
                "connections": receivers.connections,
                "unparsed_bodies": stack.index.unparsed,
            }
    if mode == "saturation":
        results["saturation"] = _saturation_verdict(results["phases"])
    return results


def _steady_or_saturation(stack: Stack, args, results: dict) -> None:
    for i in range(args.endpoints):
        register(stack, "healthy", f"hook{i}@bench", stack.receivers.listen("ok"), f"healthy{i}")
    for i in range(args.slow):
        register(stack, "slow", f"slow{i}@bench", stack.receivers.listen("ok", args.slow_delay), f"slow{i}")
    for i in range(args.refusing):
        register(stack, "refusing", f"refuse{i}@bench", refusing_port(), f"refusing{i}")
    for i in range(args.blackhole):
        register(stack, "blackhole", f"hole{i}@bench", stack.receivers.listen("blackhole"), f"blackhole{i}")
    senders = [f"sender{i}@bench" for i in range(SENDER_AGENTS)]
    results["agents"] = {"org": "bench, every agent", "sender_agents": SENDER_AGENTS, "recipients": "one per endpoint"}
    # Healthy endpoints only: slow ones would hold the pipeline before the measurement starts.
    results["warm_up"] = warm_up(stack, senders[0], [f"hook{i}@bench" for i in range(args.endpoints)], timeout=60)
    slow_share = args.slow_share if args.slow else 0.0
    bad_share = args.bad_share if args.refusing + args.blackhole else 0.0
    groups = [
        ("healthy", 1.0 - slow_share - bad_share, [f"hook{i}@bench" for i in range(args.endpoints)]),
        ("slow", slow_share, [f"slow{i}@bench" for i in range(args.slow)]),
        (
            "bad",
            bad_share,
            _interleave(
                [f"refuse{i}@bench" for i in range(args.refusing)], [f"hole{i}@bench" for i in range(args.blackhole)]
            ),
        ),
    ]
    rates = [float(r) for r in args.steps.split(",")] if args.steps else list(SATURATION_RATES)
    if not args.saturation:
        rates = [args.rate]
    print(f"webhooks bench ({results['mode']}): warm-up {results['warm_up']}", flush=True)
    for rate in rates:
        plan = _grouped(weighted_plan(groups, senders, stack.keys), stack)
        # Enough threads that a send taking 100 ms at the rate does not hold the next one back.
        threads = max(args.senders, math.ceil(rate / 10))
        stream = Stream("main", rate, args.duration, plan, threads)
        name = "steady" if not args.saturation else f"rate_{rate:g}"
        phase = run_phase(stack, name, [stream], ("healthy", "slow"), args.drain_timeout)
        results["phases"][name] = phase
        if args.saturation and not _step_ok(phase):
            break


def _interleave(a: list[str], b: list[str]) -> list[str]:
    # Refusing and blackhole agents take turns within the bad share.
    return [x[i] for i in range(max(len(a), len(b))) for x in (a, b) if i < len(x)]


def _grouped(plan: Callable[[int], tuple[str, str, str]], stack: Stack) -> Callable[[int], tuple[str, str, str]]:
    # The plan's "bad" group is refusing or blackhole by the recipient's endpoint.
    group_of = {e.recipient: e.group for e in stack.endpoints}

    def plan2(i: int) -> tuple[str, str, str]:
        key, recipient, _ = plan(i)
        return key, recipient, group_of[recipient]

    return plan2


def _step_ok(phase: dict) -> bool:
    p99 = phase["healthy"]["latency_ms"]["p99"]
    return (
        phase["streams"]["main"]["kept_up"]
        and phase["healthy"]["lost"] == 0
        and p99 is not None
        and p99 <= P99_LIMIT_MS
        and phase["drained"]
    )


def _saturation_verdict(phases: dict) -> dict:
    passed = [p["offered_rate"] for p in phases.values() if _step_ok(p)]
    last = list(phases.values())[-1] if phases else None
    reason = None
    if last is not None and not _step_ok(last):
        reason = (
            "senders could not keep up"
            if not last["streams"]["main"]["kept_up"]
            else f"healthy p99 {last['healthy']['latency_ms']['p99']} ms, lost {last['healthy']['lost']}"
        )
    if last is not None and reason is None:
        reason = "every step passed (more with --steps)"
    return {
        "highest_rate_p99_le_1s": max(passed) if passed else None,
        "criterion": "healthy p99 <= 1 s, nothing lost, drained, senders kept up",
        "stopped_at": last["offered_rate"] if last is not None and not _step_ok(last) else None,
        "stopped_because": reason,
    }


def _tenant(stack: Stack, args, results: dict) -> None:
    hold = stack.receivers.listen("ok", args.tenant_hold)
    for j in range(TENANT_ENDPOINTS):
        register(stack, "org_a", "busy@orga", hold, f"orga{j}")
    register(stack, "org_b", "quiet@orgb", stack.receivers.listen("ok"), "orgb")
    results["warm_up"] = warm_up(stack, "sender@orgb", ["quiet@orgb"], timeout=30)
    print(f"webhooks bench (tenant): warm-up {results['warm_up']}", flush=True)
    k = stack.keys

    def org_b() -> Stream:
        return Stream("org_b", 1.0, args.duration, lambda i: (k["sender@orgb"], "quiet@orgb", "org_b"), 1)

    results["phases"]["org_b_alone"] = run_phase(stack, "org_b_alone", [org_b()], ("org_b",), args.drain_timeout)
    org_a = Stream(
        "org_a",
        args.tenant_rate,
        args.duration,
        lambda i: (k["sender@orga"], "busy@orga", "org_a"),
        max(2, math.ceil(args.tenant_rate / 10)),
    )
    results["phases"]["beside_org_a"] = run_phase(
        stack, "beside_org_a", [org_a, org_b()], ("org_b",), args.drain_timeout
    )


# --- output -----------------------------------------------------------------------------------------


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def _phase_line(phase: dict) -> str:
    parts = []
    for name, st in phase["streams"].items():
        parts.append(
            f"{name} {st['achieved_rate']}/{st['offered_rate']} msg/s, send p50/p99 "
            f"{_ms(st['send_ms']['p50'])}/{_ms(st['send_ms']['p99'])} ms, {st['failed']} failed"
        )
    for group in ("healthy", "org_b", "slow"):
        g = phase.get(group)
        if g:
            lat = g["latency_ms"]
            parts.append(
                f"{group} {g['received']}/{g['expected']} p50/p95/p99 {_ms(lat['p50'])}/{_ms(lat['p95'])}/"
                f"{_ms(lat['p99'])} ms, lost {g['lost']}, dup {g['duplicates']}"
            )
    parts.append(f"drain {phase['drain_s']} s")
    return "; ".join(parts)


def print_webhooks(results: dict) -> None:
    """Print the compact table of a results document."""
    print(
        f"\nbench webhooks {results['date']} commit {results['commit']} mode {results['mode']}\n"
        f"load generator: {results['load_generator']}; {results['machine']['note']}"
    )
    print(
        f"{'phase':<14}{'stream':<7}{'offered':>8}{'sent/s':>8}{'send p50':>9}{'p99 ms':>8}{'failed':>7}"
        f"{'dlv/s':>7}{'drain s':>8}"
    )
    for name, phase in results["phases"].items():
        for i, (sname, st) in enumerate(phase["streams"].items()):
            print(
                f"{name if i == 0 else '':<14}{sname:<7}{st['offered_rate']:>8g}{st['achieved_rate']:>8}"
                f"{_ms(st['send_ms']['p50']):>9}{_ms(st['send_ms']['p99']):>8}{st['failed']:>7}"
                + (f"{phase['deliveries_per_s']['start_to_last_arrival']:>7}{phase['drain_s']:>8}" if i == 0 else "")
            )
        for group in ("healthy", "slow", "org_b"):
            g = phase.get(group)
            if g and g["endpoints"]:
                lat = g["latency_ms"]
                print(
                    f"{'':<14}{group:<8} received {g['received']}/{g['expected']}, commit->received p50/p95/p99/max "
                    f"{_ms(lat['p50'])}/{_ms(lat['p95'])}/{_ms(lat['p99'])}/{_ms(lat['max'])} ms, "
                    f"lost {g['lost']}"
                    + (f" ({g['arrived_after_drain']} arrived after the drain)" if g.get("arrived_after_drain") else "")
                    + f", duplicates {g['duplicates']}"
                )
        for group in ("refusing", "blackhole", "org_a"):
            if group in phase:
                print(f"{'':<14}{group:<8} {phase[group]}")
        for window in ("sends", "drain"):
            shown = {k: v for k, v in phase["cpu_s"][window].items() if v}
            print(f"{'':<14}cpu s ({window}): {shown}")
    for path, log in results.get("relay_delivery_log", {}).items():
        print(f"relay log {path}: {log}")
    if "saturation" in results:
        print(f"saturation: {results['saturation']}")
