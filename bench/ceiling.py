"""The bare ceiling: Flask and psycopg2 under the relay's own gunicorn config and worker class.

``POST /insert`` does one ``INSERT``, then ``COMMIT`` (the least a durable handoff can
cost) and ``GET /select`` reads 50 rows in one statement; every relay figure is reported
as a ratio to these (docs/performance.md). No ORM, no checkout ping, no Redis: a pool of plain
connections the size of the relay's (``RELAY_DB_POOL_SIZE`` + ``RELAY_DB_MAX_OVERFLOW``,
so both wait alike for a connection), on the URL the relay's processes use
(``DATABASE_CONNECTION_POOL_URL`` when set, so pooled mode measures the same pooler).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
from flask import Flask

from relay.config import load_settings

app = Flask(__name__)
_settings = load_settings()
_url = _settings.app_database_url.replace("postgresql+psycopg2://", "postgresql://")
_size = _settings.connections_per_process
# A LIFO queue of connections opened on first use: under gevent (the worker patches
# threading and psycopg2 with psycogreen) a request past the size waits for one to come back.
_idle: queue.LifoQueue = queue.LifoQueue()
_opened = 0


@contextmanager
def connection() -> Iterator[psycopg2.extensions.connection]:
    global _opened
    try:
        conn = _idle.get_nowait()
    except queue.Empty:
        if _opened < _size:
            _opened += 1
            conn = psycopg2.connect(_url)
        else:
            conn = _idle.get(timeout=_settings.db_pool_timeout)
    try:
        yield conn
    except BaseException:
        conn.rollback()
        raise
    finally:
        _idle.put(conn)


@app.post("/insert")
def insert():
    with connection() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO bench_ceiling (payload) VALUES (%s)", ("x" * 200,))
        conn.commit()
    return {"ok": True}


@app.get("/select")
def select_rows():
    with connection() as conn:
        conn.autocommit = True  # one statement, no BEGIN/COMMIT: the least a read costs
        with conn.cursor() as cur:
            cur.execute("SELECT id, payload, created_at FROM bench_ceiling ORDER BY id DESC LIMIT 50")
            rows = cur.fetchall()
        conn.autocommit = False
    return {"items": [{"id": r[0], "payload": r[1], "created_at": r[2].isoformat()} for r in rows]}
