"""Webhook isolation: concurrency caps, circuit breaker, connection reuse, honest errors, body size.

docs/webhooks.md, "Delivery", and relay/services/delivery/. Real
receivers on loopback (tests/receiver.py), real PostgreSQL and Redis, and either the real
in-process Celery worker (``celery_worker``) or, for an app with other settings, that
app's real webhook pump (workers/delivery.py) fed the committed events directly, as its
Celery task would. No timed assertions: order and counts are read at the receivers,
while a receiver holds its answers behind a gate.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid

import pytest

from tests.conftest import bearer, extra_app, rpc_answer, sql, wait_until
from tests.receiver import Receiver
from tests.test_webhooks import _msg, append, create_hook, create_thread, deliveries, get_hook

ALICE, BOB, CAROL = "alice@acme", "bob@acme", "carol@beta"


@pytest.fixture
def agents(make_agent):
    return {h: make_agent(h)[1] for h in (ALICE, BOB, CAROL)}


@pytest.fixture
def rx():
    with Receiver() as receiver:
        yield receiver


@pytest.fixture
def gate():
    """A gate the receiver's answers wait behind; opened at the end whatever happens."""
    event = threading.Event()
    yield event
    event.set()


def _pending_events(app) -> list[uuid.UUID]:
    return [uuid.UUID(r[0]) for r in sql(app, "SELECT id::text FROM events WHERE fanned_out_at IS NULL")]


def _pump(app):
    """Hand ``app``'s committed events to its pump (what its Celery task does) and wait for the fan-out."""
    from workers.delivery import pump_for

    with app.app_context():
        done = pump_for(app).committed(None, _pending_events(app))
    assert done.wait(10), "the pump did not fan the events out within 10 s"


def _leased(app) -> int:
    return sql(app, "SELECT count(*) FROM webhook_deliveries WHERE leased_until > now()")[0][0]


# --------------------------------------------------------------------------- caps


def test_an_endpoint_never_has_more_attempts_in_flight_than_its_cap(app, client, agents, rx, gate, celery_worker):
    rx.program("/slow", [], default={"status": 200, "gate": gate})
    hook = create_hook(client, BOB, agents[BOB], rx.url("/slow"), events=["message.created"])
    task_id = create_thread(client, agents[ALICE], BOB, "message 0")["task_id"]
    for i in range(1, 10):
        append(client, agents[ALICE], task_id, f"message {i}")
    rx.wait_for(4, path="/slow")
    # Every delivery is fanned out and due, and the pump has polled since (each second):
    # had the cap not held, the other six would be at the receiver by now.
    wait_until(lambda: sql(app, "SELECT count(*) FROM events WHERE fanned_out_at IS NULL")[0][0] == 0)
    wait_until(lambda: _leased(app) == 4, what="four leased deliveries")
    polled = sql(app, "SELECT now()")[0][0]
    wait_until(lambda: sql(app, "SELECT now() > CAST(:t AS timestamptz) + interval '1.5 s'", t=polled)[0][0])
    assert rx.count("/slow") == 4 and rx.in_flight("/slow") == 4
    gate.set()
    wait_until(
        lambda: (
            all(d["status"] == "succeeded" for d in deliveries(client, BOB, agents[BOB], hook["id"]))
            and len(deliveries(client, BOB, agents[BOB], hook["id"])) == 10
        ),
        what="ten succeeded deliveries",
    )
    assert rx.most_in_flight("/slow") == 4
    assert rx.count("/slow") == 10


