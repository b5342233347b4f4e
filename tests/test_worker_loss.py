"""A worker killed mid-attempt: its claimed delivery is sent again as soon
as a live worker notices its heartbeat stopped, not when the claim's lease runs out, and the
delivery log shows the attempt the dead worker made.

The Procfile's stack runs as subprocesses (tests/test_drills.py's ``drill_stack``) on a
private Redis; the receiver holds the first request of each ``webhook-id`` open without
answering, so the worker's attempt is in flight when its process group gets SIGKILL.
With ``RELAY_WEBHOOK_TIMEOUT=10`` the lease is 40 s; the heartbeat's stale period is 5 s.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from relay.services.delivery.common import IN_FLIGHT, OUTCOME_UNKNOWN
from tests.test_drills import _query, drill_stack, poll, private_redis, shared_database, stack_env, timed_send

__all__ = ["private_redis", "shared_database"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(240)
LEASE = 40.0  # RELAY_WEBHOOK_TIMEOUT (10) + 30 s


class HoldingReceiver:
    """Holds the first request of each webhook-id open (never answers it); answers 200 to the rest."""

    def __init__(self):
        self.lock = threading.Lock()
        self.arrivals: list[tuple[str, float]] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                wid = self.headers.get("webhook-id", "")
                with outer.lock:
                    first = all(w != wid for w, _ in outer.arrivals)
                    outer.arrivals.append((wid, time.monotonic()))
                if first:
                    outer.release.wait(120)  # the sender dies meanwhile
                    return
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def times(self, wid: str) -> list[float]:
        with self.lock:
            return [t for w, t in self.arrivals if w == wid]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_killed_workers_delivery_is_sent_again_after_its_heartbeat_stops_and_logged(
    shared_database, private_redis, tmp_path
):
    rx = HoldingReceiver()
    env = stack_env(shared_database, private_redis.url, tmp_path, RELAY_WEBHOOK_TIMEOUT="10")
    try:
        with drill_stack(env, tmp_path, rx) as (stack, key_a, _key_b):
            sent = timed_send(stack.base, key_a, "held by the receiver")
            assert sent.ok, (sent.status, sent.body, sent.error)
            got = poll(lambda: [w for w, _ in rx.arrivals], 30, 0.05)
            assert got, f"the webhook never reached the receiver:\n{stack.tails()}"
            wid = got[0]
            # The attempt is in the delivery log before the receiver has answered it.
            rows = _query(shared_database, "SELECT status_code, error FROM webhook_attempts")
            assert rows == [(None, IN_FLIGHT)], rows
            claimed = _query(shared_database, "SELECT count(*) FROM webhook_deliveries WHERE claimed_by IS NOT NULL")[
                0
            ][0]
            assert claimed == 1, "the claim does not name its worker"

            worker = stack.proc("worker")
            stack.kill_group(worker, signal.SIGKILL)
            worker.wait(timeout=10)
            killed_at = time.monotonic()
            stack.start("worker")

            again = poll(lambda: len(rx.times(wid)) >= 2, LEASE, 0.1)
            assert again, f"not sent again within the {LEASE:.0f} s lease:\n{stack.tails()}"
            after = rx.times(wid)[1] - killed_at
            # Well before the lease: the new worker's heartbeat held 5 s, then it reaped the dead one.
            assert after < LEASE / 2, f"sent again {after:.1f} s after the kill: that is the lease, not the heartbeat"

            done = poll(
                lambda: _query(shared_database, "SELECT status FROM webhook_deliveries") == [("succeeded",)], 30, 0.2
            )
            assert done, _query(shared_database, "SELECT status, last_error FROM webhook_deliveries")
            log = _query(shared_database, "SELECT status_code, error FROM webhook_attempts ORDER BY attempted_at")
            assert log == [(None, OUTCOME_UNKNOWN), (200, None)], log
            workers = _query(shared_database, "SELECT count(*) FROM relay_workers")[0][0]
            assert workers == 1, f"{workers} worker rows: the dead one was not removed"
            print(json.dumps({"sent_again_after_kill_s": round(after, 2)}))
    finally:
        rx.close()


@pytest.mark.parametrize(("name", "raw"), [("RELAY_WORKER_STALE", "1"), ("RELAY_WORKER_HEARTBEAT", "0")])
def test_a_stale_period_too_short_for_the_heartbeat_is_refused_naming_it(name, raw):
    from relay.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=name):
        load_settings({"DATABASE_URL": "postgresql://p@127.0.0.1/d", "REDIS_URL": "redis://x", name: raw})
