"""The console over plain HTTP (Flask's test client on the real PostgreSQL and Redis): who may see
what (every route: signed out -> the sign-in page, another org -> 404, own org -> 200/303),
sign-in, sessions, CSRF, limits, headers, and the operators' CLI. One test per rule."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote

import pytest

from tests.conftest import bearer, extra_app, rpc, send_message, sql
from tests.console import csrf_from, forged_session, make_operator, sign_in, token_of, unknown_task_id

ACME, GLOBEX = "ops@acme.example", "ops@globex.example"


@pytest.fixture
def world(app, make_agent, client):
    """Two orgs: acme (alice -> bob, bob with a webhook, a failed delivery, a key) and globex (gus -> greta)."""
    from relay.services import delivery, webhooks
    from relay.services.agents import get_agent, list_keys

    alice, alice_key = make_agent("alice@acme")
    bob, bob_key = make_agent("bob@acme")
    gus, gus_key = make_agent("gus@globex")
    make_agent("greta@globex")
    acme_task = rpc(
        client,
        alice_key,
        "message/send",
        {"recipient": bob, "message": {"parts": [{"type": "text", "text": "hello acme pagination"}]}},
    )["task_id"]
    globex_task = rpc(
        client,
        gus_key,
        "message/send",
        {"recipient": "greta@globex", "message": {"parts": [{"type": "text", "text": "hello globex"}]}},
    )["task_id"]
    with app.app_context():
        bob_agent = get_agent(bob)
        endpoint = webhooks.create_endpoint(bob_agent, "http://127.0.0.1:9/hook", None)
        event = sql(app, "SELECT id FROM events WHERE type = 'message.created' AND agent_id = :a", a=bob_agent.id)[0][0]
        [(delivery_id, _endpoint)] = delivery.fan_out_many([event])
        key_id = str(list_keys(bob_agent)[0].id)
    sql(
        app,
        "UPDATE webhook_deliveries SET status = 'failed', attempt_count = 4, next_attempt_at = NULL, completed_at = now()",
    )
    passwords = {ACME: make_operator(app, ACME, "acme"), GLOBEX: make_operator(app, GLOBEX, "globex")}
    return {
        "bob": bob,
        "bob_key": bob_key,
        "alice": alice,
        "gus": gus,
        "task": acme_task,
        "globex_task": globex_task,
        "webhook": endpoint["id"],
        "delivery": str(delivery_id),
        "key": key_id,
        "passwords": passwords,
    }


def _signed_in(app, world, email):
    client = app.test_client()
    assert sign_in(client, email, world["passwords"][email]).status_code == 303
    return client


PAGES = [
    "/console/",
    "/console/agents/{bob}",
    "/console/agents/{bob}?box=sent&state=pending",
    "/console/agents/{bob}/threads",
    "/console/threads/{task}",
    "/console/threads/{task}/live",
    "/console/search?q=hello",
    "/console/agents/{bob}/webhooks",
    "/console/agents/{bob}/webhooks?webhook={webhook}",
    "/console/agents/{bob}/keys",
    "/console/logout",
]
# Pages that name a thing of acme: another org's operator gets 404 for each.
ORG_PAGES = [p for p in PAGES if "{" in p]
# The fragments htmx polls, and the page each belongs to; the matrix asks for them as htmx does.
FRAGMENTS = {
    "/console/agents/{bob}/threads": "/console/agents/{bob}",
    "/console/threads/{task}/live": "/console/threads/{task}",
}


def _as_htmx(page: str) -> dict:
    return {"HX-Request": "true"} if page in FRAGMENTS else {}


ACTIONS = [
    ("/console/threads/{task}/cancel", {}, 303),
    ("/console/agents/{bob}/blocks", {"blocked_handle": "alice@acme"}, 303),
    ("/console/agents/{bob}/blocks/alice@acme/delete", {}, 303),
    ("/console/agents/{bob}/keys", {"label": "ci"}, 201),
    ("/console/agents/{bob}/keys/{key}/revoke", {}, 303),
    ("/console/agents/{bob}/webhooks/{webhook}/disable", {}, 303),
    ("/console/agents/{bob}/webhooks/{webhook}/enable", {}, 303),
    ("/console/agents/{bob}/webhooks/{webhook}/test", {}, 303),
    ("/console/agents/{bob}/webhooks/{webhook}/deliveries/{delivery}/redrive", {}, 303),
    ("/console/agents/{bob}/webhooks/{webhook}/recover", {"since": "2020-01-01T00:00", "tz_offset": "0"}, 303),
    (
        "/console/agents/{bob}/webhooks/{webhook}/bulk-redrive",
        {
            "job_id": "6f1c8a52-0d5e-4b7a-9c3e-2a4b6c8d0e1f",
            "since": "2020-01-01T00:00:00+00:00",
            "until": "2999-01-01T00:00:00+00:00",
        },
        303,
    ),
]
ACTION_IDS = [a[0] for a in ACTIONS]


# --------------------------------------------------------------------------- the authorization matrix


@pytest.mark.parametrize("page", PAGES)
def test_signed_out_page_redirects_to_sign_in(app, world, page):
    resp = app.test_client().get(page.format(**world))
    assert resp.status_code == 302
    assert resp.headers["Location"].startswith("/console/login?next=")
    # A fragment opened as a page sends the sign-in on to its page, never to itself.
    assert unquote(resp.headers["Location"].split("next=", 1)[1]) == FRAGMENTS.get(page, page).format(**world)


@pytest.mark.parametrize("page", ORG_PAGES)
def test_other_orgs_page_is_404(app, world, page):
    resp = _signed_in(app, world, GLOBEX).get(page.format(**world), headers=_as_htmx(page))
    assert resp.status_code == 404
    assert "Not found" in resp.get_data(as_text=True)


@pytest.mark.parametrize("page", PAGES)
def test_own_orgs_page_is_200(app, world, page):
    resp = _signed_in(app, world, ACME).get(page.format(**world), headers=_as_htmx(page))
    assert resp.status_code == 200, resp.get_data(as_text=True)[:500]


@pytest.mark.parametrize(("action", "form", "status"), ACTIONS, ids=ACTION_IDS)
def test_signed_out_action_redirects_to_sign_in(app, world, action, form, status):
    client = app.test_client()
    token = csrf_from(client.get("/console/login").get_data(as_text=True))
    resp = client.post(action.format(**world), data={**form, "csrf_token": token})
    assert resp.status_code == 302 and resp.headers["Location"] == "/console/login"


@pytest.mark.parametrize(("action", "form", "status"), ACTIONS, ids=ACTION_IDS)
def test_other_orgs_action_is_404(app, world, action, form, status):
    client = _signed_in(app, world, GLOBEX)
    resp = client.post(action.format(**world), data={**form, "csrf_token": token_of(client)})
    assert resp.status_code == 404


@pytest.mark.parametrize(("action", "form", "status"), ACTIONS, ids=ACTION_IDS)
def test_own_orgs_action_succeeds(app, world, action, form, status):
    client = _signed_in(app, world, ACME)
    resp = client.post(action.format(**world), data={**form, "csrf_token": token_of(client)})
    assert resp.status_code == status, resp.get_data(as_text=True)[:800]
    if status == 303:
        page = client.get(resp.headers["Location"]).get_data(as_text=True)
        assert 'class="flash ok"' in page, page[:2000]


def test_another_orgs_action_changes_nothing(app, world):
    client = _signed_in(app, world, GLOBEX)
    token = token_of(client)
    client.post(f"/console/agents/{world['bob']}/keys/{world['key']}/revoke", data={"csrf_token": token})
    client.post(f"/console/threads/{world['task']}/cancel", data={"csrf_token": token})
    assert sql(app, "SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == [(0,)]
    assert sql(
        app, "SELECT state FROM threads WHERE sender_id = (SELECT id FROM agents WHERE handle = 'alice@acme')"
    ) == [("pending",)]


# --------------------------------------------------------------------------- roles

VIEWER = "look@acme.example"

# What an action could change, read whole: a refused action must leave every row as it was.
_STATE = [
    "SELECT id::text, state, version FROM threads ORDER BY id",
    "SELECT blocker_id::text, blocked_id::text FROM blocks ORDER BY 1, 2",
    "SELECT id::text, revoked_at FROM api_keys ORDER BY id",
    "SELECT id::text, enabled, failing_since FROM webhook_endpoints ORDER BY id",
    "SELECT id::text, status, attempt_count, next_attempt_at FROM webhook_deliveries ORDER BY id",
    "SELECT count(*) FROM events",
    "SELECT count(*) FROM messages",
    "SELECT count(*) FROM audit_events",
]


def _viewer(app, world):
    from relay.services.operators import create_operator

    with app.app_context():
        _operator, password = create_operator(VIEWER, "acme", "viewer")
    client = app.test_client()
    assert sign_in(client, VIEWER, password).status_code == 303
    return client


@pytest.mark.parametrize(("action", "form", "status"), ACTIONS, ids=ACTION_IDS)
def test_a_viewers_action_is_403_and_changes_nothing(app, world, action, form, status):
    viewer = _viewer(app, world)
    before = [sql(app, q) for q in _STATE]
    resp = viewer.post(action.format(**world), data={**form, "csrf_token": token_of(viewer)})
    assert resp.status_code == 403, resp.get_data(as_text=True)[:800]
    assert "Viewers cannot change anything" in resp.get_data(as_text=True)
    assert [sql(app, q) for q in _STATE] == before


# Every header the console's htmx sends (its polled fragments' hx-get: HX-Request,
# HX-Current-URL, HX-Target, HX-Trigger, HX-Trigger-Name) and the rest htmx can send: a
# viewer may send any of them with a POST, and none may open a way past the role check.
HTMX_HEADERS = {
    "htmx": {"HX-Request": "true"},
    "htmx-all": {
        "HX-Request": "true",
        "HX-Current-URL": "http://localhost/console/",
        "HX-Target": "live",
        "HX-Trigger": "live",
        "HX-Trigger-Name": "live",
        "HX-Boosted": "true",
        "HX-Prompt": "yes",
        "HX-History-Restore-Request": "true",
    },
}


@pytest.mark.parametrize("headers", list(HTMX_HEADERS.values()), ids=list(HTMX_HEADERS))
@pytest.mark.parametrize(("action", "form", "status"), ACTIONS, ids=ACTION_IDS)
def test_a_viewers_action_with_htmx_headers_is_403_and_changes_nothing(app, world, action, form, status, headers):
    viewer = _viewer(app, world)
    before = [sql(app, q) for q in _STATE]
    resp = viewer.post(action.format(**world), data={**form, "csrf_token": token_of(viewer)}, headers=headers)
    assert resp.status_code == 403, resp.get_data(as_text=True)[:800]
    assert "Viewers cannot change anything" in resp.get_data(as_text=True)
    assert [sql(app, q) for q in _STATE] == before


def test_the_role_matrix_covers_every_console_action(app, world):
    """Every POST route of the console but sign-in and sign-out is in ACTIONS (so is refused to viewers above)."""
    from relay.transport.console.views import ANY_ROLE

    routes = {r.endpoint for r in app.url_map.iter_rules() if r.endpoint.startswith("console.") and "POST" in r.methods}
    adapter = app.url_map.bind("localhost")
    covered = {adapter.match(a.format(**world).split("?")[0], method="POST")[0] for a, _f, _s in ACTIONS}
    assert routes - ANY_ROLE == covered


def test_a_viewers_revoke_leaves_the_key_working(app, world, client):
    viewer = _viewer(app, world)
    resp = viewer.post(
        f"/console/agents/{world['bob']}/keys/{world['key']}/revoke", data={"csrf_token": token_of(viewer)}
    )
    assert resp.status_code == 403
    assert client.get("/api/v1/identities/me", headers=bearer(world["bob_key"])).status_code == 200


def test_a_viewer_sees_every_page_and_no_action_button(app, world):
    viewer, admin = _viewer(app, world), _signed_in(app, world, ACME)
    posts = re.compile(r'<form method="post" action="([^"]+)"')
    admin_forms = 0
    for page in PAGES:
        url = page.format(**world)
        seen = viewer.get(url, headers=_as_htmx(page))
        assert seen.status_code == 200, url
        assert [a for a in posts.findall(seen.get_data(as_text=True)) if a != "/console/logout"] == [], url
        admin_forms += len(posts.findall(admin.get(url, headers=_as_htmx(page)).get_data(as_text=True)))
    assert admin_forms > len(PAGES)  # the same pages carry actions for an admin
    assert 'look@acme.example · <strong>acme</strong> · <span class="role">viewer</span>' in viewer.get(
        "/console/"
    ).get_data(as_text=True)


def test_a_role_change_holds_from_the_next_request_of_an_open_session(app, world):
    from relay.services.operators import set_role

    admin = _signed_in(app, world, ACME)
    with app.app_context():
        assert set_role(ACME, "viewer")[1] == "admin"
    cancel = f"/console/threads/{world['task']}/cancel"
    assert admin.post(cancel, data={"csrf_token": token_of(admin)}).status_code == 403
    with app.app_context():
        set_role(ACME, "admin")
    assert admin.post(cancel, data={"csrf_token": token_of(admin)}).status_code == 303


def test_cli_creates_viewers_and_sets_roles(app, relay_cli):
    created = json.loads(relay_cli("create", "v@example.com", "--org", "acme", "--role", "viewer", "--json").stdout)
    assert created["role"] == "viewer"
    assert [o["role"] for o in json.loads(relay_cli("list", "--json").stdout)] == ["viewer"]
    assert relay_cli("set-role", "v@example.com", "admin").stdout.strip() == "v@example.com is admin (was viewer)"
    assert relay_cli("set-role", "V@example.com", "ADMIN").stdout.strip() == "v@example.com is still admin"
    bad = relay_cli("set-role", "v@example.com", "owner")
    assert bad.returncode == 2 and "'owner' is not one of 'admin', 'viewer'" in bad.stderr, bad.stderr
    missing = relay_cli("set-role", "nobody@example.com", "viewer")
    assert missing.returncode == 1 and "no operator nobody@example.com" in missing.stderr


def test_overview_lists_only_the_orgs_agents(app, world):
    page = _signed_in(app, world, GLOBEX).get("/console/").get_data(as_text=True)
    assert "gus@globex" in page and "greta@globex" in page
    assert "@acme" not in page


def test_search_finds_only_the_orgs_messages(app, world):
    acme = _signed_in(app, world, ACME).get("/console/search?q=hello").get_data(as_text=True)
    globex = _signed_in(app, world, GLOBEX).get("/console/search?q=hello").get_data(as_text=True)
    assert f"/console/threads/{world['task']}" in acme and world["globex_task"] not in acme
    assert f"/console/threads/{world['globex_task']}" in globex and world["task"] not in globex


def test_a_thread_across_orgs_is_seen_by_both_and_cancelled_only_by_its_senders_org(app, world, client):
    task = rpc(
        client,
        world["bob_key"],
        "message/send",
        {"recipient": "gus@globex", "message": {"parts": [{"type": "text", "text": "across orgs"}]}},
    )["task_id"]
    globex = _signed_in(app, world, GLOBEX)
    assert globex.get(f"/console/threads/{task}").status_code == 200
    resp = globex.post(f"/console/threads/{task}/cancel", data={"csrf_token": token_of(globex)})
    assert resp.status_code == 303
    assert "only the sender may cancel" in globex.get(resp.headers["Location"]).get_data(as_text=True)
    acme = _signed_in(app, world, ACME)
    resp = acme.post(f"/console/threads/{task}/cancel", data={"csrf_token": token_of(acme)})
    assert "The handoff is cancelled." in acme.get(resp.headers["Location"]).get_data(as_text=True)


def test_unknown_and_malformed_names_are_the_same_404(app, world):
    client = _signed_in(app, world, ACME)
    for path in (
        "/console/agents/nobody@acme",
        "/console/agents/not a handle",
        f"/console/threads/{unknown_task_id()}",
        "/console/threads/not-a-ulid",
        "/console/no/such/page",
    ):
        resp = client.get(path)
        assert resp.status_code == 404, path
        assert "Nothing of that name exists in your org." in resp.get_data(as_text=True)


# --------------------------------------------------------------------------- sign-in


def test_login_form_has_email_password_and_hidden_csrf_token(app):
    page = app.test_client().get("/console/login").get_data(as_text=True)
    assert re.search(r'<input[^>]*name="email"', page) and re.search(r'<input[^>]*name="password"', page)
    assert re.search(r'<input[^>]*name="csrf_token"[^>]*type="hidden"', page)
    assert '<label for="email">' in page and '<label for="password">' in page


def test_sign_in_redirects_to_the_console(app, world):
    resp = sign_in(app.test_client(), ACME, world["passwords"][ACME])
    assert resp.status_code == 303 and resp.headers["Location"] == "/console/"


def test_sign_in_goes_back_only_to_a_console_page(app, world):
    client = app.test_client()
    token = csrf_from(client.get("/console/login").get_data(as_text=True))
    form = {"email": ACME, "password": world["passwords"][ACME], "csrf_token": token}
    assert client.post("/console/login?next=//evil.example/x", data=form).headers["Location"] == "/console/"
    client = app.test_client()
    form["csrf_token"] = csrf_from(client.get("/console/login").get_data(as_text=True))
    assert (
        client.post("/console/login?next=/console/search?q=x", data=form).headers["Location"] == "/console/search?q=x"
    )


def _attempt(app, email, password):
    client = app.test_client()
    token = csrf_from(client.get("/console/login").get_data(as_text=True))
    resp = client.post("/console/login", data={"email": email, "password": password, "csrf_token": token})
    return resp.status_code, re.sub(r'value="[^"]*"', "", resp.get_data(as_text=True))


def test_wrong_email_and_wrong_password_get_the_same_answer(app, world):
    wrong_email = _attempt(app, "nobody@acme.example", world["passwords"][ACME])
    wrong_password = _attempt(app, ACME, "not-the-password")
    assert wrong_email[0] == wrong_password[0] == 401
    assert "wrong email or password" in wrong_email[1]
    # The same page but for the email typed back into its field.
    assert wrong_email[1].replace("nobody@acme.example", ACME) == wrong_password[1]


def test_a_disabled_operator_gets_the_same_answer_and_its_sessions_end(app, world):
    from relay.services.operators import disable_operator

    client = _signed_in(app, world, ACME)
    with app.app_context():
        disable_operator(ACME)
    assert client.get("/console/").status_code == 302
    assert _attempt(app, ACME, world["passwords"][ACME])[0] == 401


def test_reset_password_ends_sessions_and_the_old_password(app, world):
    from relay.services.operators import reset_password

    client = _signed_in(app, world, ACME)
    with app.app_context():
        _operator, new = reset_password(ACME)
    assert client.get("/console/").status_code == 302
    assert _attempt(app, ACME, world["passwords"][ACME])[0] == 401
    assert _attempt(app, ACME, new)[0] == 303


def test_passwords_are_stored_as_argon2_hashes_only(app, world):
    [(hashed,)] = sql(app, "SELECT password_hash FROM operators WHERE email = :e", e=ACME)
    assert hashed.startswith("$argon2id$") and world["passwords"][ACME] not in hashed


def test_sign_in_is_refused_under_the_public_development_key(base_env, celery_app, redis_url):
    env = {k: v for k, v in base_env.items() if k != "RELAY_SECRET_KEY"}
    with extra_app(env, celery_app, redis_url, RELAY_ENV="development") as other:
        client = other.test_client()
        token = csrf_from(client.get("/console/login").get_data(as_text=True))
        resp = client.post("/console/login", data={"email": ACME, "password": "x", "csrf_token": token})
    assert resp.status_code == 503 and "RELAY_SECRET_KEY" in resp.get_data(as_text=True)


# --------------------------------------------------------------------------- sessions


def _cookie_header(resp) -> str:
    return next(v for k, v in resp.headers.items() if k == "Set-Cookie" and v.startswith("relay_console="))


def test_session_cookie_is_httponly_samesite_lax_and_scoped_to_the_console(app, world):
    cookie = _cookie_header(sign_in(app.test_client(), ACME, world["passwords"][ACME]))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # RELAY_ENV=test: plain http on loopback


def test_session_cookie_is_secure_in_production(base_env, celery_app, redis_url):
    with extra_app(base_env, celery_app, redis_url, RELAY_ENV="production") as other:
        password = make_operator(other, "prod@acme.example", "acme")
        cookie = _cookie_header(sign_in(other.test_client(), "prod@acme.example", password))
    assert "Secure" in cookie


def test_a_session_past_its_lifetime_is_sent_to_sign_in(app, world):
    client = app.test_client()
    client.set_cookie("relay_console", forged_session(app, ACME, 12.5), path="/console")
    resp = client.get("/console/agents/bob@acme")
    assert resp.status_code == 302 and resp.headers["Location"].startswith("/console/login")
    assert "Your session has ended" in client.get(resp.headers["Location"]).get_data(as_text=True)


def test_a_session_within_its_lifetime_is_served(app, world):
    client = app.test_client()
    client.set_cookie("relay_console", forged_session(app, ACME, 11.5), path="/console")
    assert client.get("/console/").status_code == 200


def test_the_session_lifetime_is_configurable(base_env, celery_app, redis_url, app, world):
    with extra_app(base_env, celery_app, redis_url, RELAY_CONSOLE_SESSION_HOURS="0.5") as other:
        client = other.test_client()
        client.set_cookie("relay_console", forged_session(app, ACME, 0.75), path="/console")
        assert client.get("/console/").status_code == 302
        client.set_cookie("relay_console", forged_session(app, ACME, 0.25), path="/console")
        assert client.get("/console/").status_code == 200


def test_logout_ends_the_session_even_for_a_copied_cookie(app, world):
    client = _signed_in(app, world, ACME)
    copied = client.get_cookie("relay_console", path="/console").value
    resp = client.post("/console/logout", data={"csrf_token": token_of(client)})
    assert resp.status_code == 303 and resp.headers["Location"] == "/console/login"
    assert client.get("/console/").status_code == 302
    replay = app.test_client()
    replay.set_cookie("relay_console", copied, path="/console")
    assert replay.get("/console/").status_code == 302


def test_a_polled_partial_of_an_ended_session_redirects_htmx(app, world):
    resp = app.test_client().get(f"/console/agents/{world['bob']}/threads", headers={"HX-Request": "true"})
    assert resp.status_code == 401 and resp.headers["HX-Redirect"].startswith("/console/login")


def _next_of(location: str) -> str:
    return unquote(location.split("next=", 1)[1])


def test_a_polled_partial_sends_the_sign_in_back_to_the_page_it_polls_from(app, world):
    task = world["task"]
    live = f"/console/threads/{task}/live?seen=1&version=1"
    page = f"/console/threads/{task}"
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://localhost{page}?tab=audit"}
    resp = app.test_client().get(live, headers=headers)
    assert resp.status_code == 401 and _next_of(resp.headers["HX-Redirect"]) == f"{page}?tab=audit"
    # Another host's URL, or none: the fragment's own page, never the fragment.
    for current in ("http://evil.example/console/", None):
        hx = {"HX-Request": "true", **({"HX-Current-URL": current} if current else {})}
        resp = app.test_client().get(live, headers=hx)
        assert resp.status_code == 401 and _next_of(resp.headers["HX-Redirect"]) == page, current
    # Signing in from that link lands on the page (a full document), not on a 204 or a bare table.
    client = app.test_client()
    login = client.get(resp.headers["HX-Redirect"])
    token = csrf_from(login.get_data(as_text=True))
    done = client.post(
        resp.headers["HX-Redirect"],
        data={"email": ACME, "password": world["passwords"][ACME], "csrf_token": token},
    )
    assert done.status_code == 303 and done.headers["Location"] == page
    assert "<html" in client.get(done.headers["Location"]).get_data(as_text=True)


def test_a_fragment_opened_as_a_page_redirects_to_its_page(app, world):
    client = _signed_in(app, world, ACME)
    resp = client.get(f"/console/agents/{world['bob']}/threads?box=sent&state=pending")
    assert resp.status_code == 302
    assert resp.headers["Location"] == f"/console/agents/{world['bob']}?box=sent&state=pending"
    resp = client.get(f"/console/threads/{world['task']}/live?seen=0&version=0")
    assert resp.status_code == 302 and resp.headers["Location"] == f"/console/threads/{world['task']}"
    # Its query is carried as data: url_for's own keywords in it are neither a 500 nor an option.
    for query in ("handle=evil", "_external=1", "_scheme=https", "_anchor=x", "_method=POST", "box=a&box=b"):
        resp = client.get(f"/console/agents/{world['bob']}/threads?{query}")
        assert resp.status_code == 302, (query, resp.status_code)
        assert resp.headers["Location"] == f"/console/agents/{world['bob']}?{query}", query
    signed_out = app.test_client().get(f"/console/agents/{world['bob']}/threads?handle=evil")
    assert signed_out.status_code == 302 and "next=" in signed_out.headers["Location"]


@pytest.mark.parametrize(
    "bad_next",
    ["/console/%0D%0ASet-Cookie:%20pwned=1", "/console/%0Aa", "/console/%09x", "/console/%7Fx", "//evil.example/"],
)
def test_a_next_with_control_characters_or_another_host_falls_back_to_the_overview(app, world, bad_next):
    client = _signed_in(app, world, ACME)
    resp = client.get(f"/console/login?next={bad_next}")  # signed in: straight on
    assert resp.status_code == 302 and resp.headers["Location"] == "/console/"
    fresh = app.test_client()
    token = csrf_from(fresh.get(f"/console/login?next={bad_next}").get_data(as_text=True))
    resp = fresh.post(
        f"/console/login?next={bad_next}",
        data={"email": ACME, "password": world["passwords"][ACME], "csrf_token": token},
    )
    assert resp.status_code == 303 and resp.headers["Location"] == "/console/"
    assert "Set-Cookie" not in resp.headers or "pwned" not in resp.headers["Set-Cookie"]


# --------------------------------------------------------------------------- CSRF


def test_a_post_without_a_csrf_token_is_a_400_page(app, world):
    client = _signed_in(app, world, ACME)
    resp = client.post(f"/console/agents/{world['bob']}/keys/{world['key']}/revoke", data={})
    assert resp.status_code == 400 and "could not be accepted" in resp.get_data(as_text=True)
    assert sql(app, "SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL") == [(0,)]


def test_a_post_with_a_wrong_csrf_token_is_a_400_page(app, world):
    client = _signed_in(app, world, ACME)
    resp = client.post(f"/console/threads/{world['task']}/cancel", data={"csrf_token": "forged"})
    assert resp.status_code == 400
    assert sql(app, "SELECT count(*) FROM threads WHERE state = 'cancelled'") == [(0,)]


def test_another_sessions_csrf_token_is_refused(app, world):
    mine, theirs = _signed_in(app, world, ACME), _signed_in(app, world, ACME)
    resp = mine.post(f"/console/threads/{world['task']}/cancel", data={"csrf_token": token_of(theirs)})
    assert resp.status_code == 400


def test_sign_in_needs_a_csrf_token(app, world):
    resp = app.test_client().post("/console/login", data={"email": ACME, "password": world["passwords"][ACME]})
    assert resp.status_code == 400 and "Set-Cookie" not in {k for k, v in resp.headers.items() if "op" in v}


# --------------------------------------------------------------------------- sign-in limits


def _attempts(other, email, n):
    client = other.test_client()
    token = csrf_from(client.get("/console/login").get_data(as_text=True))
    return [
        client.post("/console/login", data={"email": email, "password": "wrong", "csrf_token": token}) for _ in range(n)
    ]


def test_sign_in_attempts_are_limited_per_email(base_env, celery_app, redis_url):
    with extra_app(base_env, celery_app, redis_url, RELAY_CONSOLE_LOGIN_LIMIT="2/minute") as other:
        first, second, third = _attempts(other, "target@acme.example", 3)
        other_email = _attempts(other, "someone@acme.example", 1)[0]
    assert [first.status_code, second.status_code, third.status_code] == [401, 401, 429]
    assert 1 <= int(third.headers["Retry-After"]) <= 60 and "Too many sign-in attempts" in third.get_data(as_text=True)
    assert other_email.status_code == 401  # another email from the same address still gets its answer


def test_sign_in_attempts_are_limited_per_client_address(base_env, celery_app, redis_url):
    with extra_app(base_env, celery_app, redis_url, RELAY_CONSOLE_LOGIN_ADDRESS_LIMIT="2/minute") as other:
        statuses = [_attempts(other, f"user{i}@acme.example", 1)[0].status_code for i in range(3)]
    assert statuses == [401, 401, 429]


# --------------------------------------------------------------------------- headers and actions' rules


@pytest.mark.parametrize(
    "page", ["/console/login", "/console/", "/console/nope", "/console/static/console/console.css"]
)
def test_console_responses_carry_the_security_headers(app, world, page):
    resp = _signed_in(app, world, ACME).get(page)
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
    assert resp.headers["X-Frame-Options"] == "DENY" and resp.headers["Referrer-Policy"] == "no-referrer"


def test_pages_have_no_inline_script_or_style(app, world):
    client = _signed_in(app, world, ACME)
    for page in [p.format(**world) for p in PAGES if "/live" not in p] + ["/console/login"]:
        html = client.get(page).get_data(as_text=True)
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), page
        assert "<style" not in html and " style=" not in html and " on" + "click=" not in html, page


def test_a_new_key_is_shown_once_and_works(app, world, client):
    console = _signed_in(app, world, ACME)
    resp = console.post(f"/console/agents/{world['bob']}/keys", data={"label": "ci", "csrf_token": token_of(console)})
    key = re.search(r'<code id="new-key">(ah_live_[a-z2-7]{32})</code>', resp.get_data(as_text=True)).group(1)
    assert client.get("/api/v1/identities/me", headers=bearer(key)).status_code == 200
    assert key not in console.get(f"/console/agents/{world['bob']}/keys").get_data(as_text=True)
    assert resp.headers["Cache-Control"] == "no-store"


def test_redrive_of_a_delivery_that_is_not_failed_is_refused_by_name(app, world):
    sql(app, "UPDATE webhook_deliveries SET status = 'succeeded'")
    client = _signed_in(app, world, ACME)
    resp = client.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/deliveries/{world['delivery']}/redrive",
        data={"csrf_token": token_of(client)},
    )
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert "only a failed delivery can be redriven; this one is succeeded" in page


def test_redrive_requeues_the_same_row_with_a_fresh_schedule(app, world):
    client = _signed_in(app, world, ACME)
    client.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/deliveries/{world['delivery']}/redrive",
        data={"csrf_token": token_of(client)},
    )
    rows = sql(app, "SELECT id::text, status, attempt_count, next_attempt_at IS NOT NULL FROM webhook_deliveries")
    assert rows == [(world["delivery"], "pending", 0, True)]


def test_recover_needs_an_enabled_endpoint(app, world):
    sql(app, "UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'test'")
    client = _signed_in(app, world, ACME)
    resp = client.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/recover",
        data={"since": "2020-01-01T00:00", "csrf_token": token_of(client)},
    )
    assert "the endpoint is disabled; enable it first" in client.get(resp.headers["Location"]).get_data(as_text=True)


def test_recover_since_a_time_in_the_future_is_refused(app, world):
    client = _signed_in(app, world, ACME)
    later = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    resp = client.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/recover",
        data={"since": later, "tz_offset": "0", "csrf_token": token_of(client)},
    )
    assert "since: is in the future" in client.get(resp.headers["Location"]).get_data(as_text=True)


def test_recover_reads_since_in_the_viewers_zone(app, world):
    """A local time plus the browser's getTimezoneOffset() is a UTC time: events before it stay alone."""
    sql(app, "UPDATE events SET created_at = created_at - interval '2 hours'")
    sent = sql(app, "SELECT max(created_at) FROM events")[0][0].astimezone(UTC)
    later = sent + timedelta(minutes=30)
    # A viewer at UTC-05:00 types the local time 30 minutes after the event: offset 300 minutes.
    local = (later - timedelta(minutes=300)).strftime("%Y-%m-%dT%H:%M:%S")
    client = _signed_in(app, world, ACME)
    resp = client.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/recover",
        data={"since": local, "tz_offset": "300", "csrf_token": token_of(client)},
    )
    assert "Nothing to recover" in client.get(resp.headers["Location"]).get_data(as_text=True)
    assert sql(app, "SELECT status FROM webhook_deliveries") == [("failed",)]


