"""The beat process: it starts whatever RELAY_HOME is, idle sweeps are quiet, and /readyz
and /metrics show when the sweeps last ran."""

from __future__ import annotations

import logging
import os
import re
import secrets
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from honcho.environ import parse_procfile

from relay.services import maintenance
from tests.conftest import rpc, sql
from tests.live import claimed_redis_db, stop_group

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = {
    "sweep_outbox": "workers.tasks.sweep_outbox",
    "index_pending_messages": "workers.tasks.index_pending_messages",
    "retention": "workers.tasks.retention",
    "settle_due": "workers.tasks.settle_due",
}


@pytest.fixture(autouse=True)
def sweep_records(monkeypatch, redis_url):
    """Keep this module's sweep records under a private Redis prefix (Redis is shared), removed after."""
    prefix = f"relay-test-{secrets.token_hex(4)}:beat:last_sweep:"
    monkeypatch.setattr(maintenance, "SWEEP_KEY_PREFIX", prefix)
    yield prefix
    conn = redis.Redis.from_url(redis_url)
    for key in conn.scan_iter(match=prefix + "*"):
        conn.delete(key)
    conn.close()


def _task(celery_app, name):
    import workers.tasks  # noqa: F401  (registers the shared tasks on the app's Celery)

    return celery_app.tasks[SWEEPS.get(name, name)]


# --------------------------------------------------------------------------- 1: beat starts


