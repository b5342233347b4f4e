"""The web tier's own settings: a bad value stops start-up with one line naming it.

Before, ``RELAY_HEADER_TIMEOUT=abc`` made every gunicorn worker exit at boot and the
arbiter start another, for ever (189 boots in 18 s under ``relay up``), and
``WEB_CONNECTIONS=zero`` printed a traceback from ``gunicorn.conf.py``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from relay.ops.embedded import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _gunicorn(base_env: dict, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "gunicorn"), "app:app", "--config", str(ROOT / "gunicorn.conf.py")],
        env={**base_env, "HOST": "127.0.0.1", "PORT": str(free_port()), "WEB_CONCURRENCY": "1", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("name", ["RELAY_HEADER_TIMEOUT", "RELAY_BODY_TIMEOUT", "RELAY_CLIENT_IDLE_TIMEOUT"])
@pytest.mark.parametrize("raw", ["abc", "-5", "0"])
def test_a_bad_timeout_stops_the_web_server_with_one_line(base_env, name, raw):
    done = _gunicorn(base_env, **{name: raw})
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "configuration error" in line]
    assert lines and all(name in line for line in lines), done.stderr[-2000:]
    assert len(lines) <= 2, f"the worker was booted again and again:\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr


# WEB_CONCURRENCY is read by gunicorn itself before any config file runs (its own default).
@pytest.mark.parametrize("name", ["WEB_CONNECTIONS", "PORT", "GUNICORN_TIMEOUT", "GUNICORN_KEEPALIVE"])
def test_a_bad_integer_in_gunicorn_conf_is_one_line_not_a_traceback(base_env, name):
    done = _gunicorn(base_env, **{name: "zero"})
    assert done.returncode != 0
    assert f"{name} must be a positive integer" in done.stderr
    assert "Traceback" not in done.stderr


def test_config_check_refuses_a_bad_timeout(base_env):
    done = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "config", "check"],
        env={**base_env, "RELAY_BODY_TIMEOUT": "soon"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "RELAY_BODY_TIMEOUT" in done.stderr


@pytest.mark.parametrize(
    "name", ["GUNICORN_KEEPALIVE", "WEB_CONNECTIONS", "PORT", "GUNICORN_GRACEFUL_TIMEOUT", "CELERY_CONCURRENCY"]
)
@pytest.mark.parametrize("command", [["config", "check"], ["up"]])
def test_config_check_and_relay_up_refuse_a_bad_process_integer_in_one_line(base_env, tmp_path, name, command):
    """relay.config.process_integer: what gunicorn.conf.py would refuse after relay up's banner
    (or a traceback, for PORT) is refused first, in one line, and nothing starts."""
    done = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", *command],
        env={**base_env, "RELAY_HOME": str(tmp_path / "home"), name: "abc"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip() == f"error: {name} must be a positive integer, got 'abc'"
    assert "serving" not in done.stdout


@pytest.mark.parametrize(
    "name, raw, error",
    [
        ("PORT", "70000", "PORT must be at most 65535, got '70000'"),
        ("WEB_CONCURRENCY", "100000", "WEB_CONCURRENCY must be at most 256, got '100000'"),
        ("HOST", "999.1.1.1", "HOST must be an IP address or a host name such as 127.0.0.1, got '999.1.1.1'"),
        ("PORT", "８０", "PORT must be a positive integer, got '８０'"),
        ("HOST", "my host", "HOST must be an IP address or a host name such as 127.0.0.1, got 'my host'"),
        ("HOST", "-relay.local", "HOST must be an IP address or a host name such as 127.0.0.1, got '-relay.local'"),
    ],
)
@pytest.mark.parametrize("command", [["config", "check"], ["up"]])
def test_config_check_and_relay_up_refuse_a_port_out_of_range_or_a_bad_host(
    base_env, tmp_path, name, raw, error, command
):
    done = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", *command],
        env={**base_env, "RELAY_HOME": str(tmp_path / "home"), name: raw},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr.strip()) == (1, f"error: {error}"), done.stdout
    assert "serving" not in done.stdout


def test_config_check_prints_every_process_setting_by_name(base_env, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "config", "check"],
        env={
            **base_env,
            "RELAY_HOME": str(tmp_path / "home"),
            "HOST": "::1",
            "PORT": "65535",
            "CELERY_CONCURRENCY": "3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shown = dict(line.split(None, 1) for line in done.stdout.splitlines() if line and not line.startswith(" "))
    assert (shown["HOST"], shown["PORT"], shown["CELERY_CONCURRENCY"]) == ("::1", "65535", "3")
    assert {"WEB_CONCURRENCY", "WEB_CONNECTIONS", "GUNICORN_TIMEOUT", "GUNICORN_KEEPALIVE"} <= shown.keys()


def test_a_second_relay_up_on_one_relay_home_is_refused(base_env, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with open(home / "relay-up.lock", "a+") as held:  # as a running relay up holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Its own process group, ended whatever happens: without the lock it would start a
        # whole stack on the session's Redis, whose worker would take other tests' tasks.
        proc = subprocess.Popen(
            [str(BIN / "relay"), "up", "--port", str(free_port())],
            env={**base_env, "RELAY_HOME": str(home), "REDIS_URL": "redis://127.0.0.1:1/0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 1
    assert "already running" in stderr and str(home) in stderr


def test_relay_up_refuses_a_home_that_is_a_file_a_path_with_a_space_and_a_busy_port(base_env, tmp_path):
    import socket

    def up(**env):
        return subprocess.run(
            [sys.executable, "-m", "relay.ops.cli", "up", "--port", str(env.pop("port", free_port()))],
            env={**base_env, "REDIS_URL": "redis://127.0.0.1:1/0", **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    done = up(RELAY_HOME=str(a_file / "home"))
    assert (done.returncode, done.stderr.count("\n")) == (1, 1) and "cannot be a folder" in done.stderr, done.stderr
    spaced = {k: v for k, v in base_env.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "relay.ops.cli", "up", "--port", str(free_port())],
        env={**spaced, "RELAY_HOME": str(tmp_path / "My Projects" / ".relay")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "cannot run under a path with a space" in done.stderr, done.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = up(RELAY_HOME=str(tmp_path / "home"), port=port)
    assert done.returncode == 1 and done.stderr.strip() == (
        f"error: port {port} is in use on 127.0.0.1; stop what uses it, or pass --port"
    ), done.stderr
    assert "serving" not in done.stdout


def _limits_after_conf(base_env: dict, soft: int, hard: int, connections: str) -> tuple[tuple[int, int], str]:
    """Run gunicorn.conf.py under an open-file limit of (soft, hard); return the limit it leaves and its output."""
    import resource

    probe = (
        "import resource, runpy\n"
        "runpy.run_path('gunicorn.conf.py')\n"
        "print('limit', *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**base_env, "WEB_CONNECTIONS": connections},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("limit "))
    got_soft, got_hard = (int(n) for n in line.split()[1:])
    return (got_soft, got_hard), done.stdout


def test_the_open_file_limit_is_raised_to_fit_web_connections(base_env):
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 6000:
        pytest.skip(f"this machine's hard open-file limit is {hard}")
    (soft, kept_hard), out = _limits_after_conf(base_env, 1024, min(hard, 20000), "5000")
    assert soft >= 5000 + 256, out
    assert kept_hard == min(hard, 20000)
    assert "open files are limited" not in out


def test_a_hard_limit_below_web_connections_is_said_in_one_line(base_env):
    (soft, hard), out = _limits_after_conf(base_env, 1024, 2048, "5000")
    assert (soft, hard) == (2048, 2048)
    [line] = [line for line in out.splitlines() if "open files are limited" in line]
    assert "WEB_CONNECTIONS=5000" in line and "2048" in line