def test_an_orgs_unproven_endpoints_get_half_its_cap_and_never_its_fast_ones_slots(
    base_env, celery_app, redis_url, make_agent, gate
):
    with extra_app(base_env, celery_app, redis_url, RELAY_WEBHOOK_ORG_CONCURRENCY="6") as other, Receiver() as rx:
        client = other.test_client()
        keys = {h: make_agent(h)[1] for h in ("ann@acme", "ben@acme", "cid@acme", "dee@acme", "eve@beta")}
        rx.program("/fast", [], default=200)
        create_hook(client, "dee@acme", keys["dee@acme"], rx.url("/fast"), events=["message.created"])
        create_thread(client, keys["ann@acme"], "dee@acme", "proves dee's endpoint fast")
        _pump(other)
        rx.wait_for(1, path="/fast")
        wait_until(lambda: sql(other, "SELECT count(*) FROM webhook_attempts")[0][0] == 1, what="dee's first attempt")
        rx.program("/acme", [], default={"status": 200, "gate": gate})
        for handle in ("ben@acme", "cid@acme"):  # two new endpoints of the same org (cap 4 each), one receiver
            create_hook(client, handle, keys[handle], rx.url("/acme"), events=["message.created"])
            for i in range(4):
                create_thread(client, keys["ann@acme"], handle, f"to {handle} {i}")
        _pump(other)
        rx.wait_for(3, path="/acme")  # half of the org's 6, the part unproven endpoints may hold
        # Neither the org's proven endpoint nor another org is held back by them.
        create_thread(client, keys["ann@acme"], "dee@acme", "to dee again")
        rx.program("/beta", [], default=200)
        create_hook(client, "eve@beta", keys["eve@beta"], rx.url("/beta"), events=["message.created"])
        create_thread(client, keys["ann@acme"], "eve@beta", "to eve")
        _pump(other)
        rx.wait_for(2, path="/fast")
        rx.wait_for(1, path="/beta")
        assert rx.count("/acme") == 3 and rx.in_flight("/acme") == 3
        gate.set()
        rx.wait_for(8, path="/acme", timeout=30)
        wait_until(lambda: sql(other, "SELECT count(*) FROM webhook_attempts")[0][0] == 11, what="eleven attempts")
        assert rx.most_in_flight("/acme") == 3


def test_a_slow_endpoint_does_not_hold_back_another_endpoints_deliveries(client, agents, rx, gate, celery_worker):
    rx.program("/slow", [], default={"status": 200, "gate": gate})
    rx.program("/fast", [], default=200)
    create_hook(client, BOB, agents[BOB], rx.url("/slow"), events=["message.created"])
    create_hook(client, CAROL, agents[CAROL], rx.url("/fast"), events=["message.created"])
    slow_task = create_thread(client, agents[ALICE], BOB, "slow 0")["task_id"]
    for i in range(1, 20):  # bob's backlog first: 20 deliveries behind a closed gate
        append(client, agents[ALICE], slow_task, f"slow {i}")
    fast_task = create_thread(client, agents[ALICE], CAROL, "fast 0")["task_id"]
    for i in range(1, 5):
        append(client, agents[ALICE], fast_task, f"fast {i}")
    rx.wait_for(5, path="/fast", timeout=15)  # all of carol's, while bob's receiver holds everything
    assert not gate.is_set() and rx.count("/slow") == 4
    gate.set()
    rx.wait_for(20, path="/slow", timeout=30)


def test_a_claim_reserves_only_what_each_endpoint_has_due(app, client, agents, rx):
    """Eight new endpoints with one delivery each are all claimed in one round, not four slots each."""
    from relay.services import delivery

    hooks = [
        create_hook(client, BOB, agents[BOB], rx.url(f"/e{i}"), events=["message.created"])["id"] for i in range(8)
    ]
    create_thread(client, agents[ALICE], BOB, "one message, eight endpoints")
    with app.app_context():
        created = delivery.fan_out_many(_pending_events(app))
        assert len(created) == 8
        claims = delivery.claim({uuid.UUID(h) for h in hooks}, budget=64)
    assert len(claims) == 8


def test_an_attempt_whose_lease_ran_out_does_not_overwrite_its_successors_row(app, client, agents, rx):
    """Two attempts of one delivery (the first outlived its lease): only the current lease's is written."""
    from relay.services import delivery, outbound

    hook = create_hook(client, BOB, agents[BOB], rx.url("/lease"), events=["message.created"])
    create_thread(client, agents[ALICE], BOB, "leased twice")
    endpoint = uuid.UUID(hook["id"])
    with app.app_context():
        delivery.fan_out_many(_pending_events(app))
        [first] = delivery.claim({endpoint}, budget=1)
        sql(app, "UPDATE webhook_deliveries SET next_attempt_at = now(), leased_until = now() - interval '1 s'")
        [second] = delivery.claim({endpoint}, budget=1)
        assert second.delivery_id == first.delivery_id and second.row.leased_until != first.row.leased_until
        stale = delivery.Result(first, first.row.leased_until, outbound.Outcome(500, None, None, 5))
        assert delivery.record([stale]) == {}
    [(status, count, leased)] = sql(
        app, "SELECT status, attempt_count, leased_until IS NOT NULL FROM webhook_deliveries"
    )
    assert (status, count, leased) == ("pending", 0, True)  # still the second attempt's


