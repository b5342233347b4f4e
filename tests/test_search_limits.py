"""One oversized message must not break search or indexing for anyone (docs/api.md, "Search").

The message: ~800 KB of unique tokens (two 200k-character text parts and a 400k-character
diff artifact), accepted within RELAY_MAX_BODY_BYTES. Its body and its artifacts each
make a tsvector under PostgreSQL's 1 MB limit, but together they would not; the indexed
document is bounded as a whole (``relay.services.search.MAX_DOCUMENT_CHARS``) so it fits.
A row that fails anyway is marked, logged, counted in /metrics and skipped, and a
statement error is a 500 ``internal_error``, never a 503 blaming the database.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from flask import Flask
from sqlalchemy import func, select, text

from relay.extensions import db
from relay.models import Message
from relay.services import search as search_service
from tests.conftest import bearer, extra_app, rpc, send_message, sql

PART_CHARS = 200_000
DIFF_CHARS = 400_000
TSVECTOR_LIMIT = 1_048_575  # PostgreSQL's MAXSTRPOS: lexemes plus positions of one tsvector


def unique_tokens(start: int, chars: int) -> tuple[str, int]:
    """``chars`` characters of distinct tokens ``k<hex counter>`` from ``start``; return (text, next counter)."""
    tokens, size, i = [], 0, start
    while size < chars:
        token = f"k{i:06x}"
        tokens.append(token)
        size += len(token) + 1
        i += 1
    return " ".join(tokens)[:chars].rstrip(), i


def send_oversized(client, key, recipient) -> dict:
    first, n = unique_tokens(0, PART_CHARS)
    second, n = unique_tokens(n, PART_CHARS)
    diff, _ = unique_tokens(n, DIFF_CHARS)
    params = {
        "recipient": recipient,
        "message": {"parts": [{"type": "text", "text": first}, {"type": "text", "text": second}]},
        "artifacts": [{"type": "file_diff", "path": "src/huge.txt", "diff": diff}],
    }
    return rpc(client, key, "message/send", params)


def search_resp(client, key, handle, q):
    return client.get(f"/api/v1/identities/{handle}/a2a/messages", query_string={"q": q}, headers=bearer(key))


def index_state(app, message_id) -> tuple[bool, str | None]:
    [(indexed, error)] = sql(
        app,
        "SELECT search_vector IS NOT NULL, index_error FROM messages WHERE id = CAST(:id AS uuid)",
        id=message_id,
    )
    return indexed, error


def task(app, name):
    import workers.tasks  # noqa: F401  (registers the shared tasks on the app's Celery)

    return app.extensions["celery"].tasks[name]


@pytest.fixture
def oversized(client, alice, bob):
    a_handle, a_key = alice
    b_handle, b_key = bob
    sent = send_oversized(client, a_key, b_handle)
    return sent["message_id"], (a_handle, a_key), (b_handle, b_key)


# --------------------------------------------------------------------------- the bound


def test_the_oversized_message_is_accepted_within_the_default_body_limit(app, oversized):
    message_id, _a, _b = oversized
    [(chars,)] = sql(app, "SELECT char_length(body) FROM messages WHERE id = CAST(:id AS uuid)", id=message_id)
    assert chars > 2 * PART_CHARS - 10
    assert app.config["RELAY"].max_body_bytes == 1024 * 1024


def test_worst_case_document_fits_the_tsvector_limit(app):
    """The costliest text per character found: hyphenated words of unique 4-byte letters
    (each character twice in the vector, 4 bytes each); at the cap it still fits."""
    letters = [chr(c) for c in range(0x20000, 0x2A6E0)]  # CJK Extension B: 42,720 letters, 4 bytes each

    def part(n: int) -> str:  # ten letters, distinct for every n
        return "".join(letters[n // len(letters) ** d % len(letters)] for d in range(10))

    cap = search_service.MAX_DOCUMENT_CHARS
    words, size, n = [], 0, 0
    while size < cap:  # words of 40 parts: 1,639 bytes, under the parser's 2,047-byte word limit
        word = "-".join(part(n + j) for j in range(40))
        words.append(word)
        size += len(word) + 1
        n += 40
    doc = " ".join(words)
    with app.app_context():
        data = db.session.scalar(
            text(
                "SELECT pg_column_size(v) - 8 - 4 * length(v) FROM "
                "(SELECT to_tsvector('english', left(:doc, :cap)) AS v) s"
            ),
            {"doc": doc, "cap": cap},
        )
        db.session.rollback()
    assert 0.75 * TSVECTOR_LIMIT < data < TSVECTOR_LIMIT, data


def test_worst_case_split_document_fits_the_tsvector_limit(app, client, alice, bob):
    """The whole document (as written, split into parts, file names) of the costliest body found:
    the words above, each part of the first SPLIT_CHARS led by a camelCase boundary ("aB" and
    eight letters), so the split copy adds a new lexeme for nearly every character there."""
    letters = [chr(c) for c in range(0x20000, 0x2A6E0)]

    def part(n: int) -> str:
        return "".join(letters[n // len(letters) ** d % len(letters)] for d in range(10))

    def words(size: int, n: int, shape) -> tuple[str, int]:
        out, total = [], 0
        while total < size:
            word = "-".join(shape(part(n + j)) for j in range(40))
            out.append(word)
            total += len(word) + 1
            n += 40
        return " ".join(out)[:size], n

    cap, split = search_service.MAX_DOCUMENT_CHARS, search_service.SPLIT_CHARS
    head, n = words(split, 10**7, lambda p: "aB" + p[:8])
    tail, _ = words(cap - len(head), n, lambda p: p)
    body = head + tail
    message_id = send_message(client, alice[1], bob[0], "to be replaced")["message_id"]
    sql(app, "UPDATE messages SET body = :body WHERE id = CAST(:id AS uuid)", body=body, id=message_id)
    with app.app_context():
        vector = search_service.document_vector()
        data = db.session.scalar(
            select(func.pg_column_size(vector) - 8 - 4 * func.length(vector)).where(Message.id == uuid.UUID(message_id))
        )
        db.session.rollback()
        assert search_service.index_message(uuid.UUID(message_id)) is True
    assert 0.85 * TSVECTOR_LIMIT < data < TSVECTOR_LIMIT, data
    assert index_state(app, message_id) == (True, None)


# --------------------------------------------------------------------------- search stays up


def test_both_parties_search_answers_200_and_finds_it_by_a_first_part_token(client, oversized):
    message_id, (a_handle, a_key), (b_handle, b_key) = oversized
    for handle, key in ((a_handle, a_key), (b_handle, b_key)):
        for q in ("k000123", "anything else"):
            resp = search_resp(client, key, handle, q)
            assert resp.status_code == 200, (handle, q, resp.status_code, resp.get_data(as_text=True)[:300])
        resp = search_resp(client, key, handle, "k000123")
        assert [r["id"] for r in resp.get_json()["items"]] == [message_id], handle


def test_search_finds_it_once_indexed(app, client, oversized):
    message_id, (a_handle, a_key), _b = oversized
    with app.app_context():
        assert search_service.index_message(uuid.UUID(message_id)) is True
    assert index_state(app, message_id) == (True, None)
    resp = search_resp(client, a_key, a_handle, "k000123")
    assert resp.status_code == 200 and [r["id"] for r in resp.get_json()["items"]] == [message_id]


# --------------------------------------------------------------------------- the indexer


def test_the_worker_task_indexes_it_without_raising(app, oversized):
    message_id, _a, _b = oversized
    [(event_id,)] = sql(app, "SELECT id::text FROM events WHERE message_id = CAST(:id AS uuid)", id=message_id)
    task(app, "workers.tasks.message_committed")(message_id, event_id)
    indexed, error = index_state(app, message_id)
    assert indexed or error is not None
    assert (indexed, error) == (True, None)  # with the bound it fits: indexed, not failed


def test_the_sweep_indexes_ordinary_rows_beside_it(app, client, oversized):
    message_id, (a_handle, a_key), (b_handle, _b) = oversized
    ordinary = [send_message(client, a_key, b_handle, f"ordinary heron {i}")["message_id"] for i in range(3)]
    assert task(app, "workers.tasks.index_pending_messages")() == 4
    assert all(index_state(app, m) == (True, None) for m in [message_id, *ordinary])
    resp = search_resp(client, a_key, a_handle, "heron")
    assert resp.status_code == 200 and len(resp.get_json()["items"]) == 3


# --------------------------------------------------------------------------- a row that fails anyway


@pytest.fixture
def unbounded(monkeypatch):
    """Lift the bound so the oversized message's vector really fails (ProgramLimitExceeded)."""
    monkeypatch.setattr(search_service, "MAX_DOCUMENT_CHARS", 10_000_000)


