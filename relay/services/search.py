"""Full-text search over messages: one definition of a message's search document.

DESIGN.md, "Search": a message's tsvector covers its own body (weight A) and its
artifacts' text (weight B) — never the thread summary. The worker writes it after
commit; until then queries fall back to computing it on the fly for unindexed rows,
so search never lags a write. Queries use ``websearch_to_tsquery``, so any user text
is a valid query.

The document is bounded as a whole. PostgreSQL refuses a tsvector whose lexemes and
positions pass 1 MB (1,048,575 bytes, SQLSTATE 54000), and a body and an artifact that
each fit can pass it together. So the text fed to ``to_tsvector`` is at most
``MAX_DOCUMENT_CHARS`` (120,000) characters in all: the body first, then the artifacts'
text in what is left. A character costs a vector at most 8 bytes (at most 4 bytes of
UTF-8, in at most two tokens: a hyphenated word and its part, a URL and its host or
path), so any document fits: at most 960,000 bytes (measured: hyphenated words of
unique 4-byte letters ~919,000, the worst found; unique ASCII tokens 1.5-3 bytes a
character, 180,000-360,000).

Left out of the index: the body past 120,000 characters and, once the body is that
long, all of the artifacts; a shorter body leaves the artifacts the remainder. A
message is still stored and delivered whole; only search cannot find it by text
past the bound.

A row whose vector fails anyway (a statement error that is not about the connection)
is marked: ``messages.index_error`` holds the SQLSTATE and first line, the cause is
logged, ``relay_messages_index_failed`` counts it, the sweep skips it and search's
fallback leaves it out (it is not found by text until ``index_error`` is cleared,
which makes the sweep retry it). A batch the sweep cannot write in one statement is
redone row by row, each under a savepoint, so one row never holds up the others.
"""

from __future__ import annotations

import logging
import uuid

from flask import current_app
from sqlalchemy import String, and_, cast, func, literal, literal_column, or_, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from relay.errors import error_cause, is_connection_error
from relay.models import Message
from relay.services import unit_of_work

log = logging.getLogger("relay.services.search")

# Text of every artifact field but its type tag: paths, commands, titles, urls, names, diffs.
# PostgreSQL's parser keeps "src/api/users.py" or a URL as one token, so path-like fields
# also go in split at '/' (-> "users.py") and at '/', '.', ':' (-> "users", "py"): a
# search for a file's name or a word of its path finds the message.
_ARTIFACT_TEXT = text(
    "coalesce((SELECT string_agg(CASE WHEN kv.key IN ('path', 'cwd', 'ref', 'url', 'command', 'name') "
    "THEN kv.value || ' ' || regexp_replace(kv.value, '[/\\\\]+', ' ', 'g') || ' ' "
    "|| regexp_replace(kv.value, '[/\\\\.:]+', ' ', 'g') ELSE kv.value END, ' ') FROM jsonb_array_elements("
    "CASE WHEN jsonb_typeof(messages.artifacts) = 'array' THEN messages.artifacts ELSE '[]'::jsonb END) AS a(elem), "
    "jsonb_each_text(CASE WHEN jsonb_typeof(a.elem) = 'object' THEN a.elem ELSE '{}'::jsonb END) AS kv "
    "WHERE kv.key <> 'type'), '')"
)
# The whole document's bound, in characters (body first, then artifacts): see the docstring.
MAX_DOCUMENT_CHARS = 120_000


def _config() -> ColumnElement:
    return cast(literal(current_app.config["RELAY"].search_config), REGCONFIG)


def document_vector() -> ColumnElement:
    """SQL expression: the weighted tsvector of a ``messages`` row, of at most ``MAX_DOCUMENT_CHARS`` of text.

    The one definition, used by the indexer and by the fallback for unindexed rows.
    """
    cfg = _config()
    cap = MAX_DOCUMENT_CHARS  # read at call time
    body = func.left(Message.body, cap)
    artifacts = func.left(_ARTIFACT_TEXT, cap - func.least(func.char_length(Message.body), cap))
    return func.setweight(func.to_tsvector(cfg, body), literal("A", String)).op("||")(
        func.setweight(func.to_tsvector(cfg, artifacts), literal("B", String))
    )


def query(q: str) -> ColumnElement:
    """SQL expression: ``websearch_to_tsquery`` of user text (never a syntax error)."""
    return func.websearch_to_tsquery(_config(), q)


