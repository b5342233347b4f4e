"""Wake-ups: tell the requests waiting in this process that an agent's feed or tasks moved
(docs/decisions.md, "Waking agents").

A write that commits a message (or a task transition) names its participants' agent ids;
after commit the process's publisher (``services/dispatch.py``) sends them, batched, as
one Redis ``PUBLISH`` on :func:`channel`. Every web process runs one :class:`Listener`
thread subscribed to that channel; it wakes the :class:`Waiter` objects registered for
those agents. A wake-up carries no data: the waiter re-reads the feed, so a wake-up for a
message that does not match its filters costs one query and nothing else.

Nothing is lost when a wake-up is: published after commit, a rollback wakes nobody; if
Redis is down or the listener is reconnecting, waiters re-check on their slow tick
(``RELAY_STREAM_HEARTBEAT``: a tick reads when the listener is not subscribed, or has
subscribed again, since the waiter's last read), every (re)subscription wakes all
waiters at once, since what was published meanwhile is gone, and every fourth tick reads
anyway, for a publish that failed in another process. A waiter holds no database
connection.

The per-agent cap (``RELAY_STREAMS_PER_AGENT``) counts waits and streams across every
web process, in one Redis sorted set per agent whose members expire unless refreshed, so
a process that dies frees its slots by itself.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Iterable

import redis
from flask import current_app

from relay.extensions import redis_client

log = logging.getLogger("relay.wakeup")

CHANNEL_PREFIX = "relay:wake:"
SLOTS_PREFIX = "relay:waits:"
# Back-off between reconnection attempts of the listener, in seconds.
RECONNECT_MIN, RECONNECT_MAX = 0.1, 2.0


def channel(database_url: str) -> str:
    """The wake-up channel of one database: relays sharing a Redis but not a database do not wake each other."""
    return CHANNEL_PREFIX + database_url.rsplit("/", 1)[-1].split("?", 1)[0]


def encode(agent_ids: Iterable[uuid.UUID]) -> bytes:
    """One wake-up message: the agents' ids as hex, space-separated."""
    return " ".join(sorted({a.hex for a in agent_ids})).encode()


