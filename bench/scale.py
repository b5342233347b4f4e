"""``python -m bench scale``: feed, search, inbox and tasks/get at 1M or 10M messages.

Seeds with COPY (not the API), then times each query server-side (the service call,
without HTTP) and saves ``EXPLAIN (ANALYZE, BUFFERS)`` of each, checking that no plan
scans messages or threads sequentially.

Seeding, in bounded memory and time at 10M messages:

1. agents and threads by COPY (the thread list is held: 500k tuples);
2. messages streamed by COPY (no batch held: Python generates while PostgreSQL parses)
   into an unlogged staging table;
3. the messages table's indexes and constraints dropped, the rows moved into it by
   ``INSERT ... SELECT`` that writes each row's search vector with the relay's own
   document definition (``search.document_vector()`` compiled to SQL, checked to be the
   text of the indexer's UPDATE, ``search._batch_statement``) and ``search_version =
   SEARCH_VERSION``, on ``--index-connections`` connections by block ranges; foreign
   key triggers off for the load (``session_replication_role = replica``: the rows are
   consistent by construction);
4. the indexes and constraints rebuilt from their own definitions (checked equal to the
   migrated schema's afterwards), ``VACUUM ANALYZE``.

So the indexes are freshly built (dense), not grown row by row; the heap holds no dead
tuples. Then one extra thread of ``--big-thread`` messages for tasks/get, the timed
queries, the size of every table and index, and a burst of ``--burst`` new unindexed
messages indexed by ``search.index_messages`` in batches of ``--burst-batch``.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
from sqlalchemy import event, select, text

from bench import harness
from bench.run import git_commit

COMMON = ["endpoint", "refactor", "tests", "cursor", "review", "deploy", "schema", "client"]
FILLER = (
    "the users api now returns items and next_cursor please update the client and rerun the "
    "integration tests before merging this change to main"
).split()
RARE = "zanzibar"  # about one message in ten thousand

THREAD_COLUMNS = [
    "id",
    "context_id",
    "sender_id",
    "recipient_id",
    "intent",
    "summary",
    "state",
    "version",
    "last_sequence_no",
    "created_at",
    "updated_at",
]
# The staging table's columns, as COPY fills them (artifacts and metadata take defaults).
STAGE_COLUMNS = [
    "n",
    "id",
    "thread_id",
    "sequence_no",
    "author_id",
    "caller_id",
    "target_id",
    "role",
    "body",
    "parts",
    "created_at",
]
MESSAGE_COLUMNS = STAGE_COLUMNS[1:-1] + ["artifacts", "metadata", "created_at"]
SIMPLE_VECTOR = "setweight(to_tsvector('english', messages.body), 'A')"


def _ulid_uuid(ts: datetime) -> uuid.UUID:
    from ulid import ULID

    return ULID.from_datetime(ts).to_uuid()


def _escape(v) -> str:
    return r"\N" if v is None else str(v).replace("\\", "\\\\").replace("\t", " ").replace("\n", " ")


class _Stream:
    """A file for ``copy_expert`` that reads from a generator of text chunks, so no batch is held."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._buf = ""

    def read(self, size: int = -1) -> str:
        parts, have = [self._buf], len(self._buf)
        while size < 0 or have < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            parts.append(chunk)
            have += len(chunk)
        data = "".join(parts)
        if size < 0:
            self._buf = ""
            return data
        self._buf = data[size:]
        return data[:size]

    def readline(self, size: int = -1) -> str:  # pragma: no cover - copy_expert uses read()
        return self.read(size)


def _copy(cur, table: str, columns: list[str], rows) -> None:
    def chunks():
        lines = []
        for row in rows:
            lines.append("\t".join(_escape(v) for v in row) + "\n")
            if len(lines) >= 10_000:
                yield "".join(lines)
                lines = []
        if lines:
            yield "".join(lines)

    cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", _Stream(chunks()), size=1 << 20)


def _message_chunks(rnd: random.Random, threads, agent_strs: list[str], first_n: int = 0):
    """Stage lines of every message of ``threads`` ((id, sender, recipient, start, count)), in
    chunks of 10,000 lines. Bodies are plain ASCII words: nothing to escape."""
    n = first_n
    lines = []
    sample, choice, rand = rnd.sample, rnd.choice, rnd.random
    for tid, s, r, start, count in threads:
        tid_s, s_s, r_s = str(tid), agent_strs[s], agent_strs[r]
        for seq in range(1, count + 1):
            words = sample(FILLER, 8) + [choice(COMMON)]
            if rand() < 0.0001:
                words.append(RARE)
            body = " ".join(words)
            odd = seq % 2
            n += 1
            lines.append(
                f"{n}\t{uuid.uuid4()}\t{tid_s}\t{seq}\t{s_s if odd else r_s}\t{s_s}\t{r_s}\t"
                f"{'caller' if odd else 'agent'}\t{body}\t"
                f'[{{"type": "text", "text": "{body}"}}]\t{(start + timedelta(minutes=seq)).isoformat()}\n'
            )
            if len(lines) >= 10_000:
                yield "".join(lines)
                lines = []
    if lines:
        yield "".join(lines)


