"""Full-text search over messages: one definition of a message's search document.

DESIGN.md, "Search": a message's tsvector covers its own body (weight A) and its
artifacts' text (weight B) — never the thread summary. The worker writes it after
commit; until then queries fall back to computing it on the fly for unindexed rows,
so search never lags a write. Queries use ``websearch_to_tsquery``, so any user text
is a valid query.
"""

from __future__ import annotations

import uuid

from flask import current_app
from sqlalchemy import String, and_, cast, func, literal, or_, select, text, update
from sqlalchemy.dialects.postgresql import REGCONFIG
from sqlalchemy.sql.elements import ColumnElement

from relay.models import Message
from relay.services import unit_of_work

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
# to_tsvector refuses documents over 1 MB of lexemes; bound the input instead of failing.
MAX_DOCUMENT_CHARS = 500_000


def _config() -> ColumnElement:
    return cast(literal(current_app.config["RELAY"].search_config), REGCONFIG)


def document_vector() -> ColumnElement:
    """SQL expression: the weighted tsvector of a ``messages`` row."""
    cfg = _config()
    return func.setweight(func.to_tsvector(cfg, func.left(Message.body, MAX_DOCUMENT_CHARS)), literal("A", String)).op(
        "||"
    )(func.setweight(func.to_tsvector(cfg, func.left(_ARTIFACT_TEXT, MAX_DOCUMENT_CHARS)), literal("B", String)))


def query(q: str) -> ColumnElement:
    """SQL expression: ``websearch_to_tsquery`` of user text (never a syntax error)."""
    return func.websearch_to_tsquery(_config(), q)


def matches(q: str) -> ColumnElement:
    """Condition: the message matches ``q``, using the stored vector or, if unindexed, a fresh one."""
    tsq = query(q)
    return or_(
        Message.search_vector.op("@@")(tsq),
        and_(Message.search_vector.is_(None), document_vector().op("@@")(tsq)),
    )


def index_message(message_id: uuid.UUID) -> bool:
    """Write one message's ``search_vector``; return False if the message is gone."""
    with unit_of_work() as session:
        result = session.execute(
            update(Message)
            .where(Message.id == message_id)
            .values(search_vector=document_vector())
            .execution_options(synchronize_session=False)
        )
    return bool(result.rowcount)


def index_pending(batch: int = 500) -> int:
    """Index up to ``batch`` messages still lacking a vector (a lost task, a broker outage)."""
    with unit_of_work() as session:
        ids = (
            select(Message.id)
            .where(Message.search_vector.is_(None))
            .order_by(Message.created_at)
            .limit(batch)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        result = session.execute(
            update(Message)
            .where(Message.id.in_(ids))
            .values(search_vector=document_vector())
            .execution_options(synchronize_session=False)
        )
    return result.rowcount or 0
