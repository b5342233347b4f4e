"""Helpers shared by the console's tests (tests/test_console_*.py): operators, CSRF tokens, sign-in."""

from __future__ import annotations

import re
import time

from relay.ids import new_ulid

_TOKEN = re.compile(r'name="csrf_token"(?: type="hidden")? value="([^"]+)"')


def csrf_from(html: str) -> str:
    """The CSRF token a console page's forms carry (AssertionError if it has none)."""
    match = _TOKEN.search(html)
    assert match, f"no csrf_token on the page: {html[:500]}"
    return match.group(1)


def make_operator(app, email: str, org: str) -> str:
    """Create an operator through the service; return its generated password."""
    from relay.services.operators import create_operator

    with app.app_context():
        _operator, password = create_operator(email, org)
    return password


def sign_in(client, email: str, password: str):
    """Sign ``client`` (a Flask test client) in; return the POST's response (303 on success)."""
    token = csrf_from(client.get("/console/login").get_data(as_text=True))
    return client.post("/console/login", data={"email": email, "password": password, "csrf_token": token})


def token_of(client, path: str = "/console/") -> str:
    """A CSRF token for ``client``'s session, read from one of its pages."""
    return csrf_from(client.get(path).get_data(as_text=True))


def forged_session(app, operator_email: str, signed_in_hours_ago: float) -> str:
    """A session cookie value signed with ``app``'s secret for an operator who signed in that long ago.

    What a browser would still hold after the console's session lifetime: the console must
    refuse it by the sign-in time it carries, whatever the cookie's own signature time.
    """
    from relay.services.operators import get_operator

    with app.app_context():
        operator = get_operator(operator_email)
        at = int(time.time() - signed_in_hours_ago * 3600)
        data = {"_permanent": True, "op": {"id": str(operator.id), "v": operator.session_version, "at": at}}
        return app.session_interface.get_signing_serializer(app).dumps(data)


def unknown_task_id() -> str:
    from relay.ids import format_ulid

    return format_ulid(new_ulid())
