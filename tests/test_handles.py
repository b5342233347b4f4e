"""The handle grammar (docs/decisions.md, "Handles"; relay/services/agents.py).

``local@org``: the local part is a-z, 0-9, '.', '_' and '-' with no leading, trailing or
doubled '.'; the org is dot-separated labels of a-z, 0-9 and '-', none empty and none
starting or ending with '-'. A look-alike of a handle (``x@org.`` beside ``x@org``) is
refused when an agent is created and when a message is addressed to it, with a message
that names the broken rule. Rows made before the grammar are still found.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from relay.errors import RelayError
from tests.conftest import bearer, rpc_answer, sql

ORG_RULE = "the org must be dot-separated labels of a-z, 0-9 and '-'"
EMPTY_LABEL = f"{ORG_RULE}; a label is empty"
DOT_ENDS = "the local part must not start or end with '.'"

# The look-alikes of x@org, each with the rule it breaks.
LOOK_ALIKES = [
    ("x@org.", EMPTY_LABEL),
    ("x@.org", EMPTY_LABEL),
    ("x@o..rg", EMPTY_LABEL),
    (".x@org", DOT_ENDS),
    ("x.@org", DOT_ENDS),
    ("x@org-", f"{ORG_RULE}; label 'org-' starts or ends with '-'"),
]

# (a well-formed handle, a near miss of it, the rule the near miss breaks)
NEAR_MISSES = [
    ("a.b@org", "a..b@org", "the local part must not contain '..'"),
    ("x@my-org", "x@-my-org", f"{ORG_RULE}; label '-my-org' starts or ends with '-'"),
    ("x@org-1.example", "x@org-1.example-", f"{ORG_RULE}; label 'example-' starts or ends with '-'"),
    ("x@a.b.c", "x@a.b_c", f"{ORG_RULE}; label 'b_c' holds another character"),
    ("x_y-z@org", "x y@org", "the local part may hold only a-z, 0-9, '.', '_' and '-'"),
    ("-x_@9org", "-x_@org@9org", "must be local@org with exactly one '@'"),
    ("x@org", "x@", f"{ORG_RULE}; the org (after '@') is empty"),
]

TEXT = "please review the paginated /users API"


def _create(app, handle):
    from relay.services.agents import create_agent

    with app.app_context():
        agent, _key = create_agent(handle, "X", "backend")
        return agent.handle


def _refused(app, handle) -> RelayError:
    from relay.services.agents import create_agent

    with app.app_context(), pytest.raises(RelayError) as info:
        create_agent(handle, "X", "backend")
    return info.value


def _handles(app) -> list[str]:
    return [r[0] for r in sql(app, "select handle from agents order by handle")]


def _insert_legacy(app, handle: str) -> None:
    """An agent row made before the grammar (the database's own check is the old, looser one)."""
    sql(
        app,
        "insert into agents (id, handle, org, name, role) values (:id, :handle, :org, 'Legacy', '')",
        id=uuid.uuid4(),
        handle=handle,
        org=handle.split("@", 1)[1],
    )


def _to(recipient):
    """message/send's params: TEXT to ``recipient``."""
    return {"recipient": recipient, "message": {"role": "user", "parts": [{"type": "text", "text": TEXT}]}}


def _assert_invalid_recipient(body, handle, rule):
    assert "result" not in body, body
    error = body["error"]
    assert error["code"] == -32602 and error["data"]["symbol"] == "invalid_params", body
    assert error["data"]["errors"] == {"recipient": [f"handle {handle!r}: {rule}"]}, body
    assert error["message"] == f"recipient: handle {handle!r}: {rule}", body


# --------------------------------------------------------------------------- creating an agent


@pytest.mark.parametrize(("handle", "rule"), LOOK_ALIKES)
def test_look_alike_is_refused_by_the_service_naming_the_rule(app, handle, rule):
    assert _create(app, "x@org") == "x@org"
    exc = _refused(app, handle)
    assert exc.symbol == "invalid_params"
    assert exc.message == f"handle: handle {handle!r}: {rule}"
    assert exc.details == {"handle": [f"handle {handle!r}: {rule}"]}
    assert _handles(app) == ["x@org"]


@pytest.mark.parametrize(("good", "bad", "rule"), NEAR_MISSES)
def test_well_formed_handle_is_created_and_its_near_miss_refused(app, good, bad, rule):
    assert _create(app, good) == good
    assert _refused(app, bad).details == {"handle": [f"handle {bad!r}: {rule}"]}
    assert _handles(app) == [good]


def test_refusal_names_the_handle_as_given_and_the_rule_after_lower_casing(app):
    exc = _refused(app, " X@Org. ")
    assert exc.details == {"handle": [f"handle ' X@Org. ': {EMPTY_LABEL}"]}
    assert _create(app, " X.Y@Org.Example ") == "x.y@org.example"


@pytest.fixture
def relay_cli(base_env, tmp_path):
    env = {**base_env, "RELAY_HOME": str(tmp_path / "relay-home")}

    def _run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "relay.ops.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    return _run


def test_cli_refuses_every_look_alike_with_one_line_naming_the_rule(app, relay_cli):
    made = relay_cli("agents", "create", "x@org", "--name", "X", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["handle"] == "x@org"
    for handle, rule in LOOK_ALIKES:
        proc = relay_cli("agents", "create", handle, "--name", "X", "--json")
        assert proc.returncode != 0, (handle, proc.stdout)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"handle {handle!r}: {rule}" in lines[0], (handle, lines[0])
        assert proc.stdout == ""
    assert _handles(app) == ["x@org"]


# --------------------------------------------------------------------------- addressing a message


@pytest.mark.parametrize(("handle", "rule"), LOOK_ALIKES)
def test_message_send_to_a_look_alike_is_32602_naming_recipient_and_the_rule(app, client, make_agent, handle, rule):
    make_agent("x@org")
    _sender, key = make_agent("alice@acme")
    _assert_invalid_recipient(rpc_answer(client, key, "message/send", _to(handle)), handle, rule)
    assert sql(app, "select count(*) from threads")[0][0] == 0


def test_existing_look_alike_row_is_still_found_but_not_delivered_to(app, client, make_agent):
    from relay.services.agents import disable_agent, get_agent, normalize_handle

    make_agent("x@org")
    _insert_legacy(app, "x@org.")
    _sender, key = make_agent("alice@acme")

    # POST /a2a: the look-alike is an invalid recipient, not the old row.
    _assert_invalid_recipient(rpc_answer(client, key, "message/send", _to("x@org.")), "x@org.", EMPTY_LABEL)
    # A2A binding: the row's endpoint exists, but opening a task there is refused the same way.
    a2a = client.post(
        "/a2a/agents/x@org.",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": TEXT}]}},
        },
        headers={**bearer(key), "A2A-Version": "1.0"},
    ).get_json()
    assert a2a["error"]["code"] == -32602, a2a
    bad_request = [d for d in a2a["error"]["data"] if d["@type"].endswith("google.rpc.BadRequest")]
    assert bad_request[0]["fieldViolations"] == [{"field": "agent", "description": f"handle 'x@org.': {EMPTY_LABEL}"}]
    assert sql(app, "select count(*) from threads")[0][0] == 0

    # The row itself is left alone: looked up, listed and disabled like any other.
    with app.app_context():
        assert get_agent(normalize_handle("X@Org.")).name == "Legacy"
        assert disable_agent("x@org.").disabled_at is not None
    assert _handles(app) == ["alice@acme", "x@org", "x@org."]
