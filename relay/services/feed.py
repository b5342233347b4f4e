"""The messages feed (docs/api.md, "The messages feed"): every message an identity can see, newest first.

Keyset paging on (created_at, id) so rows sharing a timestamp are neither skipped nor
repeated; a page stops early at the byte budget but always holds one row, and
``next_cursor`` is null only on the last page (docs/api.md, "Catching up after downtime").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from flask import current_app
from sqlalchemy import (
    String,
    Text,
    and_,
    bindparam,
    cast,
    literal,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import aliased

from relay.encoding import json_size, loads, raw_json
from relay.errors import RelayError
from relay.extensions import db
from relay.ids import encode_cursor, ulid_of_uuid_text
from relay.models import Agent, Message, Thread, effective_state_sql
from relay.services import iso_text, own_transaction, search, unit_of_work
from relay.services.agents import get_agent, normalize_handle
from relay.services.statements import Shapes


def resolve_identity(caller: Agent, handle: str) -> Agent:
    """Return the identity ``handle`` names for ``caller`` (401/403/404: docs/api.md, "The messages feed").

    Visible identities are the caller's own org plus any agent that shares a thread
    with the caller; anything else is identity_not_found (404) so existence does not
    leak. A visible identity other than the caller's own is forbidden (403): a key
    reads only its own identity.
    """
    normal = normalize_handle(handle, "handle")
    if normal == caller.handle:  # the common case: no query
        return caller
    target = get_agent(normal)
    if target is None:
        raise RelayError("identity_not_found", f"no identity {handle!r} is visible to you")
    if target.id == caller.id:
        return target
    visible = target.org == caller.org or db.session.scalar(
        select(literal(True))
        .where(
            or_(
                and_(Thread.sender_id == caller.id, Thread.recipient_id == target.id),
                and_(Thread.sender_id == target.id, Thread.recipient_id == caller.id),
            )
        )
        .limit(1)
    )
    if not visible:
        raise RelayError("identity_not_found", f"no identity {handle!r} is visible to you")
    raise RelayError("forbidden", f"this API key belongs to {caller.handle} and may not read {target.handle}")


def _handle_id(handle: str | None, field: str) -> uuid.UUID | None:
    if handle is None:
        return None
    agent = get_agent(normalize_handle(handle, field))
    # An unknown handle matches nothing rather than failing: the filter is simply empty.
    return agent.id if agent is not None else uuid.UUID(int=0)


_ROW_SELECT = None


def _row_select(*where):
    """Columns of a feed row (plain rows, no ORM objects: a page is 50 rows x 5 entities)."""
    global _ROW_SELECT
    if _ROW_SELECT is None:  # built once: constructing it cost more than running it
        _ROW_SELECT = _build_row_select(Message.__table__)
    return _ROW_SELECT.where(*where)


# The messages columns a feed row is built from: a page's branches carry these, so the
# page is picked from them before anything is joined (see _page_statement).
_MESSAGE_COLUMNS = (
    "id", "sequence_no", "role", "body", "parts", "artifacts", "metadata", "created_at", "thread_id", "author_id",
    "caller_id", "target_id", "read_at",
)  # fmt: skip


def _agent_of(column):
    """The handle, name and role of the agent ``column`` names, looked up row by row.

    A LATERAL subquery with LIMIT 1 is not flattened into a join: each page row probes the
    agents' primary key. Joined, the planner hashed the whole agents table three times a
    page (3 ms at 10,000 agents, where the probes cost 0.1 ms).
    """
    agent = aliased(Agent)
    return select(agent.handle, agent.name, agent.role).where(agent.id == column).limit(literal_column("1")).lateral()


def _build_row_select(m):
    """The feed row's columns of ``m`` (the messages table, or a page of its ``_MESSAGE_COLUMNS``)
    as the row shows them: the id, the time and the JSON documents as text, the metadata
    without its idempotency key (docs/api.md), so that Python copies them as they come."""
    c = m.c
    author, caller, target = _agent_of(c.author_id), _agent_of(c.caller_id), _agent_of(c.target_id)
    return (
        select(
            cast(c.id, Text).label("id"),
            c.sequence_no,
            c.role,
            c.body,
            cast(c.parts, Text).label("parts"),
            cast(c.artifacts, Text).label("artifacts"),
            cast(c.metadata.op("-", return_type=JSONB)(literal_column("'client_idempotency_key'")), Text).label("meta"),
            iso_text(c.created_at).label("created_at"),
            cast(c.thread_id, Text).label("thread_id"),
            cast(Thread.context_id, Text).label("context_id"),
            # The state now, recorded by the sweep or not (docs/decisions.md, "The work lifecycle").
            literal_column(effective_state_sql("threads"), String).label("state"),
            author.c.handle.label("author_handle"),
            caller.c.handle.label("caller_handle"),
            caller.c.name.label("caller_name"),
            caller.c.role.label("caller_role"),
            target.c.handle.label("target_handle"),
            target.c.name.label("target_name"),
            target.c.role.label("target_role"),
            Thread.priority,
            iso_text(c.read_at).label("read_at"),
        )
        .select_from(m)
        .join(Thread, Thread.id == c.thread_id)
        .join(author, true())
        .join(caller, true())
        .join(target, true())
    )


def _feed_row(r, json_value: Callable[[str], Any] = raw_json) -> dict[str, Any]:
    """One feed row from its columns in ``_Row``'s order (a row, a tuple): the message's fields
    plus task_id, context_id, task_state (now), caller, target.

    By position, not by name: a page is fifty of these. Its JSON documents are
    ``json_value`` of their text: written out as they are (:func:`relay.encoding.raw_json`)
    unless a caller needs their values.
    """
    return {
        "id": r[0],
        "sequence_no": r[1],
        "role": r[2],
        "from": r[11],
        "body": r[3],
        "parts": json_value(r[4]),
        "artifacts": json_value(r[5]),
        "metadata": json_value(r[6]),
        "created_at": r[7],
        "task_id": ulid_of_uuid_text(r[8]),
        "context_id": ulid_of_uuid_text(r[9]),
        "task_state": r[10],
        "caller": {"handle": r[12], "name": r[13], "role": r[14]},
        "target": {"handle": r[15], "name": r[16], "role": r[17]},
        "priority": r[18],
        "read_at": r[19],
    }


def message_feed_rows(message_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
    """The feed rows of several messages by id, in one query; gone ones are missing."""
    if not message_ids:
        return {}
    rows = db.session.execute(_row_select(Message.id.in_(message_ids)))
    # Parsed: webhook bodies are written by json, and signed as they are written.
    return {uuid.UUID(row.id): _feed_row(row, loads) for row in rows}


def _size_bound(r) -> int:
    """At least the bytes of ``_feed_row(r)`` as JSON: its keys and punctuation, and at most six
    bytes a character of text (``\\u001f``; UTF-8 takes at most four), so that a page under
    the budget by this count is under it exactly."""
    return _ROW_FRAME_BYTES + 6 * sum(len(v) for v in r if v.__class__ is str)


class _Row(NamedTuple):
    """A feed row's columns, in ``_build_row_select``'s order."""

    id: str  # the UUID's text
    sequence_no: int
    role: str
    body: str
    parts: str  # JSON text
    artifacts: str
    meta: str  # without client_idempotency_key
    created_at: str  # iso()'s text
    thread_id: str  # the UUID's text
    context_id: str
    state: str
    author_handle: str
    caller_handle: str
    caller_name: str
    caller_role: str
    target_handle: str
    target_name: str
    target_role: str
    priority: str
    read_at: str | None  # iso()'s text


# A feed row's bytes that no text sets: its keys and punctuation with every text null (4
# bytes, more than an empty string's 2) and the longest bigint sequence_no.
_NO_TEXT = (None, -(2**63), None, None, None, None, None, None, str(uuid.UUID(int=0)), str(uuid.UUID(int=0)))
_ROW_FRAME_BYTES = json_size(_feed_row(_NO_TEXT + (None,) * 10, lambda _text: None))


def _page_statement(direction: str, _search_shape: tuple, ascending: bool, rows: int, present: frozenset[str]):
    """One feed page's statement with named parameters, for the filters in ``present``.

    Newest first, or with ``ascending`` oldest first (a stream's next rows after its
    position). ``rows`` is written into the statement, not a parameter: a prepared
    statement's generic plan takes an unknown LIMIT for a tenth of the table, and then
    sorts a hash join of every message instead of walking the feed index.
    """
    conditions = []
    if "requester" in present:
        conditions.append(Message.caller_id == bindparam("requester"))
    if "worker" in present:
        conditions.append(Message.target_id == bindparam("worker"))
    if "task_id" in present:
        conditions.append(Message.thread_id == bindparam("task_id"))
    if "context_id" in present:
        conditions.append(Message.thread_id.in_(select(Thread.id).where(Thread.context_id == bindparam("context_id"))))
    if "role" in present:
        conditions.append(Message.role == bindparam("role"))
    if "since" in present:
        conditions.append(Message.created_at >= bindparam("since"))
    if "cursor_at" in present:
        conditions.append(
            tuple_(Message.created_at, Message.id) < tuple_(bindparam("cursor_at"), bindparam("cursor_id"))
        )
    if "after_at" in present:
        conditions.append(tuple_(Message.created_at, Message.id) > tuple_(bindparam("after_at"), bindparam("after_id")))
    identity, limit = bindparam("identity"), literal_column(str(int(rows)))
    table = Message.__table__

    def newest(rows):  # the page's order over ``rows`` (a table or subquery with created_at and id)
        c = rows.c
        return (c.created_at.asc(), c.id.asc()) if ascending else (c.created_at.desc(), c.id.desc())

    order = newest(table)

    def side(column, *more):
        return (
            select(*(table.c[name] for name in _MESSAGE_COLUMNS))
            .where(column == identity, *conditions, *more)
            .order_by(*order)
            .limit(limit)
        )

    def branch(column):
        if "q" not in present:
            return side(column)
        # The indexed and the unindexed rows apart (search.match_branches), each ordered and
        # limited, merged: a common word stops after a page of the feed index.
        indexed, unindexed = search.match_branches(bindparam("q", type_=String))
        both = union_all(side(column, indexed), side(column, unindexed)).subquery()
        return select(*both.c).order_by(*newest(both)).limit(limit)

    # One ordered index scan per side, merged: direction=both never sorts the whole history.
    # The page is picked from the sides' rows first, and only its rows are joined and
    # formatted: joining both sides' rows and then cutting the page did it all twice, and
    # was 40% of PostgreSQL's time for a page.
    if direction == "inbound":
        picked = branch(Message.target_id).subquery()
    elif direction == "outbound":
        picked = branch(Message.caller_id).subquery()
    else:
        sides = union_all(branch(Message.caller_id), branch(Message.target_id)).subquery()
        picked = select(*sides.c).order_by(*newest(sides)).limit(limit).subquery()
    return _build_row_select(picked).order_by(*newest(picked))


# The page statement of each shape (direction, search document, which filters are present),
# compiled once: building and cache-keying this union cost more than PostgreSQL took to run it.
# Planned on each call: a plan kept from when the tables were small joins a page to a
# sequential scan of threads (statements.Statement's custom_plan).
_PAGES = Shapes(
    ("requester", "worker", "task_id", "context_id", "role", "q", "since", "cursor_at", "after_at"),
    _page_statement,
    prepare=lambda present: "q" not in present,  # a search's best plan depends on its words
    custom_plan=True,
)


class Filters(NamedTuple):
    """A feed query's filters (the feed's query parameters, handles resolved), shared by a page, a wait and a stream."""

    direction: str = "both"
    requester: uuid.UUID | None = None
    worker: uuid.UUID | None = None
    task_id: uuid.UUID | None = None
    context_id: uuid.UUID | None = None
    role: str | None = None
    q: str | None = None
    since: datetime | None = None


def filters(
    *,
    direction: str = "both",
    requester_handle: str | None = None,
    worker_handle: str | None = None,
    task_id: uuid.UUID | None = None,
    context_id: uuid.UUID | None = None,
    role: str | None = None,
    q: str | None = None,
    since: datetime | None = None,
) -> Filters:
    """The feed's filters with handles resolved; raises invalid_params (422) for a malformed handle."""
    return Filters(
        direction,
        _handle_id(requester_handle, "requester_handle"),
        _handle_id(worker_handle, "worker_handle"),
        task_id,
        context_id,
        role,
        q,
        since,
    )


