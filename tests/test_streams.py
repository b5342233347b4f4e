"""Waking agents with no public URL: the feed's ``wait``, the SSE stream, the listener
(docs/decisions.md, "Waking agents").

Everything runs against a live gunicorn + Celery worker. No assertion is on time: each
wait is bounded and fails naming what did not arrive; "not woken" is shown by ordering
(a later marker message that arrives first), never by a sleep.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid

import pytest
import requests

from relay.ops.embedded import free_port
from tests.conftest import bearer, connections_named, send_message, slots_in, sql, wait_until, with_application_name
from tests.live import claimed_redis_db, live_relay
from tests.sse import SSE

HEARTBEAT = "1"  # seconds: the streams' heartbeat, slow re-check and re-authentication tick
CAP = 3  # RELAY_STREAMS_PER_AGENT for this module's relay
APP_NAME = "relay-live-streams"


@pytest.fixture(scope="module")
def live(base_env):
    env = with_application_name(base_env, APP_NAME)  # so the tests can count the relay's own connections
    worker_env = with_application_name(base_env, f"{APP_NAME}-worker")
    with (
        claimed_redis_db(base_env["REDIS_URL"]) as broker,
        live_relay(
            env,
            # The worker's own connections (its pump, its tasks) are not the web's: counted apart.
            worker_env={k: v for k, v in worker_env.items() if k.startswith("DATABASE")},
            RELAY_STREAM_HEARTBEAT=HEARTBEAT,
            RELAY_STREAMS_PER_AGENT=str(CAP),
            REDIS_URL=broker,
        ) as base,
    ):
        LIVE_REDIS[:] = [broker]
        yield base


LIVE_REDIS: list[str] = []  # the live relay's own Redis database (its slots are kept there)


def feed_url(base: str, handle: str) -> str:
    return f"{base}/api/v1/identities/{handle}/a2a/messages"


class Poll(threading.Thread):
    """One long-poll in a thread: ``.response`` once it answered."""

    def __init__(self, base: str, handle: str, key: str, read_timeout: float = 90, **params):
        super().__init__(daemon=True)
        self.url, self.key, self.params = feed_url(base, handle), key, params
        self.read_timeout = read_timeout
        self.response: requests.Response | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self):
        try:
            self.response = requests.get(
                self.url, headers=bearer(self.key), params=self.params, timeout=(5, self.read_timeout)
            )
        except BaseException as exc:  # reported by result()
            self.error = exc

    def result(self, timeout: float = 60) -> requests.Response:
        self.join(timeout)
        assert not self.is_alive(), f"the long-poll {self.params} had not answered within {timeout} s"
        assert self.error is None, self.error
        return self.response


def slots_held(app, handle: str) -> int:
    """How many waits and streams ``handle`` holds now, across web processes (its slots in Redis)."""
    return slots_in(app, LIVE_REDIS[0], handle)


@pytest.fixture
def pair(make_agent, live, settled):
    """``(alice, alice_key, bob, bob_key)``: alice hands work to bob."""
    a, a_key = make_agent("alice@acme")
    b, b_key = make_agent("bob@acme")
    return a, a_key, b, b_key


# --------------------------------------------------------------------------- long-poll


def test_long_poll_answers_the_matching_message_and_not_a_non_matching_one(app, live, pair):
    a, a_key, b, b_key = pair
    poll = Poll(live, b, b_key, wait=30, direction="inbound")
    wait_until(lambda: slots_held(app, b) == 1, what="bob's long-poll waiting")
    # Outbound for bob: wakes his waiters, but matches no inbound filter. A stream sees it
    # first, so its wake-up has been published before the matching message is written.
    watcher = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key))
    watcher.until_ready()
    sent_by_bob = send_message(live, b_key, a, "from bob: not inbound for bob")
    assert watcher.messages(1)[0].id == sent_by_bob["message_id"]
    assert poll.is_alive(), f"the long-poll answered a non-matching message: {poll.response and poll.response.text}"
    to_bob = send_message(live, a_key, b, "to bob: inbound")
    body = poll.result().json()
    assert [row["id"] for row in body["items"]] == [to_bob["message_id"]], body
    watcher.close()


def test_long_poll_with_rows_answers_at_once(live, pair):
    a, a_key, b, b_key = pair
    sent = send_message(live, a_key, b, "already there")
    # With rows on the page the wait does not start: an answer within the client's 10 s
    # read timeout, where the wait would have taken 60.
    resp = requests.get(feed_url(live, b), headers=bearer(b_key), params={"wait": 60}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert [row["id"] for row in resp.json()["items"]] == [sent["message_id"]]


def test_long_poll_that_runs_out_answers_the_empty_page(live, pair):
    a, a_key, b, b_key = pair
    resp = requests.get(feed_url(live, b), headers=bearer(b_key), params={"wait": 1}, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"items": [], "next_cursor": None}


def test_long_poll_after_a_message_waits_for_the_next_one(live, pair):
    a, a_key, b, b_key = pair
    first = send_message(live, a_key, b, "first")
    poll = Poll(live, b, b_key, wait=30, after=first["message_id"])
    second = send_message(live, a_key, b, "second")
    body = poll.result().json()
    assert [row["id"] for row in body["items"]] == [second["message_id"]], body


@pytest.mark.parametrize(
    "params,field",
    [
        ({"wait": "0"}, "wait"),
        ({"wait": "61"}, "wait"),
        ({"wait": "soon"}, "wait"),
        (
            {
                "wait": "5",
                "cursor": "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgIjAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMCJd",
            },
            "wait",
        ),
        ({"after": "not-an-id"}, "after"),
        ({"after": str(uuid.uuid4())}, "after"),
    ],
)
def test_bad_wait_or_after_is_422_naming_it(live, pair, params, field):
    a, a_key, b, b_key = pair
    resp = requests.get(feed_url(live, b), headers=bearer(b_key), params=params, timeout=30)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert field in (error["details"] or {}), error


def test_a_parameter_given_twice_is_422_saying_so(live, pair):
    a, a_key, b, b_key = pair
    resp = requests.get(feed_url(live, b), headers=bearer(b_key), params={"wait": ["1", "2"]}, timeout=30)
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["details"]["wait"] == ["is given more than once; give it once"]


def test_after_a_message_of_another_feed_is_422_as_if_unknown(live, make_agent, pair):
    a, a_key, b, b_key = pair
    c, c_key = make_agent("carol@acme")
    theirs = send_message(live, a_key, c, "alice to carol")
    resp = requests.get(feed_url(live, b), headers=bearer(b_key), params={"after": theirs["message_id"]}, timeout=30)
    assert resp.status_code == 422, resp.text
    assert "after" in resp.json()["error"]["details"]


# --------------------------------------------------------------------------- stream


def test_stream_events_are_the_feed_rows_oldest_first(live, pair):
    a, a_key, b, b_key = pair
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key))
    assert stream.status_code == 200
    assert stream.response.headers["Content-Type"].startswith("text/event-stream")
    stream.until_ready()
    sent = [send_message(live, a_key, b, f"message {i}\nwith a second line") for i in range(3)]
    events = stream.messages(3)
    stream.close()
    assert [e.id for e in events] == [s["message_id"] for s in sent]
    page = requests.get(feed_url(live, b), headers=bearer(b_key), timeout=30).json()["items"]
    assert [e.json() for e in events] == list(reversed(page))


def test_stream_resumes_after_last_event_id_with_every_message_once(live, pair):
    a, a_key, b, b_key = pair
    url = f"{feed_url(live, b)}/stream"
    stream = SSE(url, headers=bearer(b_key))
    stream.until_ready()
    sent = [send_message(live, a_key, b, f"before the drop {i}")["message_id"] for i in range(3)]
    seen = [e.id for e in stream.messages(2)]
    stream.close()  # dropped with the third unread
    sent += [send_message(live, a_key, b, f"while away {i}")["message_id"] for i in range(2)]
    again = SSE(url, headers={**bearer(b_key), "Last-Event-ID": seen[-1]})
    seen += [e.id for e in again.messages(3)]
    sent.append(send_message(live, a_key, b, "after the reconnect")["message_id"])
    seen += [e.id for e in again.messages(1)]
    again.close()
    assert seen == sent


def test_stream_since_replays_from_that_time(live, pair):
    a, a_key, b, b_key = pair
    old = send_message(live, a_key, b, "old")
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key), params={"since": old["created_at"]})
    stream.until_ready()
    new = send_message(live, a_key, b, "new")
    assert [e.id for e in stream.messages(2)] == [old["message_id"], new["message_id"]]
    stream.close()


def test_stream_filters_like_the_feed(live, pair):
    a, a_key, b, b_key = pair
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key), params={"q": "invoices"})
    stream.until_ready()
    send_message(live, a_key, b, "nothing to see")
    match = send_message(live, a_key, b, "the invoices are late")
    assert [e.id for e in stream.messages(1)] == [match["message_id"]]
    stream.close()


def test_a_stream_the_client_dropped_is_closed_without_an_error(app, live, pair):
    a, a_key, b, b_key = pair
    for _ in range(2):
        stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key))
        stream.until_ready()
        stream.close()
    # The relay notices on its next write (a heartbeat, every second here) and gives the slot back.
    wait_until(lambda: slots_held(app, b) == 0, what="the dropped streams' slots given back")
    log = live.stack.log("web")
    assert "Error handling request" not in log, log[-3000:]


def test_stream_sends_heartbeats(live, pair):
    a, a_key, b, b_key = pair
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key))
    stream.until_ready()
    for event in stream.events():
        assert event.event == "comment", event
        if event.data == "heartbeat":
            break
    stream.close()


@pytest.mark.parametrize(
    "headers,params,field",
    [
        ({"Last-Event-ID": "garbage"}, {}, "Last-Event-ID"),
        ({"Last-Event-ID": str(uuid.uuid4())}, {}, "Last-Event-ID"),
        ({}, {"cursor": "abc"}, "cursor"),
        ({}, {"limit": "5"}, "limit"),
        ({}, {"direction": "sideways"}, "direction"),
    ],
)
def test_bad_stream_query_is_422_naming_it(live, pair, headers, params, field):
    a, a_key, b, b_key = pair
    resp = requests.get(f"{feed_url(live, b)}/stream", headers={**bearer(b_key), **headers}, params=params, timeout=30)
    assert resp.status_code == 422, resp.text
    assert field in resp.json()["error"]["details"], resp.text


def test_stream_authorization_is_the_feeds(live, pair):
    a, a_key, b, b_key = pair
    url = f"{feed_url(live, b)}/stream"
    assert requests.get(url, timeout=30).status_code == 401
    assert requests.get(url, headers=bearer(a_key), timeout=30).status_code == 403
    ghost = f"{feed_url(live, 'ghost@nowhere')}/stream"
    assert requests.get(ghost, headers=bearer(b_key), timeout=30).status_code == 404


# --------------------------------------------------------------------------- limits and revocation


def test_the_per_agent_cap_answers_429_with_retry_after(app, live, pair):
    a, a_key, b, b_key = pair
    url = f"{feed_url(live, b)}/stream"
    streams = [SSE(url, headers=bearer(b_key)) for _ in range(CAP - 1)]
    for s in streams:
        s.until_ready()
    poll = Poll(live, b, b_key, wait=30)  # waits and streams count together
    wait_until(lambda: slots_held(app, b) == CAP, what=f"{b} holding {CAP} slots")
    over = requests.get(url, headers=bearer(b_key), timeout=30)
    assert over.status_code == 429, over.text
    assert int(over.headers["Retry-After"]) >= 1
    over_poll = requests.get(feed_url(live, b), headers=bearer(b_key), params={"wait": 5}, timeout=30)
    assert over_poll.status_code == 429, over_poll.text
    # Another agent is not counted against bob.
    assert (
        requests.get(f"{feed_url(live, a)}/stream", headers=bearer(a_key), stream=True, timeout=30).status_code == 200
    )
    streams.pop().close()
    wait_until(lambda: slots_held(app, b) == CAP - 1, what="the closed stream's slot given back")
    replacement = SSE(url, headers=bearer(b_key))
    assert replacement.status_code == 200
    replacement.close()
    send_message(live, a_key, b, "ends the poll")
    poll.result()
    for s in streams:
        s.close()


def test_a_revoked_key_has_its_stream_closed(live, pair):
    a, a_key, b, b_key = pair
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key))
    stream.until_ready()
    keys = requests.get(f"{live}/api/v1/identities/{b}/keys", headers=bearer(b_key), timeout=30).json()["items"]
    assert len(keys) == 1
    revoked = requests.delete(
        f"{live}/api/v1/identities/{b}/keys/{keys[0]['key_id']}", headers=bearer(b_key), timeout=30
    )
    assert revoked.status_code == 200, revoked.text
    kinds = [e.event for e in stream.events() if e.event != "comment"]  # to the end of the stream
    assert kinds == ["error"], kinds


def test_a_disabled_agents_long_poll_ends_unauthenticated(app, live, pair):
    a, a_key, b, b_key = pair
    poll = Poll(live, b, b_key, wait=30)
    sql(app, "UPDATE agents SET disabled_at = now() WHERE handle = :h", h=b)
    resp = poll.result()
    assert resp.status_code == 401, resp.text


# --------------------------------------------------------------------------- holding many, cheaply


def test_waiters_hold_no_database_connection(app, live, make_agent, settled, pooler):
    # More waiters than both web processes' pools hold connections: they would starve if a
    # waiter kept its connection.
    settings = app.config["RELAY"]
    pool_capacity = 2 * (settings.db_pool_size + settings.db_max_overflow)
    sender, sender_key = make_agent("sender@acme")
    agents = [make_agent(f"w{i}@acme") for i in range(pool_capacity // CAP + 2)]
    polls = [(h, Poll(live, h, k, wait=45, direction="inbound")) for h, k in agents for _ in range(CAP)]
    assert len(polls) > pool_capacity

    def relay_connections() -> int:
        return connections_named(app, pooler, APP_NAME)

    wait_until(
        lambda: sum(slots_held(app, h) for h, _ in agents) == len(polls),
        timeout=40,
        what=f"{len(polls)} long-polls waiting",
    )
    assert relay_connections() <= pool_capacity
    # The relay still answers others while they wait.
    assert requests.get(f"{live}/api/v1/identities/me", headers=bearer(sender_key), timeout=10).status_code == 200
    sent = {h: send_message(live, sender_key, h, f"wake {h}")["message_id"] for h, _ in agents}
    for handle, poll in polls:
        items = poll.result().json()["items"]
        assert [row["id"] for row in items] == [sent[handle]], (handle, items)


# --------------------------------------------------------------------------- the wake-up path


class Boom(Exception):
    pass


def test_a_wake_up_that_lands_as_a_wait_times_out_is_kept_for_the_next_wait():
    from relay.services import wakeup

    class LateWake(threading.Event):
        """The wake-up arrives just after the wait's timeout, before the wait returns."""

        def wait(self, timeout=None):
            woken = super().wait(timeout)
            if not woken and not getattr(self, "fired", False):
                self.fired = True
                self.set()
            return woken

    waiter = wakeup.Waiter((uuid.uuid4(),))
    waiter._event = LateWake()
    assert not waiter.wait(0.01), "nothing had woken it yet"
    # A stream waiting in slices goes straight into its next slice: it must see that wake-up.
    assert waiter.wait(0.01), "the wake-up that came as the first wait timed out was lost"
    assert not waiter.wait(0.01), "a wake-up is handed to one wait, not kept for ever"


