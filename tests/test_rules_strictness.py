"""Nothing an agent sends is dropped in silence (docs/api.md, "Unknown members").

- Every object of a ``POST /a2a`` request is closed: a member it does not name, at any
  depth (params, ``message``, a part, an artifact of each type, ``proposed_action``,
  tasks/list's ``filter`` and ``page``), is -32602 naming its path, and nothing is written.
- The REST reply body shares the schemas: the same member is 422 naming the same path.
- What the contract leaves open stays open: ``metadata`` (at any depth) and an
  ``api_contract``'s ``spec`` object are taken and come back as they were sent.
"""

from __future__ import annotations

import pytest

from tests.conftest import bearer, rpc, rpc_error, sql


def _part(text="please look"):
    return {"type": "text", "text": text}


def _send_params(recipient, **extra):
    """message/send's params: a text to ``recipient``, then ``extra``."""
    return {"recipient": recipient, "message": {"role": "user", "parts": [_part()]}, **extra}


ARTIFACTS = {
    "file_diff": {"type": "file_diff", "path": "a.py", "diff": "@@ -1 +1 @@"},
    "file_ref": {"type": "file_ref", "path": "a.py", "line_start": 1},
    "test_command": {"type": "test_command", "command": "pytest"},
    "api_contract": {"type": "api_contract", "name": "GET /users", "spec": "openapi: 3.1.0"},
    "link": {"type": "link", "url": "https://example.com/x"},
}
ACTION = {"description": "rename", "target_files": ["a.py"], "rationale": "clarity"}


def _with_member(params: dict, path: list, name: str = "colour") -> dict:
    """``params`` with ``name`` added to the object at ``path`` (keys and list indexes)."""
    target = params
    for step in path:
        target = target[step]
    target[name] = "blue"
    return params


def _counts(app) -> tuple[int, int]:
    return sql(app, "SELECT (SELECT count(*) FROM threads), (SELECT count(*) FROM messages)")[0]


# (case, method, params builder given (recipient, task_id), where the member goes, the path named)
CASES = [
    ("params", "message/send", lambda r, t: _send_params(r), [], "colour"),
    ("message", "message/send", lambda r, t: _send_params(r), ["message"], "message.colour"),
    ("first part", "message/send", lambda r, t: _send_params(r), ["message", "parts", 0], "message.parts.0.colour"),
    (
        "third part",
        "message/send",
        lambda r, t: {"recipient": r, "message": {"parts": [_part(), _part(), _part()]}},
        ["message", "parts", 2],
        "message.parts.2.colour",
    ),
    *[
        (
            f"{kind} artifact",
            "message/send",
            lambda r, t, a=artifact: _send_params(r, artifacts=[ARTIFACTS["file_ref"], dict(a)]),
            ["artifacts", 1],
            "artifacts.1.colour",
        )
        for kind, artifact in ARTIFACTS.items()
    ],
    (
        "proposed_action",
        "message/send",
        lambda r, t: _send_params(r, intent="propose_action", proposed_action=dict(ACTION)),
        ["proposed_action"],
        "proposed_action.colour",
    ),
    (
        "append's part",
        "message/send",
        lambda r, t: {"task_id": t, "message": {"parts": [_part()]}},
        ["message", "parts", 0],
        "message.parts.0.colour",
    ),
    ("tasks/list filter", "tasks/list", lambda r, t: {"filter": {"role": "sender"}}, ["filter"], "filter.colour"),
    ("tasks/list page", "tasks/list", lambda r, t: {"page": {"limit": 5}}, ["page"], "page.colour"),
    ("tasks/get", "tasks/get", lambda r, t: {"task_id": t}, [], "colour"),
    ("tasks/cancel", "tasks/cancel", lambda r, t: {"task_id": t}, [], "colour"),
    ("tasks/update", "tasks/update", lambda r, t: {"task_id": t, "transition": "cancel"}, [], "colour"),
]