def _copy_threads(cur, threads, agent_ids) -> None:
    _copy(
        cur,
        "threads",
        THREAD_COLUMNS,
        (
            (
                tid,
                _ulid_uuid(start),
                agent_ids[s],
                agent_ids[r],
                "inform",
                "bench thread",
                "pending",
                1,
                count,
                start.isoformat(),
                (start + timedelta(minutes=count)).isoformat(),
            )
            for tid, s, r, start, count in threads
        ),
    )


def _create_stage(cur) -> None:
    cur.execute("DROP TABLE IF EXISTS bench_stage")
    cur.execute(
        "CREATE UNLOGGED TABLE bench_stage (n bigint, id uuid, thread_id uuid, sequence_no int, author_id uuid, "
        "caller_id uuid, target_id uuid, role text, body text, parts jsonb, "
        "artifacts jsonb NOT NULL DEFAULT '[]', metadata jsonb NOT NULL DEFAULT '{}', created_at timestamptz)"
    )


def seed(database_url: str, messages: int, threads: int, agents: int, big_thread: int) -> dict:
    """Write agents and threads with COPY, and the messages into ``bench_stage``; return what the queries need."""
    conn, _ = harness._admin(database_url)
    conn.autocommit = False
    rnd = random.Random(42)
    now = datetime.now(UTC)
    cur = conn.cursor()
    cur.execute("SET session_replication_role = replica")  # no FK triggers: consistent by construction
    agent_ids = [uuid.uuid4() for _ in range(agents)]
    agent_strs = [str(a) for a in agent_ids]
    handles = [f"a{i}@org{i % 20}" for i in range(agents)]
    _copy(
        cur,
        "agents",
        ["id", "handle", "org", "name", "role"],
        ((agent_ids[i], handles[i], handles[i].split("@")[1], f"Agent {i}", "bench") for i in range(agents)),
    )
    per_thread = max(1, messages // threads)
    # A few busy agents (the first ten) receive a tenth of all threads.
    thread_rows = []
    for t in range(threads):
        recipient = rnd.randrange(10) if t % 10 == 0 else rnd.randrange(agents)
        sender = rnd.randrange(agents)
        if sender == recipient:
            sender = (sender + 1) % agents
        start = now - timedelta(days=90) + timedelta(seconds=t * (90 * 86400 / threads))
        thread_rows.append((_ulid_uuid(start), sender, recipient, start, per_thread))
    # tasks/get's thread: exactly big_thread messages between agents 10 and 11, its last a day ago.
    big_start = now - timedelta(days=1, minutes=big_thread)
    big = (_ulid_uuid(big_start), 10 % agents, 11 % agents, big_start, big_thread)
    all_threads = thread_rows + ([big] if big_thread else [])
    _copy_threads(cur, all_threads, agent_ids)
    _create_stage(cur)
    cur.copy_expert(
        f"COPY bench_stage ({', '.join(STAGE_COLUMNS)}) FROM STDIN",
        _Stream(_message_chunks(rnd, all_threads, agent_strs)),
        size=1 << 20,
    )
    written = per_thread * threads + (big_thread if big_thread else 0)
    cur.execute("SET session_replication_role = DEFAULT")
    conn.commit()
    conn.autocommit = True
    return {
        "agent_ids": agent_ids,
        "agent_strs": agent_strs,
        "handles": handles,
        "written": written,
        "conn": conn,
        "rnd": rnd,
        "big_thread_id": big[0] if big_thread else None,
        "big_thread_agents": (big[1], big[2]),
        "now": now,
    }


# -- the vectors, with the relay's own definition ------------------------------------------


def _vector_sql(simple: bool) -> tuple[str, bool]:
    """The document definition as SQL over ``messages.*`` columns, and whether it is verbatim in
    the indexer's compiled UPDATE (``search._batch_statement``). Needs an app context."""
    from sqlalchemy.dialects import postgresql

    from relay.models import Message
    from relay.services import search

    if simple:
        return SIMPLE_VECTOR, False
    sql = str(
        select(search.document_vector().label("v"))
        .select_from(Message.__table__)
        .compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    )
    head, tail = "SELECT ", " AS v \nFROM messages"
    if not (sql.startswith(head) and sql.endswith(tail)):
        raise RuntimeError(f"unexpected compiled document definition: {sql[:200]}...")
    expr = sql[len(head) : -len(tail)]
    batch = search._batch_statement().text
    return expr, f"search_vector=({expr})," in batch or f"search_vector={expr}," in batch


def _schema_objects(cur) -> dict:
    """Definitions of the messages table's indexes and of the constraints that own an index of it
    or reference it (foreign keys of other tables), to drop before the load and rebuild after."""
    cur.execute(
        "SELECT c.conname, c.contype, c.conrelid::regclass::text, pg_get_constraintdef(c.oid) FROM pg_constraint c "
        "WHERE (c.conrelid = 'messages'::regclass AND c.contype IN ('p', 'u')) "
        "OR (c.confrelid = 'messages'::regclass AND c.contype = 'f') ORDER BY c.conname"
    )
    constraints = [dict(zip(("name", "type", "table", "definition"), r)) for r in cur.fetchall()]
    cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'messages' ORDER BY indexname")
    indexes = dict(cur.fetchall())
    return {"constraints": constraints, "indexes": indexes}


def _parallel(database_url: str, statements_per_conn: list[list[str]], settings: list[str]) -> None:
    """Run each list of statements on its own connection, the lists at once; raise the first error."""
    errors: list[BaseException] = []

    def work(statements):
        conn, _ = harness._admin(database_url)
        try:
            with conn.cursor() as cur:
                for s in settings:
                    cur.execute(s)
                for s in statements:
                    t0 = time.perf_counter()
                    cur.execute(s)
                    print(f"  [{time.strftime('%H:%M:%S')}] {time.perf_counter() - t0:6.1f} s  {s[:90]}", flush=True)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
        finally:
            conn.close()

    workers = [threading.Thread(target=work, args=(s,)) for s in statements_per_conn if s]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


def load_messages(database_url: str, conn, vector_sql: str, connections: int, results: dict) -> None:
    """Move bench_stage into messages with vectors, indexes dropped; rebuild them; VACUUM ANALYZE."""
    from relay.models import SEARCH_VERSION

    cur = conn.cursor()
    before = _schema_objects(cur)
    constraint_indexes = {c["name"] for c in before["constraints"] if c["table"] == "messages"}
    for c in before["constraints"]:  # foreign keys onto messages first
        if c["type"] == "f":
            cur.execute(f'ALTER TABLE {c["table"]} DROP CONSTRAINT "{c["name"]}"')
    for c in before["constraints"]:
        if c["type"] != "f":
            cur.execute(f'ALTER TABLE messages DROP CONSTRAINT "{c["name"]}"')
    for name in before["indexes"]:
        if name not in constraint_indexes:
            cur.execute(f'DROP INDEX "{name}"')
    cur.execute("ANALYZE bench_stage")
    cur.execute("SELECT pg_relation_size('bench_stage') / current_setting('block_size')::int")
    (blocks,) = cur.fetchone()
    columns = ", ".join(MESSAGE_COLUMNS)
    source = ", ".join(f"messages.{c}" for c in MESSAGE_COLUMNS)
    insert = (
        f"INSERT INTO messages ({columns}, search_vector, search_version) "
        f"SELECT {source}, {vector_sql}, {SEARCH_VERSION} FROM bench_stage AS messages "
        "WHERE messages.ctid >= '({lo},0)'::tid AND messages.ctid < '({hi},0)'::tid"
    )
    # Ranges of about 250k rows, dealt out to the connections in turn.
    step = max(1, min(blocks, 8000))
    ranges = [(lo, min(lo + step, blocks + 1)) for lo in range(0, blocks + 1, step)]
    per_conn = [[] for _ in range(connections)]
    for i, (lo, hi) in enumerate(ranges):
        per_conn[i % connections].append(insert.replace("{lo}", str(lo)).replace("{hi}", str(hi)))
    t0 = time.perf_counter()
    _parallel(database_url, per_conn, ["SET session_replication_role = replica", "SET synchronous_commit = off"])
    results["vectors_seconds"] = round(time.perf_counter() - t0, 1)
    cur.execute("DROP TABLE bench_stage")
    # Rebuild: the constraint indexes first as plain unique indexes (built at once with the
    # others), attached to their constraints afterwards.
    builds = list(before["indexes"].values())
    gin = [d for d in builds if "USING gin" in d]  # the longest build, on a connection of its own
    rest = [d for d in builds if "USING gin" not in d]
    settings = ["SET maintenance_work_mem = '1GB'", "SET max_parallel_maintenance_workers = 1"]
    t0 = time.perf_counter()
    _parallel(database_url, [gin, rest] if connections > 1 else [gin + rest], settings)
    for c in before["constraints"]:
        if c["type"] == "p":
            cur.execute(f'ALTER TABLE messages ADD CONSTRAINT "{c["name"]}" PRIMARY KEY USING INDEX "{c["name"]}"')
        elif c["type"] == "u":
            cur.execute(f'ALTER TABLE messages ADD CONSTRAINT "{c["name"]}" UNIQUE USING INDEX "{c["name"]}"')
    for c in before["constraints"]:
        if c["type"] == "f":
            cur.execute(f'ALTER TABLE {c["table"]} ADD CONSTRAINT "{c["name"]}" {c["definition"]}')
    results["index_build_seconds"] = round(time.perf_counter() - t0, 1)
    after = _schema_objects(cur)
    results["schema_rebuilt_identically"] = after == before
    if after != before:
        results["schema_before"], results["schema_after"] = before, after
    t0 = time.perf_counter()
    cur.execute("SET maintenance_work_mem = '1GB'")
    cur.execute("VACUUM ANALYZE")
    results["vacuum_seconds"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    cur.execute("CHECKPOINT")  # the load's dirty pages written now, not during the timed phase
    results["checkpoint_seconds"] = round(time.perf_counter() - t0, 1)
    cur.close()


def _check_vectors(conn, vector_sql: str, sample: int = 2000) -> dict:
    """Stored vectors against the definition evaluated now, on a random sample."""
    from relay.models import SEARCH_VERSION

    with conn.cursor() as cur:
        cur.execute(
            f"SELECT count(*), count(*) FILTER (WHERE messages.search_vector IS DISTINCT FROM {vector_sql}), "
            f"count(*) FILTER (WHERE messages.search_version IS DISTINCT FROM {SEARCH_VERSION}) "
            f"FROM (SELECT * FROM messages TABLESAMPLE BERNOULLI (1) LIMIT {sample}) AS messages"
        )
        checked, differ, wrong_version = cur.fetchone()
        cur.execute("SELECT count(*) FROM messages WHERE search_vector IS NULL")
        (unindexed,) = cur.fetchone()
        cur.execute(
            "SELECT count(*) FROM messages WHERE search_vector IS NOT NULL AND index_error IS NULL "
            f"AND coalesce(search_version, 1) < {SEARCH_VERSION}"
        )
        (stale,) = cur.fetchone()
    return {
        "sampled": checked,
        "differ": differ,
        "wrong_version": wrong_version,
        "unindexed": unindexed,
        "stale": stale,
    }


# -- timing, load and coordination ----------------------------------------------------------


def _timed(fn, n: int) -> dict:
    """p50/p95/p99/max of ``n`` calls, and the cyclic GC's pauses among them (a tail's usual cause)."""
    samples, pauses, started = [], [], [0.0]

    def gc_pause(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], (time.perf_counter() - started[0]) * 1000))

    gc.callbacks.append(gc_pause)
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1000)
    finally:
        gc.callbacks.remove(gc_pause)
    samples.sort()
    full = [ms for generation, ms in pauses if generation == 2]
    return {
        "p50_ms": statistics.median(samples),
        "p95_ms": samples[int(len(samples) * 0.95) - 1],
        "p99_ms": samples[int(len(samples) * 0.99) - 1],
        "max_ms": samples[-1],
        "n": n,
        "gc": {
            "collections": len(pauses),
            "total_ms": round(sum(ms for _, ms in pauses), 1),
            "full_collections": len(full),
            "full_max_ms": round(max(full), 1) if full else 0.0,
        },
    }