def position_of(identity: Agent, message_id: uuid.UUID, field: str = "after") -> tuple[datetime, uuid.UUID]:
    """The stream position ``(created_at, id)`` of a message in ``identity``'s feed.

    Raises invalid_params naming ``field`` when no message with that id is in the feed
    (a message of another feed is not told apart from one that does not exist).
    """
    with unit_of_work() as session, own_transaction(session):
        row = session.execute(
            select(Message.created_at, Message.id).where(
                Message.id == message_id, or_(Message.caller_id == identity.id, Message.target_id == identity.id)
            )
        ).first()
    if row is None:
        raise RelayError(
            "invalid_params",
            f"{field}: no message {message_id} in the feed of {identity.handle}",
            {field: ["is not the id of a message in this feed"]},
        )
    return row[0], row[1]


def page_rows(
    identity: Agent,
    flt: Filters,
    *,
    cursor: tuple[datetime, uuid.UUID] | None = None,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int = 50,
    ascending: bool = False,
) -> list[tuple]:
    """Up to ``limit`` feed rows' columns (``_Row`` order) matching ``flt``, newest first or ``ascending``.

    ``cursor`` pages back (rows before it), ``after`` forward (rows after that position).
    """
    params = {
        "identity": identity.id,
        "requester": flt.requester,
        "worker": flt.worker,
        "task_id": flt.task_id,
        "context_id": flt.context_id,
        "role": flt.role,
        "q": flt.q,
        "since": flt.since,
        "cursor_at": cursor[0] if cursor else None,
        "cursor_id": cursor[1] if cursor else None,
        "after_at": after[0] if after else None,
        "after_id": after[1] if after else None,
        "limit": limit,
    }
    # Everything compiled into the statement is in its shape: the search document's
    # definition reads its bounds when built (tests change them).
    search_shape = (current_app.config["RELAY"].search_config, search.MAX_DOCUMENT_CHARS, search.SPLIT_CHARS)
    statement = _PAGES.get(params, flt.direction, search_shape, ascending, limit)
    # One page read: its own transaction, no BEGIN/COMMIT round trips.
    with unit_of_work() as session, own_transaction(session):
        return statement.execute(session, params).fetchall()