@pytest.mark.parametrize("case,method,build,where,path", CASES, ids=[c[0] for c in CASES])
def test_an_unknown_member_at_any_depth_is_refused_naming_its_path(
    app, client, alice, bob, case, method, build, where, path
):
    _a, key = alice
    task_id = rpc(client, key, "message/send", _send_params(bob[0]))["task_id"]
    before = _counts(app)
    params = _with_member(build(bob[0], task_id), where)
    error = rpc_error(client, key, method, params)
    assert error["code"] == -32602 and error["data"]["symbol"] == "invalid_params", error
    assert error["data"]["errors"] == {path: ["Unknown field."]}, error
    assert _counts(app) == before, "a refused call wrote something"
    assert rpc(client, key, "tasks/get", {"task_id": task_id})["status"]["state"] == "pending"


def test_every_unknown_member_of_one_request_is_named(client, alice, bob):
    """Several at several depths: each is named, none hides another."""
    _a, key = alice
    params = _send_params(bob[0], artifacts=[dict(ARTIFACTS["link"], colour="x")])
    params["message"]["parts"][0]["kind"] = "text"
    params["message"]["messageId"] = "m-1"
    error = rpc_error(client, key, "message/send", params)
    assert set(error["data"]["errors"]) == {"message.parts.0.kind", "message.messageId", "artifacts.0.colour"}, error


def test_rest_reply_refuses_an_unknown_member_naming_its_path(app, client, alice, bob):
    a_handle, key = alice
    task_id = rpc(client, key, "message/send", _send_params(bob[0]))["task_id"]
    before = _counts(app)
    body = {"message": {"parts": [dict(_part(), colour="blue")]}, "artifacts": [dict(ARTIFACTS["file_diff"], x=1)]}
    resp = client.post(f"/api/v1/identities/{a_handle}/a2a/tasks/{task_id}/messages", json=body, headers=bearer(key))
    assert resp.status_code == 422, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["code"] == "invalid_params", error
    assert set(error["details"]) == {"message.parts.0.colour", "artifacts.0.x"}, error
    assert _counts(app) == before


def test_open_objects_stay_open(client, alice, bob):
    """``metadata`` at any depth and an api_contract's object ``spec`` keep every member they were sent with."""
    _a, key = alice
    metadata = {"colour": "blue", "nested": {"deeper": [{"anything": True, "n": 1.5}]}, "client_idempotency_key": "k1"}
    spec = {"openapi": "3.1.0", "paths": {"/users": {"get": {"x-custom": {"colour": "blue"}}}}}
    contract = {"type": "api_contract", "name": "GET /users", "spec": spec, "format": "openapi"}
    task_id = rpc(client, key, "message/send", _send_params(bob[0], metadata=metadata, artifacts=[contract]))["task_id"]
    thread = rpc(client, key, "tasks/get", {"task_id": task_id})
    [message] = thread["messages"]
    assert message["payload"] == {k: v for k, v in metadata.items() if k != "client_idempotency_key"}
    assert message["artifacts"] == [contract]


def test_an_a2a_data_part_is_a_closed_artifact_too(app, client, alice, bob):
    """A2A carries an artifact as a data part: its unknown member is refused under the A2A path."""
    _a, key = alice
    message = {
        "messageId": "m-strict-1",
        "role": "ROLE_USER",
        "parts": [{"text": "see the diff"}, {"data": dict(ARTIFACTS["file_diff"], colour="blue")}],
    }
    resp = client.post(
        f"/a2a/agents/{bob[0]}",
        json={"jsonrpc": "2.0", "id": "1", "method": "SendMessage", "params": {"message": message}},
        headers={**bearer(key), "A2A-Version": "1.0"},
    )
    error = resp.get_json()["error"]
    assert error["code"] == -32602, error
    violations = {
        v["field"]: v["description"]
        for d in error.get("data") or []
        if d.get("@type", "").endswith("google.rpc.BadRequest")
        for v in d["fieldViolations"]
    }
    assert violations == {"message.parts.1.data.colour": "Unknown field."}, error
    assert _counts(app) == (0, 0)
