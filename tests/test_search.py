"""Full-text search over the feed (``q``) and the search-vector upkeep (docs/api.md, "Search").

The worker writes each message's ``search_vector`` after commit; until it has, the
query falls back to the row's own text, so search never lags a write. The vector
covers the message's own body and artifacts, never the thread summary.
"""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import event, select

from relay.extensions import db
from relay.models import Agent
from relay.services import feed as feed_service
from relay.services import search as search_service
from relay.services.statements import CUSTOM_PLAN, Statement
from tests.conftest import bearer, rpc, sql

WORKER_DEADLINE_S = 10.0


# --------------------------------------------------------------------------- helpers


def create(client, key, recipient, text_, **extra):
    return rpc(
        client,
        key,
        "message/send",
        {"recipient": recipient, "message": {"parts": [{"type": "text", "text": text_}]}, **extra},
    )


def append(client, key, task_id, text_, **extra):
    return rpc(
        client,
        key,
        "message/send",
        {"task_id": task_id, "message": {"parts": [{"type": "text", "text": text_}]}, **extra},
    )


def search_resp(client, key, handle, q, **query):
    return client.get(f"/api/v1/identities/{handle}/a2a/messages", query_string={"q": q, **query}, headers=bearer(key))


def search(client, key, handle, q, **query):
    resp = search_resp(client, key, handle, q, **query)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert isinstance(body["items"], list)
    return body


def hit_ids(client, key, handle, q, **query):
    return [r["id"] for r in search(client, key, handle, q, **query)["items"]]


def vector_is_null(app, message_id):
    [(is_null,)] = sql(app, "SELECT search_vector IS NULL FROM messages WHERE id = CAST(:id AS uuid)", id=message_id)
    return is_null


def wait_indexed(app, message_ids):
    """Poll the database until the worker has written every message's vector."""
    deadline = time.monotonic() + WORKER_DEADLINE_S
    while True:
        [(pending,)] = sql(
            app,
            "SELECT count(*) FROM messages WHERE id = ANY(CAST(:ids AS uuid[])) AND search_vector IS NULL",
            ids=list(message_ids),
        )
        if pending == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{pending} message(s) still unindexed after {WORKER_DEADLINE_S} s")
        time.sleep(0.05)


# --------------------------------------------------------------------------- the worker indexes


def test_worker_writes_the_search_vector_after_a_send(app, client, alice, bob, celery_worker):
    _a, a_key = alice
    b_handle, _b = bob
    sent = create(client, a_key, b_handle, "the zebrafish migration is ready")
    wait_indexed(app, [sent["message_id"]])
    [(matches,)] = sql(
        app,
        "SELECT search_vector @@ to_tsquery('english', 'zebrafish') FROM messages WHERE id = CAST(:id AS uuid)",
        id=sent["message_id"],
    )
    assert matches is True


def test_worker_indexes_appends_too(app, client, alice, bob, celery_worker):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "opening")["task_id"]
    reply = append(client, b_key, task_id, "a reply about capybaras")
    wait_indexed(app, [reply["message_id"]])
    [(matches,)] = sql(
        app,
        "SELECT search_vector @@ to_tsquery('english', 'capybara') FROM messages WHERE id = CAST(:id AS uuid)",
        id=reply["message_id"],
    )
    assert matches is True


def test_worker_indexed_message_is_found_by_body_and_artifact_words(app, client, alice, bob, celery_worker):
    _a, a_key = alice
    b_handle, b_key = bob
    sent = create(
        client,
        a_key,
        b_handle,
        "the tapir report",
        artifacts=[
            {"type": "file_diff", "path": "lib/okapi/index.ts", "diff": "+ const gecko = 1"},
            {"type": "test_command", "command": "npm test -- dingo"},
        ],
    )
    wait_indexed(app, [sent["message_id"]])
    for word in ("tapir", "okapi", "gecko", "dingo"):
        assert hit_ids(client, b_key, b_handle, word) == [sent["message_id"]], word


@pytest.fixture
def indexed(app, client, alice, bob):
    """Three messages with stored vectors: body words, an artifact path and a test command."""
    a_handle, a_key = alice
    b_handle, b_key = bob
    first = create(
        client,
        a_key,
        b_handle,
        "Please migrate the zebrafish tables",
        artifacts=[{"type": "file_ref", "path": "src/storage/quokka_loader.py"}],
    )
    reply = append(
        client,
        b_key,
        first["task_id"],
        "Done; run the checks below",
        artifacts=[{"type": "test_command", "command": "pytest -k wombat_suite tests/test_db.py"}],
    )
    other = create(client, b_key, a_handle, "Unrelated pelican question")
    ids = {"first": first["message_id"], "reply": reply["message_id"], "other": other["message_id"]}
    with app.app_context():
        assert search_service.index_pending() == 3
    return b_handle, b_key, ids