def feed_row(columns: tuple) -> dict[str, Any]:
    """The feed row (docs/api.md's shape) of ``page_rows`` columns."""
    return _feed_row(columns)


def row_position(columns: tuple) -> tuple[datetime, uuid.UUID]:
    """The stream position ``(created_at, id)`` of ``page_rows`` columns."""
    return datetime.fromisoformat(columns[7]), uuid.UUID(columns[0])


def list_messages(
    identity: Agent,
    *,
    cursor: tuple[datetime, uuid.UUID] | None = None,
    after: uuid.UUID | None = None,
    limit: int = 50,
    **filter_params: Any,
) -> dict[str, Any]:
    """Return one page of ``identity``'s feed: ``{"items": [...], "next_cursor": str | None}`` (docs/api.md).

    ``identity`` comes from :func:`resolve_identity`; ``filter_params`` are :func:`filters`'
    keywords; ``after`` (a message id) keeps only rows after that message. Raises
    invalid_params (422) for a malformed handle filter or an ``after`` not in the feed.
    """
    position = position_of(identity, after) if after is not None else None
    return page(identity, filters(**filter_params), cursor=cursor, after=position, limit=limit)


def page(
    identity: Agent,
    flt: Filters,
    *,
    cursor: tuple[datetime, uuid.UUID] | None = None,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    """One page of the feed for resolved filters: ``{"items", "next_cursor"}``, within the byte budget."""
    rows = page_rows(identity, flt, cursor=cursor, after=after, limit=limit + 1)
    budget = current_app.config["RELAY"].feed_budget_bytes
    if sum(map(_size_bound, rows[:limit])) <= budget:  # the whole page fits: no row is measured
        items = [_feed_row(r) for r in rows[:limit]]
    else:
        items, used = [], 0
        for r in rows[:limit]:
            row = _feed_row(r)
            size = json_size(row)
            if items and used + size > budget:
                break
            items.append(row)
            used += size
    more = len(items) < len(rows)
    next_cursor = None
    if more and items:
        next_cursor = encode_cursor(*row_position(rows[len(items) - 1]))
    return {"items": items, "next_cursor": next_cursor}
