"""The console's routes: sign-in, the org's pages and their actions (docs/console.md).

Every page but the sign-in and the static files needs a signed-in operator (else a
redirect to ``/console/login``); everything outside the operator's org is a 404 page
(``relay.services.org``). Actions are POSTs with the CSRF token that redirect back (303)
with a message saying what happened, or why not in the service's own words.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from flask import (
    Flask,
    abort,
    current_app,
    flash,
    g,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from relay.config import DEV_SECRET_KEY
from relay.errors import RelayError
from relay.ids import iso, parse_ulid
from relay.schemas.common import load_or_invalid
from relay.schemas.console import (
    AuditQuery,
    BlockForm,
    BulkRedriveForm,
    BulkRedriveQuery,
    DeliveriesQuery,
    InboxQuery,
    KeyForm,
    RecoverForm,
    SearchQuery,
)
from relay.services import agents, blocks, operators, org, threads, webhooks
from relay.transport import errors
from relay.transport.auth import client_address, retry_after_seconds
from relay.transport.console import SECURITY_HEADERS, bp, csrf
from relay.transport.console.forms import LoginForm
from relay.transport.console.render import HELPERS
from relay.transport.requests import BodyTooLarge, read_body

log = logging.getLogger("relay.console")

PAGE = 20  # threads or search hits per page
DELIVERIES = 10  # recent deliveries shown per endpoint
PUBLIC = frozenset({"console.login", "console.login_submit", "console.static", "console.unknown"})
# The POSTs a viewer may make: signing in and out. Every other POST is an action (docs/decisions.md, "Console roles").
ANY_ROLE = PUBLIC | {"console.logout"}
# Symbols that mean "no such thing for you": one 404 page, whatever the reason.
NOT_FOUND = frozenset({"identity_not_found", "thread_not_found", "not_found", "key_not_found"})


# --------------------------------------------------------------------------- request plumbing


@bp.context_processor
def _helpers() -> dict[str, Any]:
    return {**HELPERS, "operator": g.get("operator")}


def _reseat_body() -> None:
    # relay.transport.requests read the body before anything else (bounded, before any
    # database work); hand the same bytes to werkzeug's form parser and flask-wtf.
    try:
        body = read_body()
    except BodyTooLarge:
        abort(413)
    request.environ["wsgi.input"] = io.BytesIO(body)
    request.environ["CONTENT_LENGTH"] = str(len(body))


def _session_operator():
    """The signed-in operator, or None (and the session's sign-in dropped if it ended)."""
    data = session.get("op")
    if not isinstance(data, dict):
        return None
    signed_in_at = data.get("at")
    now = time.time()
    lifetime = current_app.permanent_session_lifetime.total_seconds()
    operator = None
    if isinstance(signed_in_at, int | float) and signed_in_at - 60 <= now <= signed_in_at + lifetime:
        operator = operators.session_operator(data.get("id"), data.get("v"))
    if operator is None:
        session.pop("op", None)
        g.session_ended = True
    return operator


def _safe_next(raw: Any) -> str:
    """A path of this console to go to after signing in; anything else is the overview.

    Anything else: another host, a backslash, or a control character (a CR/LF would be
    refused by the Location header as a 500; opencve#80, flask-login#211).
    """
    if (
        isinstance(raw, str)
        and raw.startswith("/console/")
        and "\\" not in raw
        and not raw.startswith("//")
        and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw)
    ):
        parts = urlsplit(raw)
        if not parts.scheme and not parts.netloc:
            return raw
    return url_for("console.overview")


# The fragments htmx polls, each with the page it belongs to: a sign-in or a plain visit
# goes to the page, never to a bare fragment (HyphaApp/hypha#4530).
def _fragment_page() -> str | None:
    args = request.view_args or {}
    if request.endpoint == "console.agent_threads":
        # The query as data, not url_for's keywords (a "handle" or "_external" in it would be a 500 or an option).
        query = urlencode(list(request.args.items(multi=True)))
        return url_for("console.agent", handle=args.get("handle")) + (f"?{query}" if query else "")
    if request.endpoint == "console.thread_live":
        return url_for("console.thread", task_id=args.get("task_id"))
    if request.endpoint == "console.redrive_progress":
        return url_for("console.agent_webhooks", handle=args.get("handle"), webhook=args.get("webhook_id"))
    return None