def _explain_sql(sql: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of ``sql``; of an ``EXECUTE`` of a prepared statement, its generic plan
    (the plan a connection settles on), prepared first on the explaining connection, or its custom
    plan when ``sql`` asks for one (``statements.CUSTOM_PLAN``: the feed's and tasks/list's pages)."""
    from relay.extensions import db
    from relay.services.statements import CUSTOM_PLAN, Statement

    mode = "force_generic_plan"
    if sql.startswith(CUSTOM_PLAN + "; "):
        sql, mode = sql[len(CUSTOM_PLAN) + 2 :], "force_custom_plan"
    with db.engine.connect() as conn:
        if sql.lstrip().upper().startswith("EXECUTE "):
            prepared = Statement.named[sql.split()[1].split("(")[0]]
            done = conn.connection.info.setdefault("relay_prepared", set())  # as Statement.ready keeps it
            if prepared.name not in done:
                conn.exec_driver_sql(prepared.prepare_sql.replace("%", "%%"))
                done.add(prepared.name)
            conn.exec_driver_sql(f"SET LOCAL plan_cache_mode = {mode}")
        rows = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + sql.replace("%", "%%")).all()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def _statement_text(sql: str) -> str:
    """The SQL a captured statement runs: an ``EXECUTE``'s prepared text, else itself."""
    from relay.services.statements import CUSTOM_PLAN, Statement

    sql = sql.removeprefix(CUSTOM_PLAN + "; ")
    if sql.lstrip().upper().startswith("EXECUTE "):
        prepared = Statement.named.get(sql.split()[1].split("(")[0])
        return prepared.prepare_sql if prepared else ""
    return sql


def _explain(app, fn) -> str:
    """Run fn once capturing its SQL; return EXPLAIN (ANALYZE, BUFFERS) of the longest statement."""
    from relay.extensions import db

    captured = []

    def grab(conn, cursor, statement, parameters, context, executemany):
        captured.append(cursor.mogrify(statement, parameters).decode())

    engine = db.engine
    event.listen(engine, "before_cursor_execute", grab)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    queries = [
        s for s in captured if s.lstrip().upper().startswith(("SELECT", "EXECUTE ", "SET LOCAL PLAN_CACHE_MODE"))
    ]
    main_sql = max(queries, key=lambda s: len(_statement_text(s)))
    return _explain_sql(main_sql)


def _explain_raw(sql: str, params: dict) -> str:
    """EXPLAIN of a statement a service runs on a raw DBAPI cursor (not seen by the engine's events)."""
    from relay.extensions import db

    raw = db.engine.raw_connection()
    try:
        cur = raw.cursor()
        statement = cur.mogrify(sql, params).decode()
        cur.close()
    finally:
        raw.close()
    return _explain_sql(statement)


def _seq_scan(plan: str) -> bool:
    return any(f"Seq Scan on {t}" in plan for t in ("messages", "threads"))


def wait_for_log(path: str | None, timeout: float = 20 * 60, poll: float = 30.0) -> dict | None:
    """Wait until ``path`` (another benchmark's log) holds "results written to"; a missing file is done."""
    if not path:
        return None
    t0 = time.monotonic()
    while True:
        try:
            done = "results written to" in Path(path).read_text(errors="replace")
        except FileNotFoundError:
            done = True
        waited = round(time.monotonic() - t0)
        if done or waited >= timeout:
            if waited:
                print(f"  waited {waited} s for {path} ({'done' if done else 'timed out'})", flush=True)
            return {"waited_s": waited, "done": done}
        print(f"  [{time.strftime('%H:%M:%S')}] another benchmark is running ({path}); waiting", flush=True)
        time.sleep(poll)


def wait_for_idle(below_pct: float | None, timeout: float = 20 * 60) -> dict | None:
    """Before a timed phase (this process idle), wait until the machine's CPU is below ``below_pct``
    busy over 5 s, at most ``timeout`` s; then time anyway."""
    if not below_pct:
        return None
    t0 = time.monotonic()
    while True:
        busy = psutil.cpu_percent(5.0)
        waited = round(time.monotonic() - t0)
        if busy < below_pct or waited >= timeout:
            return {"waited_s": waited, "busy_pct_at_start": busy, "quiet": busy < below_pct}
        print(f"  [{time.strftime('%H:%M:%S')}] machine {busy:.0f}% busy; waiting for < {below_pct:g}%", flush=True)
        time.sleep(10.0)


class Load:
    """The machine's CPU during a phase: all busy time, less this process and the bench database's backends."""

    def __init__(self, database_url: str):
        self.admin, url = harness._admin(database_url)
        self.dbname = url.database
        self.samples: list[float] = []
        self._stop = threading.Event()

    def _ours(self) -> dict[int, float]:
        with self.admin.cursor() as cur:
            cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.dbname,))
            pids = [r[0] for r in cur.fetchall()]
        out = {}
        for pid in [os.getpid(), *pids]:
            try:
                t = psutil.Process(pid).cpu_times()
                out[pid] = t.user + t.system
            except psutil.Error:
                pass
        return out

    def __enter__(self):
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self.t0, self.cpu0, self.ours0 = time.monotonic(), psutil.cpu_times(), self._ours()
        return self

    def _sample(self):
        psutil.cpu_percent(None)
        while not self._stop.wait(1.0):
            self.samples.append(psutil.cpu_percent(None))

    def __exit__(self, *exc):
        seconds, cpu1, ours1 = time.monotonic() - self.t0, psutil.cpu_times(), self._ours()
        self._stop.set()
        self._sampler.join()
        self.admin.close()
        d = {f: getattr(cpu1, f) - getattr(self.cpu0, f) for f in cpu1._fields}
        busy = sum(v for f, v in d.items() if f not in ("idle", "iowait", "steal", "guest", "guest_nice"))
        ours = sum(v - self.ours0.get(pid, 0.0) for pid, v in ours1.items())
        cores = psutil.cpu_count()
        self.result = {
            "seconds": round(seconds, 1),
            "cores": cores,
            "busy_cores": round(busy / seconds, 3),
            "bench_cores": round(ours / seconds, 3),
            "other_cores": round(max(0.0, busy - ours) / seconds, 3),
            "other_busy_pct_of_machine": round(100 * max(0.0, busy - ours) / seconds / cores, 1),
            "steal_pct_of_machine": round(100 * d.get("steal", 0.0) / seconds / cores, 1),
            "iowait_pct_of_machine": round(100 * d.get("iowait", 0.0) / seconds / cores, 1),
            "sampled_total_busy_pct": {
                "mean": round(statistics.mean(self.samples), 1) if self.samples else None,
                "max": round(max(self.samples), 1) if self.samples else None,
            },
            "note": "bench = this process + the bench database's backends (incl. its autovacuum); "
            "other = every other process, incl. PostgreSQL's shared background writers",
        }
        return False