def test_recover_sends_events_the_endpoint_never_got(app, world, client):
    """Events fanned out while the endpoint was disabled have no delivery for it: recover makes one."""
    from relay.services import delivery

    sql(app, "UPDATE webhook_endpoints SET enabled = false")
    rpc(
        client,
        _key_of(app, world["alice"]),
        "message/send",
        {"task_id": world["task"], "message": {"parts": [{"type": "text", "text": "to bob while disabled"}]}},
    )
    with app.app_context():
        events = [r[0] for r in sql(app, "SELECT id FROM events WHERE fanned_out_at IS NULL")]
        assert delivery.fan_out_many(events) == []  # disabled: nothing fanned out to it
    sql(app, "UPDATE webhook_endpoints SET enabled = true")
    console = _signed_in(app, world, ACME)
    resp = console.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/recover",
        data={"since": "2020-01-01T00:00:00", "tz_offset": "0", "csrf_token": token_of(console)},
    )
    page = console.get(resp.headers["Location"]).get_data(as_text=True)
    assert "1 failed delivery queued again, 1 event never sent queued" in page
    rows = sql(app, "SELECT status, count(*) FROM webhook_deliveries GROUP BY status")
    assert rows == [("pending", 2)]


def _key_of(app, handle):
    from relay.services.agents import create_key

    with app.app_context():
        return create_key(handle, "test").api_key


