"""Full-text search over messages: one definition of a message's search document.

docs/api.md, "Search": a message's tsvector covers its own body (weight A) and its
artifacts' text (weight B) — never the thread summary. The worker writes it after
commit; until then queries fall back to computing it on the fly for unindexed rows,
so search never lags a write. Queries use ``websearch_to_tsquery``, so any user text
is a valid query.

What agents write is full of paths, URLs, dotted names and identifiers, which
PostgreSQL's parser keeps whole: ``src/api/users.py``, ``/users``, ``foo.bar``,
``example.com/docs/pagination`` are one token each, and ``getUserById`` one word. The
body is therefore indexed three ways, all weight A (``document_vector``):

1. as written (``to_tsvector(body)``): every whole token, so a query of the whole path,
   URL, host or identifier still matches (the query side is the same parser), and every
   phrase that matched before still does;
2. its compound words (a run of non-space with one of ``- / \\ . _ :`` before another
   character, or a camelCase boundary) split into their parts: the separators become
   spaces and the boundaries get one (``getUser`` -> ``get User``, ``JSONBody`` ->
   ``JSON Body``), so ``users``, ``api``, ``pagination``, ``example``, ``user`` find them.
   A compound's parts stay in order, so a phrase of them (``"api users"``) and
   ``-negation`` or ``or`` of a part work. The compounds are indexed one after another,
   apart from the prose: a phrase of a part and the word beside it in the body
   (``"users support"``) does not match, and one of a compound's last part and the next
   compound's first part does (falsely);
3. the compounds' file names (the last segment after a ``/`` or ``\\``, if it holds a
   dot: ``users.py``, ``app.log``): the parser's whole token for them, as a query for a
   file's name produces it.

Only the compounds are parsed a second time (splitting the whole body would parse it
twice, for the same lexemes). ``snake_case`` needs no rule of its own: the parser already
splits at ``_`` on both sides (``user_id`` is ``'user' <-> 'id'`` as a query and as a
document); inside a path or dotted name the split compound supplies the same adjacent
parts. Artifact fields that hold paths are split in ``_ARTIFACT_TEXT`` (weight B).

The document is bounded as a whole. PostgreSQL refuses a tsvector whose lexemes and
positions pass 1 MB (1,048,575 bytes, SQLSTATE 54000), and a body and an artifact that
each fit can pass it together. So the text fed to the first ``to_tsvector`` is at most
``MAX_DOCUMENT_CHARS`` (120,000) characters in all: the body first, then the artifacts'
text in what is left; and the split compounds and file names (2 and 3) are taken from the
body's first ``SPLIT_CHARS`` (10,000) characters only. A character costs the as-written
vector at most 8 bytes (at most 4 bytes of UTF-8, in at most two tokens: a hyphenated word
and its part, a URL and its host or path). A character of the first 10,000 is in at most
one split compound, where it is in at most one token (nothing that joins tokens is left),
so at most 4 bytes more; and in at most one file name, which is ASCII (the pattern takes
nothing else), at most 2 bytes in two tokens, 4 with their overhead. So any document is at
most 8 x 120,000 + (4 + 4) x 10,000 = 1,040,000 bytes. Measured worst cases
(tests/test_search_limits.py builds both): hyphenated words of unique 4-byte letters
~919,000 as written, ~930,000 with the split parts' positions; the same words with every
part of the first 10,000 characters led by a camelCase boundary (``aB`` and eight letters,
a new lexeme once split) ~949,000; unique ASCII tokens 1.5-3 bytes a character.

Left out of the index: the body past 120,000 characters and, once the body is that
long, all of the artifacts; a shorter body leaves the artifacts the remainder; the parts
and file names of the compounds past the body's first 10,000 characters (their whole
tokens are still there). A message is still stored and delivered whole; only search cannot
find it by text past the bound. Positions past 16,383 are all 16,383 (PostgreSQL's limit),
so in a body of more than ~16,000 words a phrase of parts no longer matches; single words
still do.

Cost: the indexer's statement takes about half again as much PostgreSQL CPU per message
(measured on 20,000 messages of ~720 characters, 8% of their words compounds: ~150 ->
~235 us, of which the extra parse and split ~60 us, the rest the larger vector, 921 bytes
and 54 lexemes against 716 and 41, and its index entries; splitting the whole body instead
cost ~290 us).

``messages.search_version`` records which definition wrote a row's vector
(``relay.models.SEARCH_VERSION``; NULL beside a vector is version 1, before the parts were
indexed). The beat sweep rewrites older vectors through the same indexing path, newest
first, ``REINDEX_BATCH`` rows a transaction and at most ``REINDEX_PER_SWEEP`` a tick
(``reindex_outdated``); meanwhile an old vector still finds its row by every whole token.

A row whose vector fails anyway (a statement error that is not about the connection)
is marked: ``messages.index_error`` holds the SQLSTATE and first line, the cause is
logged, ``relay_messages_index_failed`` counts it, the sweep skips it and search's
fallback leaves it out (it is not found by text until ``index_error`` is cleared,
which makes the sweep retry it; a row that failed while being reindexed keeps its old
vector and is found by that). A batch the sweep cannot write in one statement is
redone row by row, each under a savepoint, so one row never holds up the others.
"""

