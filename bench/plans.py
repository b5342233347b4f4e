"""``python -m bench plans``: the feed's first page and tasks/list as the ledger grows, and their plans.

On one fresh database the ledger grows to each of ``--sizes`` threads (``INSERT ... SELECT``
in SQL: a ring of agents, each thread one message, every fourth three, a second apart;
``ANALYZE`` after the first size, or after each with ``--analyze-each``). At each size, for the feed's first page
and a tasks/list page (the statements the relay runs, with its parameters):

- ``EXPLAIN (ANALYZE, BUFFERS)`` of the prepared statement's custom plan and of its generic
  plan (``SET LOCAL plan_cache_mode``), and of the plan a connection that prepared it at the
  first size runs, saved under ``RESULTS/plans/{grown,analyzed}/``;
- the statement alone on a bare psycopg2 connection, serially: its plain text, and the
  prepared one as ``Statement`` runs it (PostgreSQL's choice after five runs), on a
  connection that prepared it at the first size and on a fresh one, with how many
  generic and custom plans ``pg_prepared_statements`` counted;
- the relay's request, serially through the Flask test client (``create_app``, bearer
  key, its own pool whose connections live across the sizes as a web process's do), with
  ``RELAY_DB_PREPARE`` on and off, ``--repeats`` rounds alternating, medians.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import psycopg2.extras

from bench import harness
from bench.run import git_commit

AGENTS = 8
SIZES = (500, 25_000, 100_000)
EPOCH = "2026-01-01T00:00:00Z"  # the first thread's time; each next one a second later

# Thread g: agent g % n sends to agent (g + 1) % n; one message, three for every fourth.
_GROW = """
WITH a AS (SELECT array_agg(id ORDER BY handle) AS ids, count(*)::int AS n FROM agents),
t AS (
    INSERT INTO threads (id, context_id, sender_id, recipient_id, intent, summary, state, version,
                         last_sequence_no, created_at, updated_at, priority)
    SELECT gen_random_uuid(), gen_random_uuid(), a.ids[1 + g %% a.n], a.ids[1 + (g + 1) %% a.n], 'inform',
           'bench thread ' || g, 'pending', 1, CASE WHEN g %% 4 = 0 THEN 3 ELSE 1 END,
           %(epoch)s::timestamptz + g * interval '1 second',
           %(epoch)s::timestamptz + g * interval '1 second' + CASE WHEN g %% 4 = 0 THEN interval '2 ms' ELSE
           interval '0' END, 'normal'
    FROM a, generate_series(%(first)s, %(last)s) g
    RETURNING id, sender_id, recipient_id, created_at, last_sequence_no
)
INSERT INTO messages (id, thread_id, sequence_no, author_id, caller_id, target_id, role, body, parts,
                      artifacts, metadata, created_at)
SELECT gen_random_uuid(), t.id, s, CASE WHEN s %% 2 = 1 THEN t.sender_id ELSE t.recipient_id END,
       t.sender_id, t.recipient_id, CASE WHEN s %% 2 = 1 THEN 'caller' ELSE 'agent' END,
       'please refactor the users endpoint; pagination uses a cursor',
       '[{"type": "text", "text": "please refactor the users endpoint; pagination uses a cursor"}]',
       '[]', '{}', t.created_at + (s - 1) * interval '1 ms'
FROM t, generate_series(1, t.last_sequence_no) s
"""


def _grow(url: str, first: int, last: int, analyze: bool) -> float:
    conn, _ = harness._admin(url)
    try:
        t0 = time.monotonic()
        if last >= first:
            with conn.cursor() as cur:
                cur.execute(_GROW, {"epoch": EPOCH, "first": first, "last": last})
        if analyze:
            harness.analyze(url)
        return round(time.monotonic() - t0, 1)
    finally:
        conn.close()


def _p50(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(samples), 3)


def _serial(cur, sql: str, params: dict, n: int) -> float:
    """p50 of ``n`` runs of ``sql`` on ``cur``, rows fetched."""

    def run():
        cur.execute(sql, params)
        cur.fetchall()

    return _p50(run, n)


def _app(url: str, prepare: str):
    from relay.factory import create_app

    return create_app(harness.base_env(url, {"RELAY_DB_PREPARE": prepare, "RELAY_LOG_LEVEL": "ERROR"}))


def _requests(client, handle: str, key: str) -> dict:
    """The two requests as bench run's clients send them (bench/closed_loop.py)."""
    auth = {"Authorization": f"Bearer {key}"}

    def feed():
        r = client.get(f"/api/v1/identities/{handle}/a2a/messages?limit=50", headers=auth)
        assert r.status_code == 200, r.data[:300]

    def tasks_list():
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {"page": {"limit": 50}}}
        r = client.post("/a2a", json=body, headers=auth)
        assert r.status_code == 200 and b'"result"' in r.data, r.data[:300]

    return {"feed": feed, "tasks_list": tasks_list}


def _statements(app, calls: dict) -> dict:
    """Each request's page statement (psycopg2 text) and parameters, as the relay sent it (PREPARE off)."""
    from sqlalchemy import event

    from relay.extensions import db
    from relay.services import feed
    from relay.services.threads.listing import _LIST_PAGES

    pages = {"feed": feed._PAGES, "tasks_list": _LIST_PAGES}
    out = {}
    with app.app_context():
        engine = db.engine
    for name, fn in calls.items():
        captured: list = []

        def grab(conn, cursor, statement, parameters, context, executemany, shapes=pages[name], captured=captured):
            if any(statement == s.sql for s in shapes._statements.values()):
                captured.append((statement, dict(parameters)))

        event.listen(engine, "before_cursor_execute", grab)
        try:
            fn()
        finally:
            event.remove(engine, "before_cursor_execute", grab)
        out[name] = captured[-1]
    return out


