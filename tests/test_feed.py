"""The messages feed ``GET /api/v1/identities/{handle}/a2a/messages`` (docs/api.md, "The messages feed").

Row shape,
task_state now, newest first, every parameter's bounds, direction x role, handle
filters, inclusive since, 401/403/404, keyset paging over shared timestamps and
deleted rows, the byte budget, and the catch-up loop under concurrent writes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest
from ulid import ULID

from tests.conftest import bearer, rpc, sql

TIE = "2026-03-04 05:06:07.123456+00"
ROW_FIELDS = {
    "priority",  # the work lifecycle's, beside the feed's own fields
    "read_at",
    "id",
    "sequence_no",
    "role",
    "from",
    "body",
    "parts",
    "artifacts",
    "metadata",
    "created_at",
    "task_id",
    "context_id",
    "task_state",
    "caller",
    "target",
}


# --------------------------------------------------------------------------- helpers


def msg(text_):
    return {"parts": [{"type": "text", "text": text_}]}


def create(client, key, recipient, text_, **extra):
    return rpc(client, key, "message/send", {"recipient": recipient, "message": msg(text_), **extra})


def append(client, key, task_id, text_, **extra):
    return rpc(client, key, "message/send", {"task_id": task_id, "message": msg(text_), **extra})


def transition(client, key, task_id, name):
    return rpc(client, key, "tasks/update", {"task_id": task_id, "transition": name})


def feed_url(handle):
    return f"/api/v1/identities/{handle}/a2a/messages"


def feed_resp(client, key, handle, query=None):
    headers = bearer(key) if key else {}
    if isinstance(query, str):
        return client.get(f"{feed_url(handle)}?{query}", headers=headers)
    return client.get(feed_url(handle), query_string=query or {}, headers=headers)


def feed(client, key, handle, **query):
    resp = feed_resp(client, key, handle, query)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"items", "next_cursor"}, body
    return body


def bodies(client, key, handle, **query):
    return [row["body"] for row in feed(client, key, handle, **query)["items"]]


def walk(client, key, handle, **query):
    """Follow next_cursor until null; return the pages' item lists and cursors."""
    pages, cursor = [], None
    for _ in range(100):
        q = dict(query)
        if cursor is not None:
            q["cursor"] = cursor
        body = feed(client, key, handle, **q)
        pages.append((body["items"], body["next_cursor"]))
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
    raise AssertionError("the walk never ended")


def assert_error(resp, status, code):
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.is_json, resp.get_data(as_text=True)
    body = resp.get_json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert body["error"]["code"] == code, body
    return body["error"]


def to_uuid(ulid_text):
    return str(ULID.from_str(ulid_text).to_uuid())


# --------------------------------------------------------------------------- row shape