def test_block_from_the_console_holds_for_the_api(app, world, client):
    console = _signed_in(app, world, ACME)
    console.post(
        f"/console/agents/{world['bob']}/blocks", data={"blocked_handle": "alice@acme", "csrf_token": token_of(console)}
    )
    resp = client.post(
        "/a2a",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {"recipient": "bob@acme", "message": {"parts": [{"type": "text", "text": "blocked?"}]}},
        },
        headers=bearer(_key_of(app, "alice@acme")),
    )
    assert resp.get_json()["error"]["data"]["symbol"] == "teammate_blocked"


def test_a_bad_query_string_is_a_page_naming_the_parameter(app, world):
    resp = _signed_in(app, world, ACME).get(f"/console/agents/{world['bob']}?state=bogus&cursor=garbage")
    body = resp.get_data(as_text=True)
    assert resp.status_code == 422 and "state" in body and "cursor" in body


# --------------------------------------------------------------------------- the operators' CLI


@pytest.fixture
def relay_cli(base_env, tmp_path):
    env = {**base_env, "RELAY_HOME": str(tmp_path / "home")}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "relay.ops.cli", "operators", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return run


def test_cli_creates_lists_resets_and_disables_operators(app, relay_cli):
    created = relay_cli("create", "You@Example.com", "--org", "acme", "--json")
    assert created.returncode == 0, created.stderr
    body = json.loads(created.stdout)
    assert set(body) == {"email", "org", "role", "password"} and body["email"] == "you@example.com"
    assert (body["org"], body["role"]) == ("acme", "admin")
    assert _attempt(app, "you@example.com", body["password"])[0] == 303
    listed = json.loads(relay_cli("list", "--json").stdout)
    assert [(o["email"], o["org"], o["disabled_at"]) for o in listed] == [("you@example.com", "acme", None)]
    assert body["password"] not in relay_cli("list").stdout
    reset = relay_cli("reset-password", "you@example.com", "--json")
    new = json.loads(reset.stdout)["password"]
    assert new != body["password"] and _attempt(app, "you@example.com", new)[0] == 303
    assert relay_cli("disable", "you@example.com").stdout.strip() == "disabled operator you@example.com"
    assert _attempt(app, "you@example.com", new)[0] == 401


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "not-an-email", "--org", "acme"), "email: 'not-an-email' is not an email address"),
        (("create", "a@b.example", "--org", "-bad-"), "org: '-bad-'"),
        (("disable", "nobody@example.com"), "no operator nobody@example.com"),
        (("reset-password", "nobody@example.com"), "no operator nobody@example.com"),
    ],
)
def test_cli_refuses_in_one_line_naming_the_reason(relay_cli, args, message):
    proc = relay_cli(*args)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_cli_refuses_a_second_operator_with_one_email(relay_cli):
    assert relay_cli("create", "dup@example.com", "--org", "acme").returncode == 0
    proc = relay_cli("create", "DUP@example.com", "--org", "globex")
    assert proc.returncode == 1 and "an operator dup@example.com already exists" in proc.stderr