def _current_page() -> str | None:
    """The console page an htmx request came from (``HX-Current-URL``), if it is this host's console."""
    parts = urlsplit(request.headers.get("HX-Current-URL", ""))
    if parts.netloc != request.host or not parts.path.startswith("/console/"):
        return None
    here = parts.path + (f"?{parts.query}" if parts.query else "")
    return here if _safe_next(here) == here else None


def _to_sign_in():
    if g.get("session_ended"):
        flash("Your session has ended; sign in again.", "info")
    here = request.full_path.rstrip("?")
    if request.headers.get("HX-Request"):
        here = _current_page() or _fragment_page() or here
    else:
        here = _fragment_page() or here
    target = url_for("console.login", next=here) if request.method == "GET" else url_for("console.login")
    if request.headers.get("HX-Request"):
        # A polled partial: have htmx load the sign-in page, not swap it into the fragment.
        response = make_response("", 401)
        response.headers["HX-Redirect"] = target
        return response
    return redirect(target)


@bp.before_request
def _gate():
    if request.method == "POST":
        _reseat_body()
    g.operator = None
    if request.endpoint == "console.static":
        return None
    g.operator = _session_operator()
    if g.operator is None and request.endpoint not in PUBLIC:
        return _to_sign_in()
    page = None if request.headers.get("HX-Request") else _fragment_page()
    if page is not None:
        return redirect(page)  # a fragment opened as a page (a link, a reload): its page
    if request.method == "POST":
        csrf.protect()  # CSRFError (400) when the token is missing or wrong
        if request.endpoint not in ANY_ROLE and not g.operator.may_act:
            # One rule for every action, before its view runs: nothing is written but the refusal.
            _log_action("viewer_refused")
            operators.record_alone(
                _audit_action(), "forbidden", operator=g.operator, target=_audit_target(), client_addr=client_address()
            )
            return _error_page(
                403,
                "Viewers cannot change anything",
                f"{g.operator.email} is a viewer of {g.operator.org}: every page is open to it, and no action."
                " An admin can change its role with `relay operators set-role`.",
            )
    return None


@bp.after_request
def _headers(response):
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if request.endpoint != "console.static":
        # Pages hold agents' text and, once, new API keys: never kept by a cache or the back button.
        response.headers["Cache-Control"] = "no-store"
    return response


def _error_page(status: int, title: str, detail: str | None = None):
    return render_template("console/error.html", status=status, title=title, detail=detail), status


@bp.errorhandler(CSRFError)
def _csrf_refused(exc: CSRFError):
    return _error_page(
        400,
        "This form could not be accepted",
        f"{exc.description} The form may have expired, or it did not come from this console. "
        "Go back, reload the page and try again.",
    )


@bp.errorhandler(RelayError)
def _relay_error(exc: RelayError):
    if exc.symbol in NOT_FOUND:
        return _error_page(404, "Not found", "Nothing of that name exists in your org.")
    return _error_page(exc.http_status, "That did not work", exc.message)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    if exc.response is not None:  # already shaped: the sign-in limits' 429 page
        return exc.response
    if exc.code == 404:
        return _error_page(404, "Not found", "Nothing of that name exists in your org.")
    return _error_page(exc.code or 500, exc.name, exc.description)


@bp.errorhandler(Exception)
def _unhandled(exc: Exception):
    failure = errors.unexpected(exc)
    if failure.symbol == "service_unavailable":
        return _error_page(503, "The relay is unavailable", f"{failure.message[:1].upper()}{failure.message[1:]}.")
    return _error_page(500, "Something went wrong", f"Request id {g.get('request_id')}: the server log has the cause.")


def _query(schema) -> dict:
    return load_or_invalid(schema, request.args.to_dict(flat=False))


def _form(schema) -> dict:
    return load_or_invalid(schema, request.form.to_dict())


def _agent(handle: str):
    return org.agent_in_org(g.operator.org, handle)


def _task_id(raw: str):
    try:
        return parse_ulid(raw)
    except ValueError:
        raise RelayError("thread_not_found", f"no thread {raw!r}") from None