def matches(q: str) -> ColumnElement:
    """Condition: the message matches ``q``, using the stored vector or, if unindexed (and not
    marked failed), a fresh one."""
    tsq = query(q)
    return or_(
        Message.search_vector.op("@@")(tsq),
        and_(Message.search_vector.is_(None), Message.index_error.is_(None), document_vector().op("@@")(tsq)),
    )


_BATCH_STATEMENTS: dict[tuple[str, int], object] = {}


def _batch_statement():
    """The batch indexer's UPDATE as SQL text, compiled once per (search config, bound).

    Building and cache-keying the ORM statement cost more CPU than running it, once per
    batch of the webhook pump.
    """
    key = (current_app.config["RELAY"].search_config, MAX_DOCUMENT_CHARS)
    stmt = _BATCH_STATEMENTS.get(key)
    if stmt is None:
        orm = (
            update(Message)
            .where(Message.id == literal_column("ANY(CAST(:ids AS uuid[]))"), Message.index_error.is_(None))
            .values(search_vector=document_vector(), index_error=None)
        )
        sql = str(orm.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        stmt = _BATCH_STATEMENTS[key] = text(sql)
    return stmt


def _write_vectors(session: Session, *where) -> int:
    result = session.execute(
        update(Message)
        .where(*where)
        .values(search_vector=document_vector(), index_error=None)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount or 0


def _index_row(session: Session, message_id: uuid.UUID) -> bool:
    """Index one row under a savepoint; mark it failed (and log why) if its statement fails."""
    try:
        with session.begin_nested():
            return bool(_write_vectors(session, Message.id == message_id))
    except DBAPIError as exc:
        if is_connection_error(exc):
            raise
        code, first_line = error_cause(exc)
        cause = f"{code or type(exc.orig).__name__}: {first_line}"
        session.execute(
            update(Message)
            .where(Message.id == message_id)
            .values(index_error=cause)
            .execution_options(synchronize_session=False)
        )
        log.error(
            "message %s not indexed, marked failed: %s",
            message_id,
            cause,
            extra={"message_id": str(message_id), "pgcode": code},
        )
        return False


def index_message(message_id: uuid.UUID) -> bool:
    """Write one message's ``search_vector``; return False if the message is gone or was marked failed.

    Only a connection-level error raises; a row that cannot be indexed is marked instead.
    """
    with unit_of_work() as session:
        return _index_row(session, message_id)


def index_pending(batch: int = 500) -> int:
    """Index up to ``batch`` messages still lacking a vector (a lost task, a broker outage); return how many.

    Rows marked failed are skipped. One statement for the batch; if it fails (and not for
    the connection), row by row, marking the rows that fail.
    """
    with unit_of_work() as session:
        ids = (
            session.execute(
                select(Message.id)
                .where(Message.search_vector.is_(None), Message.index_error.is_(None))
                .order_by(Message.created_at)
                .limit(batch)
                .with_for_update(skip_locked=True)
            )
            .scalars()
            .all()
        )
        return _index_batch(session, ids)


def index_messages(message_ids: list[uuid.UUID]) -> int:
    """Write the vectors of these just-committed messages in one statement; return how many.

    Rows marked failed are skipped. The batch runs without a savepoint (two round trips
    fewer); if it fails, and not for the connection, it is redone row by row (see index_pending).
    """
    ids = list(message_ids)
    if not ids:
        return 0
    try:
        with unit_of_work() as session:
            result = session.connection().execute(_batch_statement(), {"ids": [str(i) for i in ids]})
            return result.rowcount or 0
    except DBAPIError as exc:
        if is_connection_error(exc):
            raise
        _log_batch_failure(exc, len(ids))
    with unit_of_work() as session:
        return sum(_index_row(session, message_id) for message_id in ids)


def _index_batch(session: Session, ids: list[uuid.UUID]) -> int:
    if not ids:
        return 0
    try:
        with session.begin_nested():
            return _write_vectors(session, Message.id.in_(ids), Message.index_error.is_(None))
    except DBAPIError as exc:
        if is_connection_error(exc):
            raise
        _log_batch_failure(exc, len(ids))
    return sum(_index_row(session, message_id) for message_id in ids)


def _log_batch_failure(exc: DBAPIError, size: int) -> None:
    code, first_line = error_cause(exc)
    log.warning(
        "index batch of %d failed (%s: %s); indexing row by row", size, code, first_line, extra={"pgcode": code}
    )