def _wait_for(proc: subprocess.Popen, log: Path, what: str, found, timeout: float = 60.0) -> None:
    """Poll until ``found()``; fail loudly, with the log, if beat exits or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not found():
        if proc.poll() is not None:
            raise AssertionError(f"beat exited ({proc.returncode}) before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n{log.read_text()}")
        time.sleep(0.1)


@pytest.fixture
def beat_broker(redis_url):
    """A Redis db of its own for a beat process (tests/live.py): its sweeps go to the default
    queue there, where no other test's worker (or a parallel run's) takes them."""
    with claimed_redis_db(redis_url) as url:
        yield url


@pytest.mark.parametrize("home", ["missing", "blocked"])
def test_the_procfile_beat_starts_whatever_relay_home_is(base_env, beat_broker, tmp_path, home):
    """``missing``: RELAY_HOME does not exist yet (created); ``blocked``: it cannot be created
    (a file in the way), so the schedule is kept in memory. Either way beat keeps running."""
    if home == "missing":
        relay_home = tmp_path / "not" / "created" / "yet"
    else:
        (tmp_path / "a-file").write_text("in the way")
        relay_home = tmp_path / "a-file" / "home"
    command = parse_procfile((ROOT / "Procfile").read_text()).processes["beat"]
    env = {
        **base_env,
        "REDIS_URL": beat_broker,
        "RELAY_HOME": str(relay_home),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + base_env.get("PATH", ""),
    }
    log = tmp_path / "beat.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", f"exec {command}"],
            env=env,
            cwd=ROOT,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(proc, log, "its start line", lambda: "beat: Starting" in log.read_text())
        # celery opens the schedule right after that line; it used to die there.
        if home == "missing":
            _wait_for(proc, log, "the schedule file", lambda: any(relay_home.glob("celerybeat-schedule*")))
        else:
            _wait_for(proc, log, "the in-memory warning", lambda: "keeping the schedule in memory" in log.read_text())
        time.sleep(1.5)
        assert proc.poll() is None, f"beat exited ({proc.returncode}):\n{log.read_text()}"
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        stop_group(proc)


# --------------------------------------------------------------------------- 2: quiet when idle


def test_idle_sweeps_log_nothing(celery_app, caplog):
    caplog.set_level(logging.INFO)
    assert _task(celery_app, "sweep_outbox")() == {"fanned_out": 0, "due": 0, "redrives_resumed": 0}
    assert _task(celery_app, "index_pending_messages")() == 0
    # Nothing to make or drop in a database migrated today (its partitions are made ahead).
    report = _task(celery_app, "retention")()
    assert set(report.pop("floors")) == {"webhook_deliveries", "events"}  # raised by the pass
    assert report == {"created": [], "dropped": [], "skipped": [], "threads_deleted": 0}
    # ... and through celery's tracer, as a worker runs them ("Task ... succeeded in ...").
    for name in SWEEPS:
        _task(celery_app, name).apply()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def test_a_sweep_that_did_something_logs_one_line_with_its_counts(app, client, alice, bob, celery_app, caplog):
    rpc(client, alice[1], "message/send", {"recipient": bob[0], "message": {"parts": [{"type": "text", "text": "x"}]}})
    # No worker runs here: the message stays unindexed and its events un-fanned-out, as after
    # a lost task. Age the events past the sweep's 2 s grace.
    sql(app, "UPDATE events SET created_at = now() - interval '1 minute'")
    [(events,)] = sql(app, "SELECT count(*) FROM events WHERE fanned_out_at IS NULL")
    assert events >= 1
    caplog.set_level(logging.INFO)

    def lines():
        return [r for r in caplog.records if r.name == "relay.beat" and r.levelno == logging.INFO]

    assert _task(celery_app, "sweep_outbox")() == {
        "fanned_out": 0,
        "due": 0,
        "redrives_resumed": 0,
    }  # no webhook subscribed
    [line] = lines()
    assert line.events == events and line.fanned_out == 0 and line.due == 0
    assert f"{events} events fanned out" in line.getMessage()

    caplog.clear()
    assert _task(celery_app, "index_pending_messages")() == 1
    [line] = lines()
    assert line.indexed == 1 and "1 messages indexed" in line.getMessage()

    # Done: the next round is idle again, and silent.
    caplog.clear()
    for name in SWEEPS:
        _task(celery_app, name)()
    assert lines() == []


def test_celery_drops_its_routine_lines_about_sweeps_but_keeps_errors_and_other_tasks(celery_app, caplog):
    from celery.app.trace import LOG_RECEIVED
    from celery.beat import Scheduler

    caplog.set_level(logging.INFO)
    scheduler = Scheduler(app=celery_app, lazy=True)
    sent = []
    scheduler.apply_async = lambda entry, producer=None, advance=False: sent.append(entry.task)
    sweep = scheduler.Entry(name="sweep-outbox", task="workers.tasks.sweep_outbox", schedule=3.0, app=celery_app)
    other = scheduler.Entry(name="other", task="workers.tasks.index_message", schedule=3.0, app=celery_app)

    def messages(level=logging.INFO):
        return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith("celery")]

    # beat, every 3 s: "Scheduler: Sending due task sweep-outbox (workers.tasks.sweep_outbox)".
    scheduler.apply_entry(sweep)
    assert sent == ["workers.tasks.sweep_outbox"]
    assert messages() == []
    scheduler.apply_entry(other)
    assert messages() == ["Scheduler: Sending due task other (workers.tasks.index_message)"]

    def refuse(entry, producer=None, advance=False):
        raise ConnectionError("broker down")

    caplog.clear()
    scheduler.apply_async = refuse
    scheduler.apply_entry(sweep)  # a failed send is still an error line
    assert any("broker down" in m for m in messages(logging.ERROR)), caplog.text

    # The worker: "Task ...[id] received" and "Task ...[id] succeeded in ...".
    caplog.clear()
    logging.getLogger("celery.worker.strategy").info(
        LOG_RECEIVED, {"id": "1", "name": "workers.tasks.sweep_outbox", "args": "()", "kwargs": "{}", "eta": None}
    )
    _task(celery_app, "sweep_outbox").apply()
    assert messages() == []
    # Nor the two lines per message of the tasks that feed the webhook pump.
    for name in ("message_committed", "fan_out_event", "deliver_webhook"):
        logging.getLogger("celery.worker.strategy").info(
            LOG_RECEIVED, {"id": "2", "name": f"workers.tasks.{name}", "args": "()", "kwargs": "{}", "eta": None}
        )
    assert messages() == []
    _task(celery_app, "workers.tasks.index_message").apply(args=[str(uuid.uuid4())])
    assert any(re.match(r"Task workers\.tasks\.index_message\[.*\] succeeded", m) for m in messages()), caplog.text


# --------------------------------------------------------------------------- 3: a dead beat shows


def _parse(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def test_readyz_shows_no_sweep_before_beat_ran_and_a_recent_one_after(client, celery_app):
    resp = client.get("/readyz")
    assert resp.status_code == 200
    never = {"last_sweep": None, "age_seconds": None}
    assert resp.get_json()["beat"] == {**never, "sweeps": dict.fromkeys(SWEEPS, never)}

    _task(celery_app, "sweep_outbox")()
    resp = client.get("/readyz")
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["status"] == "ok" and body["checks"] == {"database": "ok", "redis": "ok"}
    beat = body["beat"]
    assert abs((datetime.now(UTC) - _parse(beat["last_sweep"])).total_seconds()) < 10
    assert 0 <= beat["age_seconds"] < 10
    assert beat["sweeps"]["sweep_outbox"] == {"last_sweep": beat["last_sweep"], "age_seconds": beat["age_seconds"]}
    assert beat["sweeps"]["index_pending_messages"] == never


def test_a_stale_beat_is_shown_but_does_not_fail_readiness(client, redis_url, sweep_records):
    conn = redis.Redis.from_url(redis_url)
    now = conn.time()[0]
    conn.set(sweep_records + "sweep_outbox", str(now - 600))
    conn.set(sweep_records + "retention", str(now - 7200))
    conn.close()
    resp = client.get("/readyz")
    assert resp.status_code == 200
    beat = resp.get_json()["beat"]
    assert 600 <= beat["age_seconds"] < 620  # the most recent of the sweeps
    assert 7200 <= beat["sweeps"]["retention"]["age_seconds"] < 7220


def test_metrics_report_the_age_of_each_sweep_that_ran(client, celery_app):
    gauge = re.compile(r'^relay_beat_last_sweep_age_seconds\{sweep="(\w+)"\} ([0-9.e+-]+)$', re.MULTILINE)
    text = client.get("/metrics").get_data(as_text=True)
    assert "# TYPE relay_beat_last_sweep_age_seconds gauge" in text
    assert gauge.findall(text) == []
    _task(celery_app, "index_pending_messages")()
    samples = dict(gauge.findall(client.get("/metrics").get_data(as_text=True)))
    assert list(samples) == ["index_pending_messages"]
    assert 0 <= float(samples["index_pending_messages"]) < 10


def test_an_unreachable_redis_neither_fails_a_sweep_nor_the_reading(app, monkeypatch, caplog):
    dead = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5, socket_timeout=0.5)
    monkeypatch.setitem(app.extensions, "relay_redis", dead)
    with app.app_context():
        maintenance.record_sweep("sweep_outbox")
        assert maintenance.beat_status() is None
    assert any("could not record the sweep_outbox sweep" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError):
        with app.app_context():
            maintenance.record_sweep("no_such_sweep")