def test_a_rolled_back_write_wakes_nobody(app, make_agent):
    from relay.services import threads, wakeup
    from relay.services.agents import get_agent

    a, _ = make_agent("alice@acme")
    b, _ = make_agent("bob@acme")
    m, _ = make_agent("marker@acme")
    with app.app_context():
        alice, bob, marker = get_agent(a), get_agent(b), get_agent(m)
        listener = wakeup.listener()
        to_bob, to_marker = listener.register((bob.id,)), listener.register((marker.id,))
        assert listener.subscribed.wait(20), "the listener did not subscribe"
        # A fresh subscription's wake-everyone comes just after `subscribed` is set (none when
        # the listener was already subscribed): give it a second to land and drain it, or it
        # may land later and pass for the rolled-back write's (seen once in CI with wait(0)).
        to_bob.wait(1), to_marker.wait(1)

        def boom(session, result):
            raise Boom()

        params = {"recipient": b, "message": {"parts": [{"type": "text", "text": "never committed"}]}}
        with pytest.raises(Boom):
            threads.send_message(alice, params, then=boom)
        assert sql(app, "SELECT count(*) FROM messages")[0][0] == 0
        # Two committed markers after it: had the rolled-back write published, its wake-up
        # would have been handled before the second marker's.
        for text in ("marker one", "marker two"):
            threads.send_message(alice, {"recipient": m, "message": {"parts": [{"type": "text", "text": text}]}})
            assert to_marker.wait(20), f"no wake-up for {text}"
        assert not to_bob.wait(0), "a rolled-back write woke its recipient's waiters"
        listener.unregister(to_bob), listener.unregister(to_marker)