def test_feed_row_has_exactly_the_message_and_task_fields(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    artifact = {"type": "file_ref", "path": "src/users.py", "line_start": 3}
    sent = create(client, a_key, b_handle, "please review users", artifacts=[artifact], metadata={"ticket": "T-1"})
    body = feed(client, b_key, b_handle)
    assert body["next_cursor"] is None
    [row] = body["items"]
    assert set(row) == ROW_FIELDS
    assert row == {
        "id": sent["message_id"],
        "sequence_no": 1,
        "role": "caller",
        "from": a_handle,
        "body": "please review users",
        "parts": [{"type": "text", "text": "please review users"}],
        "artifacts": [artifact],
        "metadata": {"ticket": "T-1"},
        "created_at": sent["created_at"],
        "task_id": sent["task_id"],
        "context_id": sent["context_id"],
        "task_state": "pending",
        "caller": {"handle": a_handle, "name": "Alice", "role": "frontend"},
        "target": {"handle": b_handle, "name": "Bob", "role": "backend"},
        "priority": "normal",
        "read_at": None,
    }


def test_reply_row_has_role_agent_and_author_in_from(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "opening")["task_id"]
    reply = append(client, b_key, task_id, "the reply")
    row = feed(client, a_key, a_handle)["items"][0]
    assert (row["id"], row["sequence_no"], row["role"], row["from"]) == (reply["message_id"], 2, "agent", b_handle)
    # caller/target describe the task, not the message's author.
    assert row["caller"]["handle"] == a_handle and row["target"]["handle"] == b_handle


def test_feed_metadata_excludes_client_idempotency_key(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "with a key", metadata={"client_idempotency_key": "idem-1", "trace": "x9"})
    [row] = feed(client, b_key, b_handle)["items"]
    assert row["metadata"] == {"trace": "x9"}


def test_task_state_is_the_state_now_not_when_the_message_was_written(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "old message")["task_id"]
    assert [r["task_state"] for r in feed(client, a_key, a_handle)["items"]] == ["pending"]
    transition(client, b_key, task_id, "accept")
    assert [r["task_state"] for r in feed(client, a_key, a_handle)["items"]] == ["accepted"]
    transition(client, b_key, task_id, "complete")
    assert [r["task_state"] for r in feed(client, b_key, b_handle)["items"]] == ["completed"]


def test_feed_is_newest_first(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "first")["task_id"]
    append(client, b_key, task_id, "second")
    append(client, a_key, task_id, "third")
    items = feed(client, b_key, b_handle)["items"]
    assert [r["body"] for r in items] == ["third", "second", "first"]
    assert [r["sequence_no"] for r in items] == [3, 2, 1]
    stamps = [r["created_at"] for r in items]
    assert stamps == sorted(stamps, reverse=True)


# --------------------------------------------------------------------------- parameter bounds


@pytest.mark.parametrize(
    "query, param",
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "abc"}, "limit"),
        ({"q": ""}, "q"),
        ({"q": "x" * 501}, "q"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-07-21T18:00:00"}, "since"),
        ({"task_id": "not-a-task"}, "task_id"),
        ({"task_id": "01HXYZ4K2VNJQP7R8MWDB3CSTU"}, "task_id"),  # 26 chars, U is not Crockford base32
        ({"context_id": "12345"}, "context_id"),
        ({"context_id": "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"}, "context_id"),
        ({"direction": "sideways"}, "direction"),
        ({"role": "user"}, "role"),
        ({"cursor": "garbage!!"}, "cursor"),
        ({"cursor": "eyJub3QiOiAiYSBjdXJzb3IifQ"}, "cursor"),  # valid base64 JSON, wrong shape
        ({"colour": "blue"}, "colour"),
        ({"requester_handle": "not a handle"}, "requester_handle"),
        ({"worker_handle": "nobody"}, "worker_handle"),
    ],
    ids=[
        "limit-0",
        "limit-101",
        "limit-abc",
        "q-empty",
        "q-501",
        "since-unparseable",
        "since-no-zone",
        "task_id-malformed",
        "task_id-bad-ulid",
        "context_id-short",
        "context_id-bad-uuid",
        "direction",
        "role",
        "cursor-garbage",
        "cursor-wrong-shape",
        "unknown-param",
        "requester_handle",
        "worker_handle",
    ],
)
def test_bad_parameter_is_422_naming_it(client, alice, query, param):
    a_handle, a_key = alice
    error = assert_error(feed_resp(client, a_key, a_handle, query), 422, "invalid_params")
    assert param in error["details"], error
    assert param in error["message"], error


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "1"},
        {"limit": "100"},
        {"q": "x"},
        {"q": "x" * 500},
        {"since": "2026-07-21T18:00:00Z"},
        {"since": "2026-07-21T18:00:00+02:00"},
        {"direction": "both"},
        {"role": "caller"},
    ],
)
def test_parameter_at_its_bound_is_accepted(client, alice, query):
    a_handle, a_key = alice
    assert feed(client, a_key, a_handle, **query) == {"items": [], "next_cursor": None}