def test_cli_plain_create_prints_the_password_once(relay_cli):
    proc = relay_cli("create", "plain@example.com", "--org", "acme")
    lines = proc.stdout.splitlines()
    assert lines[0] == "created operator plain@example.com of org acme (admin)"
    assert re.fullmatch(r"password \(shown once\): [A-Za-z0-9_-]{24}", lines[1])


def test_relay_up_keeps_a_generated_secret_key_per_home(tmp_path):
    from relay.config import DEV_SECRET_KEY
    from relay.ops.embedded import secret_key

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    made = secret_key(fresh)
    assert len(made) >= 40 and made != DEV_SECRET_KEY
    assert secret_key(fresh) == made  # the same key on every start: sessions and webhook secrets survive
    assert (fresh / "secret_key").stat().st_mode & 0o777 == 0o600
    older = tmp_path / "older"
    (older / "pg").mkdir(parents=True)  # a home whose database already holds secrets under the old value
    assert secret_key(older) == DEV_SECRET_KEY


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("RELAY_CONSOLE_SESSION_HOURS", "0", "RELAY_CONSOLE_SESSION_HOURS must be a positive number of hours"),
        ("RELAY_CONSOLE_SESSION_HOURS", "soon", "RELAY_CONSOLE_SESSION_HOURS must be a number of hours"),
        ("RELAY_CONSOLE_SESSION_HOURS", "100000", "RELAY_CONSOLE_SESSION_HOURS must be at most 8784 hours"),
        ("RELAY_CONSOLE_LOGIN_LIMIT", "often", "RELAY_CONSOLE_LOGIN_LIMIT must be a rate such as '60/minute'"),
        ("RELAY_CONSOLE_LOGIN_ADDRESS_LIMIT", "x", "RELAY_CONSOLE_LOGIN_ADDRESS_LIMIT must be a rate"),
    ],
)
def test_console_settings_are_checked_naming_the_variable(base_env, name, value, message):
    from relay.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_settings({**base_env, name: value})


