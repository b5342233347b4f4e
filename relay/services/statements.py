"""The hot paths' statement cache: each fixed statement built once per process, PREPAREd once per connection."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from flask import current_app
from sqlalchemy.orm import Session

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# Sent before a read's EXECUTE in the same message (Statement's custom_plan).
CUSTOM_PLAN = "SET LOCAL plan_cache_mode = force_custom_plan"
_PREPARED = "relay_prepared"  # connection info: the names this connection has prepared


class Statement:
    """One fixed statement of a hot path, kept per process: psycopg2 SQL text (``%(name)s``
    parameters), or a SQLAlchemy statement compiled once to that text.

    What runs, on :meth:`execute`: with ``prepare`` (the default) and ``RELAY_DB_PREPARE`` on,
    each connection sends ``PREPARE relay_<hash> AS <the SQL>`` the first time it runs the
    statement, then ``EXECUTE relay_<hash>(<parameters>)`` on every run. PostgreSQL then
    parses it once per connection instead of on every call, and by default plans it once
    too: after five runs it settles on a generic plan, which that connection keeps until a
    table's statistics or definition change. ``prepare`` suits only statements whose
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

    Without ``prepare``, or with ``RELAY_DB_PREPARE`` off (``auto`` behind
    DATABASE_CONNECTION_POOL_URL), the plain SQL text is sent (same parameters), and nothing
    outlives the transaction: a transaction-mode pooler gives each transaction any server
    session, where a name prepared on another is missing, or already taken
    (docs/decisions.md, "Scale-out").
    """

    __slots__ = ("sql", "defaults", "prepare", "name", "prepare_sql", "execute_sql")
    named: dict[
        str, Statement
    ] = {}  # every PREPAREd one by name: what an EXPLAIN of an ``EXECUTE`` needs (bench, tests)

    def __init__(self, sql: str | Any, *, prepare: bool = True, custom_plan: bool = False):
        if isinstance(sql, str):
            self.sql, self.defaults = sql, {}
        else:
            from sqlalchemy.dialects.postgresql import psycopg2 as pg

            # Literal values the statement holds (a search config, bounds) become its
            # default parameters. Expanding ``IN`` lists are not supported: use ``= ANY(:array)``.
            compiled = sql.compile(dialect=pg.dialect())
            self.sql, self.defaults = str(compiled), dict(compiled.params)
        order: list[str] = []

        def positional(match: re.Match) -> str:
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        # Sent without parameters, so psycopg2's doubled %% must be made single.
        body = _PLACEHOLDER.sub(positional, self.sql).replace("%%", "%")
        self.prepare = prepare
        self.name = "relay_" + hashlib.sha1(self.sql.encode()).hexdigest()[:16]
        self.prepare_sql = f"PREPARE {self.name} AS {body}"
        args = ", ".join(f"%({n})s" for n in order)
        self.execute_sql = f"EXECUTE {self.name}({args})" if order else f"EXECUTE {self.name}"
        if custom_plan:
            self.execute_sql = f"{CUSTOM_PLAN}; {self.execute_sql}"
        if prepare:
            Statement.named[self.name] = self

    def ready(self, session: Session) -> str:
        """Return the text to send on the session's connection now, PREPAREing the statement there first if it must.

        The EXECUTE text when the statement is prepared, else the plain SQL (same parameters).
        """
        if not self.prepare or not current_app.config["RELAY"].db_prepare:
            return self.sql
        connection = session.connection().connection
        prepared = connection.info.setdefault(_PREPARED, set())
        if self.name not in prepared:
            with connection.dbapi_connection.cursor() as cur:
                cur.execute(self.prepare_sql)
            prepared.add(self.name)
        return self.execute_sql

    def execute(self, session: Session, params: dict[str, Any], *, cursor: Any = None) -> Any:
        """Run in ``session`` with ``params`` over the defaults; return what holds the rows (by position).

        With ``cursor`` (a DBAPI cursor on the session's connection, from
        ``services.statement_cursor``) it runs there and the cursor is returned: no SQLAlchemy
        result wrapping, for the paths where that cost more than the statement. Without it,
        ``exec_driver_sql`` runs it and its result is returned: that skips compiling and
        cache-keying but still fires the engine's cursor events, so what tests and the bench
        capture is what was sent.
        """
        sql = self.ready(session)
        values = {**self.defaults, **params} if self.defaults else params
        if cursor is not None:
            cursor.execute(sql, values)
            return cursor
        return session.connection().exec_driver_sql(sql, values)


class Shapes:
    """The :class:`Statement` of each shape of one query, built and compiled on first use.

    A shape is the fixed arguments (a direction, a role, a search config...) plus which of
    the ``optional`` parameters are present (not None); ``build(*fixed, present)`` returns
    the SQLAlchemy statement for it, with a named ``bindparam`` per parameter.
    ``prepare(present)`` says whether a shape is PREPAREd; with ``custom_plan`` every
    prepared shape is planned on each call (see :class:`Statement`).
    """

    def __init__(
        self,
        optional: tuple[str, ...],
        build: Callable[..., Any],
        prepare: Callable[[frozenset[str]], bool] = lambda present: False,
        *,
        custom_plan: bool = False,
    ):
        self.optional, self.build, self.prepare, self.custom_plan = optional, build, prepare, custom_plan
        self._statements: dict[tuple, Statement] = {}

    def get(self, params: dict[str, Any], *fixed: Any) -> Statement:
        """The statement for ``params``' shape (built once per process and shape)."""
        present = frozenset(k for k in self.optional if params[k] is not None)
        key = (fixed, present)
        statement = self._statements.get(key)
        if statement is None:
            statement = Statement(
                self.build(*fixed, present), prepare=self.prepare(present), custom_plan=self.custom_plan
            )
            self._statements[key] = statement
        return statement