def _explain(conn, prepared, params: dict, mode: str) -> str:
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"SET LOCAL plan_cache_mode = {mode}")
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + prepared.execute_sql, params)
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("ROLLBACK")
    return plan


def _ensure_prepared(conn, prepared) -> None:
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_prepared_statements WHERE name = %s", (prepared.name,))
        if cur.fetchone() is None:
            cur.execute(prepared.prepare_sql)


def _counts(conn, prepared) -> dict:
    with conn.cursor() as cur:
        cur.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s", (prepared.name,))
        generic, custom = cur.fetchone()
    return {"generic_plans": generic, "custom_plans": custom}


def _bare(url: str, kept: dict, statements: dict, calls: int, folder: Path, size: int) -> dict:
    """The statements alone on bare connections: EXPLAINs saved, plain and prepared serial p50s."""
    from relay.services.statements import Statement

    out = {}
    fresh, _ = harness._admin(url)
    try:
        for name, (sql, params) in statements.items():
            prepared = Statement(sql)
            for conn in (fresh, kept["conn"]):
                _ensure_prepared(conn, prepared)
            # The custom and generic plans of now, and the plan the connection prepared at the
            # first size runs (its cached generic plan, unless PostgreSQL planned it again).
            for label, conn, mode in (
                ("custom", fresh, "force_custom_plan"),
                ("generic", fresh, "force_generic_plan"),
                ("kept", kept["conn"], "auto"),
            ):
                plan = _explain(conn, prepared, params, mode)
                (folder / f"{size}-{name}-{label}.txt").write_text(plan + "\n")
            entry = {}
            with fresh.cursor() as cur:
                entry["plain_p50_ms"] = _serial(cur, sql, params, calls)
            for label, conn in (("prepared_fresh", fresh), ("prepared_kept", kept["conn"])):
                with conn.cursor() as cur:
                    entry[f"{label}_p50_ms"] = _serial(cur, prepared.execute_sql, params, calls)
                entry[f"{label}_plans"] = _counts(conn, prepared)
            # As the relay sends a read planned on each call: SET LOCAL and EXECUTE in one message.
            with fresh.cursor() as cur:
                custom = Statement(sql, custom_plan=True).execute_sql
                entry["prepared_custom_p50_ms"] = _serial(cur, custom, params, calls)
            out[name] = entry
    finally:
        fresh.close()
    return out


def plans_bench(
    sizes=SIZES, calls: int = 200, repeats: int = 3, results: Path | None = None, analyze_each: bool = False
) -> dict:
    """Grow one fresh database through ``sizes`` (threads); at each, the plans and p50s above.

    ``ANALYZE`` runs after the first size only (as bench run's seed does; this server's
    autovacuum is off, and a production one analyzes a table only after a tenth of it
    changed), or with ``analyze_each`` after every size.
    """
    from relay.services import agents

    psycopg2.extras.register_uuid()
    folder = (results or harness.ROOT / "bench" / "results") / "plans" / ("analyzed" if analyze_each else "grown")
    folder.mkdir(parents=True, exist_ok=True)
    out: dict = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": git_commit(), "calls": calls}
    out |= {"repeats": repeats, "agents": AGENTS, "analyze_each": analyze_each, "sizes": {}}
    with harness.fresh_database("relay_bench_plans") as url:
        apps = {"prepare_on": _app(url, "1"), "prepare_off": _app(url, "0")}
        with apps["prepare_off"].app_context():
            made = [agents.create_agent(f"a{i}@plans", f"A{i}", "bench") for i in range(AGENTS)]
        handle, key = made[0][0].handle, made[0][1].api_key
        clients = {mode: _requests(app.test_client(), handle, key) for mode, app in apps.items()}
        kept_conn, _ = harness._admin(url)
        kept = {"conn": kept_conn}
        done = 0
        try:
            for size in sizes:
                grew_s = _grow(url, done, size - 1, analyze=analyze_each or not done)
                done = size
                for calls_of_mode in clients.values():  # warm: the first calls prepare and settle
                    for fn in calls_of_mode.values():
                        for _ in range(10):
                            fn()
                statements = _statements(apps["prepare_off"], clients["prepare_off"])
                entry: dict = {"grow_s": grew_s, "bare": _bare(url, kept, statements, calls, folder, size)}
                runs: dict = {mode: {name: [] for name in clients[mode]} for mode in clients}
                for _ in range(repeats):
                    for mode, calls_of_mode in clients.items():
                        for name, fn in calls_of_mode.items():
                            runs[mode][name].append(_p50(fn, calls))
                entry["relay"] = {
                    mode: {name: {"p50_ms": statistics.median(v), "runs": v} for name, v in by_name.items()}
                    for mode, by_name in runs.items()
                }
                out["sizes"][str(size)] = entry
                print(f"{size} threads: {json.dumps(entry)}", flush=True)
        finally:
            kept_conn.close()
            for app in apps.values():
                with app.app_context():
                    from relay.extensions import db

                    db.engine.dispose()
    return out


def print_plans(results: dict) -> None:
    print(f"{'threads':>8} {'path':<11} {'on':>7} {'off':>7} {'bare':>7} {'kept':>7} {'custom':>7}")
    for size, entry in results["sizes"].items():
        for name in ("feed", "tasks_list"):
            relay, bare = entry["relay"], entry["bare"][name]
            print(
                f"{size:>8} {name:<11} {relay['prepare_on'][name]['p50_ms']:>7.2f} "
                f"{relay['prepare_off'][name]['p50_ms']:>7.2f} {bare['plain_p50_ms']:>7.2f} "
                f"{bare['prepared_kept_p50_ms']:>7.2f} {bare['prepared_custom_p50_ms']:>7.2f}"
            )