def test_an_endpoint_with_more_deliveries_than_a_page_links_to_the_older_ones(app, world):
    from relay.services import delivery, threads
    from relay.services.agents import get_agent

    with app.app_context():
        alice = get_agent(world["alice"])
        for i in range(12):
            threads.send_message(
                alice, {"recipient": world["bob"], "message": {"parts": [{"type": "text", "text": f"n{i}"}]}}
            )
        events = [
            row[0]
            for row in sql(
                app,
                "SELECT id FROM events WHERE type = 'message.created' AND agent_id = "
                "(SELECT id FROM agents WHERE handle = :b) AND id NOT IN (SELECT event_id FROM webhook_deliveries)",
                b=world["bob"],
            )
        ]
        assert len(events) == 12
        delivery.fan_out_many(events)
    console = _signed_in(app, world, ACME)
    page = console.get(f"/console/agents/{world['bob']}/webhooks")
    assert page.status_code == 200, page.get_data(as_text=True)[:500]
    older = re.search(r'href="([^"]+)" rel="next">Older deliveries', page.get_data(as_text=True))
    assert older, "no link to the older deliveries"
    assert console.get(older.group(1).replace("&amp;", "&")).status_code == 200


def test_an_unknown_webhook_filter_is_404(app, world):
    """``?webhook=`` naming no endpoint of the agent is the console's 404 page, not a 500."""
    import uuid

    missing = uuid.uuid4()
    resp = _signed_in(app, world, ACME).get(f"/console/agents/{world['bob']}/webhooks?webhook={missing}")
    assert resp.status_code == 404, resp.get_data(as_text=True)[:500]
    assert "Not found" in resp.get_data(as_text=True)


def test_every_page_names_a_favicon_that_is_served(app, world, client):
    import re

    console = _signed_in(app, world, ACME)
    for page in (
        client.get("/console/login"),
        console.get("/console/"),
        console.get(f"/console/agents/{world['bob']}"),
    ):
        assert page.status_code == 200
        [href] = re.findall(r'<link rel="icon" type="image/svg\+xml" href="([^"]+)">', page.get_data(as_text=True))
        icon = client.get(href)
        assert (icon.status_code, icon.mimetype) == (200, "image/svg+xml")
        assert icon.get_data(as_text=True).startswith("<svg")


def test_the_block_form_does_not_suggest_the_agents_own_handle(app, world, make_agent):
    import re

    make_agent("frank@acme")  # the placeholder was frank@acme on every page
    make_agent("someone@acme")
    for handle in ("frank@acme", "someone@acme", world["bob"]):
        page = _signed_in(app, world, ACME).get(f"/console/agents/{handle}").get_data(as_text=True)
        [placeholder] = re.findall(r'id="blocked_handle"[^>]*placeholder="([^"]*)"', page)
        assert handle not in placeholder and placeholder, placeholder


# --------------------------------------------------------------------------- the audit log


def _audit(app, **where) -> list[tuple]:
    clause = " AND ".join(f"{k} = :{k}" for k in where) or "true"
    return sql(
        app,
        f"SELECT action, outcome, operator_email, org, target, client_addr FROM operator_audit WHERE {clause}"
        " ORDER BY created_at, id",
        **where,
    )


def test_sign_ins_failed_sign_ins_and_sign_outs_are_recorded(app, world):
    client = app.test_client()
    assert sign_in(client, ACME, "wrong").status_code == 401
    assert sign_in(client, "nobody@acme.example", "wrong").status_code == 401
    assert sign_in(client, ACME, world["passwords"][ACME]).status_code == 303
    client.post("/console/logout", data={"csrf_token": token_of(client)})
    rows = _audit(app)
    assert [r[:4] for r in rows] == [
        ("sign_in_failed", "unauthenticated", ACME, "acme"),
        ("sign_in_failed", "unauthenticated", "nobody@acme.example", None),
        ("sign_in", "ok", ACME, "acme"),
        ("sign_out", "ok", ACME, "acme"),
    ]
    assert all(r[5] == "127.0.0.1" for r in rows), rows


_AUDIT_NAMES = {
    "bulk-redrive": "webhook.bulk_redrive",
    "cancel": "cancel",
    "blocks/alice@acme/delete": "unblock",
    "blocks": "block",
    "keys/{key}/revoke": "key.revoke",
    "keys": "key.create",
    "disable": "webhook.disable",
    "enable": "webhook.enable",
    "test": "webhook.test",
    "redrive": "webhook.redrive",
    "recover": "webhook.recover",
}


@pytest.mark.parametrize(("action", "form", "status"), ACTIONS, ids=ACTION_IDS)
def test_every_action_is_recorded_with_its_target(app, world, action, form, status):
    name = next(v for k, v in _AUDIT_NAMES.items() if action.endswith(k))
    admin = _signed_in(app, world, ACME)
    resp = admin.post(action.format(**world), data={**form, "csrf_token": token_of(admin)})
    assert resp.status_code == status
    [row] = _audit(app, action=name)
    assert row[:4] == (name, "ok", ACME, "acme") and row[5] == "127.0.0.1", row
    path = action.format(**world)
    named = [v for k, v in world.items() if isinstance(v, str) and k not in ("bob_key",) and v in path]
    assert all(v in row[4] for v in named), (row[4], named)
    for field, value in form.items():
        if field != "tz_offset":
            assert f"{field}={value}" in row[4]


def test_a_refused_action_writes_only_its_refusal(app, world):
    admin = _signed_in(app, world, ACME)
    before = [sql(app, q) for q in _STATE]
    # A block the service refuses (no such sender), then one it makes.
    blocks = f"/console/agents/{world['bob']}/blocks"
    assert admin.post(blocks, data={"blocked_handle": "nobody@acme", "csrf_token": token_of(admin)}).status_code == 303
    assert [sql(app, q) for q in _STATE] == before
    admin.post(blocks, data={"blocked_handle": "alice@acme", "csrf_token": token_of(admin)})
    rows = _audit(app, action="block")
    assert [(r[1], r[4]) for r in rows] == [
        ("identity_not_found", f"handle={world['bob']} blocked_handle=nobody@acme"),
        ("ok", f"handle={world['bob']} blocked_handle=alice@acme"),
    ], rows
    # A viewer's refusal: the row says forbidden and nothing else moved.
    viewer = _viewer(app, world)
    after_admin = [sql(app, q) for q in _STATE]
    assert after_admin != before
    viewer.post(f"/console/threads/{world['task']}/cancel", data={"csrf_token": token_of(viewer)})
    assert _audit(app, action="cancel") == [
        ("cancel", "forbidden", VIEWER, "acme", f"task_id={world['task']}", "127.0.0.1")
    ]
    assert [sql(app, q) for q in _STATE] == after_admin