def test_waiters_get_their_messages_after_postgresql_drops_every_connection(app, live, pair, pooler):
    a, a_key, b, b_key = pair
    poll = Poll(live, b, b_key, wait=30)
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key))
    stream.until_ready()
    wait_until(lambda: slots_held(app, b) == 2, what="bob's poll and stream waiting")
    # What a restart looks like from the relay: every connection it holds is cut. Behind the
    # pooler those are the pooler's server connections (all but the one this query runs on).
    if pooler is None:
        whose, params = "application_name LIKE :n", {"n": f"{APP_NAME}%"}  # web and worker
    else:
        servers = [row["remote_pid"] for row in pooler.admin("SHOW SERVERS")]
        whose, params = "pid = ANY(:pids) AND pid <> pg_backend_pid()", {"pids": servers}
    dropped = sql(app, f"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE {whose}", **params)[0][0]
    assert dropped >= 1
    sent = send_message(live, a_key, b, "after the drop")
    assert [row["id"] for row in poll.result().json()["items"]] == [sent["message_id"]]
    assert [e.id for e in stream.messages(1)] == [sent["message_id"]]
    stream.close()


@pytest.fixture
def private_redis():
    """A Redis server of this test's own on a free port: ``(url, restart)``."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not on PATH"
    port = free_port()
    procs: list[subprocess.Popen] = []

    def start():
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        import redis

        client = redis.Redis(port=port, socket_connect_timeout=1)
        wait_until(lambda: _pings(client), what=f"redis-server on port {port}")
        client.close()

    def stop():
        procs[-1].terminate()
        procs[-1].wait(timeout=20)

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", stop, start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=20)


def _pings(client) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_the_listener_resubscribes_after_redis_restarts_and_waiters_get_their_messages(
    app, base_env, make_agent, private_redis
):
    from relay.services import threads
    from relay.services.agents import get_agent

    # Not ``settled``: its relay and worker are gone when the test ends, and the message
    # written in-process went to a broker no worker reads; the rows are truncated anyway.
    redis_url, stop_redis, start_redis = private_redis
    a, a_key = make_agent("alice@acme")
    b, b_key = make_agent("bob@acme")
    # A slow tick far past every wait here: only the listener can wake these waiters.
    module_redis = list(LIVE_REDIS)  # the module's relay's, given back for the tests after this one
    try:
        with live_relay(base_env, REDIS_URL=redis_url, RELAY_STREAM_HEARTBEAT="300") as base:
            LIVE_REDIS[:] = [redis_url]
            poll = Poll(base, b, b_key, wait=60, read_timeout=45)
            wait_until(lambda: slots_held(app, b) == 1, what="bob's long-poll waiting")
            stop_redis()
            # Written while the relay's Redis is down: its wake-up goes nowhere the relay hears.
            with app.app_context():
                missed = threads.send_message(
                    get_agent(a), {"recipient": b, "message": {"parts": [{"type": "text", "text": "while down"}]}}
                )
            start_redis()
            assert [row["id"] for row in poll.result().json()["items"]] == [missed["message_id"]]
            # And the new subscription carries wake-ups: sent through the relay, after the restart.
            again = Poll(base, b, b_key, wait=60, read_timeout=45, after=missed["message_id"])
            wait_until(lambda: slots_held(app, b) == 1, what="bob's second long-poll waiting")
            sent = send_message(base, a_key, b, "after the restart")
            assert [row["id"] for row in again.result().json()["items"]] == [sent["message_id"]]
    finally:
        LIVE_REDIS[:] = module_redis


def test_a_stream_keeps_its_slot_past_the_slots_own_lifetime(app, live, pair):
    """The process's keeper refreshes the slot and its set: held 2x its ttl, it is still counted."""
    a, a_key, b, b_key = pair
    ttl = 2 * float(HEARTBEAT) + 5  # streams.take_slot's
    stream = SSE(f"{feed_url(live, b)}/stream", headers=bearer(b_key), read_timeout=3 * ttl)
    stream.until_ready()
    try:
        wait_until(lambda: slots_held(app, b) == 1, what="bob's stream holding its slot")
        deadline = time.monotonic() + 2 * ttl
        while time.monotonic() < deadline:
            assert slots_held(app, b) == 1
            time.sleep(0.5)
    finally:
        stream.close()


def test_a_tick_reads_only_every_few_ticks_while_the_listener_stays_subscribed(app, make_agent):
    """A wake-up reads; a tick only heartbeats, and reads every RECHECK_TICKS-th (the safety net)."""
    from relay.services import streams, wakeup
    from relay.services.agents import get_agent

    handle, _ = make_agent("ticks@acme")
    reads = []

    def read():
        reads.append(time.monotonic())
        return [], False

    with app.app_context():
        # Subscribed first: a (re)subscription wakes every waiter, which would be one more read.
        listener = wakeup.listener()
        listener.unregister(listener.register((uuid.uuid4(),)))
        assert listener.subscribed.wait(10), "the listener did not subscribe"
        held = streams.Held(get_agent(handle), still_allowed=lambda: None)
        try:
            held.tick = held.first_tick = 0.05
            beats = 0
            for item in held.rounds(read):
                if item is streams.HEARTBEAT:
                    beats += 1
                    if beats == 3 * streams.RECHECK_TICKS:
                        break
        finally:
            held.close()
    # The first read, then one at the 4th and 8th ticks; the 12th's would come after the break.
    assert len(reads) == 3, reads