class Waiter:
    """One waiting request: woken when any of its agents is named, or when everyone is."""

    __slots__ = ("agent_ids", "_event")

    def __init__(self, agent_ids: tuple[uuid.UUID, ...]):
        self.agent_ids = agent_ids
        self._event = threading.Event()

    def wake(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if woken. Clears the wake-up *before* returning,
        so the caller's re-check sees every commit whose wake-up came after it.

        A wait that times out clears nothing: a wake-up set between its timeout and its
        return is kept for the next wait. (Clearing it lost it: a stream that waits in
        0.5 s slices then missed about one wake-up in fifty until the next one came.)
        """
        if self._event.wait(timeout):
            self._event.clear()
            return True
        return False


class Listener:
    """This process's subscription to the wake-up channel, and the waiters it wakes."""

    def __init__(self, redis_url: str, channel_name: str):
        self.redis_url, self.channel = redis_url, channel_name
        self._lock = threading.Lock()
        self._waiters: dict[uuid.UUID, set[Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        self.subscribed = threading.Event()
        self.subscriptions = 0  # how many times it (re)subscribed: tests watch it reconnect

    def register(self, agent_ids: Iterable[uuid.UUID]) -> Waiter:
        """A waiter for ``agent_ids``; the listener starts on first use in each process."""
        waiter = Waiter(tuple(agent_ids))
        with self._lock:
            for agent_id in waiter.agent_ids:
                self._waiters.setdefault(agent_id, set()).add(waiter)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self.subscribed.clear()
                self._thread = threading.Thread(target=self._run, name="relay-wakeup", daemon=True)
                self._thread.start()
        return waiter

    def unregister(self, waiter: Waiter) -> None:
        with self._lock:
            for agent_id in waiter.agent_ids:
                waiters = self._waiters.get(agent_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[agent_id]

    def subscription(self) -> int | None:
        """The current subscription's number, or None while unsubscribed.

        A waiter that read under subscription ``n`` and still sees ``n`` has missed no
        wake-up the channel carried since: every (re)subscription numbers itself anew.
        """
        return self.subscriptions if self.subscribed.is_set() else None

    def waiting(self) -> int:
        """How many waiters are registered now."""
        with self._lock:
            return len({w for ws in self._waiters.values() for w in ws})

    def wake(self, agent_ids: Iterable[uuid.UUID]) -> None:
        with self._lock:
            woken = {w for a in agent_ids for w in self._waiters.get(a, ())}
        for waiter in woken:
            waiter.wake()

    def wake_all(self) -> None:
        with self._lock:
            woken = {w for ws in self._waiters.values() for w in ws}
        for waiter in woken:
            waiter.wake()

    def _dispatch(self, data: bytes) -> None:
        ids = []
        for part in data.split():
            try:
                ids.append(uuid.UUID(part.decode()))
            except (ValueError, UnicodeDecodeError):
                log.warning("ignoring a malformed wake-up on %s", self.channel)
        self.wake(ids)

    def _run(self) -> None:
        backoff = RECONNECT_MIN
        while True:
            client = None
            try:
                # No read timeout: the subscription is idle for as long as nobody writes.
                # The health check pings an idle connection, so a dead peer is noticed.
                client = redis.Redis.from_url(
                    self.redis_url, socket_connect_timeout=2, socket_keepalive=True, health_check_interval=10
                )
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                pubsub.get_message(timeout=2)  # the subscribe confirmation: subscribed from here on
                self.subscriptions += 1
                self.subscribed.set()
                # Whatever was published while unsubscribed is gone: everyone re-checks.
                self.wake_all()
                backoff = RECONNECT_MIN
                while True:
                    message = pubsub.get_message(timeout=5)
                    if message is not None and message.get("type") == "message":
                        self._dispatch(message["data"])
            except Exception as exc:  # never let the thread die: waiters fall back to their slow tick
                self.subscribed.clear()
                log.warning("wake-up listener lost %s (%s); reconnecting", self.channel, type(exc).__name__)
                time.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
            finally:
                if client is not None:
                    try:
                        client.close()
                    except Exception:
                        pass


_listeners_lock = threading.Lock()


def listener() -> Listener:
    """The current app's listener (one per app and process)."""
    app = current_app._get_current_object()
    found = app.extensions.get("relay_wakeup")
    if found is None:
        settings = app.config["RELAY"]
        with _listeners_lock:
            found = app.extensions.setdefault(
                "relay_wakeup", Listener(settings.redis_url, channel(settings.database_url))
            )
    return found


# Take a slot if fewer than ARGV[3] unexpired ones exist; members expire at their score.
_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(ARGV[2] - ARGV[1]) + 1)
return 1
"""


class Keeper:
    """This process's held slots, refreshed together: one pipeline of ``ZADD XX`` every ``every`` seconds.

    A slot lasts ``ttl`` seconds unrefreshed (longer than ``every``), so the slots of a
    process that dies free themselves; while it lives, one round trip keeps all of them,
    however many waits and streams it holds.
    """

    def __init__(self, redis_url: str, every: float):
        self.redis_url, self.every = redis_url, every
        self._lock = threading.Lock()
        self._slots: set[Slot] = set()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def keep(self, slot: Slot) -> None:
        with self._lock:
            self._slots.add(slot)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="relay-slots", daemon=True)
                self._thread.start()

    def drop(self, slot: Slot) -> None:
        with self._lock:
            self._slots.discard(slot)

    def refresh(self, client: redis.Redis) -> int:
        """Refresh every kept slot now; return how many."""
        with self._lock:
            slots = list(self._slots)
        if slots:
            pipe = client.pipeline(transaction=False)
            now = time.time()
            for slot in slots:
                pipe.zadd(slot.key, {slot.member: now + slot.ttl}, xx=True)
            # The set itself outlives its newest member by a second, as taking a slot sets it.
            for key, ttl in {slot.key: slot.ttl for slot in slots}.items():
                pipe.expire(key, math.ceil(ttl) + 1)
            pipe.execute()
        return len(slots)

    def _run(self) -> None:
        client = redis.Redis.from_url(self.redis_url, socket_connect_timeout=1, socket_timeout=5)
        while True:
            time.sleep(self.every)
            try:
                self.refresh(client)
            except Exception as exc:  # never let the thread die: the next round tries again
                log.warning("wait slots not refreshed (%s); retrying in %g s", type(exc).__name__, self.every)


def keeper() -> Keeper:
    """The current app's slot keeper (one per app and process), refreshing every stream heartbeat."""
    app = current_app._get_current_object()
    found = app.extensions.get("relay_slot_keeper")
    if found is None:
        settings = app.config["RELAY"]
        with _listeners_lock:
            found = app.extensions.setdefault(
                "relay_slot_keeper", Keeper(settings.redis_url, settings.stream_heartbeat)
            )
    return found


class Slot:
    """One of an agent's concurrent waits or streams, held in Redis until released or expired.

    ``ttl`` (seconds) is how long it lasts unrefreshed: the process's :class:`Keeper`
    refreshes every slot it holds once a stream heartbeat. If Redis cannot be reached the
    slot is granted (fail open, as the rate limits are).
    """

    def __init__(self, agent_id: uuid.UUID, ttl: float):
        self.key = f"{SLOTS_PREFIX}{agent_id.hex}"
        self.member = uuid.uuid4().hex
        self.ttl = ttl
        self.client = redis_client()
        self.keeper = keeper()

    def acquire(self, cap: int) -> bool:
        """Take the slot if the agent holds fewer than ``cap``; False when it is full."""
        now = time.time()
        try:
            script = self.client.register_script(_ACQUIRE)
            taken = bool(script(keys=[self.key], args=[now, now + self.ttl, cap, self.member]))
        except redis.RedisError as exc:
            log.warning("wait slots unavailable (%s); allowing the wait", type(exc).__name__)
            taken = True
        if taken:
            self.keeper.keep(self)
        return taken

    def release(self) -> None:
        self.keeper.drop(self)
        try:
            self.client.zrem(self.key, self.member)
        except redis.RedisError:
            pass
