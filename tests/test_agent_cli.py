"""relay-agent (relay/agent/cli/) as a real subprocess against a live relay.

An agent's CLI on the public API only. Every test runs the command
the way an agent would (``python -m relay.agent.cli`` or the installed ``relay-agent``
script) with ``RELAY_URL``/``RELAY_API_KEY`` in its environment and nothing of the
server's (no DATABASE_URL, no REDIS_URL); each call is bounded by a timeout.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from relay.agent.cli.artifacts import file_ref_artifact, split_diff
from relay.agent.cli.errors import OneLineUsage
from relay.agent.client import RelayClient
from tests.conftest import sql

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "relay-agent"
CALL_TIMEOUT = 60


@pytest.fixture
def keys(make_agent, relay_url, settled):
    """API keys of alice@acme and bob@acme on the live relay."""
    return {
        "alice": make_agent("alice@acme", name="Alice", role="frontend")[1],
        "bob": make_agent("bob@acme", name="Bob", role="backend")[1],
    }


@pytest.fixture
def run(relay_url, tmp_path):
    """Run relay-agent as a subprocess: ``run(key, *args, script=False, url=..., env=..., input=...)``.

    The environment is the test's minus every RELAY_*/DATABASE_URL/REDIS_URL variable,
    plus RELAY_URL/RELAY_API_KEY (None leaves one unset) and a private XDG_STATE_HOME.
    """
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith("RELAY_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    clean["XDG_STATE_HOME"] = str(tmp_path / "state")

    def _run(
        key: str | None,
        *args: str,
        script: bool = False,
        url: str | None = relay_url,
        env: dict | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        full = dict(clean, **(env or {}))
        if url is not None:
            full["RELAY_URL"] = url
        if key is not None:
            full["RELAY_API_KEY"] = key
        cmd = [str(SCRIPT)] if script else [sys.executable, "-m", "relay.agent.cli"]
        return subprocess.run(
            [*cmd, *args], env=full, cwd=tmp_path, capture_output=True, text=True, timeout=CALL_TIMEOUT, input=input
        )

    return _run


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def field(stdout: str, name: str) -> str:
    """A value of a ``key  value`` block (send/reply/whoami output)."""
    for line in stdout.splitlines():
        parts = line.split(None, 1)
        if parts and parts[0] == name:
            return parts[1].strip()
    raise AssertionError(f"no {name!r} line in:\n{stdout}")


DIFF = """diff --git a/src/a.py b/src/a.py
index 1111111..2222222 100644
--- a/src/a.py
+++ b/src/a.py
@@ -1,3 +1,3 @@
 def f():
-    return 1
+    return 2
 # end