def _metric(client, name) -> float:
    for line in client.get("/metrics").get_data(as_text=True).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_row_that_fails_is_marked_logged_counted_and_skipped(app, client, oversized, unbounded, caplog):
    message_id, (a_handle, a_key), (b_handle, b_key) = oversized
    ordinary = [send_message(client, a_key, b_handle, f"ordinary egret {i}")["message_id"] for i in range(3)]
    caplog.set_level(logging.WARNING, logger="relay.services.search")

    assert task(app, "workers.tasks.index_pending_messages")() == 3  # the ordinary rows, not blocked

    assert all(index_state(app, m) == (True, None) for m in ordinary)
    indexed, error = index_state(app, message_id)
    assert not indexed and error.startswith("54000: string is too long for tsvector"), error
    logged = [r for r in caplog.records if r.name == "relay.services.search" and message_id in r.getMessage()]
    # The log names the class and SQLSTATE; the server's text (which may quote the row) stays in the row.
    assert logged and "ProgramLimitExceeded 54000" in logged[0].getMessage(), logged
    assert _metric(client, "relay_messages_index_failed") == 1.0
    # Excluded from later sweeps; the worker's task does not raise on it either.
    with app.app_context():
        assert search_service.index_pending() == 0
        assert search_service.index_message(uuid.UUID(message_id)) is False
    # The unindexed fallback skips it: both parties' searches still answer.
    for handle, key in ((a_handle, a_key), (b_handle, b_key)):
        resp = search_resp(client, key, handle, "egret")
        assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
        assert len(resp.get_json()["items"]) == 3


