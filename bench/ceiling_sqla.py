"""A ceiling that pings each checkout: bench/ceiling.py's views through SQLAlchemy.

Its engine pings each checkout (``pool_pre_ping``), a round trip a request the bare
ceiling does not spend: ``python -m bench run`` measures it once beside the bare one, to
show what that cost, and reports every ratio against the bare one only.
"""

from __future__ import annotations

from flask import Flask
from sqlalchemy import create_engine, text

from relay.config import load_settings

app = Flask(__name__)
_settings = load_settings()  # the relay's own pool settings, so the two pools are alike
engine = create_engine(
    _settings.database_url,
    pool_size=_settings.db_pool_size,
    max_overflow=_settings.db_max_overflow,
    pool_pre_ping=True,
)


@app.post("/insert")
def insert():
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO bench_ceiling (payload) VALUES (:p)"), {"p": "x" * 200})
    return {"ok": True}


@app.get("/select")
def select_rows():
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, payload, created_at FROM bench_ceiling ORDER BY id DESC LIMIT 50")).all()
    return {"items": [{"id": r.id, "payload": r.payload, "created_at": r.created_at.isoformat()} for r in rows]}