from __future__ import annotations

import logging
import uuid

from flask import current_app
from sqlalchemy import String, Text, and_, cast, func, literal, literal_column, or_, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from relay.errors import describe, error_cause, is_connection_error
from relay.models import SEARCH_VERSION, Message
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
# How much of the body is also indexed by its parts and file names: see the docstring.
SPLIT_CHARS = 10_000
# The body's compound words, split into parts below: a run of non-space holding a separator
# followed by another character (/users, foo.bar, user_id), or a camelCase boundary (lower
# or digit then upper; an acronym's last capital before two lowercase letters: JSONBody, not
# APIs). (No ':' before a word character in these patterns: the batch statement goes
# through text(), which would read a bind parameter.)
_COMPOUND = literal_column(r"'\S*(?:[-/\\._:]\S|[a-z0-9][A-Z]|[A-Z][A-Z][a-z][a-z])\S*'")
_CAMEL = literal_column(r"'([a-z0-9])([A-Z])'")
_ACRONYM = literal_column(r"'([A-Z])([A-Z][a-z][a-z])'")
_SPACED = literal_column(r"'\1 \2'")
# replace() is several times cheaper than a regex here. A backslash needs none: the parser never
# keeps one inside a token.
_SEPARATORS = ("-", "/", ".", "_", ":")
# A compound's file name: its last segment after a / or \, if that holds a dot (ASCII only).
_FILE_NAME = literal_column(r"'[/\\]([A-Za-z0-9_~+-]*\.[A-Za-z0-9_.~+-]*)[^/\\]*$'")
_GLOBAL = literal_column("'g'")
_SPACE = literal_column("' '")

# Rows whose vector an older definition wrote; the same conditions as the predicate of
# ix_messages_stale_vector, so the sweep reads that index (relay.models).
_OUTDATED = (
    Message.search_vector.is_not(None),
    Message.index_error.is_(None),
    func.coalesce(Message.search_version, 1) < SEARCH_VERSION,
)
#: Rows reindexed per transaction, and per beat tick, by the sweep of outdated vectors.
REINDEX_BATCH = 500
REINDEX_PER_SWEEP = 2000


def _config() -> ColumnElement:
    return cast(literal(current_app.config["RELAY"].search_config), REGCONFIG)


def _parts(words: ColumnElement) -> ColumnElement:
    """SQL: ``words`` with camelCase boundaries spaced and every separator a space."""
    text_ = func.regexp_replace(func.regexp_replace(words, _CAMEL, _SPACED, _GLOBAL), _ACRONYM, _SPACED, _GLOBAL)
    for separator in _SEPARATORS:
        text_ = func.replace(text_, literal_column("'" + separator + "'"), _SPACE)
    return text_


def _split_vector(cfg: ColumnElement) -> ColumnElement:
    """SQL: the tsvector of the compound words of the body's first ``SPLIT_CHARS``, split
    into parts, then of their file names (weight A; empty when there are none).

    One pass of one regex over the body finds the compounds; only they are split and parsed
    again, so a message costs the parser its body once plus its compounds, not twice.
    """
    word = func.regexp_matches(
        func.left(Message.body, SPLIT_CHARS), _COMPOUND, _GLOBAL, type_=postgresql.ARRAY(Text)
    ).column_valued("m")[1]
    names = func.coalesce(func.string_agg(func.substring(word, _FILE_NAME), _SPACE), literal_column("''"))
    text_ = _parts(func.string_agg(word, _SPACE)).op("||")(_SPACE).op("||")(names)
    vector = select(func.setweight(func.to_tsvector(cfg, text_), literal("A", String))).scalar_subquery()
    return func.coalesce(vector, cast(literal_column("''"), postgresql.TSVECTOR))


def document_vector() -> ColumnElement:
    """SQL expression: the weighted tsvector of a ``messages`` row, of at most ``MAX_DOCUMENT_CHARS`` of text.

    The one definition, used by the indexer and by the fallback for unindexed rows: the
    body as written, the parts and file names of the compound words of its first
    ``SPLIT_CHARS`` (both weight A), then the artifacts' text (weight B). See the module
    docstring.
    """
    cfg = _config()
    cap = MAX_DOCUMENT_CHARS  # read at call time (SPLIT_CHARS too)
    body = func.left(Message.body, cap)
    artifacts = func.left(_ARTIFACT_TEXT, cap - func.least(func.char_length(Message.body), cap))
    return (
        func.setweight(func.to_tsvector(cfg, body), literal("A", String))
        .op("||")(_split_vector(cfg))
        .op("||")(func.setweight(func.to_tsvector(cfg, artifacts), literal("B", String)))
    )