# The audit log's name of each console action (operators.AUDIT_ACTIONS).
AUDITED = {
    "console.cancel_thread": "cancel",
    "console.block_sender": "block",
    "console.unblock_sender": "unblock",
    "console.create_key": "key.create",
    "console.revoke_key": "key.revoke",
    "console.test_webhook": "webhook.test",
    "console.redrive_delivery": "webhook.redrive",
    "console.recover_webhook": "webhook.recover",
    "console.bulk_redrive": "webhook.bulk_redrive",
}


def _audit_action() -> str:
    if request.endpoint == "console.set_webhook_enabled":
        return f"webhook.{request.view_args['change']}"
    return AUDITED[request.endpoint]


def _audit_target() -> str:
    """What the action is on: its path's parts, and the form field that names a subject."""
    parts = [f"{k}={v}" for k, v in (request.view_args or {}).items() if k != "change"]
    for field in ("blocked_handle", "since", "until", "job_id", "label"):
        if request.form.get(field):
            parts.append(f"{field}={request.form[field]}")
    return " ".join(parts)


def _audited(action: Callable[[], Any]) -> Any:
    """Run ``action`` with its audit row in its transaction (operators.audited)."""
    return operators.audited(
        action, _audit_action(), operator=g.operator, target=_audit_target(), client_addr=client_address()
    )


def _act(back: str, action: Callable[[], Any], done: str | Callable[[Any], str], *, missing_is_404: bool = True):
    """Run an action (audited); flash what it did or the service's reason it did not; redirect to ``back``."""
    try:
        result = _audited(action)
    except RelayError as exc:
        _log_action(exc.symbol)
        if missing_is_404 and exc.symbol in NOT_FOUND:
            raise
        flash(exc.message, "error")
    else:
        _log_action("ok")
        flash(done(result) if callable(done) else done, "ok")
    return redirect(back, 303)


def _log_action(outcome: str) -> None:
    # The services' audit rows name the agent acted as; this line names the human who acted.
    log.info(
        "console action",
        extra={
            "request_id": g.get("request_id"),
            "operator": g.operator.email,
            "action": request.endpoint,
            "path": request.path,
            "outcome": outcome,
        },
    )


# --------------------------------------------------------------------------- sign-in


def _insecure_key() -> bool:
    return current_app.config["RELAY"].secret_key == DEV_SECRET_KEY


def _login_page(form: LoginForm, status: int = 200, error: str | None = None, headers: dict | None = None):
    page = render_template(
        "console/login.html",
        form=form,
        error=error,
        insecure=_insecure_key(),
        next=_safe_next(request.args.get("next")),
    )
    return page, status, headers or {}


@bp.get("/login")
def login():
    """The sign-in form: ``email``, ``password`` and the hidden ``csrf_token``."""
    if g.operator is not None:
        return redirect(_safe_next(request.args.get("next")))
    return _login_page(LoginForm())


@bp.post("/login")
def login_submit():
    """Sign in; 303 to ``/console/`` (or the page that sent here). One answer for any wrong email or password."""
    form = LoginForm()
    if _insecure_key():
        return _login_page(form, 503, "Sign-in is off: RELAY_SECRET_KEY is not set (relay up sets one for you).")
    if not form.validate():
        return _login_page(form, 422)
    try:
        operator = operators.authenticate(form.email.data, form.password.data, client_address())
    except RelayError as exc:  # one message for every reason (operators.authenticate)
        log.info("console sign-in refused", extra={"request_id": g.get("request_id"), "client": client_address()})
        return _login_page(form, 401, exc.message)
    session.clear()  # nothing of the anonymous session (its CSRF token) carries over
    session.permanent = True
    session["op"] = {"id": str(operator.id), "v": operator.session_version, "at": int(time.time())}
    return redirect(_safe_next(request.args.get("next")), 303)


def _form_email() -> str:
    pairs = parse_qsl(read_body().decode("utf-8", "replace"), keep_blank_values=True)
    email = next((v for k, v in pairs if k == "email"), "").strip().lower()[:320]
    return hashlib.sha256(email.encode("utf-8")).hexdigest()  # no email in Redis key names


def _too_many(limit):
    retry = retry_after_seconds(limit)
    return make_response(
        _login_page(
            LoginForm(),
            429,
            f"Too many sign-in attempts; try again in {errors.retry_later(retry)} s.",
        )
    )


