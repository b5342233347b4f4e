"""Keyset paging of ``tasks/list`` (docs/api.md, "Paging"; the feed's half is tests/test_feed.py)."""

from __future__ import annotations

import base64
import json

from sqlalchemy import text

from relay.extensions import db
from relay.ids import parse_ulid
from tests.conftest import rpc_answer

TIE = "2026-01-02 03:04:05.123456+00"
EARLIER = "2026-01-01 00:00:00.000001+00"


def make_threads(client, sender_key, recipient, n):
    ids = []
    for i in range(n):
        body = rpc_answer(
            client,
            sender_key,
            "message/send",
            {"recipient": recipient, "message": {"parts": [{"type": "text", "text": f"handoff {i}"}]}},
        )
        ids.append(body["result"]["task_id"])
    return ids


def set_updated_at(app, stamp, task_ids=None):
    with app.app_context():
        if task_ids is None:
            db.session.execute(text("UPDATE threads SET updated_at = CAST(:s AS timestamptz)"), {"s": stamp})
        else:
            db.session.execute(
                text("UPDATE threads SET updated_at = CAST(:s AS timestamptz) WHERE id = ANY(:ids)"),
                {"s": stamp, "ids": [parse_ulid(t) for t in task_ids]},
            )
        db.session.commit()


def walk(client, key, limit, filter_=None):
    """Return every page of tasks/list as (items, next_cursor) pairs."""
    pages, cursor = [], None
    for _ in range(50):
        params = {"page": {"limit": limit, "cursor": cursor}}
        if filter_ is not None:
            params["filter"] = filter_
        body = rpc_answer(client, key, "tasks/list", params)
        assert "result" in body, body
        pages.append((body["result"]["items"], body["result"]["next_cursor"]))
        cursor = body["result"]["next_cursor"]
        if cursor is None:
            return pages
    raise AssertionError("paging never ended")


def expected_order(app, task_ids):
    """(updated_at desc, id desc), read back from the database."""
    with app.app_context():
        rows = (
            db.session.execute(
                text("SELECT id FROM threads WHERE id = ANY(:ids) ORDER BY updated_at DESC, id DESC"),
                {"ids": [parse_ulid(t) for t in task_ids]},
            )
            .scalars()
            .all()
        )
    by_uuid = {parse_ulid(t): t for t in task_ids}
    return [by_uuid[r] for r in rows]


def assert_invalid_cursor(body):
    assert "result" not in body, body
    assert body["error"]["code"] == -32602
    assert body["error"]["data"]["symbol"] == "invalid_params"
    assert "page.cursor" in body["error"]["data"]["errors"]


def test_threads_sharing_updated_at_page_without_loss_or_duplicates(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    ids = make_threads(client, a_key, b_handle, 25)
    set_updated_at(app, TIE)
    pages = walk(client, b_key, 10)
    assert [len(items) for items, _ in pages] == [10, 10, 5]
    assert [cursor is not None for _, cursor in pages] == [True, True, False]
    listed = [item["task_id"] for items, _ in pages for item in items]
    assert len(set(listed)) == 25
    assert set(listed) == set(ids)
    # All share one timestamp, so the order is id descending.
    assert listed == sorted(ids, key=parse_ulid, reverse=True)
    assert listed == expected_order(app, ids)
    assert {item["updated_at"] for items, _ in pages for item in items} == {"2026-01-02T03:04:05.123456Z"}


def test_pages_follow_updated_at_then_id_descending(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    ids = make_threads(client, a_key, b_handle, 25)
    # Two tie groups of 12 and 13 threads; both straddle a page boundary at limit 10.
    set_updated_at(app, EARLIER, ids[::2])
    set_updated_at(app, TIE, ids[1::2])
    pages = walk(client, b_key, 10)
    listed = [item["task_id"] for items, _ in pages for item in items]
    newer = sorted(ids[1::2], key=parse_ulid, reverse=True)
    older = sorted(ids[::2], key=parse_ulid, reverse=True)
    assert listed == newer + older
    assert listed == expected_order(app, ids)
    assert [cursor is not None for _, cursor in pages] == [True, True, False]


def test_last_full_page_has_a_null_cursor(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    ids = make_threads(client, a_key, b_handle, 20)
    set_updated_at(app, TIE)
    pages = walk(client, b_key, 10)
    assert [len(items) for items, _ in pages] == [10, 10]
    assert [cursor is not None for _, cursor in pages] == [True, False]
    assert {i["task_id"] for items, _ in pages for i in items} == set(ids)


def test_status_filter_walk_returns_only_matching_threads_in_order(app, client, make_agent):
    _a, a_key = make_agent("alice@acme")
    b_handle, b_key = make_agent("bob@acme")
    ids = make_threads(client, a_key, b_handle, 25)
    accepted = ids[3:10]
    for task_id in accepted:
        assert "result" in rpc_answer(client, b_key, "tasks/update", {"task_id": task_id, "transition": "accept"})
    set_updated_at(app, TIE)
    pending = [t for t in ids if t not in accepted]

    pages = walk(client, b_key, 5, {"status": ["accepted"]})
    listed = [item["task_id"] for items, _ in pages for item in items]
    assert [len(items) for items, _ in pages] == [5, 2]
    assert listed == sorted(accepted, key=parse_ulid, reverse=True)
    assert {item["status"]["state"] for items, _ in pages for item in items} == {"accepted"}

    pages = walk(client, b_key, 5, {"status": ["pending"]})
    listed = [item["task_id"] for items, _ in pages for item in items]
    assert [len(items) for items, _ in pages] == [5, 5, 5, 3]
    assert listed == sorted(pending, key=parse_ulid, reverse=True)
    assert {item["status"]["state"] for items, _ in pages for item in items} == {"pending"}


def test_garbage_cursor_is_invalid_params(client, make_agent):
    _b, b_key = make_agent("bob@acme")
    for garbage in ("not-a-cursor!!", "%%%", "", 12345, "a" * 500):
        assert_invalid_cursor(rpc_answer(client, b_key, "tasks/list", {"page": {"limit": 10, "cursor": garbage}}))


def test_well_formed_cursor_of_another_shape_is_invalid_params(client, make_agent):
    _b, b_key = make_agent("bob@acme")
    shapes = (
        ["x", "y"],
        ["2026-01-02T03:04:05+00:00"],
        {"a": 1},
        ["2026-01-02T03:04:05", "00000000-0000-0000-0000-000000000000"],
        ["2026-01-02T03:04:05+00:00", "not-a-uuid"],
        [1, 2],
        None,
        "just a string",
    )
    for shape in shapes:
        cursor = base64.urlsafe_b64encode(json.dumps(shape).encode()).decode().rstrip("=")
        assert_invalid_cursor(rpc_answer(client, b_key, "tasks/list", {"page": {"limit": 10, "cursor": cursor}}))


def test_cursor_with_non_string_parts_is_invalid_params(client, make_agent):
    # A time and an id that are JSON numbers, lists or objects instead of strings.
    _b, b_key = make_agent("bob@acme")
    shapes = (
        ["2026-01-02T03:04:05+00:00", 5],
        ["2026-01-02T03:04:05+00:00", ["a"]],
        ["2026-01-02T03:04:05+00:00", {"a": 1}],
        [5, "00000000-0000-0000-0000-000000000000"],
    )
    for shape in shapes:
        cursor = base64.urlsafe_b64encode(json.dumps(shape).encode()).decode().rstrip("=")
        assert_invalid_cursor(rpc_answer(client, b_key, "tasks/list", {"page": {"limit": 10, "cursor": cursor}}))