def query(q: str) -> ColumnElement:
    """SQL expression: ``websearch_to_tsquery`` of user text (never a syntax error), or of its parts.

    The query text's compounds are split as the document's are (:func:`_query_parts`), and the
    two queries are ORed: ``bazQux``, ``foo.bar`` or ``docs/pagination`` are one token as
    typed, which only a whole compound of the document holds, while the document also
    holds every part (``baz``, ``qux``). A negated compound still excludes what holds it
    (the typed query alone decides for a message without it).
    """
    cfg = _config()
    return func.websearch_to_tsquery(cfg, q).op("||")(func.websearch_to_tsquery(cfg, _query_parts(q)))


# A separator between two letters or digits: websearch syntax (a leading "-" negates,
# quotes, "or") is left as typed, which _parts' plain replace() would not do.
_INNER_SEPARATORS = literal_column(r"'([[:alnum:]])[-/\\._:]+(?=[[:alnum:]])'")
_FIRST = literal_column(r"'\1 '")


def _query_parts(q) -> ColumnElement:
    """SQL: query text with its compounds split as :func:`_parts` splits the document's."""
    text_ = func.regexp_replace(func.regexp_replace(q, _CAMEL, _SPACED, _GLOBAL), _ACRONYM, _SPACED, _GLOBAL)
    return func.regexp_replace(text_, _INNER_SEPARATORS, _FIRST, _GLOBAL)


def matches(q: str) -> ColumnElement:
    """Condition: the message matches ``q``, using the stored vector or, if unindexed (and not
    marked failed), a fresh one."""
    return or_(*match_branches(q))


def match_branches(q: str) -> tuple[ColumnElement, ColumnElement]:
    """The two halves of :func:`matches`: an indexed row's vector matches, or an unindexed row's fresh one.

    Queried apart (the feed unions them), the first is a plain ``@@`` the planner can
    serve from the feed's ordered index (a common word: stop after a page of rows) or
    from the GIN index (a rare word), and the second reads only the partial index of
    unindexed rows. As one OR, every plan had to take the bitmap of all matches and sort.
    """
    tsq = query(q)
    return (
        Message.search_vector.op("@@")(tsq),
        and_(Message.search_vector.is_(None), Message.index_error.is_(None), document_vector().op("@@")(tsq)),
    )


_BATCH_STATEMENTS: dict[tuple[str, int, int], object] = {}


def _batch_statement():
    """The batch indexer's UPDATE as SQL text, compiled once per (search config, bounds).

    Building and cache-keying the ORM statement cost more CPU than running it, once per
    batch of the webhook pump.
    """
    key = (current_app.config["RELAY"].search_config, MAX_DOCUMENT_CHARS, SPLIT_CHARS)
    stmt = _BATCH_STATEMENTS.get(key)
    if stmt is None:
        orm = (
            update(Message)
            .where(Message.id == literal_column("ANY(CAST(:ids AS uuid[]))"), Message.index_error.is_(None))
            .values(search_vector=document_vector(), search_version=SEARCH_VERSION, index_error=None)
        )
        sql = str(orm.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        stmt = _BATCH_STATEMENTS[key] = text(sql)
    return stmt


def _write_vectors(session: Session, *where) -> int:
    result = session.execute(
        update(Message)
        .where(*where)
        .values(search_vector=document_vector(), search_version=SEARCH_VERSION, index_error=None)
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
        facts = describe(exc)
        log.error(
            "message %s not indexed, marked failed: %s %s",
            message_id,
            facts["error_class"],
            code,
            extra={**facts, "message_id": str(message_id)},
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


def reindex_outdated(batch: int = REINDEX_BATCH) -> int:
    """Rewrite up to ``batch`` vectors an older definition wrote (``search_version`` below
    ``SEARCH_VERSION``), newest first, in one transaction; return how many were written.

    The same statement and failure handling as ``index_pending``: rows marked failed are
    skipped, and a row that fails now is marked and keeps its old vector. Rows another
    sweep holds are skipped (SKIP LOCKED), so two sweeps never redo each other's batch.
    """
    with unit_of_work() as session:
        ids = (
            session.execute(
                select(Message.id)
                .where(*_OUTDATED)
                .order_by(Message.created_at.desc())
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
    # The class and SQLSTATE only: the server's text may quote the row (a message's body).
    facts = describe(exc)
    log.warning(
        "index batch of %d failed (%s %s); indexing row by row",
        size,
        facts["error_class"],
        facts.get("pgcode"),
        extra=facts,
    )
