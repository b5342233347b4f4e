"""Services: one transaction per use case, all business rules; nothing here knows HTTP."""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2.extensions
from flask import current_app
from sqlalchemy import func, literal_column
from sqlalchemy.orm import Session

from relay.errors import log_unexpected
from relay.extensions import db
from relay.ids import ISO_SQL_FORMAT

log = logging.getLogger("relay.services")
_AFTER_COMMIT = "relay_after_commit"


def after_commit(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current use case commits; drop it if it rolls back."""
    db.session.info.setdefault(_AFTER_COMMIT, []).append(callback)


@contextmanager
def unit_of_work() -> Iterator[Session]:
    """Yield the session; commit when the block ends cleanly, roll back on any error.

    Callbacks registered with :func:`after_commit` run after a successful commit; a
    failing callback is logged, never raised (the outbox sweep covers what it missed).
    """
    session = db.session
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        session.info.pop(_AFTER_COMMIT, None)
        raise
    for callback in session.info.pop(_AFTER_COMMIT, []):
        try:
            callback()
        except Exception as exc:
            log_unexpected(log, exc, "after-commit callback failed")


@contextmanager
def own_transaction(session: Session) -> Iterator[bool]:
    """Run the block's statements in autocommit if no transaction is open yet; yield whether they do.

    Each statement is then its own transaction: a use case that is one statement (a
    page read, a one-statement write), or reads whose answers need not share one
    snapshot, costs no BEGIN and no COMMIT round trip (psycopg2 sends each apart). A
    block inside an open transaction joins it, committed by :func:`unit_of_work`.
    """
    dbapi = session.connection().connection.dbapi_connection
    alone = dbapi.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    if alone:
        dbapi.autocommit = True
    try:
        yield alone
    finally:
        # A connection cut mid-statement is closed: setting autocommit would raise and
        # hide the outage's own error (a 503) behind an InterfaceError.
        if alone and not dbapi.closed:
            dbapi.autocommit = False


@contextmanager
def statement_cursor(session: Session, *, alone: bool = False) -> Iterator[Any]:
    """Yield a DBAPI cursor on the session's connection, for a hot path's fixed SQL.

    SQLAlchemy's statement machinery (cache key, compiled lookup, result wrapping) cost
    more per request on these paths than the statements themselves. With ``alone``, see
    :func:`own_transaction`.
    """
    dbapi = session.connection().connection.dbapi_connection
    if alone:
        with own_transaction(session), dbapi.cursor() as cur:
            yield cur
    else:
        with dbapi.cursor() as cur:
            yield cur


def iso_text(column: Any) -> Any:
    """A timestamptz ``column`` as text in the query, formatted as :func:`relay.ids.iso` formats it.

    For pages of rows: psycopg2 building a datetime and Python formatting it cost ten times
    what ``to_char`` costs PostgreSQL. Shape: ``2026-12-01T20:11:07.833036Z``; NULL stays NULL.
    """
    return func.to_char(func.timezone(literal_column("'UTC'"), column), literal_column(f"'{ISO_SQL_FORMAT}'"))


_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# Sent before a read's EXECUTE in the same message (Prepared's custom_plan).
CUSTOM_PLAN = "SET LOCAL plan_cache_mode = force_custom_plan"
_PREPARED = "relay_prepared"  # connection info: the names this connection has prepared


class Prepared:
    """psycopg2 SQL text (``%(name)s`` parameters) that each connection PREPAREs once, then EXECUTEs.

    PostgreSQL then parses it once per connection instead of on every call, and by default
    plans it once too: after five runs it settles on a generic plan, which that connection
    keeps until a table's statistics or definition change. Only for statements whose
    parameters PostgreSQL can type from where they are used, and, planned once, whose best
    plan does not hang on their values (not a text search, whose selectivity does).
    ``PREPARE`` is not undone by a rollback, so a name once prepared stays usable.

    With ``custom_plan`` each EXECUTE is planned for its values and the tables' sizes now
    (``SET LOCAL plan_cache_mode = force_custom_plan`` in the same query message: an
    implicit transaction when alone, else it lasts to the end of the open one). For reads
    over tables that grow: a generic plan made while they were small (a hash join over a
    sequential scan of threads) stays on the connection as they grow, because nothing
    invalidates it until ``ANALYZE`` runs: at 100,000 threads a feed page's statement took
    10.5 ms on the plan made at 500, and 0.8 ms planned for the call (docs/performance.md,
    "Plans as the ledger grows"). Planning each call costs what the generic plan saved,
    less the parse.

    With ``RELAY_DB_PREPARE`` off (``auto`` behind DATABASE_CONNECTION_POOL_URL) the plain
    text is sent instead: a transaction-mode pooler gives each transaction any server
    session, where a name prepared on another is missing, or already taken (docs/decisions.md, "Scale-out").
    """

    __slots__ = ("name", "sql", "prepare_sql", "execute_sql")
    named: dict[str, Prepared] = {}  # every one by name: what an EXPLAIN of an ``EXECUTE`` needs (bench, tests)

    def __init__(self, sql: str, *, custom_plan: bool = False):
        order: list[str] = []

        def positional(match: re.Match) -> str:
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        # Sent without parameters, so psycopg2's doubled %% must be made single.
        body = _PLACEHOLDER.sub(positional, sql).replace("%%", "%")
        self.sql = sql
        self.name = "relay_" + hashlib.sha1(sql.encode()).hexdigest()[:16]
        self.prepare_sql = f"PREPARE {self.name} AS {body}"
        args = ", ".join(f"%({n})s" for n in order)
        self.execute_sql = f"EXECUTE {self.name}({args})" if order else f"EXECUTE {self.name}"
        if custom_plan:
            self.execute_sql = f"{CUSTOM_PLAN}; {self.execute_sql}"
        Prepared.named[self.name] = self

    def ready(self, session: Session) -> str:
        """PREPARE on the session's connection if it has not yet; return the EXECUTE text to run.

        With prepared statements off, return the plain SQL text (same parameters).
        """
        if not current_app.config["RELAY"].db_prepare:
            return self.sql
        connection = session.connection().connection
        prepared = connection.info.setdefault(_PREPARED, set())
        if self.name not in prepared:
            with connection.dbapi_connection.cursor() as cur:
                cur.execute(self.prepare_sql)
            prepared.add(self.name)
        return self.execute_sql


class Compiled:
    """A SQLAlchemy statement compiled once to psycopg2's SQL text, run as driver SQL.

    For hot paths whose statement is built from a few optional filters: build it once per
    shape (which filters are present) with named ``bindparam``s, keep it here, and run
    it with :meth:`execute`. Literal values the statement holds (a search config, bounds)
    are kept as its default parameters. Expanding ``IN`` lists are not supported: use
    ``= ANY(:array)``. With ``prepared`` it runs as a :class:`Prepared` statement, planned
    for each call's values with ``custom_plan``.
    """

    __slots__ = ("sql", "defaults", "prepared")

    def __init__(self, statement: Any, *, prepared: bool = False, custom_plan: bool = False):
        from sqlalchemy.dialects.postgresql import psycopg2 as pg

        compiled = statement.compile(dialect=pg.dialect())
        self.sql = str(compiled)
        self.defaults = dict(compiled.params)
        self.prepared = Prepared(self.sql, custom_plan=custom_plan) if prepared else None

    def execute(self, session: Session, **params: Any) -> Any:
        """Run in ``session`` with ``params`` over the defaults; return the result (rows by position).

        ``exec_driver_sql`` skips compiling and cache-keying but still fires the engine's
        cursor events, so what tests and the bench capture is what was sent.
        """
        sql = self.sql if self.prepared is None else self.prepared.ready(session)
        return session.connection().exec_driver_sql(sql, {**self.defaults, **params})


class Shapes:
    """The compiled statements of one query, one per shape, built on first use.

    A shape is the fixed arguments (a direction, a role, a search config...) plus which of
    the ``optional`` parameters are present (not None); ``build(*fixed, present)`` returns
    the SQLAlchemy statement for it, with a named ``bindparam`` per parameter. With
    ``custom_plan`` every prepared shape is planned on each call (see :class:`Prepared`).
    """

    def __init__(
        self,
        optional: tuple[str, ...],
        build: Callable[..., Any],
        prepared: Callable[[frozenset[str]], bool] = lambda present: False,
        *,
        custom_plan: bool = False,
    ):
        self.optional, self.build, self.prepared, self.custom_plan = optional, build, prepared, custom_plan
        self._compiled: dict[tuple, Compiled] = {}

    def get(self, params: dict[str, Any], *fixed: Any) -> Compiled:
        """The statement for ``params``' shape (compiled once per process and shape); ``prepared(present)``
        says whether a shape is PREPAREd (see :class:`Compiled`)."""
        present = frozenset(k for k in self.optional if params[k] is not None)
        key = (fixed, present)
        compiled = self._compiled.get(key)
        if compiled is None:
            statement = self.build(*fixed, present)
            compiled = Compiled(statement, prepared=self.prepared(present), custom_plan=self.custom_plan)
            self._compiled[key] = compiled
        return compiled