def test_search_finds_a_message_by_a_body_word(client, indexed):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, "zebrafish") == [ids["first"]]
    assert hit_ids(client, key, handle, "pelican") == [ids["other"]]


def test_search_stems_body_words(client, indexed):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, "migrating") == [ids["first"]]


def test_search_finds_a_message_by_an_artifact_path_word(client, indexed):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, "quokka") == [ids["first"]]


@pytest.mark.parametrize("q", ["src/storage/quokka_loader.py", "quokka_loader.py", "quokka_loader", "storage"])
def test_search_finds_a_message_by_any_form_of_an_artifact_path(client, indexed, q):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, q) == [ids["first"]]


def test_search_finds_a_message_by_a_test_command_word(client, indexed):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, "wombat") == [ids["reply"]]
    assert hit_ids(client, key, handle, "pytest") == [ids["reply"]]


def test_search_does_not_match_later_messages_by_a_word_of_the_opening_message(client, indexed):
    """The vector is the message's own text, not the thread summary."""
    handle, key, ids = indexed
    # "zebrafish" and "tables" occur only in the opening message (the thread's summary).
    assert hit_ids(client, key, handle, "zebrafish") == [ids["first"]]
    assert hit_ids(client, key, handle, "tables") == [ids["first"]]
    assert hit_ids(client, key, handle, "checks") == [ids["reply"]]


def test_search_combines_with_other_filters(client, indexed):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, "zebrafish", role="agent") == []
    assert hit_ids(client, key, handle, "wombat", role="agent") == [ids["reply"]]
    assert hit_ids(client, key, handle, "pelican", direction="inbound") == []
    assert hit_ids(client, key, handle, "pelican", direction="outbound") == [ids["other"]]


def test_search_with_websearch_syntax_or_and_negation(client, indexed):
    handle, key, ids = indexed
    assert hit_ids(client, key, handle, "zebrafish or pelican") == [ids["other"], ids["first"]]
    assert hit_ids(client, key, handle, "tables -zebrafish") == []
    assert hit_ids(client, key, handle, '"migrate the zebrafish"') == [ids["first"]]


# --------------------------------------------------------------------------- unindexed rows


