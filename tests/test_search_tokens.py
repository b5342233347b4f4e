"""Search finds what agents write: paths, URLs, dotted names and identifiers by their parts
as well as whole (relay.services.search).

PostgreSQL's parser keeps ``src/api/users.py``, ``/users``, a URL or ``foo.bar`` as one
token and ``getUserById`` as one word; the search document also indexes the body's
compound words split into parts, and their file names. Every rule is checked on a stored vector
and on an unindexed row (the fallback computes the same document), and the queries keep
``websearch_to_tsquery``'s syntax. Rows an older definition indexed are reindexed by the
beat sweep in batches.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from sqlalchemy import select

from relay.extensions import db
from relay.models import SEARCH_VERSION, Message
from relay.services import search as search_service
from tests.conftest import sql
from tests.test_search import create, hit_ids

BODIES = {
    "path": "Does GET /users support filtering by team? See src/api/users.py for the handler.",
    "url": "The cursor format is documented at https://example.com/docs/pagination today.",
    "dotted": "Then call billing.invoices.finalize once the batch commits.",
    "snake": "Rename models/gizmo_account.py and the key orders.customer_ref afterwards.",
    "camel": "The worker calls fetchWidgetOwners and parseJSONBody on each reply.",
    "plain": "Does GET /orders support the same handler?",
    "windows": r"The log is at C:\Deploy\Logs\nightly_run.log on the runner.",
}


@pytest.fixture(params=["indexed", "unindexed"])
def messages(request, app, client, alice, bob):
    """One message per body, from alice to bob; ``indexed``: their vectors written by the
    indexer, ``unindexed``: left NULL, so search computes the document on the fly."""
    _a, a_key = alice
    b_handle, b_key = bob
    ids = {name: create(client, a_key, b_handle, body)["message_id"] for name, body in BODIES.items()}
    if request.param == "indexed":
        with app.app_context():
            assert search_service.index_pending() == len(ids)
        [(versions,)] = sql(app, "SELECT array_agg(DISTINCT search_version) FROM messages")
        assert versions == [SEARCH_VERSION]
    else:
        [(nulls,)] = sql(app, "SELECT count(*) FROM messages WHERE search_vector IS NULL")
        assert nulls == len(ids)  # no worker runs in these tests
    return lambda q: hit_ids(client, b_key, b_handle, q), ids


def _ids(ids, *names):
    """The ids of these messages, newest first (the feed's order; they were created in BODIES order)."""
    order = list(BODIES)
    return [ids[n] for n in sorted(names, key=order.index, reverse=True)]


# --------------------------------------------------------------------------- one rule each


@pytest.mark.parametrize("q", ["users", "api", "src", "users.py", "/users", "src/api/users.py"])
def test_a_path_in_the_body_is_found_by_a_segment_by_its_file_name_and_whole(messages, q):
    find, ids = messages
    assert find(q) == _ids(ids, "path"), q


@pytest.mark.parametrize("q", ["pagination", "docs", "example", "example.com", "example.com/docs/pagination"])
def test_a_url_in_the_body_is_found_by_its_host_a_host_label_and_a_path_word(messages, q):
    find, ids = messages
    assert find(q) == _ids(ids, "url"), q


@pytest.mark.parametrize("q", ["billing", "invoices", "finalize", "billing.invoices.finalize"])
def test_a_dotted_name_is_found_by_each_part_and_whole(messages, q):
    find, ids = messages
    assert find(q) == _ids(ids, "dotted"), q


@pytest.mark.parametrize(
    "q",
    # websearch_to_tsquery makes 'gizmo' <-> 'account' of gizmo_account (the parser splits at
    # '_' on both sides), so the parts must be adjacent in the document: inside a path or a
    # dotted name only the split copy has them so.
    ["gizmo_account", "gizmo", "account", "gizmo_account.py", "customer_ref", "customer", "orders.customer_ref"],
)
def test_snake_case_inside_a_path_or_dotted_name_is_found_by_its_parts_and_whole(messages, q):
    find, ids = messages
    assert find(q) == _ids(ids, "snake"), q


@pytest.mark.parametrize(
    "q", ["fetchWidgetOwners", "fetchwidgetowners", "widget", "owners", "fetch", "parseJSONBody", "json", "body"]
)
def test_camel_case_is_found_by_its_parts_and_whole(messages, q):
    find, ids = messages
    assert find(q) == _ids(ids, "camel"), q


@pytest.mark.parametrize("q", ["Deploy", "nightly_run", "nightly_run.log", "logs"])
def test_a_windows_path_is_found_by_its_segments_and_file_name(messages, q):
    find, ids = messages
    assert find(q) == _ids(ids, "windows"), q


@pytest.mark.parametrize(
    ("q", "name"),
    [
        # Part of a compound, itself a compound as typed: found through the query's own parts.
        ("WidgetOwners", "camel"),
        ("fetchWidget", "camel"),
        ("JSONBody", "camel"),
        ("invoices.finalize", "dotted"),
        ("billing.invoices", "dotted"),
        ("example.com/docs", "url"),
        ("docs/pagination", "url"),
        ("/docs/pagination", "url"),
        ("api/users.py", "path"),
    ],
)
def test_a_query_that_is_part_of_a_compound_finds_it(messages, q, name):
    find, ids = messages
    assert find(q) == _ids(ids, name), q


def test_a_negated_compound_still_excludes_what_holds_it(messages):
    find, ids = messages
    assert ids["dotted"] not in find("-billing.invoices.finalize"), "the negation let the message through"
    assert ids["plain"] in find("-billing.invoices.finalize")


# --------------------------------------------------------------------------- websearch syntax on parts


def test_a_phrase_of_a_compounds_parts_matches_in_their_order_and_only_so(messages):
    find, ids = messages
    assert find('"api users"') == _ids(ids, "path")
    assert find('"src api users py"') == _ids(ids, "path")
    assert find('"widget owners"') == _ids(ids, "camel")
    assert find('"json body"') == _ids(ids, "camel")
    assert find('"owners widget"') == []
    assert find('"users api"') == []
    assert find('"GET /users"') == _ids(ids, "path")  # a phrase of whole tokens, as before
    assert find('"/users support"') == _ids(ids, "path")


def test_negation_of_a_part_excludes_the_message(messages):
    find, ids = messages
    assert find("handler") == _ids(ids, "path", "plain")
    assert find("handler -users") == _ids(ids, "plain")
    assert find("handler -api") == _ids(ids, "plain")
    assert find('support -"api users"') == _ids(ids, "plain")


def test_or_of_parts_finds_either(messages):
    find, ids = messages
    assert find("users or widget") == _ids(ids, "path", "camel")
    assert find("pagination or invoices or gizmo") == _ids(ids, "url", "dotted", "snake")


# --------------------------------------------------------------------------- the fallback


QUERIES = [
    "users",
    "users.py",
    "api",
    "pagination",
    "example",
    "invoices",
    "gizmo_account",
    "customer",
    "widget",
    "json",
    "nightly_run.log",
    '"api users"',
    "handler -users",
    "users or widget",
    "/users",
    "example.com",
]


def test_the_fallback_for_unindexed_rows_finds_what_the_indexed_rows_do(app, client, alice, bob):
    _a, a_key = alice
    b_handle, b_key = bob
    for body in BODIES.values():
        create(client, a_key, b_handle, body)
    unindexed = {q: hit_ids(client, b_key, b_handle, q) for q in QUERIES}
    [(nulls,)] = sql(app, "SELECT count(*) FROM messages WHERE search_vector IS NULL")
    assert nulls == len(BODIES)
    with app.app_context():
        assert search_service.index_pending() == len(BODIES)
    indexed = {q: hit_ids(client, b_key, b_handle, q) for q in QUERIES}
    assert indexed == unindexed
    assert all(indexed.values()), {q: hits for q, hits in indexed.items() if not hits}
    # ... and the stored vector is exactly the document the fallback computes.
    with app.app_context():
        differ = db.session.scalar(
            select(db.func.count()).where(Message.search_vector != search_service.document_vector())
        )
        db.session.rollback()
    assert differ == 0


def test_the_pump_path_writes_the_same_vector_and_the_version(app, client, alice, bob):
    """index_messages (the webhook pump's batch statement) and index_message write the one definition."""
    _a, a_key = alice
    b_handle, b_key = bob
    ids = [create(client, a_key, b_handle, body)["message_id"] for body in BODIES.values()]
    with app.app_context():
        assert search_service.index_messages([uuid.UUID(i) for i in ids[:-1]]) == len(ids) - 1
        assert search_service.index_message(uuid.UUID(ids[-1])) is True
    [(versions, nulls)] = sql(
        app, "SELECT array_agg(DISTINCT search_version), count(*) FILTER (WHERE search_vector IS NULL) FROM messages"
    )
    assert (versions, nulls) == ([SEARCH_VERSION], 0)
    assert hit_ids(client, b_key, b_handle, "users") == [ids[0]]
    assert hit_ids(client, b_key, b_handle, "widget") == [ids[4]]


# --------------------------------------------------------------------------- reindexing old vectors

# What the definition before search_version 2 (migration 0007) wrote for a body without artifacts.
OLD_VECTOR = "setweight(to_tsvector('english', left(body, 120000)), 'A')"


def _age_vectors(app):
    """Make every message's vector what the old definition wrote, with no version (as after 0007)."""
    sql(app, f"UPDATE messages SET search_vector = {OLD_VECTOR}, search_version = NULL")


def _versions(app) -> list[tuple[str, int | None]]:
    return [(r[0], r[1]) for r in sql(app, "SELECT body, search_version FROM messages ORDER BY created_at DESC")]


@pytest.fixture
def aged(app, client, alice, bob):
    """Five path messages, newest last, whose vectors the old definition wrote."""
    _a, a_key = alice
    b_handle, b_key = bob
    ids = [create(client, a_key, b_handle, f"GET /users page {i} in src/api/users.py")["message_id"] for i in range(5)]
    _age_vectors(app)
    return ids, lambda q: hit_ids(client, b_key, b_handle, q)


def test_old_vectors_still_find_whole_tokens_until_reindexed(aged):
    ids, find = aged
    assert find("/users") == ids[::-1]  # the old vector has the whole path ...
    assert find("users") == []  # ... not its parts, and the fallback does not cover indexed rows


def test_the_sweep_reindexes_old_vectors_newest_first_in_batches(app, aged):
    ids, find = aged
    with app.app_context():
        assert search_service.reindex_outdated(batch=2) == 2
    assert [v for _b, v in _versions(app)] == [SEARCH_VERSION, SEARCH_VERSION, None, None, None]
    assert find("users") == ids[:2:-1]  # the two newest: ids[4], ids[3]
    with app.app_context():
        assert search_service.reindex_outdated(batch=2) == 2
        assert search_service.reindex_outdated(batch=2) == 1
        assert search_service.reindex_outdated(batch=2) == 0
    assert [v for _b, v in _versions(app)] == [SEARCH_VERSION] * 5
    assert find("users") == ids[::-1]
    assert find("/users") == ids[::-1]
    # Exactly what the indexer writes for a new message.
    with app.app_context():
        differ = db.session.scalar(
            select(db.func.count()).where(Message.search_vector != search_service.document_vector())
        )
        db.session.rollback()
    assert differ == 0


def test_the_sweep_leaves_unindexed_and_failed_rows_alone(app, client, alice, bob, aged):
    ids, _find = aged
    _a, a_key = alice
    b_handle, _b = bob
    pending = create(client, a_key, b_handle, "not indexed yet /users")["message_id"]
    sql(app, "UPDATE messages SET index_error = '54000: marked' WHERE id = CAST(:id AS uuid)", id=ids[0])
    with app.app_context():
        assert search_service.reindex_outdated(batch=100) == 4
        assert search_service.reindex_outdated(batch=100) == 0
    query = "SELECT id::text, search_version, search_vector IS NULL FROM messages"
    rows = {r[0]: (r[1], r[2]) for r in sql(app, query)}
    assert rows[pending] == (None, True)  # index_pending's, not the reindex's
    assert rows[ids[0]] == (None, False)  # marked failed: skipped, keeps its old vector
    assert all(rows[i] == (SEARCH_VERSION, False) for i in ids[1:])


def test_the_beat_task_reindexes_a_bounded_batch_per_tick(app, aged, monkeypatch, caplog):
    import workers.tasks  # noqa: F401  (registers the shared tasks on the app's Celery)

    ids, find = aged
    monkeypatch.setattr(search_service, "REINDEX_BATCH", 2)
    monkeypatch.setattr(search_service, "REINDEX_PER_SWEEP", 3)
    task = app.extensions["celery"].tasks["workers.tasks.index_pending_messages"]
    caplog.set_level(logging.INFO, logger="relay.beat")

    assert task() == 0  # nothing was unindexed; the reindex is logged, not returned
    assert [v for _b, v in _versions(app)] == [SEARCH_VERSION] * 3 + [None] * 2
    [line] = [r for r in caplog.records if r.name == "relay.beat"]
    assert line.reindexed == 3 and line.indexed == 0
    assert "3 outdated vectors reindexed" in line.getMessage()

    caplog.clear()
    task()
    assert [v for _b, v in _versions(app)] == [SEARCH_VERSION] * 5
    assert find("users") == ids[::-1]
    [line] = [r for r in caplog.records if r.name == "relay.beat"]
    assert line.reindexed == 2

    caplog.clear()
    task()  # done: quiet again
    assert [r for r in caplog.records if r.name == "relay.beat"] == []


def test_the_sweep_reads_the_partial_index_of_old_vectors(app, aged):
    """Its query implies ix_messages_stale_vector's predicate: once all rows are current the
    sweep reads an empty index, not the whole table, every tick."""
    with app.app_context():
        query = (
            select(Message.id)
            .where(*search_service._OUTDATED)
            .order_by(Message.created_at.desc())
            .limit(search_service.REINDEX_BATCH)
            .with_for_update(skip_locked=True)
        )
        compiled = query.compile(dialect=db.engine.dialect, compile_kwargs={"literal_binds": True})
        db.session.execute(db.text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(r[0] for r in db.session.execute(db.text(f"EXPLAIN {compiled}")))
        db.session.rollback()
    assert "ix_messages_stale_vector" in plan, plan