"""


# --------------------------------------------------------------------------- 1. the docs/agents.md round trip


def test_readme_round_trip_with_the_installed_script(run, keys, tmp_path):
    assert SCRIPT.exists(), "pip install -e . did not install the relay-agent console script"
    alice, bob = keys["alice"], keys["bob"]
    (tmp_path / "change.diff").write_text(DIFF)

    sent = ok(
        run(
            alice,
            "send",
            "bob@acme",
            "Refactored f(); please update the callers",
            "--file-ref",
            "src/a.py:10-20",
            "--test-command",
            "pytest -q",
            "--link",
            "https://example.com/pr/1",
            "--artifact-file-diff",
            "change.diff",
            script=True,
        )
    )
    task_id = field(sent, "task_id")
    assert len(task_id) == 26 and field(sent, "state") == "pending"

    inbox = ok(run(bob, "inbox", script=True))
    [row] = [line for line in inbox.splitlines() if task_id in line]
    assert "pending" in row.split() and "alice@acme" in row.split()

    shown = ok(run(bob, "show", task_id, script=True))
    assert "Refactored f(); please update the callers" in shown
    assert "[file_diff] src/a.py" in shown and "+    return 2" in shown
    assert "[file_ref] src/a.py:10-20" in shown and "[test_command] pytest -q" in shown
    assert "[link] https://example.com/pr/1" in shown

    replied = ok(run(bob, "reply", task_id, "Looking now", script=True))
    assert field(replied, "message") == "#2"
    assert "accepted" in ok(run(bob, "accept", task_id, "--session-id", "s1", script=True))
    assert "completed" in ok(run(bob, "complete", task_id, "--summary", "done", script=True))

    final = json.loads(ok(run(alice, "show", task_id, "--json", script=True)))
    assert final["status"]["state"] == "completed" and final["result_summary"] == "done"
    assert [m["from"] for m in final["messages"]] == ["alice@acme", "bob@acme"]
    assert final["artifacts"] == [
        {"type": "file_diff", "path": "src/a.py", "diff": DIFF},
        {"type": "file_ref", "path": "src/a.py", "line_start": 10, "line_end": 20},
        {"type": "test_command", "command": "pytest -q"},
        {"type": "link", "url": "https://example.com/pr/1"},
    ]


# --------------------------------------------------------------------------- 2. --json


def test_json_output_parses_with_the_expected_keys(run, keys):
    sent = json.loads(ok(run(keys["alice"], "send", "bob@acme", "json please", "--intent", "ask_question", "--json")))
    assert {"task_id", "thread_id", "context_id", "status", "message_id", "sequence_no", "created_at"} <= set(sent)
    assert sent["status"]["state"] == "pending" and sent["sequence_no"] == 1

    inbox = json.loads(ok(run(keys["bob"], "inbox", "--status", "pending", "--json")))
    assert set(inbox) == {"items", "next_cursor"} and inbox["next_cursor"] is None
    [item] = inbox["items"]
    assert {
        "task_id",
        "status",
        "sender",
        "recipient",
        "summary_preview",
        "intent",
        "unread_messages",
        "created_at",
        "updated_at",
    } <= set(item)
    assert (item["task_id"], item["intent"], item["unread_messages"]) == (sent["task_id"], "ask_question", 1)

    shown = json.loads(ok(run(keys["bob"], "show", sent["task_id"], "--json")))
    assert {
        "task_id",
        "thread_id",
        "status",
        "sender",
        "recipient",
        "summary",
        "intent",
        "artifacts",
        "proposed_action",
        "messages",
        "created_at",
    } <= set(shown)
    assert shown["messages"][0]["body"] == "json please"

    sent_list = json.loads(ok(run(keys["alice"], "inbox", "--sent", "--json")))
    assert [t["task_id"] for t in sent_list["items"]] == [sent["task_id"]]


def test_propose_action_sends_the_proposal_and_the_diff(run, keys):
    out = json.loads(
        ok(
            run(
                keys["alice"],
                "send",
                "bob@acme",
                "Rename the helper",
                "--intent",
                "propose_action",
                "--proposed-description",
                "rename f to g",
                "--target-file",
                "src/a.py",
                "--target-file",
                "src/b.py",
                "--rationale",
                "clearer",
                "--artifact-file-diff",
                "-",
                "--json",
                input=DIFF,
            )
        )
    )
    shown = json.loads(ok(run(keys["bob"], "show", out["task_id"], "--json")))
    assert shown["intent"] == "propose_action"
    assert shown["proposed_action"] == {
        "description": "rename f to g",
        "target_files": ["src/a.py", "src/b.py"],
        "rationale": "clearer",
        "suggested_diff": DIFF,
    }
    assert shown["artifacts"] == [{"type": "file_diff", "path": "src/a.py", "diff": DIFF}]


# --------------------------------------------------------------------------- 3. errors


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _not_authorized(run, keys):
    task_id = json.loads(ok(run(keys["alice"], "send", "bob@acme", "cancel me?", "--json")))["task_id"]
    return run(keys["bob"], "cancel", task_id)


def _terminal(run, keys):
    task_id = json.loads(ok(run(keys["alice"], "send", "bob@acme", "finish me", "--json")))["task_id"]
    ok(run(keys["bob"], "accept", task_id))
    ok(run(keys["bob"], "complete", task_id, "--summary", "done"))
    return run(keys["bob"], "reply", task_id, "one more thing")


ERRORS = {
    # symbol: (trigger, a word of its hint)
    "not_authorized_transition": (_not_authorized, "only the sender cancels"),
    "thread_terminal": (_terminal, "start a new handoff with relay-agent send"),
    "unauthenticated": (lambda run, keys: run("ah_live_" + "a" * 32, "inbox"), "check RELAY_API_KEY"),
    "recipient_not_found": (lambda run, keys: run(keys["alice"], "send", "nobody@acme", "hi"), "check the handle"),
    "thread_not_found": (
        lambda run, keys: run(keys["alice"], "show", "01HXYZ4K2VNJQP7R8MWDB3CSTF"),
        "relay-agent inbox",
    ),
    "connection_error": (lambda run, keys: run(keys["alice"], "whoami", url=_closed_port()), "is RELAY_URL right"),
}


@pytest.mark.parametrize("symbol", list(ERRORS))
def test_a_relay_error_is_one_line_with_its_symbol_and_a_hint(run, keys, symbol):
    trigger, hint = ERRORS[symbol]
    proc = trigger(run, keys)
    assert proc.returncode == 1, proc
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: {symbol}: ") and "(hint: " in line and hint in line, line


def test_an_unreachable_relay_url_fails_on_its_first_attempt_with_the_hint(run):
    # Nothing listens there: the refused connect is reported at once, not retried 4 times.
    url = _closed_port()
    proc = run("ah_live_" + "a" * 32, "inbox", url=url)
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()  # no retry lines: there was no retry
    assert line.startswith(f"error: connection_error: cannot reach the relay at {url} "), line
    assert "(connection refused, 1 attempt)" in line and "is RELAY_URL right" in line, line


class _RateLimitedRelay:
    """An HTTP server that answers every request 429 with ``Retry-After: 0`` (so retries do not wait)."""

    def __init__(self):
        outer = self
        self.hits = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits += 1
                body = json.dumps({"error": {"code": "rate_limited", "message": "slow down"}}).encode()
                self.send_response(429)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_each_retry_prints_one_stderr_line_before_the_error(run):
    with _RateLimitedRelay() as relay:
        proc = run("ah_live_" + "a" * 32, "whoami", url=relay.url)
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    *retries, last = proc.stderr.splitlines()
    assert relay.hits == 5  # the first attempt and 4 retries
    assert len(retries) == 4, proc.stderr
    for n, line in enumerate(retries, 1):
        assert line.startswith(f"relay-agent: {relay.url} answered rate limited (HTTP 429); retry {n}/4 in "), line
        assert line.endswith(" s"), line
    assert last.startswith("error: rate_limited: ") and "(hint: " in last, last


def test_a_usage_error_is_one_line_naming_what_is_missing(run, keys):
    proc = run(keys["alice"], "send", "bob@acme", "do it", "--intent", "propose_action", "--rationale", "why")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ") and "missing: --proposed-description, --target-file" in line, line

    proc = run(keys["alice"], "send", "bob@acme")  # click's own usage error, made one line too
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert "Missing argument 'TEXT'" in line and "relay-agent send --help" in line


# --------------------------------------------------------------------------- 4. configuration


@pytest.mark.parametrize("missing", ["RELAY_URL", "RELAY_API_KEY"])
def test_a_missing_variable_exits_3_naming_it(run, keys, missing):
    key = None if missing == "RELAY_API_KEY" else keys["alice"]
    url = None if missing == "RELAY_URL" else "http://127.0.0.1:9"
    proc = run(key, "inbox", url=url)
    assert proc.returncode == 3 and proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"error: {missing} is not set"), line
    other = {"RELAY_URL": "RELAY_API_KEY", "RELAY_API_KEY": "RELAY_URL"}[missing]
    assert f"{other} is" not in line
    # help needs neither
    assert "whoami" in ok(run(None, "--help", url=None))


@pytest.mark.parametrize(
    "url, key, named",
    [
        ("http://[::1", None, "RELAY_URL"),
        ("localhost:8000", None, "RELAY_URL"),
        (None, "ah_live_\nX", "RELAY_API_KEY"),
    ],
    ids=["unparseable-url", "no-scheme", "key-with-newline"],
)
def test_a_malformed_variable_exits_3_naming_it(run, keys, url, key, named):
    proc = run(key or keys["alice"], "inbox", url=url or "http://127.0.0.1:9")
    assert proc.returncode == 3 and proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ") and named in line, line
    assert "ah_live_" not in line.replace("ah_live_...", "")  # the key itself is never echoed


def test_show_pages_a_thread_like_tasks_get(run, keys):
    task_id = json.loads(ok(run(keys["alice"], "send", "bob@acme", "m1", "--json")))["task_id"]
    for n in range(2, 6):
        ok(run(keys["alice"], "reply", task_id, f"m{n}"))

    def numbers(out: str) -> list[int]:
        return [int(line.split()[0][1:]) for line in out.splitlines() if line.startswith("  #")]

    whole = ok(run(keys["bob"], "show", task_id))
    assert numbers(whole) == [1, 2, 3, 4, 5] and "messages (5):" in whole
    newest = ok(run(keys["bob"], "show", task_id, "--limit", "2"))
    assert numbers(newest) == [4, 5] and "messages #4-#5 of 5:" in newest and "(more" not in newest
    page = ok(run(keys["bob"], "show", task_id, "--after", "1", "--limit", "2"))
    assert numbers(page) == [2, 3] and "(more: --after 3)" in page
    paged = json.loads(ok(run(keys["bob"], "show", task_id, "--after", "3", "--json")))
    assert [m["sequence_no"] for m in paged["messages"]] == [4, 5] and paged["messages_next"] is None
    bad = run(keys["bob"], "show", task_id, "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr


# --------------------------------------------------------------------------- 5. search


def test_search_finds_a_word_of_one_message(run, keys):
    hit = json.loads(ok(run(keys["alice"], "send", "bob@acme", "the kumquat importer drops rows", "--json")))
    miss = json.loads(ok(run(keys["alice"], "send", "bob@acme", "the banana exporter is slow", "--json")))

    out = ok(run(keys["bob"], "search", "kumquat"))
    assert hit["task_id"] in out and miss["task_id"] not in out
    found = json.loads(ok(run(keys["bob"], "search", "kumquat", "--json")))
    assert [r["task_id"] for r in found["items"]] == [hit["task_id"]]
    assert "no messages match" in ok(run(keys["bob"], "search", "durian"))


# --------------------------------------------------------------------------- 6. watch


def _watch_ids(run, key, *extra) -> list[str]:
    out = ok(run(key, "watch", "--once", "--json", *extra))
    return [json.loads(line)["id"] for line in out.splitlines()]


def test_a_first_watch_starts_at_now_as_wait_does_and_from_start_replays(run, keys, relay_url):
    with RelayClient(relay_url, keys["alice"]) as alice:
        old = alice.send("bob@acme", "sent before bob ever watched")
        assert _watch_ids(run, keys["bob"]) == []  # no saved position: now, not the whole feed
        assert _watch_ids(run, keys["bob"], "--from-start") == [old.message_id]
        assert _watch_ids(run, keys["bob"]) == []  # --from-start saved its position too
        new = alice.send("bob@acme", "sent after")
        assert _watch_ids(run, keys["bob"]) == [new.message_id]
    both = run(keys["bob"], "watch", "--once", "--from-start", "--since", "now")
    assert both.returncode == 2 and "--from-start and --since" in both.stderr, both.stderr


def test_a_first_wait_starts_at_now(run, keys, relay_url):
    with RelayClient(relay_url, keys["alice"]) as alice:
        alice.send("bob@acme", "sent before bob ever waited")
    waited = run(keys["bob"], "wait", "--timeout", "0")
    assert waited.returncode == 4 and waited.stdout == "", (waited.stdout, waited.stderr)


def test_watch_prints_each_new_message_once_and_resumes_from_its_state_file(run, keys, relay_url, app, tmp_path):
    alice = RelayClient(relay_url, keys["alice"])
    assert _watch_ids(run, keys["bob"]) == []  # the first run saves its position at now
    first = [alice.send("bob@acme", f"first batch {i}") for i in range(2)]

    out = ok(run(keys["bob"], "watch", "--once"))
    assert out.count("first batch 0") == 1 and out.count("first batch 1") == 1
    assert out.index("first batch 0") < out.index("first batch 1")  # oldest first
    assert first[0].task_id in out

    assert _watch_ids(run, keys["bob"]) == []  # nothing new: nothing printed

    more = [alice.send("bob@acme", f"second batch {i}") for i in range(3)]
    assert _watch_ids(run, keys["bob"]) == [m.message_id for m in more]  # exactly those 3, in order

    state_file = tmp_path / "state" / "relay-agent" / "bob@acme.json"
    state = json.loads(state_file.read_text())
    newest = alice.get(more[-1].task_id).messages[-1]
    assert state["seen"] == [more[-1].message_id]
    assert state["since"] == newest.raw["created_at"]

    # A message written at exactly the saved timestamp: it is new, so printed (once);
    # the one already printed at that timestamp is not printed again.
    same = alice.send("bob@acme", "same instant")
    sql(
        app,
        "UPDATE messages SET created_at = CAST(:at AS timestamptz) WHERE id = CAST(:id AS uuid)",
        at=state["since"],
        id=same.message_id,
    )
    assert _watch_ids(run, keys["bob"]) == [same.message_id]
    assert _watch_ids(run, keys["bob"]) == []
    assert sorted(json.loads(state_file.read_text())["seen"]) == sorted([more[-1].message_id, same.message_id])

    # Own messages are left out unless asked for; a reply by bob moves the position all the same.
    bob = RelayClient(relay_url, keys["bob"])
    bob.reply(same.task_id, "bob's own note")
    assert _watch_ids(run, keys["bob"]) == []
    alice.close()
    bob.close()


def test_watch_stops_quietly_on_ctrl_c(relay_url, keys, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update(RELAY_URL=relay_url, RELAY_API_KEY=keys["bob"])
    state_file = tmp_path / "watch.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "relay.agent.cli", "watch", "--interval", "0.2", "--state-file", str(state_file)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background by a non-interactive shell inherits SIGINT
        # ignored, and so would the child: Python then never raises KeyboardInterrupt.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + CALL_TIMEOUT
        while not state_file.exists():  # written after the first poll: the loop is running
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=CALL_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err == "", err


# --------------------------------------------------------------------------- 7. whoami


def test_whoami_prints_the_handle(run, keys):
    out = ok(run(keys["alice"], "whoami"))
    assert field(out, "handle") == "alice@acme" and field(out, "name") == "Alice"
    assert json.loads(ok(run(keys["alice"], "whoami", "--json")))["handle"] == "alice@acme"


# --------------------------------------------------------------------------- artifact parsing (no relay)


def test_a_multi_file_diff_becomes_one_artifact_per_file():
    text = DIFF + (
        "diff --git a/src/old.py b/src/old.py\ndeleted file mode 100644\n--- a/src/old.py\n+++ /dev/null\n"
        "@@ -1,2 +0,0 @@\n--- removed line that looks like a header\n-x = 1\n"
        "--- lib/c.txt\t2026-01-01 00:00:00\n+++ lib/c.txt\t2026-01-02 00:00:00\n@@ -1 +1 @@\n-a\n+b\n"
    )
    parts = split_diff(text)
    assert [p for p, _ in parts] == ["src/a.py", "src/old.py", "lib/c.txt"]
    assert "".join(d for _, d in parts) == text
    assert split_diff("@@ -1 +1 @@\n-a\n+b\n") == [(None, "@@ -1 +1 @@\n-a\n+b\n")]


def test_file_ref_lines():
    assert file_ref_artifact("src/a.py") == {"type": "file_ref", "path": "src/a.py"}
    assert file_ref_artifact("src/a.py:7") == {"type": "file_ref", "path": "src/a.py", "line_start": 7}
    assert file_ref_artifact("src/a.py:10-20") == {
        "type": "file_ref",
        "path": "src/a.py",
        "line_start": 10,
        "line_end": 20,
    }


@pytest.mark.parametrize(
    "spec, path",
    [("C:/repo/a.py", "C:/repo/a.py"), ("src:v2/a.py", "src:v2/a.py"), ("C:\\repo\\a.py", "C:\\repo\\a.py")],
)
def test_file_ref_a_colon_followed_by_a_path_is_part_of_the_path(spec, path):
    assert file_ref_artifact(spec) == {"type": "file_ref", "path": path}
    assert file_ref_artifact(spec + ":7") == {"type": "file_ref", "path": path, "line_start": 7}


@pytest.mark.parametrize(
    "spec",
    ["src/x.py:abc", "src/x.py:2x", "src/x.py:3-", "src/x.py:-3", "src/x.py:", "src/x.py:1.5", "src/x.py:1-2-3"],
)
def test_file_ref_refuses_line_parts_that_are_not_numbers(spec):
    with pytest.raises(OneLineUsage) as info:
        file_ref_artifact(spec)
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"--file-ref {spec}: ") and "START-END" in line, line


@pytest.mark.parametrize("spec", ["src/x.py:20-10", "src/x.py:0", ":10", "   "])
def test_file_ref_refuses_bad_ranges_and_empty_paths(spec):
    with pytest.raises(OneLineUsage) as info:
        file_ref_artifact(spec)
    assert str(info.value).startswith("--file-ref"), info.value


def test_a_non_numeric_file_ref_line_is_a_usage_error_and_nothing_is_sent(run, keys):
    proc = run(keys["alice"], "send", "bob@acme", "look here", "--file-ref", "src/x.py:abc")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: --file-ref src/x.py:abc: ") and "PATH:START-END" in line, line
    assert json.loads(ok(run(keys["alice"], "inbox", "--sent", "--json")))["items"] == []
    assert "PATH[:START[-END]]" in ok(run(None, "send", "--help", url=None))


# --------------------------------------------------------------------------- the work lifecycle


def _handoff(run, keys, *extra: str) -> str:
    return field(ok(run(keys["alice"], "send", "bob@acme", "please do it", *extra)), "task_id")


def test_decline_sends_the_reason_the_sender_then_reads(run, keys):
    task = _handoff(run, keys)
    assert "declined " + task + ": state is now declined" in ok(
        run(keys["bob"], "decline", task, "--reason", "not mine")
    )
    shown = ok(run(keys["alice"], "show", task))
    assert field(shown, "state") == "declined" and field(shown, "reason") == "not mine"


def test_a_missing_reason_is_one_usage_line_and_nothing_is_sent(run, keys):
    task = _handoff(run, keys)
    for verb in ("decline", "fail"):
        proc = run(keys["bob"], verb, task)
        assert proc.returncode == 2 and proc.stdout == "", proc
        assert (
            proc.stderr.strip()
            == f"error: {verb} needs --reason TEXT: say why, for the sender to read (1-2000 characters)"
        )
    assert field(ok(run(keys["bob"], "show", task)), "state") == "pending"


def test_request_input_asks_the_sender_and_a_reply_answers_it(run, keys):
    task = _handoff(run, keys)
    ok(run(keys["bob"], "accept", task, "--lease", "60"))
    proc = run(keys["bob"], "request-input", task)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.strip() == (
        "error: request-input needs --question TEXT: what the sender should answer (1-2000 characters)"
    )
    asked = ok(run(keys["bob"], "request-input", task, "--question", "which branch?"))
    assert f"asked {task}: state is now input_required" in asked
    shown = ok(run(keys["alice"], "show", task))
    assert (field(shown, "state"), field(shown, "question")) == ("input_required", "which branch?")
    ok(run(keys["alice"], "reply", task, "main"))
    assert field(ok(run(keys["bob"], "show", task)), "state") == "accepted"
    # the lease went on: the saved token still completes it
    assert "state is now completed" in ok(run(keys["bob"], "complete", task, "--summary", "done on main"))


def test_accept_lease_then_complete_uses_the_saved_token_kept_private(run, keys, tmp_path):
    task = _handoff(run, keys)
    accepted = json.loads(ok(run(keys["bob"], "accept", task, "--lease", "60", "--json")))
    assert accepted["lease_token"] and accepted["lease_expires_at"]
    saved = tmp_path / "state" / "relay-agent" / "bob@acme.leases.json"
    assert saved.stat().st_mode & 0o777 == 0o600 and saved.parent.stat().st_mode & 0o777 == 0o700
    assert json.loads(saved.read_text())["leases"][task]["lease_token"] == accepted["lease_token"]
    # another process, no --lease-token: the saved token is sent
    assert "state is now completed" in ok(run(keys["bob"], "complete", task, "--summary", "done"))
    assert task not in json.loads(saved.read_text())["leases"]


def test_fail_and_release_use_the_saved_token(run, keys):
    task = _handoff(run, keys)
    ok(run(keys["bob"], "accept", task, "--lease", "60"))
    assert "state is now pending" in ok(run(keys["bob"], "release", task, "--reason", "out of time"))
    ok(run(keys["bob"], "accept", task, "--lease", "60"))
    assert "state is now failed" in ok(run(keys["bob"], "fail", task, "--reason", "tests will not pass"))
    assert field(ok(run(keys["alice"], "show", task)), "reason") == "tests will not pass"


def test_renew_with_the_stored_token_moves_the_lease_end(run, keys):
    task = _handoff(run, keys)
    first = json.loads(ok(run(keys["bob"], "accept", task, "--lease", "30", "--json")))
    renewed = json.loads(ok(run(keys["bob"], "renew", task, "--lease", "3600", "--json")))
    assert renewed["lease_token"] == first["lease_token"]
    assert renewed["lease_expires_at"] > first["lease_expires_at"]
    assert "lease ends" in ok(run(keys["bob"], "renew", task))


def test_a_stale_saved_token_after_another_accept_says_to_accept_again(run, keys, relay_url):
    task = _handoff(run, keys)
    first = json.loads(ok(run(keys["bob"], "accept", task, "--lease", "60", "--json")))
    with RelayClient(relay_url, keys["bob"]) as other:  # bob's other session takes the work over
        other.release(task, lease_token=first["lease_token"])
        second = other.accept(task, lease_seconds=60)
    proc = run(keys["bob"], "complete", task, "--summary", "done")
    assert proc.returncode == 1 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: state_changed: ") and "saved lease token is stale" in line
    assert f"accept it again (relay-agent accept {task} --lease SECONDS)" in line
    # --lease-token overrides the saved one
    ok(run(keys["bob"], "complete", task, "--summary", "done", "--lease-token", second.lease_token))


def test_send_priority_and_expiry_and_inbox_filters_on_priority(run, keys):
    urgent = json.loads(
        ok(run(keys["alice"], "send", "bob@acme", "now", "--priority", "urgent", "--expires-in", "3600", "--json"))
    )
    plain = _handoff(run, keys)
    assert urgent["priority"] == "urgent" and urgent["expires_at"]
    listed = ok(run(keys["bob"], "inbox", "--priority", "urgent"))
    assert urgent["task_id"] in listed and plain not in listed
    [row] = [ln for ln in listed.splitlines() if urgent["task_id"] in ln]
    assert "urgent" in row.split()
    shown = ok(run(keys["bob"], "show", urgent["task_id"]))
    assert field(shown, "priority") == "urgent" and field(shown, "expires") != "-"


def test_show_prints_each_messages_read_receipt(run, keys):
    task = _handoff(run, keys)
    ok(run(keys["alice"], "reply", task, "one more thing"))

    def receipts(shown: str) -> list[str]:
        return [ln.split(")", 1)[1].split("Z", 1)[1].strip() for ln in shown.splitlines() if ln.startswith("  #")]

    assert receipts(ok(run(keys["alice"], "show", task))) == ["unread", "unread"]
    ok(run(keys["bob"], "show", task))  # bob reads them
    after = receipts(ok(run(keys["alice"], "show", task)))
    assert all(r.startswith("read 20") and r.endswith("Z") for r in after), after


def test_status_takes_the_new_states(run, keys):
    task = _handoff(run, keys)
    ok(run(keys["bob"], "decline", task, "--reason", "no"))
    assert task in ok(run(keys["bob"], "inbox", "--status", "declined"))
