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
import requests

from relay.ops.embedded import free_port

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


def _matching_processes(needles: list[str]) -> list[tuple[int, str]]:
    """Processes (other than this one) whose command line contains one of ``needles``."""
    patterns = [
        re.compile(r"(?<![0-9])" + re.escape(n) + r"(?![0-9])") if n.isdigit() else re.compile(re.escape(n))
        for n in needles
    ]
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["pid"] == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        args = " ".join(proc.info["cmdline"] or [])
        if any(p.search(args) for p in patterns):
            found.append((proc.info["pid"], args))
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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


def _kill_everything(up: subprocess.Popen, needles: list[str], pids: set[int]) -> None:
    """Last resort so a failing test leaves no orphans: only processes this test started."""
    if up.poll() is None:
        try:
            os.killpg(up.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        up.wait(10)
    for pid, _args in _matching_processes(needles):
        pids.add(pid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_relay_up_serves_on_embedded_servers_and_stops_cleanly_on_sigterm(tmp_path):
    home = tmp_path / "h"
    log = tmp_path / "up.log"
    port = free_port()
    env = _up_env(home)
    needles = [str(home), str(port)]
    descendants: set[int] = set()
    with open(log, "wb") as out:
        up = subprocess.Popen(
            _relay_cmd("up", "--port", str(port)),
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_healthy(up, f"http://127.0.0.1:{port}/healthz", log)

        recorded = dict(line.split("=", 1) for line in (home / "relay.env").read_text().splitlines())
        redis_port = int(re.search(r":(\d+)/", recorded["REDIS_URL"]).group(1))
        needles.append(str(redis_port))
        descendants = {p.pid for p in psutil.Process(up.pid).children(recursive=True)}
        descendants |= {pid for pid, _ in _matching_processes(needles)}

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

        me = requests.get(
            f"http://127.0.0.1:{port}/api/v1/identities/me", headers={"Authorization": f"Bearer {api_key}"}, timeout=10
        )
        assert me.status_code == 200
        assert me.json()["handle"] == "frank@acme"

        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"relay up ignored SIGTERM:\n{log.read_text()[-4000:]}") from None

        assert _matching_processes(needles) == []
        assert [pid for pid in sorted(descendants) if _alive(pid)] == []
        assert not _port_open(port)
        assert not _port_open(redis_port)
        assert not (home / "relay.env").exists()
    finally:
        _kill_everything(up, needles, descendants)
        shutil.rmtree(home, ignore_errors=True)