@contextmanager
def timing_flag(path: str | None):
    """The flag file the other engineer's runs watch: present only while a timed phase runs."""
    if path:
        Path(path).write_text(f"bench scale timing, pid {os.getpid()}\n")
    try:
        yield
    finally:
        if path:
            Path(path).unlink(missing_ok=True)


def _sizes(conn) -> dict:
    mib = 1024 * 1024
    with conn.cursor() as cur:
        cur.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid), "
            "coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), c.reltuples::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r' "
            "ORDER BY pg_total_relation_size(c.oid) DESC"
        )
        tables = {
            r[0]: {
                "total_mib": round(r[1] / mib, 1),
                "heap_mib": round(r[2] / mib, 1),
                "indexes_mib": round(r[3] / mib, 1),
                "toast_mib": round(r[4] / mib, 1),
                "rows_estimate": r[5],
            }
            for r in cur.fetchall()
        }
        cur.execute(
            "SELECT i.relname, t.relname, pg_relation_size(i.oid) FROM pg_class i JOIN pg_index x ON x.indexrelid = i.oid "
            "JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = i.relnamespace "
            "WHERE n.nspname = 'public' ORDER BY pg_relation_size(i.oid) DESC"
        )
        indexes = {r[0]: {"table": r[1], "mib": round(r[2] / mib, 1)} for r in cur.fetchall()}
        cur.execute("SELECT pg_database_size(current_database())")
        (database,) = cur.fetchone()
    return {"database_mib": round(database / mib, 1), "tables": tables, "indexes": indexes}