def limit_sign_in(app: Flask) -> None:
    """Put the sign-in limits on ``POST /console/login``: per email and per client address (flask-limiter)."""
    limiter = app.extensions["relay_limiter"]
    view = app.view_functions["console.login_submit"]
    for setting, kind, key in (
        ("console_login_limit", "email", _form_email),
        ("console_login_address_limit", "address", client_address),
    ):
        view = limiter.limit(
            lambda setting=setting: getattr(current_app.config["RELAY"], setting),
            key_func=lambda kind=kind, key=key: f"console-{kind}:{key()}",
            scope=f"console-login-{kind}",
            on_breach=_too_many,
        )(view)
    app.view_functions["console.login_submit"] = view


@bp.get("/logout")
def logout_page():
    """A page with the sign-out button (a link or a typed URL cannot sign out: that is a POST)."""
    return render_template("console/logout.html")


@bp.post("/logout")
def logout():
    """Sign out: this and every other session of the operator end."""
    operators.sign_out(g.operator, client_address())
    session.clear()
    flash("You are signed out.", "info")
    return redirect(url_for("console.login"), 303)


# --------------------------------------------------------------------------- pages


@bp.get("/")
def overview():
    """The org's agents with their open handoffs, last activity and webhook health."""
    return render_template(
        "console/overview.html", agents=org.overview(g.operator.org), activity=org.activity(g.operator.org)
    )


def _threads_page(agent, q: dict) -> dict:
    return threads.list_threads(
        agent,
        role="recipient" if q["box"] == "inbox" else "sender",
        status=q["state"] or None,
        priority=q["priority"] or None,
        limit=PAGE,
        cursor=q["cursor"],
    )


@bp.get("/agents/<handle>")
def agent(handle: str):
    """An agent's inbox or sent handoffs (``box``), filtered by ``state`` and ``priority``, paged by ``cursor``; its blocks."""
    subject = _agent(handle)
    q = _query(InboxQuery())
    return render_template(
        "console/agent.html",
        agent=subject,
        q=q,
        page=_threads_page(subject, q),
        blocked=blocks.list_blocks(subject),
    )


@bp.get("/agents/<handle>/threads")
def agent_threads(handle: str):
    """The threads table of ``/console/agents/<handle>`` alone: htmx polls it."""
    subject = _agent(handle)
    q = _query(InboxQuery())
    return render_template("console/_threads.html", agent=subject, q=q, page=_threads_page(subject, q))


@bp.get("/threads/<task_id>")
def thread(task_id: str):
    """A thread: brief, intent, messages with their artifacts, and the audit trail."""
    return render_template("console/thread.html", t=org.thread_view(g.operator.org, _task_id(task_id)))


@bp.get("/threads/<task_id>/live")
def thread_live(task_id: str):
    """What changed on a thread since the page's ``seen`` (sequence), ``version`` and ``state``
    (the effective one: a lease that lapsed or an expiry that passed changes it with no write):
    204 when nothing did.

    Otherwise the new messages (appended by htmx), the thread's state and audit trail
    (swapped out of band) and the poller with the new marks.
    """
    tid = _task_id(task_id)
    seen = request.args.get("seen", default=0, type=int)
    version = request.args.get("version", default=0, type=int)
    if org.thread_marker(g.operator.org, tid) == (seen, version, request.args.get("state")):
        return "", 204
    view = org.thread_view(g.operator.org, tid)
    new = [m for m in view["messages"] if m["sequence_no"] > seen]
    return render_template("console/_thread_live.html", t=view, new=new)


@bp.get("/search")
def search():
    """Full-text search over the org's messages, newest first; each hit links to its thread."""
    q = _query(SearchQuery())
    results = org.search_feed(g.operator.org, q["q"], limit=PAGE, cursor=q["cursor"]) if q["q"] else None
    return render_template("console/search.html", q=q, results=results)


@bp.get("/audit")
def audit():
    """The org's operator audit log, newest first: filters ``operator``, ``action``, ``since``, ``until``; ``cursor``."""
    q = _query(AuditQuery())
    page = operators.audit_page(
        g.operator.org,
        email=q["operator"],
        action=q["action"],
        since=q["since"],
        until=q["until"],
        cursor=q["cursor"],
    )
    filters = {k: request.args[k] for k in ("operator", "action", "since", "until", "tz_offset") if request.args.get(k)}
    return render_template("console/audit.html", page=page, filters=filters, actions=operators.AUDIT_ACTIONS)


