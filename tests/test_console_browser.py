"""The console in a real browser: Debian's headless Chromium driven by Selenium (chromedriver), against
a live relay (the Procfile's gunicorn and Celery worker, tests/live.py) on loopback.

Every page and action: sign-in, the overview, an inbox with paging, filters and live updates,
a thread followed from send to completion with its rendered diff, search, a failing webhook's
attempts, redrive and recover (a loopback receiver gets the same ``webhook-id`` again), a
test event, enable and disable, key create and revoke, block and unblock, cancel, another
org's 404 on every page, CSRF refusal, XSS payloads staying text, session expiry and sign-out,
a phone's width. A screenshot of each page goes to ``test-artifacts/console/`` (git-ignored).
Waits fail loudly, naming what they waited for; nothing is timed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import bearer, rpc, send_message, sql, wait_until
from tests.console import forged_session, make_operator
from tests.live import live_relay
from tests.receiver import Receiver

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "console"
WAIT = 30  # seconds any one wait may take before it fails, naming what it waited for
OPS = "ops@acme.example"

# Skipped on a machine without them, never in CI (which installs them): there a missing browser fails.
pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)) and not os.environ.get("CI"),
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
)


@pytest.fixture(scope="module")
def console_url(base_env):
    """A live relay whose webhooks get one attempt each (a failure is final at once: redrive's case)."""
    with live_relay(base_env, RELAY_WEBHOOK_SCHEDULE="0", RELAY_WEBHOOK_CIRCUIT_FAILURES="100") as url:
        yield url


@pytest.fixture(scope="module")
def driver():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # A zone other than UTC, so the page's local times are visibly converted.
    service = Service(CHROMEDRIVER, env={**os.environ, "TZ": "America/New_York"})
    chrome = webdriver.Chrome(service=service, options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield chrome
    finally:
        chrome.quit()


class Browser:
    """The driver plus the console's vocabulary: pages by path, waits with messages, screenshots."""

    def __init__(self, driver, base: str):
        self.d, self.base = driver, base

    def go(self, path: str) -> None:
        self.d.get(self.base + path)

    def wait(self, condition, what: str):
        return WebDriverWait(self.d, WAIT, poll_frequency=0.2).until(condition, message=f"waited {WAIT} s for {what}")

    def css(self, selector: str):
        return self.d.find_elements(By.CSS_SELECTOR, selector)

    def one(self, selector: str):
        return self.wait(EC.presence_of_element_located((By.CSS_SELECTOR, selector)), f"an element {selector!r}")

    def text(self, selector: str = "main") -> str:
        return self.one(selector).text

    def wait_text(self, text: str, selector: str = "main") -> None:
        self.wait(EC.text_to_be_present_in_element((By.CSS_SELECTOR, selector), text), f"{text!r} in {selector}")

    def refresh_until(self, text: str, selector: str = "main") -> None:
        """Reload until ``text`` shows (pages the console does not poll: webhooks)."""

        def shown(d):
            d.refresh()
            return text in d.find_element(By.CSS_SELECTOR, selector).text

        self.wait(shown, f"{text!r} in {selector} after reloads")

    def click(self, selector: str) -> None:
        self.wait(EC.element_to_be_clickable((By.CSS_SELECTOR, selector)), f"{selector!r} clickable").click()

    def button(self, label: str, within: str = "main") -> None:
        """Click the first button labelled ``label`` inside ``within``."""
        xpath = f".//button[normalize-space()={label!r}]"
        scope = self.one(within)
        self.wait(lambda d: scope.find_elements(By.XPATH, xpath), f"a button {label!r} in {within}")[0].click()

    def sign_in(self, email: str, password: str, *, here: bool = False) -> None:
        """Sign in on /console/login, or (``here``) on the sign-in page already open."""
        if not here:
            self.go("/console/login")
        self.one("#email").clear()
        self.one("#email").send_keys(email)
        self.one("#password").send_keys(password)
        self.button("Sign in")
        self.wait(lambda d: "/console/login" not in d.current_url, "the sign-in to leave /console/login")

    def mark(self) -> None:
        """Mark the loaded document; :meth:`same_document` then tells that no reload happened."""
        self.d.execute_script("window.__consoleMark = 'kept';")

    def same_document(self) -> bool:
        return self.d.execute_script("return window.__consoleMark === 'kept';")

    def shot(self, name: str) -> None:
        self.d.save_screenshot(str(SHOTS / f"{name}.png"))

    def csp_violations(self) -> list[str]:
        return [e["message"] for e in self.d.get_log("browser") if "Content Security Policy" in e["message"]]


@pytest.fixture
def b(driver, console_url, settled):
    driver.set_window_size(1280, 1000)
    driver.get(console_url + "/console/login")
    driver.delete_all_cookies()
    driver.get_log("browser")  # drop what earlier tests logged
    browser = Browser(driver, console_url)
    yield browser
    assert browser.csp_violations() == [], "the console's own pages broke its CSP"


@pytest.fixture
def acme(app, make_agent, b):
    """alice and bob of acme with their keys, and a signed-in operator of acme."""
    alice = make_agent("alice@acme", name="Alice", role="frontend")
    bob = make_agent("bob@acme", name="Bob", role="backend")
    password = make_operator(app, OPS, "acme")
    b.sign_in(OPS, password)
    return {"alice": alice, "bob": bob, "password": password}


def no_injection(b: Browser) -> None:
    """No alert opened, no payload ran, no element came out of agents' text."""
    with pytest.raises(NoAlertPresentException):
        _ = b.d.switch_to.alert.text
    assert b.d.execute_script("return window.__xss === undefined;"), "a payload ran"
    assert b.css("main script, main img, main iframe, main svg") == []
    assert b.css("a[href^='javascript'], a[href^='JAVASCRIPT'], a[href^='data:']") == []


# --------------------------------------------------------------------------- sign-in and the overview


def test_sign_in_then_the_overview(app, make_agent, b, console_url):
    _alice, alice_key = make_agent("alice@acme", name="Alice", role="frontend")
    make_agent("bob@acme", name="Bob", role="backend")
    send_message(console_url, alice_key, "bob@acme", "please update the users client")
    password = make_operator(app, OPS, "acme")
    b.go("/console/")
    b.wait(lambda d: "/console/login" in d.current_url, "a signed-out visit to go to the sign-in page")
    b.shot("login")
    # Keyboard only: the fields and the button are reachable with Tab, in order.
    b.one("#email").send_keys(OPS + Keys.TAB)
    assert b.d.switch_to.active_element.get_attribute("id") == "password"
    b.d.switch_to.active_element.send_keys(password + Keys.TAB)
    assert b.d.switch_to.active_element.text == "Sign in"
    b.d.switch_to.active_element.send_keys(Keys.ENTER)
    b.wait(lambda d: d.current_url == console_url + "/console/", "the sign-in to land on /console/")
    row = b.one("table.agents tbody tr:nth-child(2)")
    assert row.find_element(By.CSS_SELECTOR, "th").text.startswith("bob@acme")
    assert row.find_element(By.CSS_SELECTOR, "td[data-label='Pending in']").text == "1"
    alice_row = b.one("table.agents tbody tr:nth-child(1)")
    assert alice_row.find_element(By.CSS_SELECTOR, "td[data-label='Pending out']").text == "1"
    stamp = alice_row.find_element(By.CSS_SELECTOR, "time")
    assert stamp.get_attribute("title").endswith("(UTC)") and "UTC" not in stamp.text  # shown in New York time
    b.shot("overview")


def test_a_wrong_password_and_a_wrong_email_read_the_same(app, make_agent, b):
    make_operator(app, OPS, "acme")
    answers = []
    for email, password in ((OPS, "wrong-password"), ("nobody@acme.example", "whatever")):
        b.go("/console/login")
        b.one("#email").send_keys(email)
        b.one("#password").send_keys(password)
        b.button("Sign in")
        answers.append(b.text("#login-error"))
    assert answers == ["wrong email or password"] * 2


def test_an_empty_org_says_what_to_do_next(app, b):
    b.sign_in(OPS, make_operator(app, OPS, "acme"))
    assert "relay agents create frank@acme --name Frank --role frontend" in b.text(".empty")
    b.shot("overview-empty")


# --------------------------------------------------------------------------- an inbox


def test_inbox_pages_filters_cancels_and_updates_live(acme, b, console_url):
    alice_key, bob_key = acme["alice"][1], acme["bob"][1]
    tasks = [send_message(console_url, alice_key, "bob@acme", f"handoff number {i}")["task_id"] for i in range(23)]
    rpc(console_url, bob_key, "tasks/update", {"task_id": tasks[0], "transition": "accept", "session_id": "s-1"})
    b.go("/console/agents/bob@acme")
    assert len(b.css("#threads tbody tr")) == 20
    assert "handoff number 0" in b.text("#threads tbody tr:first-child")  # accepting it was its latest activity
    b.shot("inbox")
    b.click("#page-older")
    b.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#threads tbody tr")) == 3, "the second page's 3 rows")
    b.click("#page-newest")
    b.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#threads tbody tr")) == 20, "the first page again")
    b.click("#state-accepted")
    b.button("Filter")
    b.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#threads tbody tr")) == 1, "one accepted handoff")
    assert "accepted" in b.text("#threads tbody tr")
    # Live: a new handoff shows up on the open inbox, with no reload.
    b.go("/console/agents/bob@acme")
    b.mark()
    send_message(console_url, alice_key, "bob@acme", "a fresh handoff while you watch")
    b.wait_text("a fresh handoff while you watch", "#threads")
    assert b.same_document(), "the page reloaded"
    # The sender's side: cancel a pending handoff from the sent tab.
    b.go("/console/agents/alice@acme?box=sent")
    b.button("Cancel", "#threads tbody tr:first-child")
    b.wait_text("The handoff is cancelled.", ".flashes")
    assert "cancelled" in b.text("#threads tbody tr:first-child")
    b.shot("sent")


def test_an_empty_inbox_says_how_to_send_one(acme, b):
    b.go("/console/agents/bob@acme")
    assert 'relay-agent send bob@acme "what to do"' in b.text("#threads")


def test_block_and_unblock_a_sender(acme, b, console_url):
    alice_key = acme["alice"][1]
    b.go("/console/agents/bob@acme")
    b.one("#blocked_handle").send_keys("alice@acme")
    b.button("Block", "section.blocks")
    b.wait_text("alice@acme is blocked.", ".flashes")
    resp = requests.post(
        f"{console_url}/a2a",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": "bob@acme", "message": {"parts": [{"type": "text", "text": "x"}]}},
        },
        headers=bearer(alice_key),
        timeout=30,
    )
    assert resp.json()["error"]["data"]["symbol"] == "teammate_blocked"
    b.shot("blocks")
    b.button("Unblock", "section.blocks")
    b.wait_text("alice@acme is unblocked.", ".flashes")
    send_message(console_url, alice_key, "bob@acme", "after the unblock")


# --------------------------------------------------------------------------- a thread, send to completion


DIFF = (
    "--- a/src/api/users.py\n+++ b/src/api/users.py\n@@ -1,3 +1,3 @@\n def list_users():\n"
    '-    return users\n+    return {"items": users, "next_cursor": None}\n'
)


def test_follow_a_handoff_from_send_to_completion_with_its_diff(acme, b, console_url):
    alice_key, bob_key = acme["alice"][1], acme["bob"][1]
    task = send_message(
        console_url,
        alice_key,
        "bob@acme",
        "Refactored /users: it returns {items, next_cursor}; please update the client",
        intent="propose_action",
        proposed_action={
            "description": "Paginate the users client",
            "target_files": ["web/src/users.ts"],
            "rationale": "the API pages now",
            "suggested_diff": "--- a/web/src/users.ts\n+++ b/web/src/users.ts\n@@ -1 +1 @@\n-get()\n+page()\n",
        },
        artifacts=[
            {"type": "file_diff", "path": "src/api/users.py", "diff": DIFF},
            {"type": "file_ref", "path": "src/api/users.py", "line_start": 10, "line_end": 20},
            {"type": "test_command", "command": "pytest -q tests/test_users.py", "cwd": "backend"},
            {"type": "api_contract", "name": "GET /users", "spec": {"items": "array", "next_cursor": "string"}},
            {"type": "link", "url": "https://example.com/pr/1", "title": "the pull request"},
        ],
    )["task_id"]
    b.go(f"/console/threads/{task}")
    assert "Refactored /users" in b.text("#brief")
    assert "Paginate the users client" in b.text("#proposed-action") and "web/src/users.ts" in b.text(
        "#proposed-action"
    )
    # The diff is highlighted server-side: added and removed lines are spans of their own.
    added = b.css(".artifact-file_diff .hl .gi")
    assert any('"next_cursor": None' in e.text for e in added)
    assert any("return users" in e.text for e in b.css(".artifact-file_diff .hl .gd"))
    assert "src/api/users.py:10-20" in b.text(".artifact-file_ref")
    assert "pytest -q tests/test_users.py" in b.text(".artifact-test_command")
    assert '"next_cursor": "string"' in b.text(".artifact-api_contract")
    link = b.one(".artifact-link a")
    assert (link.get_attribute("href"), link.get_attribute("rel")) == (
        "https://example.com/pr/1",
        "noopener noreferrer",
    )
    assert "alice@acme" in b.text("#m1 header") and "sender (caller)" in b.text("#m1 header")
    b.shot("thread")
    # The recipient works on it while the page is open: every step shows up without a reload.
    b.mark()
    rpc(
        console_url,
        bob_key,
        "message/send",
        {"task_id": task, "message": {"parts": [{"type": "text", "text": "Is next_cursor opaque?"}]}},
    )
    b.wait_text("Is next_cursor opaque?", "#messages")
    assert "recipient (agent)" in b.text("#m2 header")
    rpc(console_url, bob_key, "tasks/update", {"task_id": task, "transition": "accept", "session_id": "session-42"})
    b.wait_text("accepted", "#status")
    rpc(
        console_url,
        bob_key,
        "tasks/update",
        {"task_id": task, "transition": "complete", "result_summary": "Client paginates with next_cursor"},
    )
    b.wait_text("completed", "#status")
    b.wait_text("Client paginates with next_cursor", "#audit")
    assert "session-42" in b.text("#audit")
    assert b.same_document(), "the page reloaded"
    b.wait(lambda d: not d.find_elements(By.ID, "live"), "polling to stop once the handoff is completed")
    b.shot("thread-completed")


def test_cancel_a_pending_handoff_from_its_thread(acme, b, console_url):
    task = send_message(console_url, acme["alice"][1], "bob@acme", "not needed after all")["task_id"]
    b.go(f"/console/threads/{task}")
    b.button("Cancel this handoff")
    b.wait_text("The handoff is cancelled.", ".flashes")
    assert "cancelled" in b.text("#status")
    assert b.css("#status button") == []


# --------------------------------------------------------------------------- search


def test_search_the_orgs_messages(acme, b, console_url):
    task = send_message(console_url, acme["alice"][1], "bob@acme", "The invoices endpoint needs cursor pagination")[
        "task_id"
    ]
    send_message(console_url, acme["alice"][1], "bob@acme", "something else entirely")
    b.go("/console/search")
    assert "Type what you are looking for" in b.text(".empty")
    b.one("#q").send_keys("pagination" + Keys.ENTER)
    b.wait_text("The invoices endpoint needs cursor pagination", ".hits")
    assert len(b.css(".hit")) == 1
    b.shot("search")
    b.click(".hit-link")
    b.wait(lambda d: d.current_url.endswith(f"/console/threads/{task}#m1"), "the hit to open its thread at the message")
    b.go("/console/search?q=zebrafish")
    assert "No message" in b.text("#no-hits")


# --------------------------------------------------------------------------- webhooks


def _endpoint(url: str, handle: str, key: str, target: str) -> str:
    resp = requests.post(
        f"{url}/api/v1/identities/{handle}/webhooks", json={"url": target}, headers=bearer(key), timeout=30
    )
    assert resp.status_code == 201, resp.text
    return resp.json()["id"]


def test_a_failing_webhook_redriven_and_recovered(acme, b, console_url, app):
    alice_key, bob_key = acme["alice"][1], acme["bob"][1]
    with Receiver() as rx:
        rx.program("/hook", [500], default=200)
        endpoint = _endpoint(console_url, "bob@acme", bob_key, rx.url("/hook"))
        send_message(console_url, alice_key, "bob@acme", "the first handoff")
        [first] = rx.wait_for(1, timeout=WAIT, path="/hook")
        b.go("/console/agents/bob@acme/webhooks")
        b.refresh_until("failed", f"#endpoint-{endpoint} .deliveries")
        attempts = b.text(f"#endpoint-{endpoint} .attempts")
        assert "500" in attempts and " ms" in attempts
        assert "slowed" in b.text(f"#endpoint-{endpoint} h2")  # a failure in a row: its health says so
        assert "Failing since" in b.text(f"#endpoint-{endpoint} .facts")
        b.shot("webhooks-failing")
        # Redrive: the same delivery again, so the receiver sees the same webhook-id.
        b.button("Redrive", f"#endpoint-{endpoint} .deliveries")
        b.wait_text("is queued again.", ".flashes")
        second = rx.wait_for(2, timeout=WAIT, path="/hook")[1]
        assert second.header("webhook-id") == first.header("webhook-id")
        assert second.header("webhook-id") in b.text(".flashes")
        b.refresh_until("succeeded", f"#endpoint-{endpoint} .deliveries")

        # Recover: one delivery that failed and one event sent while the endpoint was disabled.
        rx.program("/hook", [500], default=200)
        send_message(console_url, alice_key, "bob@acme", "the second handoff")
        failed_again = rx.wait_for(3, timeout=WAIT, path="/hook")[2]
        b.refresh_until("failed", f"#endpoint-{endpoint} .deliveries li:first-child")
        b.button("Disable", f"#endpoint-{endpoint} .actions")
        b.wait_text("is disabled.", ".flashes")
        assert "disabled by its owner" in b.text(f"#endpoint-{endpoint} .facts")
        assert b.css(f"#endpoint-{endpoint} .deliveries button") == []  # nothing to redrive while disabled
        third_task = send_message(console_url, alice_key, "bob@acme", "the third handoff, while disabled")["task_id"]
        wait_until(
            lambda: sql(app, "SELECT count(*) FROM events WHERE fanned_out_at IS NULL") == [(0,)],
            timeout=WAIT,
            what="the worker to fan the third handoff out (to no endpoint)",
        )
        assert rx.count("/hook") == 3
        b.button("Enable", f"#endpoint-{endpoint} .actions")
        b.wait_text("is enabled.", ".flashes")
        # time.js starts "since" at an hour ago in the browser's own zone (New York) and tells the server the offset.
        assert b.one(f"#since-{endpoint}").get_attribute("value")
        assert b.one(f"#endpoint-{endpoint} input.tz-offset").get_attribute("value") in ("240", "300")
        b.button("Recover", f"#endpoint-{endpoint} form.recover")
        b.wait_text("1 failed delivery queued again, 1 event never sent queued", ".flashes")
        got = rx.wait_for(5, timeout=WAIT, path="/hook")[3:]
        ids = {r.header("webhook-id") for r in got}
        assert failed_again.header("webhook-id") in ids  # the failed one, with its own id again
        [fresh] = [r for r in got if r.header("webhook-id") != failed_again.header("webhook-id")]
        assert third_task in fresh.body.decode()
        b.refresh_until("succeeded", f"#endpoint-{endpoint} .deliveries li:first-child")
        b.shot("webhooks-recovered")

        # A test event goes to this endpoint alone.
        b.button("Send a test event", f"#endpoint-{endpoint} .actions")
        b.wait_text("is on its way.", ".flashes")
        test_event = rx.wait_for(6, timeout=WAIT, path="/hook")[5]
        assert b'"type":"webhook.test"' in test_event.body


def test_a_bulk_redrive_previewed_confirmed_and_its_progress_shown(acme, b, console_url, app):
    alice_key, bob_key = acme["alice"][1], acme["bob"][1]
    with Receiver() as rx:
        rx.program("/hook", [], default=200)
        endpoint = _endpoint(console_url, "bob@acme", bob_key, rx.url("/hook"))
        for i in range(3):
            send_message(console_url, alice_key, "bob@acme", f"handoff {i}")
        first = rx.wait_for(3, timeout=WAIT, path="/hook")
        wait_until(
            lambda: sql(app, "SELECT count(*) FROM webhook_deliveries WHERE status = 'succeeded'") == [(3,)],
            timeout=WAIT,
            what="three delivered",
        )
        sql(app, "UPDATE webhook_deliveries SET status = 'failed', last_error = 'HTTP 503'")  # as after an outage
        b.go("/console/agents/bob@acme/webhooks")
        assert b.one(f"#bulk-since-{endpoint}").get_attribute("value")  # time.js: 24 hours ago, local time
        b.button("Preview", f"#endpoint-{endpoint} form.bulk-redrive")
        b.wait_text("3 failed deliveries", "#bulk-preview")
        b.button("Redrive 3 failed deliveries", "#bulk-preview")
        b.wait_text("Redriving 3 failed deliveries in the background.", ".flashes")
        b.mark()
        b.wait_text("3 of 3 sent again · done", f"#redrives-{endpoint}")  # on the page (polled in while it runs)
        assert b.same_document()
        again = rx.wait_for(6, timeout=WAIT, path="/hook")[3:]
        assert sorted(r.header("webhook-id") for r in again) == sorted(r.header("webhook-id") for r in first)
        b.shot("webhooks-bulk-redrive")


def test_no_webhooks_says_how_to_add_one(acme, b):
    b.go("/console/agents/bob@acme/webhooks")
    assert "/api/v1/identities/bob@acme/webhooks" in b.text(".empty")


# --------------------------------------------------------------------------- keys


def test_create_and_revoke_a_key(acme, b, console_url):
    b.go("/console/agents/bob@acme/keys")
    b.one("#label").send_keys("ci runner")
    b.button("Create a key")
    key = b.text("#new-key")
    me = f"{console_url}/api/v1/identities/me"
    assert requests.get(me, headers=bearer(key), timeout=30).status_code == 200
    b.shot("keys-created")
    row = next(r for r in b.css("table.keys tbody tr") if r.find_element(By.CSS_SELECTOR, "td").text.endswith(key[-4:]))
    assert "ci runner" in row.text
    row.find_element(By.XPATH, ".//button[normalize-space()='Revoke']").click()
    b.wait_text(f"Key …{key[-4:]} is revoked.", ".flashes")
    assert requests.get(me, headers=bearer(key), timeout=30).status_code == 401
    assert requests.get(me, headers=bearer(acme["bob"][1]), timeout=30).status_code == 200  # its other key still works
    assert key not in b.text("main")  # shown once only
    b.shot("keys")


# --------------------------------------------------------------------------- another org, CSRF, XSS


def test_another_orgs_pages_are_404(app, make_agent, b, console_url):
    _alice, alice_key = make_agent("alice@acme")
    make_agent("bob@acme")
    task = send_message(console_url, alice_key, "bob@acme", "acme only")["task_id"]
    b.sign_in("ops@globex.example", make_operator(app, "ops@globex.example", "globex"))
    for path in (
        "/console/agents/bob@acme",
        "/console/agents/bob@acme?box=sent",
        "/console/agents/bob@acme/webhooks",
        "/console/agents/bob@acme/keys",
        f"/console/threads/{task}",
    ):
        b.go(path)
        assert b.text("h1") == "404 Not found", path
        assert "acme only" not in b.text("main")
    b.shot("not-found")
    b.go("/console/search?q=acme")
    assert "No message" in b.text("#no-hits")
    b.go("/console/")
    assert "bob@acme" not in b.text("main")


def test_a_tampered_csrf_token_is_refused(acme, b, console_url):
    b.go("/console/agents/bob@acme/keys")
    b.d.execute_script("document.querySelectorAll('input[name=csrf_token]').forEach(e => e.value = 'tampered');")
    b.button("Revoke", "table.keys")
    b.wait_text("could not be accepted", "main")
    assert b.text("h1").startswith("400")
    b.shot("csrf-refused")
    me = f"{console_url}/api/v1/identities/me"
    assert requests.get(me, headers=bearer(acme["bob"][1]), timeout=30).status_code == 200


SCRIPT = "<script>alert('xss');window.__xss=1</script>"
IMG = "<img src=x onerror=\"alert('xss');window.__xss=2\">"


def test_agents_payloads_stay_text(acme, b, console_url, app):
    task = send_message(
        console_url,
        acme["alice"][1],
        "bob@acme",
        f"text {SCRIPT} and {IMG} and javascript:alert('xss')",
        artifacts=[
            {"type": "file_diff", "path": f"{IMG}.py", "diff": f"--- a\n+++ b\n@@ -1 +1 @@\n-{SCRIPT}\n+{IMG}\n"},
            {"type": "file_ref", "path": f"src/{IMG}/x.py", "description": SCRIPT},
            {"type": "link", "url": "https://example.com/ok", "title": f"{SCRIPT}{IMG}"},
            {"type": "api_contract", "name": IMG, "spec": SCRIPT},
        ],
    )["task_id"]
    # The API refuses a javascript: link; a row written some other way must still not become one.
    sql(
        app,
        "UPDATE messages SET artifacts = artifacts || CAST(:extra AS jsonb)",
        extra='[{"type": "link", "url": "javascript:alert(\'xss\');window.__xss=3", "title": "click me"},'
        ' {"type": "link", "url": "JaVaScRiPt:window.__xss=4"}]',
    )
    for path in (f"/console/threads/{task}", "/console/agents/bob@acme", "/console/search?q=alert"):
        b.go(path)
        b.one("main")
        no_injection(b)
    b.go(f"/console/threads/{task}")
    assert SCRIPT in b.text("#brief") and IMG in b.text("#brief")
    assert SCRIPT in b.text(".artifact-file_diff") and IMG in b.text(".artifact-file_diff .artifact-head")
    assert IMG in b.text(".artifact-file_ref") and SCRIPT in b.text(".artifact-link a")
    assert "click me (not a web link: javascript:alert('xss');window.__xss=3)" in b.text("#messages")
    assert "(not a web link: JaVaScRiPt:window.__xss=4)" in b.text("#messages")
    assert len(b.css(".unsafe-link")) == 2
    b.shot("xss-as-text")


# --------------------------------------------------------------------------- sessions


def test_an_expired_session_and_signing_out(acme, b, app):
    b.go("/console/")
    b.d.delete_cookie("relay_console")
    b.d.add_cookie(
        {"name": "relay_console", "value": forged_session(app, OPS, 13), "path": "/console", "httpOnly": True}
    )
    b.go("/console/agents/bob@acme")
    b.wait(lambda d: "/console/login" in d.current_url, "the expired session to be sent to sign-in")
    assert "Your session has ended; sign in again." in b.text(".flashes")
    b.shot("session-ended")
    b.sign_in(OPS, acme["password"], here=True)
    # Back where it was going.
    assert b.d.current_url.endswith("/console/agents/bob@acme")
    b.button("Sign out", "header.top")
    b.wait(lambda d: "/console/login" in d.current_url, "the sign-out to go to sign-in")
    assert "You are signed out." in b.text(".flashes")
    b.go("/console/")
    b.wait(lambda d: "/console/login" in d.current_url, "a signed-out visit to go to sign-in")


def test_readable_at_a_phones_width(acme, b, console_url):
    task = send_message(
        console_url,
        acme["alice"][1],
        "bob@acme",
        "a long path src/some/deeply/nested/module/with/a/long/name.py",
        artifacts=[{"type": "file_diff", "path": "a.py", "diff": DIFF}],
    )["task_id"]
    b.d.set_window_size(390, 844)
    for name, path in (
        ("phone-overview", "/console/"),
        ("phone-thread", f"/console/threads/{task}"),
        ("phone-inbox", "/console/agents/bob@acme"),
    ):
        b.go(path)
        b.one("main")
        overflow = b.d.execute_script("return document.documentElement.scrollWidth - window.innerWidth;")
        assert overflow <= 0, f"{path} scrolls sideways by {overflow} px at 390 px"
        b.shot(name)


def test_screenshot_for_the_readme(app, acme, b, console_url):
    """docs/console.png is a leased handoff's page, docs/screenshots/inbox.png an inbox of handoffs in
    every state: run with RELAY_CONSOLE_README_SHOT=1 to renew them (docs/console.md)."""
    from relay.ids import parse_ulid
    from relay.services import threads

    alice, bob = acme["alice"][1], acme["bob"][1]

    def move(task: str, key: str, transition: str, **params) -> None:
        rpc(console_url, key, "tasks/update", {"task_id": task, "transition": transition, **params})

    expired = send_message(console_url, alice, "bob@acme", "Rotate the staging certificates", expires_in_seconds=600)[
        "task_id"
    ]
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 minute' WHERE id = :id", id=parse_ulid(expired))
    with app.app_context():
        assert threads.settle_due() == 1  # recorded by the sweep's own function, as beat does
    move(
        send_message(console_url, alice, "bob@acme", "Draft the Q3 roadmap", priority="low")["task_id"], alice, "cancel"
    )
    failed = send_message(console_url, alice, "bob@acme", "Upgrade the ORM to 2.1", priority="high")["task_id"]
    move(failed, bob, "accept")
    move(failed, bob, "fail", reason="the migration tests fail on 2.1; see the CI log")
    move(
        send_message(console_url, alice, "bob@acme", "Port the billing cron", priority="low")["task_id"],
        bob,
        "decline",
        reason="not mine",
    )
    done = send_message(console_url, alice, "bob@acme", "Fix the flaky login test")["task_id"]
    move(done, bob, "accept")
    move(done, bob, "complete", result_summary="retries removed; the test waits for the session")
    task = send_message(
        console_url,
        alice,
        "bob@acme",
        "Refactored /users: it returns {items, next_cursor}; please update the client",
        artifacts=[
            {"type": "file_diff", "path": "src/api/users.py", "diff": DIFF},
            {"type": "test_command", "command": "pytest -q tests/test_users.py"},
        ],
        priority="high",
        expires_in_seconds=86_400,
    )["task_id"]
    rpc(console_url, bob, "tasks/get", {"task_id": task})  # bob reads it: a receipt on alice's message
    move(task, bob, "accept", session_id="s-1", lease_seconds=3600)
    reply = {"task_id": task, "message": {"parts": [{"type": "text", "text": "On it: the client pages next"}]}}
    rpc(console_url, bob, "message/send", reply)
    send_message(console_url, alice, "bob@acme", "Review the incident timeline before 17:00", priority="urgent")
    b.d.set_window_size(1000, 1200)
    b.go(f"/console/threads/{task}")
    assert "ends" in b.text("#lease") and "HIGH" in b.text("#status").upper()
    assert b.text("#m1 .receipt").startswith("read ")
    b.shot("readme")
    b.d.set_window_size(1280, 1250)
    b.go("/console/agents/bob@acme")
    states = b.text("#threads")
    for state in ("pending", "accepted", "completed", "declined", "failed", "cancelled", "expired"):
        assert state in states, (state, states)
    b.shot("inbox")
    assert (SHOTS / "readme.png").stat().st_size > 0
    if os.environ.get("RELAY_CONSOLE_README_SHOT"):
        docs = Path(__file__).resolve().parent.parent / "docs"
        shutil.copy(SHOTS / "readme.png", docs / "console.png")
        shutil.copy(SHOTS / "inbox.png", docs / "screenshots" / "inbox.png")


def test_a_viewer_sees_pages_and_charts_but_no_action(app, make_agent, b, console_url):
    from relay.services.operators import create_operator

    alice_key = make_agent("alice@acme", name="Alice")[1]
    bob_key = make_agent("bob@acme", name="Bob")[1]
    send_message(console_url, alice_key, "bob@acme", "charted")
    _endpoint(console_url, "bob@acme", bob_key, "http://127.0.0.1:9/hook")  # never reached: a page to chart
    with app.app_context():
        _op, password = create_operator("look@acme.example", "acme", "viewer")
    b.sign_in("look@acme.example", password)
    b.go("/console/")
    chart = b.one("#activity svg")
    assert chart.is_displayed() and chart.size["height"] > 40
    assert len(b.css("#activity rect.bar")) == 48  # 24 hours, two series
    b.shot("overview-chart")
    for path in ("/console/agents/bob@acme", "/console/agents/bob@acme/keys", "/console/agents/bob@acme/webhooks"):
        b.go(path)
        b.one("main h1, main h2")
        labels = [e.text for e in b.css("main button")]
        assert labels == [] or set(labels) <= {"Filter", "Search"}, (path, labels)
    assert b.one("figure.chart svg").is_displayed()  # the endpoint's deliveries chart
    b.shot("webhooks-viewer")
    b.go("/console/audit")
    assert "look@acme.example" in b.text("#audit") and "sign_in" in b.text("#audit")
    b.shot("audit")


# --------------------------------------------------------------------------- the work lifecycle


def test_a_declined_urgent_handoff_with_its_reason_and_receipt(acme, b, console_url):
    alice_key, bob_key = acme["alice"][1], acme["bob"][1]
    task = send_message(console_url, alice_key, "bob@acme", "Migrate the invoices table", priority="urgent")["task_id"]
    b.go(f"/console/threads/{task}")
    assert b.text("#m1 .receipt") == "unread"
    assert "no lease" in b.text("#lease")
    b.mark()
    rpc(console_url, bob_key, "tasks/get", {"task_id": task})  # bob reads it: alice's message has a receipt
    rpc(console_url, bob_key, "tasks/update", {"task_id": task, "transition": "decline", "reason": "not my area"})
    b.wait_text("declined", "#status")  # the open page polls it in, no reload
    assert b.same_document(), "the page reloaded"
    badge = b.one("#status .state-declined")
    assert "TASK_STATE_REJECTED" in badge.get_attribute("title")
    assert badge.value_of_css_property("border-top-style") == "double"  # its own look
    assert "not my area" in b.text("#reason")
    assert b.one("#status .priority-urgent").value_of_css_property("text-transform") == "uppercase"
    b.go(f"/console/threads/{task}")
    receipt = b.text("#m1 .receipt")
    assert receipt.startswith("read ") and "UTC" not in receipt, receipt  # a local time, from time.js
    assert "not my area" in b.text("#audit")
    assert b.css("#live") == [], "a declined handoff is still polled"
    b.shot("thread-declined")
    b.go("/console/agents/bob@acme?state=declined&priority=urgent")
    assert "Migrate the invoices table" in b.text("#threads tbody tr")
    b.shot("inbox-declined-urgent")
    if os.environ.get("RELAY_CONSOLE_README_SHOT"):
        docs = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
        shutil.copy(SHOTS / "thread-declined.png", docs / "thread-declined.png")


def test_an_input_required_handoff_shows_its_question_and_goes_back_to_accepted_when_answered(acme, b, console_url):
    alice_key, bob_key = acme["alice"][1], acme["bob"][1]
    task = send_message(console_url, alice_key, "bob@acme", "Archive the old invoices")["task_id"]
    rpc(console_url, bob_key, "tasks/update", {"task_id": task, "transition": "accept"})
    b.go(f"/console/threads/{task}")
    b.mark()
    rpc(
        console_url,
        bob_key,
        "tasks/update",
        {"task_id": task, "transition": "request_input", "question": "Which years: 2024 only, or all?"},
    )
    b.wait_text("input_required", "#status")  # the open page polls it in, no reload
    assert b.same_document(), "the page reloaded"
    badge = b.one("#status .state-input_required")
    assert "TASK_STATE_INPUT_REQUIRED" in badge.get_attribute("title")
    assert badge.value_of_css_property("border-top-style") == "dotted"  # its own look
    assert "Which years: 2024 only, or all?" in b.text("#question")
    rpc(
        console_url,
        alice_key,
        "message/send",
        {"task_id": task, "message": {"parts": [{"type": "text", "text": "All of them"}]}},
    )
    b.wait_text("accepted", "#status")
    assert b.css("#question") == [] and b.same_document()
    b.go("/console/agents/bob@acme?state=accepted")
    assert "Archive the old invoices" in b.text("#threads tbody tr")