def test_plus_offset_arriving_as_space_is_422_mentioning_percent_2b(client, alice):
    a_handle, a_key = alice
    # A raw '+' in a query string decodes to a space: the server sees "2026-07-21T18:00:00 02:00".
    error = assert_error(feed_resp(client, a_key, a_handle, "since=2026-07-21T18:00:00+02:00"), 422, "invalid_params")
    assert list(error["details"]) == ["since"]
    assert "%2B" in error["message"] and "%2B" in " ".join(error["details"]["since"])


def test_plus_offset_encoded_as_percent_2b_is_accepted(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "recent")
    resp = feed_resp(client, b_key, b_handle, "since=" + quote("2000-01-01T00:00:00+02:00", safe=""))
    assert resp.status_code == 200
    assert [r["body"] for r in resp.get_json()["items"]] == ["recent"]


def test_limit_caps_the_page_and_sets_next_cursor(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "m0")["task_id"]
    for i in range(1, 3):
        append(client, a_key, task_id, f"m{i}")
    body = feed(client, b_key, b_handle, limit=2)
    assert [r["body"] for r in body["items"]] == ["m2", "m1"]
    assert body["next_cursor"] is not None
    rest = feed(client, b_key, b_handle, limit=2, cursor=body["next_cursor"])
    assert [r["body"] for r in rest["items"]] == ["m0"] and rest["next_cursor"] is None


def test_exactly_limit_rows_leave_next_cursor_null(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "m0")["task_id"]
    append(client, a_key, task_id, "m1")
    body = feed(client, b_key, b_handle, limit=2)
    assert len(body["items"]) == 2 and body["next_cursor"] is None


# --------------------------------------------------------------------------- id filters