def test_a_cached_target_is_checked_again_when_its_name_is_resolved_again(monkeypatch):
    """DNS is cached; a renewal that now points at a private address is refused."""
    import time as _time

    from relay.services import outbound

    answers = {"ip": "93.184.216.34"}

    def fake_getaddrinfo(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers["ip"], port))]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    cache = outbound.TargetCache(ttl=0.2)
    url = "https://hooks.example.com/in"
    assert cache.resolve(url, allow_private=False, allow_http=False).address == "93.184.216.34"
    answers["ip"] = "10.0.0.8"
    assert cache.resolve(url, allow_private=False, allow_http=False).address == "93.184.216.34"  # cached
    _time.sleep(0.3)
    with pytest.raises(outbound.TargetRefused, match="10.0.0.8"):
        cache.resolve(url, allow_private=False, allow_http=False)


# --------------------------------------------------------------------------- circuit breaker


def test_the_circuit_opens_after_failures_in_a_row_and_a_probe_success_closes_it(
    base_env, celery_app, redis_url, make_agent
):
    env = {
        "RELAY_WEBHOOK_CIRCUIT_FAILURES": "3",
        "RELAY_WEBHOOK_CIRCUIT_OPEN": "3",
        "RELAY_WEBHOOK_SCHEDULE": "0,0,0,0,0,0",
    }
    with extra_app(base_env, celery_app, redis_url, **env) as other, Receiver() as rx:
        client = other.test_client()
        keys = {h: make_agent(h)[1] for h in (ALICE, BOB)}
        rx.program("/flaky", [500, 500, 500], default=200)
        hook = create_hook(client, BOB, keys[BOB], rx.url("/flaky"), events=["message.created"])
        assert get_hook(client, BOB, keys[BOB], hook["id"])["health"]["state"] == "healthy"
        task_id = create_thread(client, keys[ALICE], BOB, "first")["task_id"]
        _pump(other)
        health = wait_until(
            lambda: (h := get_hook(client, BOB, keys[BOB], hook["id"])["health"])["state"] == "open" and h,
            what="an open circuit",
        )
        assert health["consecutive_failures"] == 3 and "3 failed attempts in a row (last: HTTP 500)" in health["reason"]
        # The opening is kept for the console's chart of circuit spans, written with the health.
        [(opened, until, reason, matches)] = sql(
            other,
            "SELECT o.opened_at, o.until, o.reason, o.until = e.circuit_open_until"
            " FROM circuit_openings o JOIN webhook_endpoints e ON e.id = o.endpoint_id",
        )
        assert matches and (until - opened).total_seconds() == 3 and reason == health["reason"]
        # While it is open, nothing goes out, and new deliveries wait (pending, not lost).
        append(client, keys[ALICE], task_id, "second")
        _pump(other)
        still = sql(other, "SELECT circuit_open_until > now() FROM webhook_endpoints")[0][0]
        assert rx.count("/flaky") == 3 or not still
        if still:
            assert sql(other, "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")[0][0] == 2
        # The pause ends, one probe succeeds, the circuit closes and the backlog goes out.
        rx.wait_for(5, path="/flaky", timeout=20)
        items = wait_until(
            lambda: (
                (d := deliveries(client, BOB, keys[BOB], hook["id"]))
                and all(x["status"] == "succeeded" for x in d)
                and len(d) == 2
                and d
            ),
            what="both deliveries succeeded",
        )
        assert sorted(x["attempt_count"] for x in items) == [1, 4]
        health = get_hook(client, BOB, keys[BOB], hook["id"])["health"]
        assert health == {**health, "state": "healthy", "reason": None, "consecutive_failures": 0}
        assert health["circuit_open_until"] is None