def test_message_not_yet_indexed_is_still_found(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    sent = create(
        client,
        a_key,
        b_handle,
        "the narwhal deploy failed",
        artifacts=[{"type": "test_command", "command": "make axolotl-check"}],
    )
    assert vector_is_null(app, sent["message_id"]) is True  # no worker in this test
    assert hit_ids(client, b_key, b_handle, "narwhal") == [sent["message_id"]]
    assert hit_ids(client, b_key, b_handle, "axolotl") == [sent["message_id"]]
    assert vector_is_null(app, sent["message_id"]) is True  # searching does not write it


def test_unindexed_later_message_does_not_match_an_opening_word(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    first = create(client, a_key, b_handle, "about the narwhal")
    reply = append(client, b_key, first["task_id"], "done")
    assert vector_is_null(app, reply["message_id"]) is True
    assert hit_ids(client, b_key, b_handle, "narwhal") == [first["message_id"]]


def test_indexed_and_unindexed_rows_are_found_together_newest_first(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    first = create(client, a_key, b_handle, "flamingo one")
    second = append(client, a_key, first["task_id"], "flamingo two")
    with app.app_context():
        assert search_service.index_message(uuid.UUID(first["message_id"])) is True
    assert vector_is_null(app, first["message_id"]) is False
    assert vector_is_null(app, second["message_id"]) is True
    assert hit_ids(client, b_key, b_handle, "flamingo") == [second["message_id"], first["message_id"]]


def test_search_results_stay_newest_first_across_pages(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "pelican zero")["task_id"]
    sent = [append(client, a_key, task_id, f"filler {i}" if i % 2 else f"pelican {i}") for i in range(1, 8)]
    expected = [
        s["message_id"]
        for s in reversed(sent)
        if "pelican" in sql(app, "SELECT body FROM messages WHERE id = CAST(:id AS uuid)", id=s["message_id"])[0][0]
    ]
    expected.append(sql(app, "SELECT id::text FROM messages WHERE sequence_no = 1")[0][0])
    seen, cursor = [], None
    for _ in range(10):
        query = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        body = search(client, b_key, b_handle, "pelican", **query)
        seen.extend(r["id"] for r in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == expected
    assert len(seen) == 4


def test_stop_words_only_query_is_200_with_no_rows(client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "the and of it")
    assert search(client, b_key, b_handle, "the and") == {"items": [], "next_cursor": None}


# --------------------------------------------------------------------------- C8: any text is a valid query

C8_QUERIES = [
    "team:foo",
    "a & | !",
    '"unterminated',
    "don\u02bct",
    "Cannot read config file:",
    "\U0001f600\U0001f525\U0001f680\U0001f41b",
    "\u914d\u7f6e\u6587\u4ef6\u8bfb\u53d6\u5931\u8d25",
]
C8_IDS = ["team-colon", "operators", "unterminated-quote", "modifier-apostrophe", "trailing-colon", "emoji", "cjk"]


@pytest.mark.parametrize("q", C8_QUERIES, ids=C8_IDS)
def test_c8_query_answers_200_never_500(client, alice, bob, q):
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "an ordinary message")
    assert search(client, b_key, b_handle, q) == {"items": [], "next_cursor": None}


# (query, whether a message whose body is exactly that text must be found by it)
C8_FOUND = [
    ("team:foo", True),
    ("a & | !", False),
    ('"unterminated', True),
    ("don\u02bct", True),
    ("Cannot read config file:", True),
    ("\U0001f600\U0001f525\U0001f680\U0001f41b", False),
    ("\u914d\u7f6e\u6587\u4ef6\u8bfb\u53d6\u5931\u8d25", True),
]


@pytest.mark.parametrize("q, found", C8_FOUND, ids=C8_IDS)
def test_c8_text_written_into_a_body_is_found_by_itself_where_it_has_words(client, alice, bob, q, found):
    """Text with lexemes finds its own message; text without any (operators, emoji) finds nothing."""
    _a, a_key = alice
    b_handle, b_key = bob
    create(client, a_key, b_handle, "an ordinary message")
    sent = create(client, a_key, b_handle, q)
    assert hit_ids(client, b_key, b_handle, q) == ([sent["message_id"]] if found else [])


def test_c8_queries_against_worker_indexed_rows_answer_200(app, client, alice, bob, celery_worker):
    _a, a_key = alice
    b_handle, b_key = bob
    sent = {q: create(client, a_key, b_handle, q)["message_id"] for q in C8_QUERIES}
    wait_indexed(app, sent.values())
    for q, found in C8_FOUND:
        resp = search_resp(client, b_key, b_handle, q)
        assert resp.status_code == 200, (q, resp.get_data(as_text=True))
        ids = [r["id"] for r in resp.get_json()["items"]]
        assert (sent[q] in ids) is found, q


# --------------------------------------------------------------------------- the beat sweep


def test_index_pending_indexes_rows_left_null(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    task_id = create(client, a_key, b_handle, "heron one")["task_id"]
    append(client, a_key, task_id, "heron two", artifacts=[{"type": "link", "url": "https://example.com/ibis"}])
    [(nulls,)] = sql(app, "SELECT count(*) FROM messages WHERE search_vector IS NULL")
    assert nulls == 2
    with app.app_context():
        assert search_service.index_pending() == 2
        assert search_service.index_pending() == 0
    [(nulls,)] = sql(app, "SELECT count(*) FROM messages WHERE search_vector IS NULL")
    assert nulls == 0
    [(ibis,)] = sql(app, "SELECT count(*) FROM messages WHERE search_vector @@ to_tsquery('english', 'ibis')")
    assert ibis == 1
    assert len(hit_ids(client, b_key, b_handle, "heron")) == 2


def test_index_pending_messages_task_sweeps_in_batches_until_done(app, client, alice, bob):
    _a, a_key = alice
    b_handle, _b = bob
    create(client, a_key, b_handle, "egret")
    # More rows than one batch: copy the message 1200 times as further messages of its thread.
    sql(
        app,
        """
        INSERT INTO messages (id, thread_id, sequence_no, author_id, caller_id, target_id, role, body, parts,
                              artifacts, metadata, created_at)
        SELECT gen_random_uuid(), m.thread_id, m.sequence_no + g, m.author_id, m.caller_id, m.target_id, m.role,
               'egret ' || g, m.parts, m.artifacts, m.metadata, m.created_at
        FROM messages m, generate_series(1, 1200) g
    """,
    )
    import workers.tasks  # noqa: F401  (registers the shared tasks on the app's Celery)

    task = app.extensions["celery"].tasks["workers.tasks.index_pending_messages"]
    assert task() == 1201
    [(nulls,)] = sql(app, "SELECT count(*) FROM messages WHERE search_vector IS NULL")
    assert nulls == 0


# --------------------------------------------------------------------------- the plans use the feed indexes

BULK_N = 10_000  # per pair: big enough that the planner prefers index lookups to re-reading the table


def _seed_bulk(app, client, make_agent, n=BULK_N):
    """Two busy pairs of agents with ``n`` messages each, indexed, and ANALYZEd."""
    pairs = []
    for sender, recipient in (("alice@acme", "bob@acme"), ("carol@acme", "dave@acme")):
        _s, s_key = make_agent(sender)
        make_agent(recipient)
        pairs.append(create(client, s_key, recipient, f"{sender} opens")["task_id"])
    sql(
        app,
        """
        INSERT INTO messages (id, thread_id, sequence_no, author_id, caller_id, target_id, role, body, parts,
                              artifacts, metadata, created_at, search_vector)
        SELECT gen_random_uuid(), m.thread_id, m.sequence_no + g, m.author_id, m.caller_id, m.target_id, m.role,
               'bulk message ' || g || CASE WHEN g % 500 = 0 THEN ' kingfisher' ELSE '' END,
               m.parts, m.artifacts, m.metadata, m.created_at - g * interval '1 second',
               to_tsvector('english', 'bulk message ' || g || CASE WHEN g % 500 = 0 THEN ' kingfisher' ELSE '' END)
        FROM messages m, generate_series(1, :n) g
    """,
        n=n,
    )
    sql(app, "UPDATE messages SET search_vector = to_tsvector('english', body) WHERE search_vector IS NULL")
    sql(app, "ANALYZE messages")
    [(count,)] = sql(app, "SELECT count(*) FROM messages")
    assert count == 2 * (n + 1)


def _explain_feed(app, handle, **params):
    """Run the feed service and EXPLAIN (not ANALYZE) the statement it sent for the page."""
    captured: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if ("FROM messages" in statement and "ORDER BY" in statement) or "EXECUTE relay_" in statement:
            captured.append((statement, parameters))

    with app.app_context():
        engine = db.engine
        event.listen(engine, "before_cursor_execute", capture)
        try:
            caller = db.session.scalar(select(Agent).where(Agent.handle == handle))
            page = feed_service.list_messages(caller, **params)
        finally:
            event.remove(engine, "before_cursor_execute", capture)
        assert len(captured) == 1, [s for s, _ in captured]
        statement, parameters = captured[0]
        with engine.connect() as conn:
            if "EXECUTE relay_" in statement:
                # A prepared page: explain the plan it runs with, planned for the call when it
                # sets that (statements.CUSTOM_PLAN), else the generic plan it settles on.
                mode = "force_generic_plan"
                if statement.startswith(CUSTOM_PLAN + "; "):
                    statement, mode = statement[len(CUSTOM_PLAN) + 2 :], "force_custom_plan"
                name = statement.split()[1].split("(")[0]
                prepared = Statement.named[name]
                if name not in conn.connection.info.get("relay_prepared", ()):
                    conn.exec_driver_sql(prepared.prepare_sql.replace("%", "%%"))
                    conn.connection.info.setdefault("relay_prepared", set()).add(name)
                conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            conn.exec_driver_sql("RESET plan_cache_mode")
    return page, plan


def test_feed_first_page_plan_uses_both_feed_indexes(app, client, make_agent):
    _seed_bulk(app, client, make_agent)
    page, plan = _explain_feed(app, "bob@acme")
    assert len(page["items"]) == 50
    assert "ix_messages_target_feed" in plan, plan
    assert "ix_messages_caller_feed" in plan, plan
    assert "Seq Scan on messages" not in plan, plan


def test_inbound_feed_plan_uses_the_target_index(app, client, make_agent):
    _seed_bulk(app, client, make_agent)
    page, plan = _explain_feed(app, "bob@acme", direction="inbound")
    assert len(page["items"]) == 50
    assert "ix_messages_target_feed" in plan, plan
    assert "Seq Scan on messages" not in plan, plan


def test_search_plan_uses_an_index_on_messages(app, client, make_agent):
    _seed_bulk(app, client, make_agent)
    page, plan = _explain_feed(app, "bob@acme", q="kingfisher")
    assert [r["body"] for r in page["items"]] == [f"bulk message {g} kingfisher" for g in range(500, BULK_N + 1, 500)]
    # A rare word: the GIN index narrows the busy side's indexed rows (a common word may
    # walk the feed index instead: the indexed and unindexed rows are queried apart).
    assert "ix_messages_search" in plan, plan
    assert "Seq Scan on messages" not in plan, plan
