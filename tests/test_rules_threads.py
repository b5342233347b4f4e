"""Rules of the thread service that a one-line change could break with the suite green.

- A transition that loses the compare-and-set answers ``state_changed`` (-32010), not
  ``invalid_transition``: both racers are held until each has read the thread
  (pending, version 1), so the loser is always a compare-and-set loser.
- A read position never moves backwards (the ``greatest()`` of the mark-read upsert).
- A create that fails several checks answers the first in their order (threads.create._CHECKS),
  with a ``context_id`` (checked by a read first) or without (checked by the create's statement).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from relay.ids import parse_ulid
from relay.services import unit_of_work
from relay.services.threads import read, transitions
from tests.conftest import message_params, rpc, rpc_answer, rpc_error, send_message, sql


def test_transition_that_loses_a_race_answers_state_changed(app, client, alice, bob, monkeypatch):
    _a, a_key = alice
    b_handle, b_key = bob
    original_now = transitions._now
    for round_ in range(3):
        task_id = send_message(client, a_key, b_handle)["task_id"]
        # transition() reads the thread, checks its state, then asks _now() just before its
        # compare-and-set UPDATE: holding both callers there means both read pending v1.
        both_read = threading.Barrier(2, timeout=20)

        def held_now(session, _barrier=both_read):
            _barrier.wait()
            return original_now(session)

        monkeypatch.setattr(transitions, "_now", held_now)
        calls = {
            "cancel": lambda c: rpc_answer(c, a_key, "tasks/cancel", {"task_id": task_id}),
            "accept": lambda c: rpc_answer(c, b_key, "tasks/update", {"task_id": task_id, "transition": "accept"}),
        }
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {name: pool.submit(call, app.test_client()) for name, call in calls.items()}
            answers = {name: f.result(timeout=60) for name, f in futures.items()}
        monkeypatch.setattr(transitions, "_now", original_now)

        winners = [name for name, a in answers.items() if "result" in a]
        assert len(winners) == 1, answers
        [loser] = [name for name in answers if name not in winners]
        error = answers[loser]["error"]
        assert (error["code"], error["data"]["symbol"]) == (-32010, "state_changed"), (round_, answers)
        assert error["data"]["details"] == {"transition": loser}, error
        expected = "cancelled" if winners == ["cancel"] else "accepted"
        fresh = rpc(client, b_key, "tasks/get", {"task_id": task_id})
        assert (fresh["status"]["state"], fresh["version"]) == (expected, 2), fresh


def _position(app, task_id, handle):
    rows = sql(
        app,
        "SELECT rp.last_read_sequence_no FROM read_positions rp JOIN agents a ON a.id = rp.agent_id"
        " WHERE rp.thread_id = :t AND a.handle = :h",
        t=str(parse_ulid(task_id)),
        h=handle,
    )
    return [r[0] for r in rows]


def test_read_position_never_moves_backwards(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = send_message(client, a_key, b_handle)["task_id"]
    send_message(client, a_key, None, task_id=task_id)
    send_message(client, a_key, None, task_id=task_id)
    assert [m["sequence_no"] for m in rpc(client, b_key, "tasks/get", {"task_id": task_id})["messages"]] == [1, 2, 3]
    assert _position(app, task_id, b_handle) == [3]

    # A stale reader (it loaded the thread at sequence 1 and commits after the read at 3)
    # marks through the same upsert as tasks/get.
    with app.app_context():
        from relay.services.agents import get_agent

        reader, author = get_agent(b_handle), get_agent(_a)
        with unit_of_work() as session:
            read._mark_read(session, parse_ulid(task_id), reader.id, 1, author=author.id)
    assert _position(app, task_id, b_handle) == [3]
    inbox = rpc(client, b_key, "tasks/list", {})["items"]
    assert [(i["task_id"], i["unread_messages"]) for i in inbox] == [(task_id, 0)]


def test_a_create_answers_the_first_check_it_fails_in_order(app, client, alice, bob, make_agent):
    """Each case fails its check and every later one: unknown or disabled, yourself, intent, blocked
    (carol, disabled, and bob block alice; so does alice herself)."""
    a_handle, a_key = alice
    b_handle, _ = bob
    c_handle, _ = make_agent("carol@acme")
    context_id = send_message(client, a_key, b_handle)["context_id"]
    sql(
        app,
        "INSERT INTO blocks (blocker_id, blocked_id, created_at)"
        " SELECT b.id, a.id, now() FROM agents a, agents b WHERE a.handle = :a AND b.handle IN (:a, :b, :c)",
        a=a_handle,
        b=b_handle,
        c=c_handle,
    )
    sql(app, "UPDATE agents SET disabled_at = now() WHERE handle = :c", c=c_handle)
    bad_intent = {"intent": "propose_action"}  # without proposed_action
    cases = [
        (c_handle, bad_intent, "recipient_not_found"),
        (a_handle, bad_intent, "invalid_params"),
        (b_handle, bad_intent, "invalid_intent_payload"),
        (b_handle, {}, "teammate_blocked"),
    ]
    [(threads_before,)] = sql(app, "SELECT count(*) FROM threads")
    for recipient, more, symbol in cases:
        for extra in ({}, {"context_id": context_id}):
            error = rpc_error(client, a_key, "message/send", message_params(recipient, "hi", **more, **extra))
            assert error["data"]["symbol"] == symbol, (recipient, more, extra, error)
    assert sql(app, "SELECT count(*) FROM threads") == [(threads_before,)]