def test_a_new_url_starts_with_a_closed_circuit(app, client, agents):
    hook = create_hook(client, BOB, agents[BOB], "http://127.0.0.1:9/old", events=["message.created"])
    sql(
        app,
        "UPDATE webhook_endpoints SET consecutive_failures = 9, circuit_opens = 3, failing_since = now(), "
        "circuit_open_until = now() + interval '1 hour', circuit_reason = 'old receiver down' "
        "WHERE id = CAST(:i AS uuid)",
        i=hook["id"],
    )
    assert get_hook(client, BOB, agents[BOB], hook["id"])["health"]["state"] == "open"
    resp = client.patch(
        f"/api/v1/identities/{BOB}/webhooks/{hook['id']}",
        json={"url": "http://127.0.0.1:9/new"},
        headers=bearer(agents[BOB]),
    )
    assert resp.status_code == 200, resp.get_data(as_text=True)
    record = resp.get_json()
    assert record["health"]["state"] == "healthy" and record["health"]["consecutive_failures"] == 0
    assert record["failing_since"] is None


def test_an_endpoint_disabled_by_410_shows_disabled(app, client, agents, rx):
    from relay.ids import parse_ulid
    from relay.services import webhooks

    rx.program("/gone", [], default=410)
    hook = create_hook(client, BOB, agents[BOB], rx.url("/gone"))
    resp = client.post(f"/api/v1/identities/{BOB}/webhooks/{hook['id']}/test", headers=bearer(agents[BOB]))
    with app.app_context():
        [delivery_id] = webhooks.fan_out(parse_ulid(resp.get_json()["event_id"].removeprefix("evt_")))
        assert webhooks.deliver(delivery_id) == "failed"
    health = get_hook(client, BOB, agents[BOB], hook["id"])["health"]
    assert health["state"] == "disabled" and "410" in health["reason"]


def test_an_endpoint_answering_slowly_is_shown_slowed(base_env, celery_app, redis_url, make_agent):
    with extra_app(base_env, celery_app, redis_url, RELAY_WEBHOOK_SLOW_MS="300") as other, Receiver() as rx:
        client = other.test_client()
        keys = {h: make_agent(h)[1] for h in (ALICE, BOB)}
        rx.program("/sluggish", [], default={"status": 200, "delay": 0.5})
        hook = create_hook(client, BOB, keys[BOB], rx.url("/sluggish"), events=["message.created"])
        create_thread(client, keys[ALICE], BOB, "hello")
        _pump(other)
        health = wait_until(
            lambda: (h := get_hook(client, BOB, keys[BOB], hook["id"])["health"])["last_attempt_at"] and h,
            what="an attempt recorded",
        )
        assert health["state"] == "slowed" and health["last_duration_ms"] >= 500
        assert "the last attempt took" in health["reason"] and "300 ms" in health["reason"]


# --------------------------------------------------------------------------- connections


def test_deliveries_to_one_endpoint_reuse_one_connection(client, agents, celery_worker):
    with Receiver(keepalive=True) as rx:
        hook = create_hook(client, BOB, agents[BOB], rx.url("/keep"), events=["message.created"])
        task_id = create_thread(client, agents[ALICE], BOB, "message 0")["task_id"]
        rx.wait_for(1, path="/keep")
        for i in range(1, 5):  # one at a time: each after the previous one arrived
            append(client, agents[ALICE], task_id, f"message {i}")
            rx.wait_for(i + 1, path="/keep")
        wait_until(
            lambda: [d["status"] for d in deliveries(client, BOB, agents[BOB], hook["id"])] == ["succeeded"] * 5,
            what="five succeeded deliveries",
        )
        assert len({r.peer for r in rx.requests("/keep")}) == 1


# --------------------------------------------------------------------------- honest errors


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def trickler():
    """A receiver that answers a status line, then one header byte every 0.2 s, for ever."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.recv(65536)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not stop.wait(0.2):
                    conn.sendall(b"X")
            except OSError:
                pass
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/trickle"
    stop.set()
    thread.join(5)
    server.close()


@pytest.fixture
def black_hole():
    """A listening socket that never answers (the kernel completes the handshake)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}/hole"
    s.close()


def _one_attempt(app, handle, key, url):
    """Point a fresh endpoint at ``url``, send it a test event and make one attempt now; return (delivery, attempt)."""
    from relay.ids import parse_ulid
    from relay.services import webhooks

    client = app.test_client()
    hook = create_hook(client, handle, key, "http://127.0.0.1:9/placeholder")
    sql(app, "UPDATE webhook_endpoints SET url = :u WHERE id = CAST(:i AS uuid)", u=url, i=hook["id"])
    resp = client.post(f"/api/v1/identities/{handle}/webhooks/{hook['id']}/test", headers=bearer(key))
    assert resp.status_code == 202, resp.get_data(as_text=True)
    with app.app_context():
        [delivery_id] = webhooks.fan_out(parse_ulid(resp.get_json()["event_id"].removeprefix("evt_")))
        webhooks.deliver(delivery_id)
    [item] = deliveries(client, handle, key, hook["id"])
    [attempt] = item["attempts"]
    return item, attempt