def test_an_action_whose_record_cannot_be_written_does_not_happen(app, world):
    """The record is in the action's transaction: refuse the record, and the cancel is not made."""
    admin = _signed_in(app, world, ACME)
    sql(app, "ALTER TABLE operator_audit ADD CONSTRAINT no_cancel_record CHECK (action <> 'cancel')")
    try:
        resp = admin.post(f"/console/threads/{world['task']}/cancel", data={"csrf_token": token_of(admin)})
    finally:
        sql(app, "ALTER TABLE operator_audit DROP CONSTRAINT no_cancel_record")
    assert resp.status_code == 500
    assert sql(
        app, "SELECT state FROM threads WHERE sender_id = (SELECT id FROM agents WHERE handle = 'alice@acme')"
    ) == [("pending",)]


def test_the_audit_page_filters_and_pages_newest_first(app, world):
    from relay.services.operators import record

    admin = _signed_in(app, world, ACME)
    with app.app_context():
        for i in range(60):
            record("webhook.test", "ok", email=f"bot{i}@acme.example", org="acme", target=f"n={i}")
        record("cancel", "ok", email="other@globex.example", org="globex", target="globex only")
        from relay.extensions import db

        db.session.commit()
    first = admin.get("/console/audit").get_data(as_text=True)
    assert "n=59" in first and "n=10" in first and "n=9<" not in first and "globex only" not in first
    assert first.index("n=59") < first.index("n=58")
    older = re.search(r'href="(/console/audit\?cursor=[^"]+)" rel="next"', first).group(1)
    second = admin.get(older.replace("&amp;", "&")).get_data(as_text=True)
    assert "n=9<" in second and "n=0<" in second and "n=59" not in second
    only = admin.get("/console/audit?operator=bot7@acme.example").get_data(as_text=True)
    assert "n=7<" in only and "n=8<" not in only
    signs = admin.get("/console/audit?action=sign_in").get_data(as_text=True)
    assert "n=1<" not in signs and ACME in signs
    future = admin.get("/console/audit?since=2999-01-01T00:00").get_data(as_text=True)
    assert 'id="no-audit"' in future
    for bad in ("action=drop_tables", "cursor=garbage", "since=yesterday", "until=2026-13-40T00:00"):
        resp = admin.get(f"/console/audit?{bad}")
        assert resp.status_code in (400, 422), (bad, resp.status_code)