@bp.get("/agents/<handle>/webhooks")
def agent_webhooks(handle: str):
    """An agent's webhook endpoints with their health and recent deliveries (each attempt)."""
    subject = _agent(handle)
    q = _query(DeliveriesQuery())
    endpoints = webhooks.list_endpoints(subject)
    if q["webhook"] is not None:
        endpoints = [e for e in endpoints if e["id"] == str(q["webhook"])]
        if not endpoints:
            raise RelayError("not_found", f"no webhook {q['webhook']}")
    for endpoint in endpoints:
        cursor = q["cursor"] if q["webhook"] is not None else None
        endpoint["deliveries"] = webhooks.list_deliveries(subject, endpoint["id"], limit=DELIVERIES, cursor=cursor)
        endpoint["hours"] = webhooks.endpoint_hours(subject, endpoint["id"])
        endpoint["redrives"] = webhooks.list_redrives(subject, endpoint["id"])
    return render_template("console/webhooks.html", agent=subject, endpoints=endpoints, one=q["webhook"] is not None)


@bp.get("/agents/<handle>/keys")
def agent_keys(handle: str):
    """An agent's API keys: label, created, last used, revoked."""
    subject = _agent(handle)
    return render_template("console/keys.html", agent=subject, keys=agents.list_keys(subject), issued=None)


# --------------------------------------------------------------------------- actions


@bp.post("/threads/<task_id>/cancel")
def cancel_thread(task_id: str):
    """Cancel a pending handoff sent by an agent of the org (threads.transition, as its sender)."""
    tid = _task_id(task_id)
    back = _safe_next(request.form.get("next")) if request.form.get("next") else url_for(".thread", task_id=task_id)
    return _act(back, lambda: org.cancel(g.operator.org, tid), "The handoff is cancelled.")


@bp.post("/agents/<handle>/blocks")
def block_sender(handle: str):
    """Block a sender for this agent: its new handoffs fail with teammate_blocked."""
    subject = _agent(handle)
    back = url_for(".agent", handle=subject.handle)

    def run():
        return blocks.block(subject, _form(BlockForm())["blocked_handle"])

    return _act(back, run, lambda target: f"{target.handle} is blocked.", missing_is_404=False)


@bp.post("/agents/<handle>/blocks/<blocked>/delete")
def unblock_sender(handle: str, blocked: str):
    """Unblock a sender."""
    subject = _agent(handle)
    back = url_for(".agent", handle=subject.handle)
    return _act(
        back,
        lambda: blocks.unblock(subject, blocked),
        lambda existed: f"{blocked} is unblocked." if existed else f"{blocked} was not blocked.",
        missing_is_404=False,
    )


@bp.post("/agents/<handle>/keys")
def create_key(handle: str):
    """Issue a key for the agent; the page shows it this once (201, never stored in the page's URL)."""
    subject = _agent(handle)
    try:
        issued = _audited(lambda: agents.create_key(subject.handle, _form(KeyForm())["label"]))
    except RelayError as exc:
        _log_action(exc.symbol)
        flash(exc.message, "error")
        return redirect(url_for(".agent_keys", handle=subject.handle), 303)
    _log_action("ok")
    page = render_template("console/keys.html", agent=subject, keys=agents.list_keys(subject), issued=issued)
    return page, 201


@bp.post("/agents/<handle>/keys/<key_id>/revoke")
def revoke_key(handle: str, key_id: str):
    """Revoke one of the agent's keys: the API refuses it from the next request on."""
    subject = _agent(handle)
    back = url_for(".agent_keys", handle=subject.handle)
    return _act(back, lambda: agents.revoke_key(key_id, owner=subject), lambda key: f"Key …{key.hint} is revoked.")


def _webhooks_back(subject) -> str:
    return url_for(".agent_webhooks", handle=subject.handle)