def test_each_error_kind_is_recorded_as_itself(
    base_env, celery_app, redis_url, make_agent, black_hole, trickler, caplog
):
    caplog.set_level(logging.INFO, logger="relay.webhooks")
    with extra_app(base_env, celery_app, redis_url, RELAY_WEBHOOK_TIMEOUT="1") as other, Receiver() as rx:
        handle, key = make_agent(BOB)
        rx.program("/busy", [], default=503)
        rx.program("/late", [], default={"status": 200, "delay": 1.5})
        cases = {
            "refused": (f"http://127.0.0.1:{_closed_port()}/x", "connection refused"),
            "dns": ("http://no-such-host.invalid/x", "DNS failure: host 'no-such-host.invalid' does not resolve"),
            "tls": (f"https://127.0.0.1:{rx.port}/busy", "TLS failure: "),
            "late": (rx.url("/late"), "timeout after 1 s (waiting for the response)"),
            "black hole": (black_hole, "timeout after 1 s (waiting for the response)"),
            # Each byte comes within the read timeout; the whole attempt still ends at 1 s.
            "trickle": (trickler, "timeout after 1 s (the whole attempt)"),
        }
        for kind, (url, expected) in cases.items():
            item, attempt = _one_attempt(other, handle, key, url)
            assert attempt["status_code"] is None, kind
            assert attempt["error"].startswith(expected), (kind, attempt["error"])
            assert item["last_error"] == attempt["error"], kind
            if kind in ("late", "black hole", "trickle"):
                assert 1000 <= attempt["duration_ms"] < 3000, (kind, attempt)
            else:
                assert attempt["duration_ms"] < 1000, (kind, attempt)
        item, attempt = _one_attempt(other, handle, key, rx.url("/busy"))
        assert attempt["status_code"] == 503 and attempt["error"] is None and item["last_error"] == "HTTP 503"
    logged = [r for r in caplog.records if r.getMessage() == "webhook attempt"]
    assert [getattr(r, "error", None) for r in logged][:2] == [
        "connection refused",
        "DNS failure: host 'no-such-host.invalid' does not resolve",
    ]
    assert all(isinstance(getattr(r, "duration_ms", None), int) for r in logged)


# --------------------------------------------------------------------------- body size


def test_a_webhook_past_the_size_bound_carries_a_feed_reference_instead_of_the_content(
    base_env, celery_app, redis_url, make_agent
):
    with extra_app(base_env, celery_app, redis_url, RELAY_WEBHOOK_MAX_PAYLOAD_BYTES="20000") as other, Receiver() as rx:
        import json

        client = other.test_client()
        keys = {h: make_agent(h)[1] for h in (ALICE, BOB)}
        create_hook(client, BOB, keys[BOB], rx.url("/in"), events=["message.created"])
        small = create_thread(client, keys[ALICE], BOB, "short and sweet")
        big_text = "word " * 3000  # 15,000 characters, carried twice (body and parts): past 20,000 bytes
        rpc_answer(client, keys[ALICE], "message/send", {"task_id": small["task_id"], "message": _msg(big_text)})
        _pump(other)
        got = rx.wait_for(2, path="/in")
        bodies = sorted((json.loads(r.body) for r in got), key=lambda b: b["data"]["sequence_no"])
        assert bodies[0]["data"]["body"] == "short and sweet" and "content_omitted" not in bodies[0]["data"]
        assert len(got[0].body) <= 20000 and len(got[1].body) <= 20000
        slim = bodies[1]["data"]
        assert "body" not in slim and "parts" not in slim and "more than 20000" in slim["content_omitted"]["reason"]
        fetched = client.get(slim["content_omitted"]["fetch"], headers=bearer(keys[BOB]))
        assert fetched.status_code == 200, fetched.get_data(as_text=True)[:300]
        [row] = [m for m in fetched.get_json()["items"] if m["id"] == slim["id"]]
        assert row["body"] == big_text
