"""Concurrency on real PostgreSQL: gapless sequence numbers and racing transitions.

Each worker thread uses its own ``app.test_client()``; every request gets its own app
context and therefore its own database session and connection.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import text

from relay.extensions import db
from tests.conftest import rpc_answer

RACE_ROUNDS = 20


def create_thread(client, sender_key, recipient_handle, text_="please review"):
    body = rpc_answer(
        client,
        sender_key,
        "message/send",
        {"recipient": recipient_handle, "message": {"parts": [{"type": "text", "text": text_}]}},
    )
    assert "result" in body, body
    return body["result"]["task_id"]


def run_parallel(app, calls):
    """Run each ``call(client)`` in its own thread, released together by a Barrier."""
    barrier = threading.Barrier(len(calls))

    def runner(call):
        client = app.test_client()
        barrier.wait(timeout=30)
        return call(client)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(runner, c) for c in calls]
        return [f.result(timeout=60) for f in futures]


def test_concurrent_appends_get_gapless_sequence_numbers(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    for round_ in range(3):
        task_id = create_thread(client, a_key, b_handle, f"round {round_}")

        def append(n, key):
            def call(c):
                return rpc_answer(
                    c,
                    key,
                    "message/send",
                    {"task_id": task_id, "message": {"parts": [{"type": "text", "text": f"append {n}"}]}},
                )

            return call

        answers = run_parallel(app, [append(n, a_key if n % 2 else b_key) for n in range(8)])
        assert all("result" in a for a in answers), answers
        seqs = sorted(a["result"]["sequence_no"] for a in answers)
        assert seqs == list(range(2, 10))
        assert len({a["result"]["message_id"] for a in answers}) == 8

        got = rpc_answer(client, a_key, "tasks/get", {"task_id": task_id})["result"]
        assert [m["sequence_no"] for m in got["messages"]] == list(range(1, 10))
        by_id = {m["id"]: m for m in got["messages"]}
        for a in answers:
            assert by_id[a["result"]["message_id"]]["sequence_no"] == a["result"]["sequence_no"]

        with app.app_context():
            rows = (
                db.session.execute(
                    text("SELECT sequence_no FROM messages WHERE thread_id = :t ORDER BY sequence_no"),
                    {"t": _uuid(task_id)},
                )
                .scalars()
                .all()
            )
            last = db.session.execute(
                text("SELECT last_sequence_no FROM threads WHERE id = :t"), {"t": _uuid(task_id)}
            ).scalar_one()
        assert rows == list(range(1, 10))
        assert last == 9


def _uuid(task_id: str) -> str:
    from relay.ids import parse_ulid

    return str(parse_ulid(task_id))


def _outcome(answer):
    if "result" in answer:
        return "ok"
    return (answer["error"]["code"], answer["error"]["data"]["symbol"])


LOSER_OUTCOMES = {(-32010, "state_changed"), (-32008, "invalid_transition")}


def test_cancel_and_accept_race_has_exactly_one_winner(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    task_ids = [create_thread(client, a_key, b_handle, f"race {i}") for i in range(RACE_ROUNDS)]
    winners = {"cancel": 0, "accept": 0}
    for task_id in task_ids:
        cancel, accept = run_parallel(
            app,
            [
                lambda c: rpc_answer(c, a_key, "tasks/cancel", {"task_id": task_id}),
                lambda c: rpc_answer(
                    c, b_key, "tasks/update", {"task_id": task_id, "transition": "accept", "session_id": "s1"}
                ),
            ],
        )
        outcomes = [_outcome(cancel), _outcome(accept)]
        assert outcomes.count("ok") == 1, (cancel, accept)
        loser = outcomes[1] if outcomes[0] == "ok" else outcomes[0]
        seen = ((accept if outcomes[0] == "ok" else cancel)["error"]["data"].get("details") or {}).get("state")
        # A loser that read pending v1 lost the compare-and-set: -32010 state_changed. Only one
        # that read the winner's committed state may answer -32008, and it names that state.
        assert loser == (-32010, "state_changed") or (
            loser == (-32008, "invalid_transition") and seen == ("cancelled" if outcomes[0] == "ok" else "accepted")
        ), (cancel, accept)
        expected = "cancelled" if outcomes[0] == "ok" else "accepted"
        winners["cancel" if expected == "cancelled" else "accept"] += 1
        winner_answer = cancel if outcomes[0] == "ok" else accept
        assert winner_answer["result"]["status"]["state"] == expected

        fresh = rpc_answer(app.test_client(), b_key, "tasks/get", {"task_id": task_id})["result"]
        assert fresh["status"]["state"] == expected
        assert fresh["version"] == 2
        assert (fresh["cancelled_at"] is not None) == (expected == "cancelled")
        assert (fresh["accepted_at"] is not None) == (expected == "accepted")
        with app.app_context():
            transitions = (
                db.session.execute(
                    text("SELECT action FROM audit_events WHERE thread_id = :t AND from_state IS NOT NULL"),
                    {"t": _uuid(task_id)},
                )
                .scalars()
                .all()
            )
        assert transitions == ["cancel" if expected == "cancelled" else "accept"]
    assert sum(winners.values()) == RACE_ROUNDS


def test_same_recipient_accepting_twice_in_parallel_succeeds_once(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    for i in range(5):
        task_id = create_thread(client, a_key, b_handle, f"double accept {i}")
        accept = lambda c: rpc_answer(c, b_key, "tasks/update", {"task_id": task_id, "transition": "accept"})  # noqa: E731
        first, second = run_parallel(app, [accept, accept])
        outcomes = [_outcome(first), _outcome(second)]
        assert outcomes.count("ok") == 1, (first, second)
        loser = outcomes[1] if outcomes[0] == "ok" else outcomes[0]
        assert loser in LOSER_OUTCOMES, (first, second)

        fresh = rpc_answer(client, b_key, "tasks/get", {"task_id": task_id})["result"]
        assert fresh["status"]["state"] == "accepted"
        assert fresh["version"] == 2
        with app.app_context():
            accepts = db.session.execute(
                text("SELECT count(*) FROM audit_events WHERE thread_id = :t AND action = 'accept'"),
                {"t": _uuid(task_id)},
            ).scalar_one()
            events = db.session.execute(
                text("SELECT count(*) FROM events WHERE thread_id = :t AND type = 'task.updated'"),
                {"t": _uuid(task_id)},
            ).scalar_one()
        assert accepts == 1
        assert events == 1