@bp.post("/agents/<handle>/webhooks/<webhook_id>/<any(enable, disable):change>")
def set_webhook_enabled(handle: str, webhook_id: str, change: str):
    """Enable (health reset, circuit closed) or disable an endpoint."""
    subject = _agent(handle)
    on = change == "enable"
    return _act(
        _webhooks_back(subject),
        lambda: webhooks.update_endpoint(subject, webhook_id, {"enabled": on}),
        lambda e: f"{e['url']} is {'enabled' if on else 'disabled'}.",
    )


@bp.post("/agents/<handle>/webhooks/<webhook_id>/test")
def test_webhook(handle: str, webhook_id: str):
    """Send a ``webhook.test`` event to this endpoint."""
    subject = _agent(handle)
    return _act(
        _webhooks_back(subject),
        lambda: webhooks.send_test(subject, webhook_id),
        lambda r: f"Test event {r['event_id']} is on its way.",
    )


@bp.post("/agents/<handle>/webhooks/<webhook_id>/deliveries/<delivery_id>/redrive")
def redrive_delivery(handle: str, webhook_id: str, delivery_id: str):
    """Send a failed delivery again: same event, same ``webhook-id``, a fresh retry schedule."""
    subject = _agent(handle)
    return _act(
        _webhooks_back(subject),
        lambda: webhooks.redrive(subject, webhook_id, delivery_id),
        lambda r: f"Delivery of {r['event_id']} is queued again.",
    )


@bp.post("/agents/<handle>/webhooks/<webhook_id>/recover")
def recover_webhook(handle: str, webhook_id: str):
    """Re-send every event since a time that the endpoint did not receive (failed, or never sent to it)."""
    subject = _agent(handle)

    def run():
        return webhooks.recover(subject, webhook_id, _form(RecoverForm())["since"])

    def done(r):
        if not r["requeued"] and not r["created"]:
            return "Nothing to recover: every event since then was delivered or is on its way."
        return (
            f"Recovering: {_count(r['requeued'], 'failed delivery', 'failed deliveries')} queued again, "
            f"{_count(r['created'], 'event never sent', 'events never sent')} queued."
        )

    return _act(_webhooks_back(subject), run, done)


@bp.get("/agents/<handle>/webhooks/<webhook_id>/bulk-redrive")
def bulk_redrive_preview(handle: str, webhook_id: str):
    """How many failed deliveries a bulk redrive of ``since``..``until`` would send again, and the button to confirm."""
    import uuid

    subject = _agent(handle)
    q = _query(BulkRedriveQuery())
    preview = webhooks.redrive_preview(subject, webhook_id, q["since"], q["until"])
    endpoint = next(e for e in webhooks.list_endpoints(subject) if e["id"] == str(uuid.UUID(webhook_id)))
    return render_template(
        "console/bulk_redrive.html", agent=subject, e=endpoint, preview=preview, job_id=uuid.uuid4(), iso=iso
    )


@bp.post("/agents/<handle>/webhooks/<webhook_id>/bulk-redrive")
def bulk_redrive(handle: str, webhook_id: str):
    """Confirm a bulk redrive: a background task sends the window's failed deliveries again; the page shows its progress."""
    subject = _agent(handle)

    def run():
        form = _form(BulkRedriveForm())
        return webhooks.start_redrive(
            subject, webhook_id, form["job_id"], form["since"], form["until"], requested_by=g.operator.email
        )

    def done(result):
        job, made = result
        if not made:
            return f"That redrive was already confirmed: {job['done']} of {job['total']} sent again so far."
        return f"Redriving {_count(job['total'], 'failed delivery', 'failed deliveries')} in the background."

    back = url_for(".agent_webhooks", handle=subject.handle) + f"#endpoint-{webhook_id}"
    return _act(back, run, done)


@bp.get("/agents/<handle>/webhooks/<webhook_id>/redrives")
def redrive_progress(handle: str, webhook_id: str):
    """The endpoint's bulk redrives alone, with their progress: htmx polls it while one runs."""
    subject = _agent(handle)
    return render_template(
        "console/_redrives.html",
        agent=subject,
        e={"id": webhook_id, "redrives": webhooks.list_redrives(subject, webhook_id)},
    )


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@bp.route("/<path:anything>", methods=["GET", "POST"])
def unknown(anything: str):
    """Any other console path: the console's 404 page."""
    abort(404)
