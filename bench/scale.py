"""``python -m bench scale``: feed, search and inbox queries at a million messages.

Seeds with COPY (not the API), then times each query server-side (the service call,
without HTTP) and saves ``EXPLAIN (ANALYZE, BUFFERS)`` of each, checking that no plan
scans messages or threads sequentially.
"""

from __future__ import annotations

import io
import json
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import event, select, text

from bench import harness
from bench.run import git_commit

COMMON = ["endpoint", "refactor", "tests", "cursor", "review", "deploy", "schema", "client"]
FILLER = (
    "the users api now returns items and next_cursor please update the client and rerun the "
    "integration tests before merging this change to main"
).split()
RARE = "zanzibar"  # about one message in ten thousand


def _ulid_uuid(ts: datetime) -> uuid.UUID:
    from ulid import ULID

    return ULID.from_datetime(ts).to_uuid()


def _copy(cur, table: str, columns: list[str], rows) -> None:
    buf = io.StringIO()
    for row in rows:
        buf.write(
            "\t".join(
                r"\N" if v is None else str(v).replace("\\", "\\\\").replace("\t", " ").replace("\n", " ") for v in row
            )
            + "\n"
        )
    buf.seek(0)
    cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", buf)


def seed(database_url: str, messages: int, threads: int, agents: int) -> dict:
    """Write agents, threads and messages with COPY; return what the queries need."""
    conn, _ = harness._admin(database_url)
    conn.autocommit = False
    rnd = random.Random(42)
    now = datetime.now(UTC)
    cur = conn.cursor()
    agent_ids = [uuid.uuid4() for _ in range(agents)]
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
        thread_rows.append((_ulid_uuid(start), sender, recipient, start))
    _copy(
        cur,
        "threads",
        [
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
        ],
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
                per_thread,
                start.isoformat(),
                (start + timedelta(minutes=per_thread)).isoformat(),
            )
            for tid, s, r, start in thread_rows
        ),
    )
    written = 0
    batch = []
    for tid, s, r, start in thread_rows:
        for seq in range(1, per_thread + 1):
            words = rnd.sample(FILLER, 8) + [rnd.choice(COMMON)]
            if rnd.random() < 0.0001:
                words.append(RARE)
            body = " ".join(words)
            author = s if seq % 2 else r
            batch.append(
                (
                    uuid.uuid4(),
                    tid,
                    seq,
                    agent_ids[author],
                    agent_ids[s],
                    agent_ids[r],
                    "caller" if seq % 2 else "agent",
                    body,
                    json.dumps([{"type": "text", "text": body}]),
                    "[]",
                    "{}",
                    (start + timedelta(minutes=seq)).isoformat(),
                )
            )
            written += 1
        if len(batch) >= 100_000:
            _copy(
                cur,
                "messages",
                [
                    "id",
                    "thread_id",
                    "sequence_no",
                    "author_id",
                    "caller_id",
                    "target_id",
                    "role",
                    "body",
                    "parts",
                    "artifacts",
                    "metadata",
                    "created_at",
                ],
                batch,
            )
            batch = []
    if batch:
        _copy(
            cur,
            "messages",
            [
                "id",
                "thread_id",
                "sequence_no",
                "author_id",
                "caller_id",
                "target_id",
                "role",
                "body",
                "parts",
                "artifacts",
                "metadata",
                "created_at",
            ],
            batch,
        )
    conn.commit()
    conn.autocommit = True
    return {"agent_ids": agent_ids, "handles": handles, "written": written, "conn": conn}


def _timed(fn, n: int) -> dict:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p95_ms": samples[int(len(samples) * 0.95) - 1], "n": n}


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
    main_sql = max((s for s in captured if s.lstrip().upper().startswith("SELECT")), key=len)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + main_sql.replace("%", "%%")).all()
    return "\n".join(r[0] for r in rows)


def scale(messages: int, threads: int, agents: int, queries: int) -> dict:
    from relay.factory import create_app
    from relay.models import Agent
    from relay.services import feed
    from relay.services import threads as thread_service

    results: dict = {
        "date": datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "messages": messages,
        "threads": threads,
        "agents": agents,
        "queries": {},
        "plans": {},
    }
    with harness.fresh_database("relay_scale") as database_url:
        t0 = time.perf_counter()
        seeded = seed(database_url, messages, threads, agents)
        results["seed_seconds"] = round(time.perf_counter() - t0, 1)
        conn = seeded["conn"]
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            # The worker's own expression, applied in bulk (the beat sweep does the same in batches).
            cur.execute("SET maintenance_work_mem = '512MB'")
            cur.execute("UPDATE messages SET search_vector = setweight(to_tsvector('english', body), 'A')")
            cur.execute("VACUUM ANALYZE")
        results["index_seconds"] = round(time.perf_counter() - t0, 1)
        conn.close()
        app = create_app(harness.base_env(database_url))
        with app.test_request_context():
            from relay.extensions import db

            busy = db.session.scalar(select(Agent).where(Agent.handle == seeded["handles"][0]))
            idents = list(db.session.scalars(select(Agent).where(Agent.handle.in_(seeded["handles"][:200]))))
            deep = db.session.execute(
                text(
                    "SELECT created_at, id FROM messages WHERE target_id = :a ORDER BY created_at DESC, id DESC OFFSET :n LIMIT 1"
                ),
                {"a": busy.id, "n": min(5000, messages // 200)},
            ).first()
            deep_cursor = (deep.created_at, deep.id)  # deep into the busy agent's inbound feed
            cases = {
                "feed first page": lambda: feed.list_messages(busy),
                "feed first page (200 identities)": None,
                "feed deep cursor page": lambda: feed.list_messages(busy, cursor=deep_cursor),
                "q common word": lambda: feed.list_messages(busy, q="endpoint"),
                "q rare word": lambda: feed.list_messages(busy, q=RARE),
                "tasks/list busy inbox": lambda: thread_service.list_threads(busy, role="recipient", limit=50),
            }
            rotating = iter(idents * (queries // max(1, len(idents)) + 1))
            cases["feed first page (200 identities)"] = lambda: (lambda a: feed.list_messages(a))(next(rotating))
            for name, fn in cases.items():
                fn()  # warm
                results["queries"][name] = _timed(fn, queries)
                plan = _explain(app, fn)
                results["plans"][name] = plan
                results["queries"][name]["seq_scan"] = any(f"Seq Scan on {t}" in plan for t in ("messages", "threads"))
    return results


def print_scale(results: dict) -> None:
    print(
        f"\nscale bench {results['date']} commit {results['commit']}: {results['messages']} messages, "
        f"{results['threads']} threads, {results['agents']} agents (seed {results['seed_seconds']} s, "
        f"index {results['index_seconds']} s)"
    )
    print(f"{'query':<36}{'p50 ms':>9}{'p95 ms':>9}  seq scan")
    for name, fig in results["queries"].items():
        print(f"{name:<36}{fig['p50_ms']:>9.2f}{fig['p95_ms']:>9.2f}  {'YES' if fig['seq_scan'] else 'no'}")