def test_task_id_filter_accepts_ulid_and_uuid_forms(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    t1 = create(client, a_key, b_handle, "thread one")["task_id"]
    append(client, b_key, t1, "thread one reply")
    create(client, a_key, b_handle, "thread two")
    for form in (t1, to_uuid(t1), to_uuid(t1).upper(), t1.lower()):
        rows = feed(client, b_key, b_handle, task_id=form)["items"]
        assert [r["body"] for r in rows] == ["thread one reply", "thread one"], form
        assert {r["task_id"] for r in rows} == {t1}


def test_context_id_filter_accepts_ulid_and_uuid_forms(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    first = create(client, a_key, b_handle, "ctx first")
    ctx = first["context_id"]
    create(client, a_key, b_handle, "ctx second", context_id=ctx)
    create(client, a_key, b_handle, "other context")
    for form in (ctx, to_uuid(ctx)):
        rows = feed(client, b_key, b_handle, context_id=form)["items"]
        assert [r["body"] for r in rows] == ["ctx second", "ctx first"], form
        assert {r["context_id"] for r in rows} == {ctx}


def test_unknown_task_id_filter_is_an_empty_page(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "something")
    assert feed(client, b_key, b_handle, task_id=str(ULID())) == {"items": [], "next_cursor": None}


# --------------------------------------------------------------------------- direction x role


@pytest.fixture
def two_way(client, alice, bob):
    """alice -> bob: "a-open", bob replies "b-reply"; bob -> alice: "b-open", alice replies "a-reply"."""
    a_handle, a_key = alice
    b_handle, b_key = bob
    t1 = create(client, a_key, b_handle, "a-open")["task_id"]
    append(client, b_key, t1, "b-reply")
    t2 = create(client, b_key, a_handle, "b-open")["task_id"]
    append(client, a_key, t2, "a-reply")
    return a_handle, a_key


@pytest.mark.parametrize(
    "direction, role, expected",
    [
        ("inbound", "agent", ["a-reply"]),  # your own replies on work others sent you
        ("inbound", "caller", ["b-open"]),
        ("inbound", None, ["a-reply", "b-open"]),
        ("outbound", "caller", ["a-open"]),  # your own opening messages
        ("outbound", "agent", ["b-reply"]),
        ("outbound", None, ["b-reply", "a-open"]),
        ("both", "caller", ["b-open", "a-open"]),
        ("both", "agent", ["a-reply", "b-reply"]),
        ("both", None, ["a-reply", "b-open", "b-reply", "a-open"]),
        (None, None, ["a-reply", "b-open", "b-reply", "a-open"]),
    ],
)
def test_direction_and_role_are_independent_axes(client, two_way, direction, role, expected):
    a_handle, a_key = two_way
    query = {k: v for k, v in (("direction", direction), ("role", role)) if v is not None}
    assert bodies(client, a_key, a_handle, **query) == expected


def test_feed_never_shows_threads_the_identity_is_not_part_of(client, alice, bob, make_agent):
    a_handle, a_key = alice
    b_handle, b_key = bob
    c_handle, c_key = make_agent("carol@acme")
    create(client, b_key, c_handle, "bob to carol")
    create(client, c_key, b_handle, "carol to bob")
    assert feed(client, a_key, a_handle) == {"items": [], "next_cursor": None}


# --------------------------------------------------------------------------- requester / worker filters


@pytest.fixture
def three_threads(client, alice, bob, make_agent):
    a_handle, a_key = alice
    b_handle, b_key = bob
    _c, c_key = make_agent("carol@acme")
    create(client, a_key, b_handle, "alice asks bob")
    create(client, b_key, a_handle, "bob asks alice")
    create(client, c_key, a_handle, "carol asks alice")
    return a_handle, a_key


def test_requester_handle_keeps_threads_that_handle_sent(client, three_threads):
    a_handle, a_key = three_threads
    assert bodies(client, a_key, a_handle, requester_handle="bob@acme") == ["bob asks alice"]
    assert bodies(client, a_key, a_handle, requester_handle="alice@acme") == ["alice asks bob"]


def test_worker_handle_keeps_threads_that_handle_received(client, three_threads):
    a_handle, a_key = three_threads
    assert bodies(client, a_key, a_handle, worker_handle="bob@acme") == ["alice asks bob"]
    assert bodies(client, a_key, a_handle, worker_handle="alice@acme") == ["carol asks alice", "bob asks alice"]


def test_requester_and_worker_handles_combine(client, three_threads):
    a_handle, a_key = three_threads
    assert bodies(client, a_key, a_handle, requester_handle="carol@acme", worker_handle="alice@acme") == [
        "carol asks alice"
    ]
    assert bodies(client, a_key, a_handle, requester_handle="carol@acme", worker_handle="bob@acme") == []


def test_handle_filters_are_case_insensitive(client, three_threads):
    a_handle, a_key = three_threads
    assert bodies(client, a_key, a_handle, requester_handle="Bob@ACME") == ["bob asks alice"]


@pytest.mark.parametrize("param", ["requester_handle", "worker_handle"])
def test_unknown_handle_filter_is_an_empty_list(client, three_threads, param):
    a_handle, a_key = three_threads
    assert feed(client, a_key, a_handle, **{param: "ghost@acme"}) == {"items": [], "next_cursor": None}


# --------------------------------------------------------------------------- since


def test_since_is_inclusive_at_a_messages_exact_created_at(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "one")["task_id"]
    append(client, a_key, task_id, "two")
    append(client, a_key, task_id, "three")
    items = feed(client, b_key, b_handle)["items"]
    middle = items[1]
    assert middle["body"] == "two"
    assert bodies(client, b_key, b_handle, since=middle["created_at"]) == ["three", "two"]
    assert bodies(client, b_key, b_handle, since=items[0]["created_at"]) == ["three"]


def test_since_with_an_offset_means_the_same_instant(client, app, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "early")["task_id"]
    append(client, a_key, task_id, "late")
    sql(
        app, "UPDATE messages SET created_at = CAST(:t AS timestamptz) WHERE body = 'early'", t="2026-07-21 15:59:59+00"
    )
    sql(app, "UPDATE messages SET created_at = CAST(:t AS timestamptz) WHERE body = 'late'", t="2026-07-21 16:00:00+00")
    assert bodies(client, b_key, b_handle, since="2026-07-21T18:00:00+02:00") == ["late"]
    assert bodies(client, b_key, b_handle, since="2026-07-21T16:00:00Z") == ["late"]
    assert bodies(client, b_key, b_handle, since="2026-07-21T15:59:59Z") == ["late", "early"]


# --------------------------------------------------------------------------- who may read


def test_missing_key_is_401(client, alice):
    a_handle, _ = alice
    resp = feed_resp(client, None, a_handle)
    assert_error(resp, 401, "unauthenticated")
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")


def test_401_comes_before_parameter_validation(client, alice):
    a_handle, _ = alice
    assert_error(feed_resp(client, None, a_handle, {"limit": "0"}), 401, "unauthenticated")


def test_teammates_feed_is_403(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, b_key, "alice@acme", "private to bob and alice")
    error = assert_error(feed_resp(client, a_key, b_handle), 403, "forbidden")
    assert "private to bob" not in str(error)


def test_other_org_agent_sharing_no_thread_is_404(client, alice, make_agent):
    _a, a_key = alice
    make_agent("dave@other")
    assert_error(feed_resp(client, a_key, "dave@other"), 404, "identity_not_found")


def test_other_org_agent_sharing_a_thread_is_403_not_404(client, alice, make_agent):
    a_handle, a_key = alice
    c_handle, c_key = make_agent("carol@other")
    create(client, a_key, c_handle, "cross-org work")
    assert_error(feed_resp(client, a_key, c_handle), 403, "forbidden")
    # ...and the other way round: the recipient can see the sender exists.
    assert_error(feed_resp(client, c_key, a_handle), 403, "forbidden")


def test_unknown_handle_is_404(client, alice):
    _a, a_key = alice
    assert_error(feed_resp(client, a_key, "ghost@acme"), 404, "identity_not_found")


def test_malformed_handle_in_path_is_422(client, alice):
    _a, a_key = alice
    error = assert_error(feed_resp(client, a_key, "not-a-handle"), 422, "invalid_params")
    assert "handle" in error["details"]


def test_own_handle_in_upper_case_reads_own_feed(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "hello bob")
    assert bodies(client, b_key, "BOB@acme") == ["hello bob"]


# --------------------------------------------------------------------------- C7: keyset paging


def _tied_messages(app, client, a_key, b_handle, n=25):
    task_id = create(client, a_key, b_handle, "tied 0")["task_id"]
    for i in range(1, n):
        append(client, a_key, task_id, f"tied {i}")
    sql(app, "UPDATE messages SET created_at = CAST(:t AS timestamptz)", t=TIE)
    order = sql(app, "SELECT id::text FROM messages ORDER BY created_at DESC, id DESC")
    return [r[0] for r in order]


def test_c7_messages_sharing_created_at_page_without_loss_or_duplicates(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    expected = _tied_messages(app, client, a_key, b_handle)
    pages = walk(client, b_key, b_handle, limit=10)
    assert [len(items) for items, _ in pages] == [10, 10, 5]
    assert [cursor is None for _, cursor in pages] == [False, False, True]
    ids = [row["id"] for items, _ in pages for row in items]
    assert len(set(ids)) == 25
    assert ids == expected
    assert {row["created_at"] for items, _ in pages for row in items} == {"2026-03-04T05:06:07.123456Z"}


def test_c7_walk_over_both_directions_keeps_order(app, client, alice, bob):
    """direction=both merges two index scans; the merged walk still has every id once, in order."""
    a_handle, a_key = alice
    b_handle, b_key = bob
    t1 = create(client, a_key, b_handle, "out 0")["task_id"]
    t2 = create(client, b_key, a_handle, "in 0")["task_id"]
    for i in range(1, 12):
        append(client, a_key, t1, f"out {i}")
        append(client, b_key, t2, f"in {i}")
    sql(app, "UPDATE messages SET created_at = CAST(:t AS timestamptz)", t=TIE)
    expected = [r[0] for r in sql(app, "SELECT id::text FROM messages ORDER BY created_at DESC, id DESC")]
    pages = walk(client, a_key, a_handle, limit=10)
    assert [len(items) for items, _ in pages] == [10, 10, 4]
    assert [row["id"] for items, _ in pages for row in items] == expected


def test_c7_row_deleted_under_the_cursor_does_not_end_the_walk(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    expected = _tied_messages(app, client, a_key, b_handle)
    first = feed(client, b_key, b_handle, limit=10)
    assert [r["id"] for r in first["items"]] == expected[:10]
    # The cursor names the last row of page 1; delete that very row, and one more from page 1.
    sql(app, "DELETE FROM messages WHERE id = ANY(CAST(:ids AS uuid[]))", ids=[expected[9], expected[3]])
    seen = [r["id"] for r in first["items"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = feed(client, b_key, b_handle, limit=10, cursor=cursor)
        seen.extend(r["id"] for r in page["items"])
        cursor = page["next_cursor"]
    assert seen == expected


def test_c7_row_deleted_ahead_of_the_cursor_is_skipped_not_fatal(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    expected = _tied_messages(app, client, a_key, b_handle)
    first = feed(client, b_key, b_handle, limit=10)
    sql(app, "DELETE FROM messages WHERE id = CAST(:id AS uuid)", id=expected[10])
    second = feed(client, b_key, b_handle, limit=10, cursor=first["next_cursor"])
    assert [r["id"] for r in second["items"]] == expected[11:21]
    third = feed(client, b_key, b_handle, limit=10, cursor=second["next_cursor"])
    assert [r["id"] for r in third["items"]] == expected[21:] and third["next_cursor"] is None


def test_cursor_from_one_filter_applied_with_the_same_filter_walks_it(app, client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    t1 = create(client, a_key, b_handle, "t1 0")["task_id"]
    t2 = create(client, a_key, b_handle, "t2 0")["task_id"]
    for i in range(1, 6):
        append(client, a_key, t1, f"t1 {i}")
        append(client, a_key, t2, f"t2 {i}")
    pages = walk(client, b_key, b_handle, limit=4, task_id=t1)
    assert [r["body"] for items, _ in pages for r in items] == [f"t1 {i}" for i in range(5, -1, -1)]


# --------------------------------------------------------------------------- byte budget

BUDGET = 512 * 1024


def test_large_messages_split_pages_at_the_byte_budget(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    # Each row carries the text twice (body and parts): about 200 KB of JSON per row.
    task_id = create(client, a_key, b_handle, "0" * 100_000)["task_id"]
    for i in range(1, 5):
        append(client, a_key, task_id, str(i) * 100_000)
    pages = walk(client, b_key, b_handle)
    assert [len(items) for items, _ in pages] == [2, 2, 1]
    assert [cursor is None for _, cursor in pages] == [False, False, True]
    assert [r["body"][0] for items, _ in pages for r in items] == ["4", "3", "2", "1", "0"]
    assert all(len(r["body"]) == 100_000 for items, _ in pages for r in items)


def test_message_bigger_than_the_budget_comes_back_alone(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    big_parts = [{"type": "text", "text": "b" * 200_000}, {"type": "text", "text": "c" * 200_000}]
    task_id = create(client, a_key, b_handle, "small before")["task_id"]
    big = rpc(client, a_key, "message/send", {"task_id": task_id, "message": {"parts": big_parts}})
    append(client, a_key, task_id, "small after")
    pages = walk(client, b_key, b_handle)
    assert [[r["body"][:12] for r in items] for items, _ in pages] == [["small after"], ["b" * 12], ["small before"]]
    assert [cursor is None for _, cursor in pages] == [False, False, True]
    huge = pages[1][0][0]
    assert huge["id"] == big["message_id"] and huge["parts"] == big_parts
    assert len(huge["body"]) == 400_002


def test_text_that_json_escapes_counts_at_its_escaped_size(client, alice, bob):
    """A page is measured as sent: a control character is six bytes of JSON (\\u0001), not one."""
    _a, a_key = alice
    b_handle, b_key = bob
    # About 240 KB of JSON a row (body and parts) from 20,000 characters: two rows fit the
    # budget, three do not, though their characters would.
    task_id = create(client, a_key, b_handle, "\x01" * 20_000)["task_id"]
    for _ in range(2):
        append(client, a_key, task_id, "\x01" * 20_000)
    pages = walk(client, b_key, b_handle)
    assert [len(items) for items, _ in pages] == [2, 1]
    assert all(r["body"] == "\x01" * 20_000 for items, _ in pages for r in items)


def test_budget_page_respects_limit_too(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "0" * 100_000)["task_id"]
    for i in range(1, 3):
        append(client, a_key, task_id, str(i) * 100_000)
    pages = walk(client, b_key, b_handle, limit=1)
    assert [len(items) for items, _ in pages] == [1, 1, 1]


# --------------------------------------------------------------------------- the catch-up loop


def _catch_up(client, key, handle, saved, seen):
    """One catch-up pass: page since saved, follow next_cursor, dedupe on id.

    The loop of docs/api.md, "Catching up after downtime".
    """
    cursor, newest = None, saved
    for _ in range(1000):
        query = {"since": saved, "direction": "inbound", "limit": 7}
        if cursor is not None:
            query["cursor"] = cursor
        body = feed(client, key, handle, **query)
        for row in body["items"]:
            seen.setdefault(row["id"], row)
            newest = max(newest, row["created_at"])
        cursor = body["next_cursor"]
        if cursor is None:
            return newest
    raise AssertionError("catch-up never reached next_cursor null")


def test_catch_up_loop_sees_every_message_written_while_it_runs(app, client, alice, bob, make_agent):
    """The feed's recovery loop misses nothing even while concurrent writers commit.

    It can only hold if a message never commits with a created_at older than a message
    already visible to the same identity (created_at order must follow commit order).
    """
    a_handle, a_key = alice
    _b, b_key = bob
    _c, c_key = make_agent("carol@acme")
    # The saved timestamp: the server's clock now, in the feed's own format.
    [(saved,)] = sql(app, "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
    openings = [create(client, key, a_handle, f"thread of {who}") for who, key in (("bob", b_key), ("carol", c_key))]
    threads = [o["task_id"] for o in openings]
    keys = (b_key, c_key)
    written: list[str] = []
    lock = threading.Lock()

    def write(n):
        c = app.test_client()
        if n % 3 == 0:  # a new thread each third message, appends to two busy threads otherwise
            result = create(c, keys[n % 2], a_handle, f"new {n}")
        else:
            result = append(c, keys[n % 2], threads[n % 2], f"append {n}")
        with lock:
            written.append(result["message_id"])

    done = threading.Event()

    def writer():
        try:
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(write, range(50)))
        finally:
            done.set()

    seen: dict[str, dict] = {}
    runner = threading.Thread(target=writer)
    runner.start()
    passes = 0
    while not done.is_set():
        saved = _catch_up(client, a_key, a_handle, saved, seen)
        passes += 1
    runner.join(timeout=60)
    saved = _catch_up(client, a_key, a_handle, saved, seen)
    assert len(written) == 50
    missing = set(written) - set(seen)
    assert not missing, f"{len(missing)} of 50 messages never seen after {passes} passes"
    # Every id once (seen is keyed on id), nothing extra: the 50 plus the two openings.
    assert set(seen) == set(written) | {o["message_id"] for o in openings}
    assert len(seen) == 52
