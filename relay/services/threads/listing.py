"""tasks/list: a page of a caller's inbox or sent threads, and the thread summary lists and webhooks show."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, String, Text, and_, bindparam, cast, func, literal_column, or_, select
from sqlalchemy.orm import Session, aliased

from relay.extensions import db
from relay.ids import encode_cursor, iso, ulid_of_uuid_text
from relay.models import Agent, Message, ReadPosition, Thread, effective_state_sql
from relay.services import iso_text, own_transaction, unit_of_work
from relay.services.statements import Shapes
from relay.services.threads.read import message_row

PREVIEW_CHARS = 200


def thread_summary(t: Thread) -> dict[str, Any]:
    """A thread as lists and ``task.updated`` webhooks show it (a tasks/list item: docs/api.md, "Thread list")."""
    s, r = t.sender, t.recipient
    return _summary(
        (str(t.id), str(t.context_id), t.state, s.handle, s.name, s.role, r.handle, r.name, r.role, t.summary, t.intent,
         t.result_summary, iso(t.created_at), iso(t.updated_at), t.priority)
    )  # fmt: skip


def _summary(r: Any) -> dict[str, Any]:
    """thread_summary's shape from ``_LIST_COLUMNS``' values (ids and times as text, see iso_text).

    Built from the row as it comes: a page is fifty of these, and building each from
    objects, helpers and merged dicts was a fifth of tasks/list's request.
    """
    return {
        "thread_id": (tid := ulid_of_uuid_text(r[0])),
        "task_id": tid,
        "context_id": ulid_of_uuid_text(r[1]),
        "status": {"state": r[2]},
        "sender": {"handle": r[3], "name": r[4], "role": r[5]},
        "recipient": {"handle": r[6], "name": r[7], "role": r[8]},
        "summary_preview": r[9][:PREVIEW_CHARS],
        "intent": r[10],
        "result_summary": r[11],
        "created_at": r[12],
        "updated_at": r[13],
        "priority": r[14],
    }


_SENDER, _RECIPIENT = aliased(Agent), aliased(Agent)
# The state a list shows and filters on: as of now, recorded by the sweep or not
# (docs/decisions.md, "The work lifecycle").
_EFFECTIVE_STATE = literal_column(effective_state_sql("threads"), String)
# A page of tasks/list as plain columns (_summary's order, then the unread count): 50
# Thread entities with two joined agents each cost more to build as ORM objects than the
# query took to run.
_LIST_COLUMNS = (
    cast(Thread.id, Text),
    cast(Thread.context_id, Text),
    _EFFECTIVE_STATE,
    _SENDER.handle,
    _SENDER.name,
    _SENDER.role,
    _RECIPIENT.handle,
    _RECIPIENT.name,
    _RECIPIENT.role,
    Thread.summary,
    Thread.intent,
    Thread.result_summary,
    iso_text(Thread.created_at),
    iso_text(Thread.updated_at),
    Thread.priority,
)


def _page_messages(thread_ids: list[uuid.UUID], messages: int | str):
    """Messages of a page of threads, oldest first per thread: all, or the newest N of each."""
    stmt = select(Message).where(Message.thread_id.in_(thread_ids))
    if messages != "all":
        rank = (
            select(
                Message.id,
                func.row_number()
                .over(partition_by=Message.thread_id, order_by=Message.sequence_no.desc())
                .label("rank"),
            )
            .where(Message.thread_id.in_(thread_ids))
            .subquery()
        )
        stmt = stmt.join(rank, rank.c.id == Message.id).where(rank.c.rank <= int(messages))
    return stmt.order_by(Message.thread_id, Message.sequence_no).options(db.joinedload(Message.author))


def _list_filters(role: str, present: set[str]) -> list:
    """The filters of a tasks/list page (named parameters), besides the keyset cursor."""
    column = Thread.recipient_id if role == "recipient" else Thread.sender_id
    filters = [column == bindparam("caller")]
    if "peer" in present:
        filters.append((Thread.sender_id if role == "recipient" else Thread.recipient_id) == bindparam("peer"))
    if "context_id" in present:
        filters.append(Thread.context_id == bindparam("context_id"))
    if "status" in present:
        filters.append(_EFFECTIVE_STATE == func.any(bindparam("status", type_=ARRAY(String))))
    if "priority" in present:
        filters.append(Thread.priority == func.any(bindparam("priority", type_=ARRAY(String))))
    if "since" in present:
        filters.append(Thread.updated_at >= bindparam("since"))
    return filters


def _list_statement(role: str, rows: int, present: set[str]):
    """One tasks/list page with named parameters: newest activity first, and each thread's unread count.

    ``rows`` is written into the statement (see feed._page_statement: a generic plan's
    unknown LIMIT).
    """
    caller = bindparam("caller")
    unread = (
        select(func.count(Message.id))
        .where(
            Message.thread_id == Thread.id,
            Message.author_id != caller,
            Message.sequence_no
            > func.coalesce(
                select(ReadPosition.last_read_sequence_no)
                .where(ReadPosition.thread_id == Thread.id, ReadPosition.agent_id == caller)
                # Correlate to the outer threads row, not to a second copy of threads.
                .correlate(Thread)
                .scalar_subquery(),
                0,
            ),
        )
        .correlate(Thread)
        .scalar_subquery()
    )
    stmt = (
        select(*_LIST_COLUMNS, unread, Thread.question)
        .join(_SENDER, _SENDER.id == Thread.sender_id)
        .join(_RECIPIENT, _RECIPIENT.id == Thread.recipient_id)
        .where(*_list_filters(role, present))
    )
    if "cursor_at" in present:
        at, ident = bindparam("cursor_at"), bindparam("cursor_id")
        stmt = stmt.where(or_(Thread.updated_at < at, and_(Thread.updated_at == at, Thread.id < ident)))
    return stmt.order_by(Thread.updated_at.desc(), Thread.id.desc()).limit(literal_column(str(int(rows))))


# The tasks/list page statement of each shape (role, which filters are present), compiled once,
# and planned on each call, as the feed's page is (statements.Statement's custom_plan).
_LIST_PAGES = Shapes(
    ("peer", "context_id", "status", "priority", "since", "cursor_at"),
    _list_statement,
    prepare=lambda present: True,
    custom_plan=True,
)


def _count_threads(session: Session, role, caller, peer, context_id, status, since, priority=None) -> int:
    """Rows matching tasks/list's filters on all pages (the A2A binding's ListTasks ``total``)."""
    params = {"caller": caller.id, "peer": peer.id if peer else None, "context_id": context_id}
    params |= {"status": list(status) if status else None, "since": since}
    params |= {"priority": list(priority) if priority else None}
    present = {k for k, v in params.items() if v is not None and k != "caller"}
    stmt = select(func.count()).select_from(Thread).where(*_list_filters(role, present))
    return session.scalar(stmt, params)


def list_threads(
    caller: Agent,
    role: str = "recipient",
    status: list[str] | None = None,
    since: datetime | None = None,
    limit: int = 50,
    cursor: tuple[datetime, uuid.UUID] | None = None,
    *,
    peer: Agent | None = None,
    context_id: uuid.UUID | None = None,
    with_total: bool = False,
    messages: int | str | None = None,
    priority: list[str] | None = None,
) -> dict:
    """Return one page of the caller's inbox or sent threads (``tasks/list``, docs/api.md).

    Newest activity first; keyset cursor on (updated_at, id); ``since`` is inclusive on
    the last activity; ``unread_messages`` counts the other side's messages after the
    caller's read position. Shape: ``{"items": [...], "next_cursor": str | None}``.

    For the A2A binding's ListTasks: ``peer`` keeps the threads whose other side is that
    agent, ``context_id`` one context; ``with_total`` adds ``total`` (rows matching the
    filters, all pages) and ``messages`` each item's ``messages`` (oldest first): ``"all"``,
    or the newest N of each thread (one window query for the page, not every message).
    """
    params = {
        "caller": caller.id,
        "peer": peer.id if peer is not None else None,
        "context_id": context_id,
        "status": list(status) if status else None,
        "priority": list(priority) if priority else None,
        "since": since,
        "cursor_at": cursor[0] if cursor else None,
        "cursor_id": cursor[1] if cursor else None,
        "limit": limit + 1,
    }
    statement = _LIST_PAGES.get(params, role, limit + 1)
    with unit_of_work() as session, own_transaction(session):
        rows = statement.execute(session, params).all()
        page = rows[:limit]
        items = []
        for r in page:
            item = _summary(r)
            item["unread_messages"] = r[15]
            if with_total:  # the A2A binding's status message of an input_required task
                item["question"] = r[16]
            items.append(item)
        if messages and page:
            by_thread: dict[uuid.UUID, list[dict]] = {}
            for m in session.scalars(_page_messages([uuid.UUID(r[0]) for r in page], messages)):
                by_thread.setdefault(str(m.thread_id), []).append(message_row(m))
            for item, r in zip(items, page):
                item["messages"] = by_thread.get(r[0], [])
        total = _count_threads(session, role, caller, peer, context_id, status, since, priority) if with_total else None
    last = page[-1] if page else None
    next_cursor = None
    if len(rows) > limit and last is not None:
        next_cursor = encode_cursor(datetime.fromisoformat(last[13]), uuid.UUID(last[0]))
    result: dict[str, Any] = {"items": items, "next_cursor": next_cursor}
    if with_total:
        result["total"] = total
    return result
