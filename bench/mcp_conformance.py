"""``python -m bench mcp-conformance``: the MCP conformance suite against relay-mcp --http and the relay's /mcp.

Starts what it needs (a fresh migrated database, gunicorn from the Procfile's web line,
one agent and its key; ``relay-mcp --http`` on a free port), then runs
``npx -y @modelcontextprotocol/conformance@VERSION server --url ... --scenario S`` for
each scenario in SCENARIOS, against both servers. The suite has no option for a header,
so the relay's /mcp is reached through a loopback proxy that adds the agent's
``Authorization: Bearer`` (and passes Host and Origin through as sent, so the
DNS-rebinding scenario tests the relay's own check).

The scenarios left out need the suite's reference server's own tools, resources or
prompts (``test_simple_text``, ``test_error_handling``, ``json_schema_2020_12_tool``,
``test_prompt_with_image``, ...), or features the relay does not serve (logging,
completion, sampling, elicitation, resources, prompts; the two SSE scenarios need a
session and the suite's ``test_reconnection`` tool, and only warn on a stateless server). Exit 1
when any scenario run here fails. Writes one JSON file of the outcomes to ``--results``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from bench.harness import BIN, base_env, create_agents, fresh_database, gunicorn, server_urls

VERSION = "0.1.13"
#: the server scenarios that need nothing but a spec-following tools server
SCENARIOS = ("server-initialize", "ping", "tools-list", "dns-rebinding-protection")
#: seconds one scenario may take (npx's first download included)
SCENARIO_TIMEOUT = 300


class _BearerProxy(BaseHTTPRequestHandler):
    """Forwards each request to ``target`` with ``Authorization: Bearer key`` added."""

    target = ""
    key = ""
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "connection")}
        headers["Authorization"] = f"Bearer {self.key}"
        resp = requests.request(
            self.command, self.target + self.path, data=body, headers=headers, timeout=120, allow_redirects=False
        )
        self.send_response(resp.status_code)
        for name, value in resp.headers.items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding", "content-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(resp.content)))
        self.end_headers()
        self.wfile.write(resp.content)

    do_GET = do_POST = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


@contextmanager
def bearer_proxy(target: str, key: str):
    """A loopback proxy to ``target`` adding the bearer key; yields its base URL."""
    handler = type("Proxy", (_BearerProxy,), {"target": target, "key": key})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def relay_mcp_http(env: dict, relay_url: str, key: str):
    """``relay-mcp --http`` on a free port; yields its /mcp URL (from the line it prints)."""
    log = Path(env.get("RELAY_HOME", "/tmp")) / f"relay-mcp-{os.getpid()}.log"
    out = open(log, "w")
    proc = subprocess.Popen(
        [str(BIN / "relay-mcp"), "--http"],
        env={**env, "RELAY_URL": relay_url, "RELAY_API_KEY": key},
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"serving MCP at (http://\S+/mcp)", log.read_text())
            if found:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"relay-mcp --http printed no URL: {log.read_text()[-2000:]}")
        yield found.group(1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        out.close()


def run_scenario(url: str, scenario: str) -> dict:
    """One scenario's outcome: {scenario, passed, output (its tail)}."""
    try:
        done = subprocess.run(
            [
                "npx",
                "-y",
                f"@modelcontextprotocol/conformance@{VERSION}",
                "server",
                "--url",
                url,
                "--scenario",
                scenario,
            ],
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT,
        )
        output = done.stdout + done.stderr
        # Passed only when it checked something and all of it passed ("Passed: 0/0" with
        # warnings is a scenario that found nothing to test, such as the SSE ones here).
        tally = re.search(r"Passed: (\d+)/(\d+), 0 failed, 0 warnings", re.sub(r"\x1b\[[0-9;]*m", "", output))
        passed = done.returncode == 0 and tally is not None and tally[1] == tally[2] != "0"
    except subprocess.TimeoutExpired as exc:
        output, passed = f"timed out after {SCENARIO_TIMEOUT} s: {exc}", False
    return {"scenario": scenario, "passed": passed, "output": output[-3000:]}


def main(results: Path) -> int:
    """Run SCENARIOS against both servers; print each outcome; 1 when any failed."""
    outcomes: dict[str, list[dict]] = {}
    with ExitStack() as stack:
        database = stack.enter_context(fresh_database("relay_mcp_conf"))
        env = base_env(database, {"REDIS_URL": server_urls()[1]})
        keys = create_agents(env, ["conformance@bench"])
        key = keys["conformance@bench"]
        web, relay_url = gunicorn("app:app", env, workers=1)
        stack.callback(web.stop)
        targets = {
            "relay /mcp": stack.enter_context(bearer_proxy(relay_url, key)) + "/mcp",
            "relay-mcp --http": stack.enter_context(relay_mcp_http(env, relay_url, key)),
        }
        for name, url in targets.items():
            outcomes[name] = []
            for scenario in SCENARIOS:
                outcome = run_scenario(url, scenario)
                outcomes[name].append(outcome)
                print(f"{name:18} {scenario:28} {'pass' if outcome['passed'] else 'FAIL'}", flush=True)
                if not outcome["passed"]:
                    print(outcome["output"], file=sys.stderr, flush=True)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"mcp-conformance-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"version": VERSION, "outcomes": outcomes}, indent=2))
    failed = [(n, o["scenario"]) for n, runs in outcomes.items() for o in runs if not o["passed"]]
    print(f"results: {path}; {len(failed)} failed" + (f": {failed}" if failed else ""), flush=True)
    return 1 if failed else 0