def test_relay_audit_list_prints_the_orgs_records(app, world, base_env, tmp_path):
    admin = _signed_in(app, world, ACME)
    admin.post(f"/console/agents/{world['bob']}/keys/{world['key']}/revoke", data={"csrf_token": token_of(admin)})
    env = {**base_env, "RELAY_HOME": str(tmp_path / "home")}

    def audit(*args):
        return subprocess.run(
            [sys.executable, "-m", "relay.ops.cli", "audit", "list", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    rows = json.loads(audit("--org", "acme", "--json").stdout)
    assert [r["action"] for r in rows][:2] == ["key.revoke", "sign_in"]  # newest first
    assert {"at", "operator", "org", "action", "target", "outcome", "client_addr"} == set(rows[0])
    assert json.loads(audit("--org", "acme", "--since", "2999-01-01T00:00:00Z", "--json").stdout) == []
    assert json.loads(audit("--org", "globex", "--action", "key.revoke", "--json").stdout) == []
    naive = audit("--org", "acme", "--since", "2026-01-01T00:00")
    assert naive.returncode == 2 and "give a time zone" in naive.stderr
    assert audit("--org", "acme", "--action", "nope").returncode == 2


def test_a_role_change_is_recorded_in_the_orgs_log(app, world):
    from relay.services.operators import set_role

    with app.app_context():
        set_role(ACME, "viewer")
    assert _audit(app, action="role.set") == [
        ("role.set", "ok", "relay operators set-role", "acme", f"{ACME}: admin -> viewer", "cli")
    ]


# --------------------------------------------------------------------------- charts


def _chart_desc(page: str, chart_id: str) -> str:
    match = re.search(rf'<figure class="chart" id="{re.escape(chart_id)}">.*?<desc [^>]*>([^<]*)</desc>', page, re.S)
    assert match, f"no chart {chart_id} in the page"
    return match.group(1)


def test_the_overview_charts_handoffs_opened_and_closed_per_hour(app, world):
    admin = _signed_in(app, world, ACME)
    page = admin.get("/console/").get_data(as_text=True)
    assert _chart_desc(page, "activity").startswith("Opened: 1; Closed: 0 in the last 24 hours")
    assert page.count('class="bar bar-opened"') == 24 and "<details>" in page  # a table behind a disclosure
    admin.post(f"/console/threads/{world['task']}/cancel", data={"csrf_token": token_of(admin)})
    # An hour the chart does not cover: a thread opened two days ago is not counted.
    sql(
        app,
        "UPDATE threads SET created_at = now() - interval '2 days'"
        " WHERE sender_id = (SELECT id FROM agents WHERE handle = 'alice@acme')",
    )
    page = admin.get("/console/").get_data(as_text=True)
    assert _chart_desc(page, "activity").startswith("Opened: 0; Closed: 1 in the last 24 hours")
    assert _chart_desc(_signed_in(app, world, GLOBEX).get("/console/").get_data(as_text=True), "activity").startswith(
        "Opened: 1; Closed: 0"
    )


def test_an_endpoints_page_charts_its_deliveries_and_latency(app, world):
    admin = _signed_in(app, world, ACME)
    url = f"/console/agents/{world['bob']}/webhooks"
    page = admin.get(url).get_data(as_text=True)
    chart = f"deliveries-{world['webhook']}"
    assert _chart_desc(page, chart).startswith("Delivered: 0; Retried: 0; Failed: 1 in the last 24 hours")
    assert "nothing delivered" in page
    sql(
        app,
        "UPDATE webhook_deliveries SET status = 'succeeded', completed_at = created_at + interval '1.5 seconds'",
    )
    sql(
        app,
        "INSERT INTO webhook_attempts (delivery_id, attempted_at, status_code, duration_ms)"
        " SELECT id, now(), 503, 10 FROM webhook_deliveries",
    )
    page = admin.get(url).get_data(as_text=True)
    assert _chart_desc(page, chart).startswith("Delivered: 1; Retried: 1; Failed: 0")
    assert "p50 1500 ms · p95 1500 ms" in page
    assert 'class="band"' not in page
    # A circuit that opened for ten minutes an hour ago, and one of two days ago (not in the chart).
    for ago in ("1 hour", "2 days"):
        sql(
            app,
            "INSERT INTO circuit_openings (endpoint_id, opened_at, until, reason)"
            f" VALUES (CAST(:e AS uuid), now() - interval '{ago}', now() - interval '{ago}' + interval '10 minutes',"
            " :why)",
            e=world["webhook"],
            why=f"5 failed attempts in a row, {ago} ago",
        )
    page = admin.get(url).get_data(as_text=True)
    assert page.count('class="band"') == 1 and "5 failed attempts in a row, 1 hour ago" in page
    assert "2 days ago" not in page
    band = re.search(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*class="band"', page)
    assert 4 < float(band.group(2)) < 6  # ten minutes of the 24 hours over 672 units: 4.7


# --------------------------------------------------------------------------- bulk redrive


def test_a_bulk_redrive_sends_each_failed_delivery_once_with_its_webhook_id(app, make_agent, client, celery_worker):
    from tests.conftest import wait_until
    from tests.receiver import Receiver

    make_agent("alice@acme")
    _bob, bob_key = make_agent("bob@acme")
    alice_key = _key_of(app, "alice@acme")
    with Receiver() as rx:
        rx.program("/hook", [], default=200)
        hook = client.post(
            "/api/v1/identities/bob@acme/webhooks",
            json={"url": rx.url(), "events": ["message.created"]},
            headers=bearer(bob_key),
        ).get_json()
        for i in range(5):
            rpc(
                client,
                alice_key,
                "message/send",
                {"recipient": "bob@acme", "message": {"parts": [{"type": "text", "text": f"n{i}"}]}},
            )
        first = rx.wait_for(5, timeout=30)
        wait_until(
            lambda: sql(app, "SELECT count(*) FROM webhook_deliveries WHERE status = 'succeeded'") == [(5,)],
            what="5 delivered",
        )
        # As after a receiver's outage: all five given up.
        sql(app, "UPDATE webhook_deliveries SET status = 'failed', last_error = 'HTTP 503'")
        password = make_operator(app, ACME, "acme")
        admin = app.test_client()
        assert sign_in(admin, ACME, password).status_code == 303
        base = f"/console/agents/bob@acme/webhooks/{hook['id']}"
        preview = admin.get(f"{base}/bulk-redrive?since=2020-01-01T00:00&tz_offset=0").get_data(as_text=True)
        assert "<strong>5</strong> failed deliveries" in preview
        form = {
            "job_id": re.search(r'name="job_id" value="([^"]+)"', preview).group(1),
            "since": re.search(r'name="since" value="([^"]+)"', preview).group(1),
            "until": re.search(r'name="until" value="([^"]+)"', preview).group(1),
            "csrf_token": token_of(admin),
        }
        once = admin.post(f"{base}/bulk-redrive", data=form)
        twice = admin.post(f"{base}/bulk-redrive", data=form)  # a double click: the same job
        assert once.status_code == twice.status_code == 303
        assert "already confirmed" in admin.get(twice.headers["Location"]).get_data(as_text=True)
        again = rx.wait_for(10, timeout=30)
        wait_until(
            lambda: sql(app, "SELECT status, done, total FROM redrive_jobs") == [("done", 5, 5)],
            what="the job done",
        )
        progress = admin.get(f"{base}/redrives", headers={"HX-Request": "true"}).get_data(as_text=True)
        assert "5 of 5 sent again · done" in progress and "hx-trigger" not in progress  # done: no more polling
        # Each failed delivery once more, with the webhook-id it had.
        ids = [r.header("webhook-id") for r in again]
        assert sorted(ids[5:]) == sorted(r.header("webhook-id") for r in first) and len(set(ids[5:])) == 5
        # A new job on the same window finds nothing failed: nothing is sent twice.
        preview = admin.get(f"{base}/bulk-redrive?since=2020-01-01T00:00&tz_offset=0").get_data(as_text=True)
        assert "<strong>0</strong> failed deliveries" in preview and "Nothing to redrive" in preview
        assert rx.count() == 10
    assert [r[:2] for r in _audit(app, action="webhook.bulk_redrive")] == [("webhook.bulk_redrive", "ok")] * 2


def test_a_running_redrive_is_polled_and_a_lost_one_is_resumed(app, world):
    from relay.services import webhooks

    job = "0b8f6a1e-5d2c-4f3a-8e7b-1c9d2e3f4a5b"
    sql(
        app,
        "INSERT INTO redrive_jobs (id, endpoint_id, since, until, requested_by, total, updated_at)"
        " VALUES (CAST(:j AS uuid), CAST(:e AS uuid), now() - interval '1 day', now(), 'x', 1, now() - interval '2 minutes')",
        j=job,
        e=world["webhook"],
    )
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/agents/{world['bob']}/webhooks").get_data(as_text=True)
    assert "0 of 1 sent again · running" in page and 'hx-trigger="every 2s"' in page
    # Its task was lost (no worker ran it): the outbox sweep queues it again, then runs to the end.
    with app.app_context():
        assert webhooks.resume_redrives() == [job]
        assert webhooks.run_redrive(job)["status"] == "done"
    assert sql(app, "SELECT done, total, status FROM redrive_jobs") == [(1, 1, "done")]
    assert sql(app, "SELECT status, attempt_count FROM webhook_deliveries") == [("pending", 0)]
    # Fragment opened as a page: its page.
    resp = admin.get(f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/redrives")
    assert resp.status_code == 302 and "/webhooks" in resp.headers["Location"]


def test_a_redrive_stops_when_its_endpoint_is_disabled(app, world):
    from relay.services import webhooks

    job = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
    sql(
        app,
        "INSERT INTO redrive_jobs (id, endpoint_id, since, until, requested_by, total)"
        " VALUES (CAST(:j AS uuid), CAST(:e AS uuid), now() - interval '1 day', now(), 'x', 1)",
        j=job,
        e=world["webhook"],
    )
    sql(app, "UPDATE webhook_endpoints SET enabled = false")
    with app.app_context():
        assert webhooks.run_redrive(job)["status"] == "failed"
    assert sql(app, "SELECT status, error, done FROM redrive_jobs") == [("failed", "the endpoint was disabled", 0)]
    assert sql(app, "SELECT status FROM webhook_deliveries") == [("failed",)]
    admin = _signed_in(app, world, ACME)
    form = {
        "job_id": "2c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f",
        "since": "2020-01-01T00:00:00+00:00",
        "until": "2999-01-01T00:00:00+00:00",
    }
    resp = admin.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/bulk-redrive",
        data={**form, "csrf_token": token_of(admin)},
    )
    assert "the endpoint is disabled" in admin.get(resp.headers["Location"]).get_data(as_text=True)
    assert sql(app, "SELECT count(*) FROM redrive_jobs") == [(1,)]


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+05:00", "2026-01-01T00:00:00+18:00"])
def test_a_bulk_redrive_confirm_with_an_edge_time_names_the_field(app, world, since):
    admin = _signed_in(app, world, ACME)
    form = {"job_id": "3c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "since": since, "until": "9999-12-31T23:59:59-05:00"}
    resp = admin.post(
        f"/console/agents/{world['bob']}/webhooks/{world['webhook']}/bulk-redrive",
        data={**form, "csrf_token": token_of(admin)},
    )
    assert resp.status_code in (303, 400, 422), resp.status_code
    assert sql(app, "SELECT count(*) FROM redrive_jobs") == [(0,)]


def test_a_nul_in_the_sign_in_email_is_a_wrong_credential(app, world):
    assert sign_in(app.test_client(), "ops\x00@acme.example", "x").status_code == 401
    assert _audit(app, action="sign_in_failed")[0][:2] == ("sign_in_failed", "unauthenticated")


def test_a_refused_cancel_leaves_only_its_refusal(app, world):
    admin = _signed_in(app, world, ACME)
    cancel = f"/console/threads/{world['task']}/cancel"
    admin.post(cancel, data={"csrf_token": token_of(admin)})
    admin.post(cancel, data={"csrf_token": token_of(admin)})  # already cancelled: refused
    assert [r[1] for r in _audit(app, action="cancel")] == ["ok", "invalid_transition"]


# --------------------------------------------------------------------------- the work lifecycle


def _update(client, key, task_id, transition, **more):
    return rpc(client, key, "tasks/update", {"task_id": task_id, "transition": transition, **more})


def _row_of(page: str, text: str) -> str:
    """The threads table's row that holds ``text``."""
    rows = [r for r in re.findall(r"<tr>.*?</tr>", page, re.S) if text in r]
    assert len(rows) == 1, f"{len(rows)} rows hold {text!r}"
    return rows[0]


def test_the_filters_offer_every_state_and_every_priority(app, world):
    from relay.models import PRIORITIES, THREAD_STATES

    page = _signed_in(app, world, ACME).get(f"/console/agents/{world['bob']}").get_data(as_text=True)
    for s in THREAD_STATES:
        assert f'name="state" value="{s}"' in page, s
    for p in PRIORITIES:
        assert f'name="priority" value="{p}"' in page, p


def test_the_inbox_shows_each_priority_and_filters_by_one_or_several(app, world, client):
    alice_key = _key_of(app, world["alice"])
    for p in ("low", "high", "urgent"):
        send_message(client, alice_key, world["bob"], f"a {p} one", priority=p)
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/agents/{world['bob']}").get_data(as_text=True)
    assert 'class="priority priority-urgent"' in _row_of(page, "a urgent one")
    assert 'class="priority priority-high"' in _row_of(page, "a high one")
    assert 'class="priority priority-normal"' in _row_of(page, "hello acme pagination")  # the default
    only = admin.get(f"/console/agents/{world['bob']}?priority=urgent").get_data(as_text=True)
    assert "a urgent one" in only and "a high one" not in only and "hello acme" not in only
    assert 'value="urgent" id="priority-urgent" checked' in only
    both = admin.get(
        f"/console/agents/{world['bob']}/threads?priority=urgent&priority=low", headers={"HX-Request": "1"}
    )
    body = both.get_data(as_text=True)
    assert "a urgent one" in body and "a low one" in body and "a high one" not in body
    assert "priority=low&amp;priority=urgent" in body  # the poll keeps the filter
    none = admin.get(f"/console/agents/{world['bob']}?priority=urgent&state=completed").get_data(as_text=True)
    assert "No incoming handoffs in completed of priority urgent." in none


@pytest.mark.parametrize(
    "query",
    ["priority=bogus", "priority=urgent&priority=bogus", "priority=" + "x" * 5000, "state=declined&priority=URGENT"],
)
def test_a_bad_priority_filter_is_a_422_page_naming_it(app, world, query):
    admin = _signed_in(app, world, ACME)
    for path in (f"/console/agents/{world['bob']}", f"/console/agents/{world['bob']}/threads"):
        resp = admin.get(f"{path}?{query}", headers={"HX-Request": "1"} if path.endswith("/threads") else {})
        body = resp.get_data(as_text=True)
        assert resp.status_code == 422 and "priority" in body and "must be one of low, normal, high, urgent" in body


def test_a_declined_thread_shows_its_state_reason_receipts_and_no_poller(app, world, client):
    bob_key = world["bob_key"]
    _update(client, bob_key, world["task"], "decline", reason="not my area: ask the billing team")
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/threads/{world['task']}").get_data(as_text=True)
    assert re.search(r'class="state state-declined" title="[^"]*A2A TASK_STATE_REJECTED[^"]*">declined<', page)
    reason = re.search(r'<p id="reason">(.*?)</p>', page, re.S).group(1)
    assert "Declined" in reason and "not my area: ask the billing team" in reason
    # The audit row carries the reason too.
    audit = page[page.index('id="audit"') :]
    assert "decline" in audit and "not my area: ask the billing team" in audit
    assert 'id="live"' not in page  # terminal: no more polling
    # Nobody read alice's message yet (the operator's reading is not the agent's).
    assert re.search(r'id="m1".*?<span class="receipt unread">unread</span>', page, re.S)
    rpc(client, bob_key, "tasks/get", {"task_id": world["task"]})
    page = admin.get(f"/console/threads/{world['task']}").get_data(as_text=True)
    assert re.search(r'id="m1".*?<span class="receipt read">read <time datetime="[^"]+"', page, re.S)


def test_an_input_required_thread_shows_its_badge_question_and_filter_and_keeps_polling(app, world, client):
    bob_key, task = world["bob_key"], world["task"]
    _update(client, bob_key, task, "accept")
    _update(client, bob_key, task, "request_input", question="Which invoices: 2025 or all?")
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    assert re.search(
        r'class="state state-input_required" title="[^"]*A2A TASK_STATE_INPUT_REQUIRED[^"]*">input_required<', page
    )
    question = re.search(r'<p id="question">(.*?)</p>', page, re.S).group(1)
    assert "Question to the sender" in question and "Which invoices: 2025 or all?" in question
    assert "request_input" in page[page.index('id="audit"') :]
    assert 'id="live"' in page  # not terminal: the page still polls
    only = admin.get(f"/console/agents/{world['bob']}?state=input_required").get_data(as_text=True)
    assert 'class="state state-input_required"' in _row_of(only, "hello acme")
    other = admin.get(f"/console/agents/{world['bob']}?state=accepted").get_data(as_text=True)
    assert "hello acme" not in other


@pytest.mark.parametrize("end", ["completed", "cancelled", "declined", "failed", "expired"])
def test_the_poller_stops_in_every_terminal_state(app, world, client, end):
    bob_key, task = world["bob_key"], world["task"]
    admin = _signed_in(app, world, ACME)
    assert 'id="live"' in admin.get(f"/console/threads/{task}").get_data(as_text=True)
    if end == "completed":
        _update(client, bob_key, task, "accept")
        _update(client, bob_key, task, "complete", result_summary="done")
    elif end == "cancelled":
        _update(client, _key_of(app, world["alice"]), task, "cancel")
    elif end == "declined":
        _update(client, bob_key, task, "decline", reason="no")
    elif end == "failed":
        _update(client, bob_key, task, "accept")
        _update(client, bob_key, task, "fail", reason="the build is broken")
    else:
        sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE state = 'pending'")
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    assert f'class="state state-{end}"' in page and 'id="live"' not in page


def test_the_lease_is_shown_with_its_end_and_never_its_token(app, world, client):
    # From another org's sender: acme sees it as its recipient, bob, the lease's holder.
    task = send_message(client, _key_of(app, world["gus"]), world["bob"], "leased across orgs")["task_id"]
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    assert re.search(r'<p id="lease">.*no lease', page, re.S)
    accepted = _update(client, world["bob_key"], task, "accept", lease_seconds=600)
    token = accepted["lease_token"]
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    lease = re.search(r'<p id="lease">(.*?)</p>', page, re.S).group(1)
    assert re.search(r"ends <span class=\"relative\">in (9|10) min</span> \(<time datetime=", lease), lease
    assert accepted["lease_expires_at"] in lease
    live = admin.get(f"/console/threads/{task}/live?seen=0&version=0", headers={"HX-Request": "1"})
    for body in (page, live.get_data(as_text=True)):
        assert token not in body and "lease_token" not in body
    with app.app_context():
        from relay.ids import parse_ulid
        from relay.services import org

        assert "lease_token" not in org.thread_view("acme", parse_ulid(task))


def test_the_console_shows_the_effective_state_a_lapsed_lease_is_pending(app, world, client):
    from relay.services import threads

    _update(client, world["bob_key"], world["task"], "accept", lease_seconds=600)
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/threads/{world['task']}").get_data(as_text=True)
    marks = re.search(r'id="live" hx-get="[^"]*\?([^"]*)"', page).group(1).replace("&amp;", "&")
    assert "state=accepted" in marks
    sql(app, "UPDATE threads SET lease_expires_at = now() - interval '1 second' WHERE state = 'accepted'")
    # Not recorded yet (the sweep has not run): every page shows it pending already.
    assert sql(app, "SELECT count(*) FROM threads WHERE state = 'accepted'") == [(1,)]
    page = admin.get(f"/console/threads/{world['task']}").get_data(as_text=True)
    assert 'class="state state-pending"' in page and re.search(r'<p id="lease">.*no lease', page, re.S)
    inbox = admin.get(f"/console/agents/{world['bob']}?state=pending").get_data(as_text=True)
    assert 'class="state state-pending"' in _row_of(inbox, "hello acme pagination")
    assert "hello acme" not in admin.get(f"/console/agents/{world['bob']}?state=accepted").get_data(as_text=True)
    hits = admin.get("/console/search?q=pagination").get_data(as_text=True)
    assert 'class="state state-pending"' in hits
    # An open page's poll sees the change though nothing was written: it gets the new state.
    live = admin.get(f"/console/threads/{world['task']}/live?{marks}", headers={"HX-Request": "1"})
    assert live.status_code == 200 and 'class="state state-pending"' in live.get_data(as_text=True)
    # Once the sweep records it, the audit trail shows the clock's row readably.
    with app.app_context():
        assert threads.settle_due() == 1
    page = admin.get(f"/console/threads/{world['task']}").get_data(as_text=True)
    row = re.search(r'<tr class="clock-made">(.*?)</tr>', page, re.S).group(1)
    assert ">clock<" in row and "lease expired" in row and "accepted → pending" in row


def test_a_passed_expiry_is_expired_everywhere_and_the_clocks_row_says_so(app, world, client):
    from relay.services import threads

    task = send_message(client, _key_of(app, world["alice"]), world["bob"], "due soon", expires_in_seconds=3600)[
        "task_id"
    ]
    admin = _signed_in(app, world, ACME)
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    assert re.search(r'<p id="expiry">.*in (59 min|1 h)', page, re.S)
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 second' WHERE summary = 'due soon'")
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    assert 'class="state state-expired"' in page and re.search(r'<p id="expiry">.*<strong>expired</strong>', page, re.S)
    inbox = admin.get(f"/console/agents/{world['bob']}?state=expired").get_data(as_text=True)
    assert "due soon" in inbox and "hello acme" not in inbox
    with app.app_context():
        threads.settle_due()
    page = admin.get(f"/console/threads/{task}").get_data(as_text=True)
    row = re.search(r'<tr class="clock-made">(.*?)</tr>', page, re.S).group(1)
    assert ">clock<" in row and ">expired <code" in row and "pending → expired" in row


def test_the_overview_counts_open_handoffs_by_their_effective_state(app, world, client):
    from relay.services import org

    _update(client, world["bob_key"], world["task"], "accept", lease_seconds=600)
    with app.app_context():
        bob = next(a for a in org.overview("acme") if a["handle"] == world["bob"])
    assert (bob["pending_in"], bob["accepted_in"]) == (0, 1)
    sql(app, "UPDATE threads SET lease_expires_at = now() - interval '1 second' WHERE state = 'accepted'")
    with app.app_context():
        bob = next(a for a in org.overview("acme") if a["handle"] == world["bob"])
    assert (bob["pending_in"], bob["accepted_in"]) == (1, 0)
    sql(app, "UPDATE threads SET expires_at = now() - interval '1 second'")
    with app.app_context():
        bob = next(a for a in org.overview("acme") if a["handle"] == world["bob"])
        closed = sum(h["closed"] for h in org.activity("acme"))
    assert (bob["pending_in"], bob["accepted_in"], closed) == (0, 0, 1)  # expired, not yet recorded
    # The chart's "closed" counts every terminal state: a declined and a failed handoff too.
    alice_key = _key_of(app, world["alice"])
    declined = send_message(client, alice_key, world["bob"], "no")["task_id"]
    _update(client, world["bob_key"], declined, "decline", reason="no")
    failing = send_message(client, alice_key, world["bob"], "try")["task_id"]
    _update(client, world["bob_key"], failing, "accept")
    _update(client, world["bob_key"], failing, "fail", reason="broken")
    with app.app_context():
        assert sum(h["closed"] for h in org.activity("acme")) == 3
