"""Client idempotency keys on ``message/send`` (docs/api.md, "Conventions")."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select, text

from relay.extensions import db
from relay.models import Agent, Block
from tests.conftest import rpc_answer

CONCURRENT_CALLS = 10


def send_params(recipient, text_="please review the login flow", idem="key-1", **extra):
    params = {"recipient": recipient, "message": {"parts": [{"type": "text", "text": text_}]}, **extra}
    if idem is not None:
        params["metadata"] = {"client_idempotency_key": idem}
    return params


def counts(app) -> dict[str, int]:
    with app.app_context():
        return {
            table: db.session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("threads", "messages", "events", "idempotency_records")
        }


def assert_error(body, code, symbol):
    assert "result" not in body, body
    assert body["error"]["code"] == code, body
    assert body["error"]["data"]["symbol"] == symbol, body


def test_same_key_same_params_replays_the_first_answer(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    first = rpc_answer(client, a_key, "message/send", send_params(b_handle))
    second = rpc_answer(client, a_key, "message/send", send_params(b_handle), id=2)
    assert "result" in first, first
    assert second["result"] == first["result"]
    assert second["result"]["task_id"] == first["result"]["task_id"]
    assert second["result"]["message_id"] == first["result"]["message_id"]
    assert counts(app) == {"threads": 1, "messages": 1, "events": 1, "idempotency_records": 1}


def test_same_key_different_text_is_duplicate_and_creates_nothing(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    first = rpc_answer(client, a_key, "message/send", send_params(b_handle, "first text"))
    assert "result" in first, first
    before = counts(app)
    second = rpc_answer(client, a_key, "message/send", send_params(b_handle, "other text"))
    assert_error(second, -32011, "duplicate_idempotency_key")
    assert counts(app) == before == {"threads": 1, "messages": 1, "events": 1, "idempotency_records": 1}


def test_keys_are_scoped_per_agent(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    _b, b_key = make_agent("bob@acme")
    c_handle, _c_key = make_agent("carol@acme")
    from_a = rpc_answer(client, a_key, "message/send", send_params(c_handle, idem="shared-value"))
    from_b = rpc_answer(client, b_key, "message/send", send_params(c_handle, idem="shared-value"))
    assert "result" in from_a and "result" in from_b, (from_a, from_b)
    assert from_b["result"]["task_id"] != from_a["result"]["task_id"]
    assert from_b["result"]["message_id"] != from_a["result"]["message_id"]
    assert counts(app) == {"threads": 2, "messages": 2, "events": 2, "idempotency_records": 2}
    got = rpc_answer(client, b_key, "tasks/get", {"task_id": from_b["result"]["task_id"]})["result"]
    assert got["sender"]["handle"] == "bob@acme"


def test_key_of_a_create_reused_for_an_append_is_duplicate(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    created = rpc_answer(client, a_key, "message/send", send_params(b_handle, idem="k"))["result"]
    before = counts(app)
    append = {
        "task_id": created["task_id"],
        "message": {"parts": [{"type": "text", "text": "more"}]},
        "metadata": {"client_idempotency_key": "k"},
    }
    assert_error(rpc_answer(client, a_key, "message/send", append), -32011, "duplicate_idempotency_key")
    assert counts(app) == before


def test_replay_after_the_thread_completed_returns_the_original_answer(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    first = rpc_answer(client, a_key, "message/send", send_params(b_handle))["result"]
    task = {"task_id": first["task_id"]}
    assert "result" in rpc_answer(client, b_key, "tasks/update", {**task, "transition": "accept"})
    assert "result" in rpc_answer(
        client, b_key, "tasks/update", {**task, "transition": "complete", "result_summary": "done"}
    )
    # Without a key the thread is terminal: an append would be refused.
    refused = rpc_answer(client, a_key, "message/send", {**task, "message": {"parts": [{"type": "text", "text": "x"}]}})
    assert_error(refused, -32007, "thread_terminal")
    before = counts(app)
    replay = rpc_answer(client, a_key, "message/send", send_params(b_handle))
    assert replay["result"] == first
    assert replay["result"]["status"] == {"state": "pending"}
    assert counts(app) == before


def test_replay_after_the_recipient_blocked_the_sender_returns_the_original_answer(app, client, make_agent):
    a_handle, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    first = rpc_answer(client, a_key, "message/send", send_params(b_handle))["result"]
    with app.app_context():
        alice = db.session.scalar(select(Agent).where(Agent.handle == a_handle))
        bob = db.session.scalar(select(Agent).where(Agent.handle == b_handle))
        db.session.add(Block(blocker_id=bob.id, blocked_id=alice.id))
        db.session.commit()
    # The block is in force for a new handoff...
    assert_error(
        rpc_answer(client, a_key, "message/send", send_params(b_handle, idem="new-key")), -32013, "teammate_blocked"
    )
    before = counts(app)
    # ...but the retry of the earlier one still gets its answer.
    replay = rpc_answer(client, a_key, "message/send", send_params(b_handle))
    assert replay["result"] == first
    assert counts(app) == before


def test_failed_first_call_does_not_burn_the_key(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    params = send_params("carol@acme", idem="retry-me")
    assert_error(rpc_answer(client, a_key, "message/send", params), -32004, "recipient_not_found")
    assert counts(app) == {"threads": 0, "messages": 0, "events": 0, "idempotency_records": 0}
    make_agent("carol@acme")
    second = rpc_answer(client, a_key, "message/send", params)
    assert "result" in second, second
    assert second["result"]["status"] == {"state": "pending"}
    assert counts(app) == {"threads": 1, "messages": 1, "events": 1, "idempotency_records": 1}
    assert rpc_answer(client, a_key, "message/send", params)["result"] == second["result"]


def test_concurrent_calls_with_one_key_create_exactly_one_thread(app, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    barrier = threading.Barrier(CONCURRENT_CALLS)

    def call(n):
        c = app.test_client()
        barrier.wait(timeout=30)
        return rpc_answer(c, a_key, "message/send", send_params(b_handle, idem="burst"), id=n)

    with ThreadPoolExecutor(max_workers=CONCURRENT_CALLS) as pool:
        answers = [f.result(timeout=60) for f in [pool.submit(call, n) for n in range(CONCURRENT_CALLS)]]
    assert all("result" in a for a in answers), [a.get("error") for a in answers]
    with app.app_context():
        thread_ids = db.session.execute(text("SELECT id FROM threads")).scalars().all()
    assert len(thread_ids) == 1
    task_ids = {a["result"]["task_id"] for a in answers}
    message_ids = {a["result"]["message_id"] for a in answers}
    assert len(task_ids) == 1 and len(message_ids) == 1
    from relay.ids import parse_ulid

    assert parse_ulid(task_ids.pop()) == thread_ids[0]
    assert counts(app) == {"threads": 1, "messages": 1, "events": 1, "idempotency_records": 1}


def _expire(app, key: str) -> None:
    with app.app_context():
        n = db.session.execute(
            text("UPDATE idempotency_records SET expires_at = now() - interval '1 hour' WHERE key = :k"), {"k": key}
        ).rowcount
        db.session.commit()
    assert n == 1


# Expired records are not purged by a DELETE any more: they go with their time partition
# (tests/test_retention.py, test_expired_idempotency_records_go_with_their_partition).


def test_expired_key_can_be_reused_with_other_params(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, _b_key = make_agent("bob@acme")
    first = rpc_answer(client, a_key, "message/send", send_params(b_handle, "one", idem="k"))["result"]
    _expire(app, "k")
    second = rpc_answer(client, a_key, "message/send", send_params(b_handle, "two", idem="k"))
    assert "result" in second, second
    assert second["result"]["task_id"] != first["task_id"]
    assert counts(app) == {"threads": 2, "messages": 2, "events": 2, "idempotency_records": 1}
    # The key now answers for the new params.
    assert (
        rpc_answer(client, a_key, "message/send", send_params(b_handle, "two", idem="k"))["result"] == second["result"]
    )
    assert_error(
        rpc_answer(client, a_key, "message/send", send_params(b_handle, "one", idem="k")),
        -32011,
        "duplicate_idempotency_key",
    )
