"""Housekeeping use cases run by Celery beat, and the record of when each sweep last ran."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import redis

from relay.extensions import redis_client
from relay.ids import iso

log = logging.getLogger("relay.beat")

#: The sweeps beat schedules (their task names in workers.tasks, without the module).
SWEEPS = ("sweep_outbox", "index_pending_messages", "retention", "settle_due")
#: Redis key prefix of "when did this sweep last finish" (``<prefix><sweep>``, no expiry).
SWEEP_KEY_PREFIX = "relay:beat:last_sweep:"


def _seconds(redis_time: tuple[int, int]) -> float:
    return redis_time[0] + redis_time[1] / 1_000_000


def record_sweep(name: str) -> None:
    """Note that sweep ``name`` just finished, on Redis's clock (every reader uses the same one).

    Never raises for Redis: a sweep that did its work must not fail for its record, and
    a Redis outage shows as a growing age anyway. The failure is logged as a warning.
    """
    if name not in SWEEPS:
        raise ValueError(f"unknown sweep {name!r}")
    try:
        client = redis_client()
        client.set(SWEEP_KEY_PREFIX + name, repr(_seconds(client.time())))
    except redis.RedisError as exc:
        log.warning("could not record the %s sweep in Redis (%s)", name, type(exc).__name__)


def beat_status() -> dict | None:
    """When the beat sweeps last ran, or None when Redis cannot be read.

    ``{"last_sweep": iso, "age_seconds": float, "sweeps": {name: {"last_sweep", "age_seconds"}}}``;
    the top-level pair is the most recent sweep of any kind, and every value is None for a
    sweep that never ran (beat never started, or no worker ran its tasks). A beat that died
    shows as an ``age_seconds`` growing past the sweep intervals (3 s, 10 s, 1 h).
    """
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.mget([SWEEP_KEY_PREFIX + name for name in SWEEPS])
            now_raw, stamps = pipe.execute()
    except redis.RedisError:
        return None
    now = _seconds(now_raw)
    ran = {name: _float(raw) for name, raw in zip(SWEEPS, stamps, strict=True)}
    last = max((at for at in ran.values() if at is not None), default=None)
    return {**_when(last, now), "sweeps": {name: _when(at, now) for name, at in ran.items()}}


def _float(raw: bytes | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:  # not a record of ours: as if never
        return None


def _when(at: float | None, now: float) -> dict:
    if at is None:
        return {"last_sweep": None, "age_seconds": None}
    return {"last_sweep": iso(datetime.fromtimestamp(at, UTC)), "age_seconds": round(max(0.0, now - at), 3)}