def _settings(conn) -> dict:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT name, setting, unit FROM pg_settings WHERE name IN ('shared_buffers', 'work_mem', "
            "'effective_cache_size', 'random_page_cost', 'jit', 'max_parallel_workers_per_gather', 'server_version')"
        )
        return {n: f"{s}{'' if u is None else ' ' + u}" for n, s, u in cur.fetchall()}


def _tree_state() -> dict:
    """HEAD plus whether relay/ differs from it (another engineer edits it while this runs)."""
    try:
        diff = subprocess.run(
            ["git", "diff", "HEAD", "--stat", "--", "relay"], cwd=harness.ROOT, capture_output=True, text=True
        ).stdout.strip()
    except FileNotFoundError:
        diff = ""
    return {"relay_dirty": bool(diff), "relay_diff_stat": diff.splitlines()[-1] if diff else ""}


# -- the burst ------------------------------------------------------------------------------


def _seed_burst(conn, seeded: dict, burst: int, agents: int) -> list[uuid.UUID]:
    """COPY ``burst`` new messages (in new threads of 20) with no vector, as the web tier writes them."""
    rnd, agent_ids = seeded["rnd"], seeded["agent_ids"]
    per, start0 = 20, datetime.now(UTC)
    threads = []
    for t in range((burst + per - 1) // per):
        s, r = rnd.randrange(agents), rnd.randrange(agents)
        if s == r:
            s = (s + 1) % agents
        start = start0 + timedelta(seconds=t)
        threads.append((_ulid_uuid(start), s, r, start, min(per, burst - t * per)))
    conn.autocommit = False
    with conn.cursor() as cur:
        _copy_threads(cur, threads, agent_ids)
        _create_stage(cur)
        cur.copy_expert(
            f"COPY bench_stage ({', '.join(STAGE_COLUMNS)}) FROM STDIN",
            _Stream(_message_chunks(rnd, threads, seeded["agent_strs"])),
            size=1 << 20,
        )
        columns = ", ".join(MESSAGE_COLUMNS)
        cur.execute(f"INSERT INTO messages ({columns}) SELECT {columns} FROM bench_stage ORDER BY n RETURNING id")
        ids = [r[0] for r in cur.fetchall()]
        cur.execute("DROP TABLE bench_stage")
    conn.commit()
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE messages")
        cur.execute("CHECKPOINT")
    return [uuid.UUID(str(i)) for i in ids]


def _time_burst(ids: list[uuid.UUID], batch: int) -> dict:
    from relay.services import search

    per_batch, written = [], 0
    t0 = time.perf_counter()
    for i in range(0, len(ids), batch):
        b0 = time.perf_counter()
        written += search.index_messages(ids[i : i + batch])
        per_batch.append((time.perf_counter() - b0) * 1000)
    seconds = time.perf_counter() - t0
    per_batch.sort()
    return {
        "messages": len(ids),
        "indexed": written,
        "batch": batch,
        "batches": len(per_batch),
        "seconds": round(seconds, 2),
        "messages_per_s": round(len(ids) / seconds),
        "batch_p50_ms": round(statistics.median(per_batch), 1),
        "batch_p95_ms": round(per_batch[int(len(per_batch) * 0.95) - 1], 1),
        "batch_max_ms": round(per_batch[-1], 1),
    }


# -- the run --------------------------------------------------------------------------------


def scale(
    messages: int,
    threads: int,
    agents: int,
    queries: int,
    *,
    big_thread: int = 1000,
    burst: int = 100_000,
    burst_batch: int = 500,
    index_connections: int = 2,
    simple_vectors: bool = False,
    wait_log: str | None = None,
    timing_flag_path: str | None = None,
    idle_below: float | None = None,
) -> dict:
    from relay.factory import create_app
    from relay.models import SEARCH_VERSION, Agent
    from relay.services import feed
    from relay.services import threads as thread_service

    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        **_tree_state(),
        "messages": messages,
        "threads": threads,
        "agents": agents,
        "big_thread_messages": big_thread,
        "queries": {},
        "plans": {},
        "waits": {},
    }
    results["waits"]["seed"] = wait_for_log(wait_log)
    with harness.fresh_database("relay_scale") as database_url:
        app = create_app(harness.base_env(database_url))
        with app.app_context():
            vector_sql, verbatim = _vector_sql(simple_vectors)
        results["vectors"] = {
            "definition": "simplified: " + SIMPLE_VECTOR
            if simple_vectors
            else "relay.services.search.document_vector(), compiled",
            "verbatim_in_indexer_update": verbatim,
        }
        print(f"[{time.strftime('%H:%M:%S')}] seeding {messages} messages", flush=True)
        t0 = time.perf_counter()
        seeded = seed(database_url, messages, threads, agents, big_thread)
        results["seed_seconds"] = round(time.perf_counter() - t0, 1)
        results["messages_written"] = seeded["written"]
        print(f"[{time.strftime('%H:%M:%S')}] seeded in {results['seed_seconds']} s; indexing", flush=True)
        conn = seeded["conn"]
        results["waits"]["index"] = wait_for_log(wait_log)
        t0 = time.perf_counter()
        load_messages(database_url, conn, vector_sql, index_connections, results)
        results["index_seconds"] = round(time.perf_counter() - t0, 1)
        results["vector_check"] = _check_vectors(conn, vector_sql)
        results["postgres"] = _settings(conn)
        print(f"[{time.strftime('%H:%M:%S')}] indexed in {results['index_seconds']} s", flush=True)
        with app.test_request_context():
            from relay.extensions import db

            busy = db.session.scalar(select(Agent).where(Agent.handle == seeded["handles"][0]))
            idents = list(db.session.scalars(select(Agent).where(Agent.handle.in_(seeded["handles"][:200]))))
            big_reader = db.session.scalar(
                select(Agent).where(Agent.handle == seeded["handles"][seeded["big_thread_agents"][1]])
            )
            deep_offset = messages // 200
            deep = db.session.execute(
                text(
                    "SELECT created_at, id FROM messages WHERE target_id = :a ORDER BY created_at DESC, id DESC OFFSET :n LIMIT 1"
                ),
                {"a": busy.id, "n": deep_offset},
            ).first()
            deep_cursor = (deep.created_at, deep.id)  # deep into the busy agent's inbound feed
            results["deep_cursor_offset"] = deep_offset
            db.session.rollback()
            big_id = seeded["big_thread_id"]
            cases = {
                "feed first page": lambda: feed.list_messages(busy),
                "feed first page (200 identities)": None,
                "feed deep cursor page": lambda: feed.list_messages(busy, cursor=deep_cursor),
                "q common word": lambda: feed.list_messages(busy, q="endpoint"),
                "q rare word": lambda: feed.list_messages(busy, q=RARE),
                "tasks/list busy inbox": lambda: thread_service.list_threads(busy, role="recipient", limit=50),
            }
            rotating = iter(idents * (queries // max(1, len(idents)) + 2))
            cases["feed first page (200 identities)"] = lambda: (lambda a: feed.list_messages(a))(next(rotating))
            # Also a common word for ordinary identities (about messages/agents rows a
            # side, where the planner may choose the word's whole GIN bitmap over walking the feed index).
            rotating_q = iter(idents * (queries // max(1, len(idents)) + 2))
            cases["q common word (200 identities)"] = lambda: feed.list_messages(next(rotating_q), q="endpoint")
            # The rotating cases' plans: one ordinary identity (not one of the ten busy ones).
            ordinary = next(a for a in idents if a.handle == seeded["handles"][150 % agents])
            explain_as = {
                "feed first page (200 identities)": lambda: feed.list_messages(ordinary),
                "q common word (200 identities)": lambda: feed.list_messages(ordinary, q="endpoint"),
            }
            results["plan_identity_of_rotating_cases"] = ordinary.handle
            if big_id is not None:
                cases[f"tasks/get {big_thread}-message thread"] = lambda: thread_service.get_thread(big_reader, big_id)
                # Its first and last pages of 50, a read that fits an agent's context
                # (docs/decisions.md, "Paged reads and bounded answers").
                cases[f"tasks/get {big_thread}-message thread, messages_limit=50"] = lambda: thread_service.get_thread(
                    big_reader, big_id, messages_limit=50
                )
                cases[f"tasks/get {big_thread}-message thread, messages_limit=50 after {big_thread - 50}"] = lambda: (
                    thread_service.get_thread(big_reader, big_id, messages_limit=50, messages_after=big_thread - 50)
                )
            results["waits"]["timing"] = wait_for_log(wait_log)
            results["waits"]["timing_idle"] = wait_for_idle(idle_below)
            print(f"[{time.strftime('%H:%M:%S')}] timing", flush=True)
            with timing_flag(timing_flag_path), Load(database_url) as load:
                for name, fn in cases.items():
                    fn()  # warm
                    results["queries"][name] = _timed(fn, queries)
                    if name.startswith("tasks/get"):
                        from relay.services.threads.read import _GET_MESSAGES_SQL, _GET_PAGE, _GET_THREAD_SQL

                        if "messages_limit" in name:
                            after = big_thread - 50 if "after" in name else 0
                            plan = _explain_raw(_GET_PAGE.sql, {"id": big_id, "after": after, "n": 51})
                        else:
                            plan = _explain_raw(_GET_MESSAGES_SQL, {"id": big_id})
                        results["plans"][name] = plan
                        results["plans"][name + " (thread row)"] = thread_plan = _explain_raw(
                            _GET_THREAD_SQL, {"id": big_id}
                        )
                        results["queries"][name]["seq_scan"] = _seq_scan(plan) or _seq_scan(thread_plan)
                    else:
                        plan = _explain(app, explain_as.get(name, fn))
                        results["plans"][name] = plan
                        results["queries"][name]["seq_scan"] = _seq_scan(plan)
            results["timing_load"] = load.result
            results["sizes"] = _sizes(conn)
            if burst:
                print(f"[{time.strftime('%H:%M:%S')}] burst of {burst} unindexed messages", flush=True)
                ids = _seed_burst(conn, seeded, burst, agents)
                results["waits"]["burst"] = wait_for_log(wait_log)
                results["waits"]["burst_idle"] = wait_for_idle(idle_below)
                with timing_flag(timing_flag_path), Load(database_url) as load:
                    results["burst_indexing"] = _time_burst(ids, burst_batch)
                results["burst_indexing"]["load"] = load.result
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT count(*) FROM messages WHERE id = ANY(%s::uuid[]) AND search_vector IS NOT NULL "
                        "AND search_version = %s",
                        ([str(i) for i in ids], SEARCH_VERSION),
                    )
                    results["burst_indexing"]["verified_indexed"] = cur.fetchone()[0]
            db.session.remove()
        conn.close()
        db_engine_dispose(app)
    results["targets"] = _targets(results)
    return results


def db_engine_dispose(app) -> None:
    """Close the app's pooled connections so the database can be dropped."""
    with app.app_context():
        from relay.extensions import db

        db.engine.dispose()


TARGETS = {  # p95 ceilings in ms a run must stay under (docs/performance.md, "At scale")
    "feed first page": 15.0,
    "feed first page (200 identities)": 15.0,
    "feed deep cursor page": 15.0,
    "q common word": 50.0,
    "q common word (200 identities)": 50.0,
    "tasks/list busy inbox": 15.0,
}


def _targets(results: dict) -> dict:
    out = {}
    for name, ceiling in TARGETS.items():
        fig = results["queries"].get(name)
        if fig is not None:
            out[name] = {"p95_ms": round(fig["p95_ms"], 2), "ceiling_ms": ceiling, "met": fig["p95_ms"] <= ceiling}
    out["no seq scan on messages/threads"] = {"met": not any(f.get("seq_scan") for f in results["queries"].values())}
    return out


def print_scale(results: dict) -> None:
    print(
        f"\nscale bench {results['date']} commit {results['commit']}{' (relay/ modified)' if results.get('relay_dirty') else ''}: "
        f"{results['messages_written']} messages, {results['threads']} threads (+1 of {results['big_thread_messages']}), "
        f"{results['agents']} agents"
    )
    print(
        f"seed {results['seed_seconds']} s, index {results['index_seconds']} s (vectors {results.get('vectors_seconds')} s, "
        f"index builds {results.get('index_build_seconds')} s, vacuum {results.get('vacuum_seconds')} s, "
        f"checkpoint {results.get('checkpoint_seconds')} s); "
        f"vectors: {results['vectors']['definition']}"
        + ("" if results["vectors"].get("verbatim_in_indexer_update") else " (NOT verbatim the indexer's statement)")
    )
    print(f"{'query':<36}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}  seq scan  target")
    for name, fig in results["queries"].items():
        target = results.get("targets", {}).get(name)
        mark = "" if target is None else f"{'met' if target['met'] else 'MISSED'} (<= {target['ceiling_ms']:g})"
        print(
            f"{name:<36}{fig['p50_ms']:>9.2f}{fig['p95_ms']:>9.2f}{fig.get('p99_ms', 0):>9.2f}{fig.get('max_ms', 0):>9.2f}"
            f"  {'YES' if fig['seq_scan'] else 'no':<8}  {mark}"
        )
    gcs = [
        f"{n} {f['gc']['full_collections']}x {f['gc']['full_max_ms']} ms"
        for n, f in results["queries"].items()
        if f.get("gc", {}).get("full_collections")
    ]
    if gcs:
        print("full GC pauses in the timed loops (count x longest): " + "; ".join(gcs))
    load = results.get("timing_load")
    if load:
        print(
            f"timed phase: {load['seconds']} s, other load {load['other_cores']} cores "
            f"({load['other_busy_pct_of_machine']}% of machine), bench {load['bench_cores']} cores"
        )
    b = results.get("burst_indexing")
    if b:
        print(
            f"burst: {b['messages']} messages indexed in {b['seconds']} s ({b['messages_per_s']}/s) by index_messages "
            f"in batches of {b['batch']} (batch p50 {b['batch_p50_ms']} ms, p95 {b['batch_p95_ms']} ms); "
            f"other load {b['load']['other_cores']} cores"
        )
    sizes = results.get("sizes")
    if sizes:
        print(f"database {sizes['database_mib']} MiB")
        for name, t in list(sizes["tables"].items())[:4]:
            print(f"  {name:<28} total {t['total_mib']:>9} MiB  heap {t['heap_mib']:>9}  indexes {t['indexes_mib']:>9}")
        for name, i in sizes["indexes"].items():
            if i["table"] in ("messages", "threads"):
                print(f"    {name:<40} {i['mib']:>9} MiB")