def test_a_failing_single_row_index_does_not_raise(app, oversized, unbounded):
    message_id, _a, _b = oversized
    [(event_id,)] = sql(app, "SELECT id::text FROM events WHERE message_id = CAST(:id AS uuid)", id=message_id)
    task(app, "workers.tasks.message_committed")(message_id, event_id)
    indexed, error = index_state(app, message_id)
    assert not indexed and error.startswith("54000:"), error


# --------------------------------------------------------------------------- 500 vs 503


@pytest.fixture(scope="module")
def probe_app(base_env, celery_app, redis_url):
    """An app with test-only routes that run real failing statements."""
    with extra_app(base_env, celery_app, redis_url) as other:
        _add_probe_routes(other)
        yield other


def _add_probe_routes(other: Flask) -> None:
    huge, _ = unique_tokens(0, 1_200_000)

    def oversized_vector():
        db.session.execute(text("SELECT to_tsvector('simple', :doc)"), {"doc": huge})
        return "unreachable"

    def connection_killed():
        db.session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return "unreachable"

    other.add_url_rule("/_probe/oversized-vector", view_func=oversized_vector)
    other.add_url_rule("/_probe/connection-killed", view_func=connection_killed)


def test_a_statement_error_is_500_internal_error_with_the_request_id(probe_app, caplog):
    caplog.set_level(logging.ERROR)
    resp = probe_app.test_client().get("/_probe/oversized-vector", headers={"X-Request-Id": "probe-500"})
    assert resp.status_code == 500, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["code"] == "internal_error"
    assert "database" not in error["message"]
    assert error["details"] == {"request_id": "probe-500"}
    records = [r for r in caplog.records if getattr(r, "request_id", None) == "probe-500"]
    assert records, [r.getMessage() for r in caplog.records]
    assert getattr(records[0], "pgcode", None) == "54000"
    assert "ProgramLimitExceeded 54000" in records[0].getMessage()
    assert "k000001" not in records[0].getMessage()  # the class and SQLSTATE, never the statement's parameters
    # The session is usable again afterwards.
    assert probe_app.test_client().get("/healthz").status_code == 200


def test_a_lost_connection_is_still_503_service_unavailable(probe_app):
    resp = probe_app.test_client().get("/_probe/connection-killed", headers={"X-Request-Id": "probe-503"})
    assert resp.status_code == 503, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["code"] == "service_unavailable"
    assert error["details"] == {"request_id": "probe-503"}
    assert probe_app.test_client().get("/healthz").status_code == 200
