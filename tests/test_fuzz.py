"""Bad-input sweep: schemathesis over every REST operation, hypothesis over POST /a2a bodies.

Whatever arrives, the relay answers with a 4xx (or 2xx) in its own JSON shape: never a
5xx, never a traceback, never a JSON-RPC internal error (docs/api.md, "Errors":
-32603 carries no traceback, and a bad input is the caller's error, not ours).

Every sweep is bounded and derandomized, so CI runs the same examples every time:
25 schemathesis examples per REST operation and generation mode, 200 /a2a bodies, and
100 raw bodies for the REST routes that read one (~30 s in all).

schemathesis is driven through its Python API (the served document through ``from_dict``,
``APIOperation.as_strategy``, ``Case.call`` to the WSGI app, ``Case.validate_response``)
rather than ``schemathesis.pytest.from_fixture``: the lazy fixture loader of schemathesis
4.32 reads ``Function._nodeid``, which pytest 9.2 no longer has.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import bearer, post_a2a, rpc

OPENAPI = "/api/v1/openapi.json"
ME, TEAMMATE, STRANGER = "fuzz@acme", "frank@acme", "zed@elsewhere"
# Never derived from a random seed: the same examples run locally and in CI.
SWEEP = dict(
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)
JSON_TYPES = ("application/json", "application/problem+json")


def _document_operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in the REST document, read at collection time.

    The document is built from the blueprint's routes, so a bare Flask app holding only
    the ``api_v1`` blueprint yields the same operations as the served document (the
    test itself loads the served one and fails if an operation is missing from it).
    """
    from relay.transport.rest import bp
    from relay.transport.rest.openapi import build_spec

    bare = Flask("fuzz-collect")
    bare.register_blueprint(bp)
    with bare.app_context():
        doc = build_spec()
    return sorted((method.upper(), path) for path, ops in doc["paths"].items() for method in ops)


# The stream never ends by itself, so a generated call would never return: it has its own
# bad-input tests (tests/test_streams.py), and shares the feed's filters, swept here.
UNSWEPT = {("GET", "/api/v1/identities/{handle}/a2a/messages/stream")}
OPERATIONS = [op for op in _document_operations() if op not in UNSWEPT]
# A generated feed wait may hold the request this long (the bound itself is tested apart).
SWEPT_WAIT_SECONDS = 1


# --------------------------------------------------------------------------- shared checks


def assert_clean_body(content: bytes, content_type: str | None, status: int, sent: bytes = b"") -> Any:
    """No 5xx; a body, when present, is JSON of a JSON content type without a traceback."""
    assert status < 500, f"{status}: {content[:500]!r}"
    if b"Traceback" not in sent:
        assert b"Traceback" not in content, content[:2000]
    if not content:
        return None
    mimetype = (content_type or "").split(";", 1)[0].strip().lower()
    assert mimetype in JSON_TYPES, f"{status} with Content-Type {content_type!r}: {content[:200]!r}"

    def _no_constants(name):
        raise AssertionError(f"response holds the non-JSON token {name}")

    return json.loads(content, parse_constant=_no_constants)


# --------------------------------------------------------------------------- REST: schemathesis


@pytest.fixture
def rest_world(app, client, make_agent):
    """A caller with a thread each way, a webhook and a spare key; two other agents.

    Path parameters are steered to these real values part of the time, so generated
    bodies and queries reach the services instead of stopping at 404.
    """
    me, key = make_agent(ME)
    teammate, teammate_key = make_agent(TEAMMATE)
    stranger, _ = make_agent(STRANGER)

    message = {"parts": [{"type": "text", "text": "please review the fuzz"}]}
    inbound = rpc(client, teammate_key, "message/send", {"recipient": me, "message": message})["task_id"]
    outbound = rpc(client, key, "message/send", {"recipient": teammate, "message": message})["task_id"]
    hook = client.post(
        f"/api/v1/identities/{me}/webhooks", json={"url": "http://127.0.0.1:9/fuzz"}, headers=bearer(key)
    )
    assert hook.status_code == 201, hook.get_data(as_text=True)
    spare = client.post(f"/api/v1/identities/{me}/keys", json={"label": "spare"}, headers=bearer(key))
    assert spare.status_code == 201, spare.get_data(as_text=True)
    # None keeps what schemathesis generated. The key in use is never offered for revocation,
    # so the sweep keeps its credentials to the end.
    return {
        "key": key,
        "steer": {
            "handle": [me, me, me, None, teammate, stranger],
            "blocked_handle": [teammate, stranger, me, None],
            "task_id": [inbound, outbound, None],
            "webhook_id": [hook.get_json()["id"], None],
            "key_id": [spare.get_json()["key_id"], None],
        },
    }


RESPONSE_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# A negative case for a 262,144-character bound is a string of 262,145: more choices than one
# hypothesis example may hold, so generating it fails (InvalidArgument) instead of testing.
# Bounds past this are capped in the copy the sweep generates from; the /a2a sweep below and
# the services' own tests send the really long strings.
GENERABLE_LENGTH = 4096


def _generable(node: Any) -> Any:
    if isinstance(node, dict):
        wait = node.get("properties", {}).get("wait") if isinstance(node.get("properties"), dict) else None
        if isinstance(wait, dict) and "maximum" in wait:
            wait["maximum"] = SWEPT_WAIT_SECONDS
        if isinstance(node.get("maxLength"), int) and node["maxLength"] > GENERABLE_LENGTH:
            node["maxLength"] = GENERABLE_LENGTH
        for value in node.values():
            _generable(value)
    elif isinstance(node, list):
        for value in node:
            _generable(value)
    return node


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize("method,path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_rest_operation_survives_generated_requests(app, rest_world, method, path, mode):
    served = app.test_client().get(OPENAPI)
    assert served.status_code == 200, served.get_data(as_text=True)
    schema = schemathesis.openapi.from_dict(
        _generable(served.get_json()), config=schemathesis.Config.from_dict({"seed": 20260420})
    )
    schema.app = app  # requests go to the app in-process (WSGI), as with from_wsgi
    operation = schema[path][method]  # KeyError: the served document lacks this operation
    if mode.is_negative and not any((operation.path_parameters, operation.query, operation.headers, operation.body)):
        pytest.skip("no parameter or body to make invalid")
    headers = bearer(rest_world["key"])
    steer = rest_world["steer"]
    names = [p.name for p in operation.path_parameters]
    choices = st.fixed_dictionaries({n: st.sampled_from(steer.get(n, [None])) for n in names})

    # Generation-efficiency health checks only: schemathesis strategies are large and filtered.
    @settings(
        max_examples=25,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
        **SWEEP,
    )
    @given(case=operation.as_strategy(generation_mode=mode), picks=choices)
    def sweep(case, picks):
        for name, value in picks.items():
            if value is not None:
                case.path_parameters[name] = value
        response = case.call(headers=headers)
        event(f"HTTP {response.status_code}")  # shown by --hypothesis-show-statistics
        case.validate_response(response, checks=RESPONSE_CHECKS, headers=headers)
        content_type = (response.headers.get("content-type") or [None])[0]
        assert_clean_body(response.content, content_type, response.status_code)

    sweep()


# --------------------------------------------------------------------------- /a2a: hypothesis

METHODS = ["message/send", "tasks/get", "tasks/list", "tasks/update", "tasks/cancel"]
GARBAGE_METHODS = [
    "",
    "message/Send",
    "tasks/",
    "tasks/get ",
    "rpc.discover",
    "__init__",
    "message\x00send",
    "../tasks/get",
    "tasks/get/extra",
    "é/ü",
]
PARAM_KEYS = [
    "task_id",
    "recipient",
    "intent",
    "context_id",
    "message",
    "artifacts",
    "proposed_action",
    "metadata",
    "filter",
    "page",
    "transition",
    "session_id",
    "result_summary",
]

# NUL, lone surrogates, quotes and backslashes turn up often, not once in a million characters.
any_text = st.text(
    st.characters(codec=None, exclude_categories=())
    | st.characters(categories=["Cs"])
    | st.sampled_from('\x00"\\\u2028'),
    max_size=40,
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | any_text
    | st.sampled_from([2**63, -(2**63) - 1, 10**30, 1e308, -0.0, 5e-324])
)
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=5) | st.dictionaries(any_text, kids, max_size=5), max_leaves=25
)
huge_text = st.builds(lambda ch, n: ch * n, st.characters(codec="utf-8"), st.integers(1, 300_000))
ids = st.integers() | any_text | st.none() | st.floats() | st.booleans() | json_values
# Placeholders the test swaps for the ids of real threads, so tasks/get, tasks/update and
# tasks/cancel also run on threads that exist (see a2a_world).
REAL_IDS = ("@@INBOUND@@", "@@OUTBOUND@@", "@@CONTEXT@@")
ulid_like = (
    st.sampled_from(REAL_IDS)
    | st.sampled_from(REAL_IDS)
    | st.sampled_from(
        [
            "01HXYZ4K2VNJQP7R8MWDB3CSTF",
            "01hxyz4k2vnjqp7r8mwdb3cstf",
            "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
            "00000000-0000-0000-0000-000000000000",
            "not-a-ulid",
            "",
        ]
    )
    | any_text
    | huge_text
)
text_like = any_text | huge_text | json_values
message_like = (
    st.fixed_dictionaries(
        {},
        optional={
            "role": text_like,
            "parts": st.lists(
                st.fixed_dictionaries({}, optional={"type": st.just("text") | text_like, "text": text_like}), max_size=3
            )
            | json_values,
        },
    )
    | json_values
)
param_values = {
    "task_id": ulid_like | json_values,
    "context_id": ulid_like | json_values,
    "recipient": st.sampled_from([TEAMMATE, ME, "nobody@nowhere", "NOT A HANDLE"]) | text_like,
    "intent": text_like,
    "message": message_like,
    "transition": st.sampled_from(["accept", "complete", "cancel"]) | text_like,
    "session_id": text_like,
    "result_summary": text_like,
    "artifacts": st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["file_diff", "file_ref", "test_command", "api_contract", "link"]) | text_like},
            optional={
                "path": text_like,
                "diff": text_like,
                "spec": json_values,
                "url": text_like,
                "command": text_like,
            },
        ),
        max_size=3,
    )
    | json_values,
    "metadata": st.dictionaries(st.just("client_idempotency_key") | any_text, json_values | huge_text, max_size=3)
    | json_values,
    "filter": st.fixed_dictionaries({}, optional={"role": text_like, "status": json_values, "since": text_like})
    | json_values,
    "page": st.fixed_dictionaries({}, optional={"limit": json_values, "cursor": text_like}) | json_values,
    "proposed_action": json_values,
}
params = (
    st.fixed_dictionaries({}, optional={k: param_values[k] for k in PARAM_KEYS})
    | st.dictionaries(st.sampled_from(PARAM_KEYS) | any_text, json_values, max_size=4)
    | json_values
)
# Each method with plausible params (real thread ids, a valid message) and one odd member,
# so calls get past the schema into the services and the state machine.
plain_text = st.text(max_size=30)
good_message = st.fixed_dictionaries(
    {
        "parts": st.lists(
            st.fixed_dictionaries({"type": st.just("text"), "text": plain_text | any_text}), min_size=1, max_size=2
        )
    }
)
real_task = st.sampled_from(REAL_IDS[:2]) | ulid_like
plausible_calls = st.one_of(
    st.fixed_dictionaries(
        {
            "method": st.just("message/send"),
            "params": st.fixed_dictionaries(
                {"message": good_message},
                optional={
                    "task_id": real_task,
                    "recipient": param_values["recipient"],
                    "context_id": ulid_like,
                    "metadata": param_values["metadata"],
                    "artifacts": param_values["artifacts"],
                    "intent": plain_text,
                    "proposed_action": json_values,
                },
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "method": st.sampled_from(["tasks/get", "tasks/cancel"]),
            "params": st.fixed_dictionaries({"task_id": real_task}),
        }
    ),
    st.fixed_dictionaries(
        {
            "method": st.just("tasks/update"),
            "params": st.fixed_dictionaries(
                {"task_id": real_task, "transition": param_values["transition"]},
                optional={"session_id": text_like, "result_summary": text_like},
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "method": st.just("tasks/list"),
            "params": st.fixed_dictionaries(
                {}, optional={"filter": param_values["filter"], "page": param_values["page"]}
            ),
        }
    ),
)
# Mostly a valid envelope around a real method, so the params reach the method's schema and
# service; then envelopes with any member missing or of the wrong type; then any object.
valid_ids = st.integers(-(2**53), 2**53) | st.text(max_size=20)
rpc_objects = st.one_of(
    st.builds(lambda call, id_: {"jsonrpc": "2.0", "id": id_, **call}, plausible_calls, valid_ids),
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "id": valid_ids, "method": st.sampled_from(METHODS), "params": params}
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", "2", 2.0, 2]) | json_values,
            "id": ids,
            "method": st.sampled_from(METHODS + METHODS + GARBAGE_METHODS) | any_text | huge_text | json_values,
            "params": params,
        },
    ),
    st.dictionaries(any_text, json_values, max_size=4),
)


def _encode(doc: Any) -> bytes:
    # allow_nan: NaN/Infinity tokens are not JSON, so they must come back as a parse error;
    # ensure_ascii: lone surrogates travel as \\udXXX escapes, which is valid JSON text.
    return json.dumps(doc, allow_nan=True).encode("utf-8")


def _nested(depth: int, opener: bytes, closer: bytes, inner: bytes = b"1") -> bytes:
    return opener * depth + inner + closer * depth


def _invalid_utf8(prefix: bytes, junk: bytes, suffix: bytes) -> bytes:
    return prefix + junk + suffix


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Overlong, surrogate, past-U+10FFFF, truncated and stray continuation bytes, then any junk.
INVALID_UTF8 = st.sampled_from(
    [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80", b"\xe2\x82", b"\xf0\x9f\x98"]
) | st.binary(min_size=1, max_size=20).filter(lambda b: not _is_utf8(b))
RPC_PREFIX = (
    b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"recipient":"'
    + TEAMMATE.encode()
    + b'","message":{"parts":[{"type":"text","text":"'
)
RPC_SUFFIX = b'"}]}}}'
bodies = st.one_of(
    json_values.map(_encode),  # any JSON value
    rpc_objects.map(_encode),  # request-shaped, wrong types
    rpc_objects.map(_encode),  # (weighted: the deepest reach)
    rpc_objects.map(_encode),
    st.lists(rpc_objects, min_size=0, max_size=6).map(_encode),  # batches, empty included
    st.builds(lambda n: _encode([{"jsonrpc": "2.0", "method": "tasks/list"}] * n), st.integers(99, 102)),
    st.builds(lambda depth: _nested(depth, b"[", b"]"), st.integers(1, 10_000)),  # deep nesting
    st.builds(lambda depth: _nested(depth, b'{"a":', b"}"), st.integers(1, 10_000)),
    st.builds(
        lambda depth: (
            RPC_PREFIX[: -len(b'"text":"')] + b'"text":"x"}]},"metadata":{"deep":' + _nested(depth, b"[", b"]") + b"}}}"
        ),
        st.integers(1, 3_000),
    ),  # deep, inside params
    st.builds(
        _invalid_utf8,
        st.sampled_from([b"", b'{"jsonrpc":"2.0","id":"', RPC_PREFIX]),
        INVALID_UTF8,
        st.sampled_from([b"", b'"}', RPC_SUFFIX]),
    ),  # invalid UTF-8
    st.builds(
        lambda text: RPC_PREFIX + text.encode("utf-8") + RPC_SUFFIX,
        huge_text.filter(lambda t: '"' not in t and "\\" not in t and not any(ord(c) < 32 for c in t)),
    ),
    st.builds(lambda pad, doc: b" " * pad + _encode(doc), st.integers(900_000, 1_100_000), rpc_objects),  # ~limit
    st.binary(max_size=2_000),  # random bytes
)
auth_headers = st.sampled_from(["valid"] * 9 + ["none", "garbage", "basic", "empty"])
content_types = st.sampled_from(
    [
        "application/json",
        "application/json",
        "text/plain",
        None,
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
    ]
)


@pytest.fixture
def a2a_world(client, make_agent):
    """A real caller for /a2a, a teammate to write to, and a thread each way between them."""
    _, teammate_key = make_agent(TEAMMATE)
    _, key = make_agent(ME)
    ids = {}
    for name, sender_key, recipient in (("@@INBOUND@@", teammate_key, ME), ("@@OUTBOUND@@", key, TEAMMATE)):
        resp = post_a2a(
            client,
            sender_key,
            _encode(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "message/send",
                    "params": {"recipient": recipient, "message": {"parts": [{"type": "text", "text": "fuzz me"}]}},
                }
            ),
        )
        result = resp.get_json()["result"]
        ids[name] = result["task_id"]
        ids["@@CONTEXT@@"] = result["context_id"]
    return key, {name.encode(): value.encode() for name, value in ids.items()}


def assert_rpc_answer(doc: Any) -> None:
    """A JSON-RPC 2.0 answer (or batch of them) that is never an internal error."""
    answers = doc if isinstance(doc, list) else [doc]
    assert answers, "an empty batch answer must be HTTP 204, not []"
    for answer in answers:
        assert isinstance(answer, dict) and answer.get("jsonrpc") == "2.0", answer
        event("result" if "result" in answer else f"error {answer['error'].get('data', {}).get('symbol')}")
        assert ("result" in answer) != ("error" in answer), answer
        if "error" in answer:
            error = answer["error"]
            assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), error
            assert error["code"] != -32603, f"internal error for bad input: {error}"


# The Authorization header of each ``auth`` but "valid" (the caller's own key).
BAD_AUTHORIZATION = {
    "none": {},
    "garbage": {"Authorization": "Bearer ah_live_nope"},
    "basic": {"Authorization": "Basic Zm9vOmJhcg=="},
    "empty": {"Authorization": "Bearer "},
}


def check_a2a(resp, body: bytes, auth: str) -> None:
    content = resp.get_data()
    event(f"HTTP {resp.status_code}")
    assert resp.status_code in (200, 204, 401, 413, 429), f"{resp.status_code}: {content[:500]!r}"
    if auth != "valid" and resp.status_code != 413:
        assert resp.status_code == 401, content[:500]
    doc = assert_clean_body(content, resp.headers.get("Content-Type"), resp.status_code, sent=body)
    if resp.status_code == 204:
        assert not content
        return
    assert content, f"{resp.status_code} without a body"
    assert_rpc_answer(doc)


# The fixtures are function-scoped, and hypothesis runs every example inside one use of them.
# That is intended here: the test client keeps no state between requests (no cookies), the
# agents and key are created once and only read, and rows the examples write (threads,
# messages) change no assertion. So the health check is suppressed for these two tests only.
@settings(
    max_examples=200,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    **SWEEP,
)
@given(body=bodies, auth=auth_headers, content_type=content_types)
@example(body=b"", auth="valid", content_type="application/json")
@example(body=b"[" * 10_000 + b"]" * 10_000, auth="valid", content_type="application/json")
@example(
    body=b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"task_id":"\xff"}}',
    auth="valid",
    content_type="application/json",
)
def test_a2a_survives_any_body(client, a2a_world, body, auth, content_type):
    key, real_ids = a2a_world
    for placeholder, value in real_ids.items():
        body = body.replace(placeholder, value)
    if auth == "valid":
        resp = post_a2a(client, key, body, content_type=content_type)
    else:
        resp = post_a2a(client, None, body, headers=BAD_AUTHORIZATION[auth], content_type=content_type)
    check_a2a(resp, body, auth)


# schemathesis only ever sends valid JSON; the REST routes that read a body get the same
# bytes as /a2a (the JSON parser is theirs, not the one behind /a2a).
REST_BODY_ROUTES = [
    ("POST", "{me}/a2a/tasks/{task}/messages"),
    ("POST", "{me}/a2a/tasks/{task}/transitions"),
    ("POST", "{me}/webhooks"),
    ("PATCH", "{me}/webhooks/{hook}"),
    ("POST", "{me}/keys"),
]


@settings(
    max_examples=100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    **SWEEP,
)
@given(route=st.sampled_from(REST_BODY_ROUTES), body=bodies, content_type=content_types)
@example(route=REST_BODY_ROUTES[0], body=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
def test_rest_bodies_survive_any_bytes(client, rest_world, route, body, content_type):
    steer = rest_world["steer"]
    method, template = route
    url = "/api/v1/identities/" + template.format(
        me=steer["handle"][0], task=steer["task_id"][0], hook=steer["webhook_id"][0]
    )
    headers = {**bearer(rest_world["key"]), **({"Content-Type": content_type} if content_type else {})}
    resp = client.open(url, method=method, data=body, headers=headers)
    event(f"HTTP {resp.status_code}")
    doc = assert_clean_body(resp.get_data(), resp.headers.get("Content-Type"), resp.status_code, sent=body)
    assert resp.status_code in (200, 201, 400, 409, 413, 422), resp.get_data()[:500]
    if resp.status_code == 400:
        assert resp.get_json()["error"]["code"] == "parse_error", resp.get_data()[:500]
    if resp.status_code >= 400:
        assert set(doc) == {"error"} and {"code", "message", "details"} <= set(doc["error"]), doc


# --------------------------------------------------------------------------- inputs the fuzz sweep found


def _cursor(stamp: str) -> str:
    import base64
    import uuid

    raw = json.dumps([stamp, str(uuid.uuid4())]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# Found by schemathesis: GET .../a2a/tasks?since=0340-05-21T11:36:51+18:21 answered 500.
# Python accepts offsets up to ±23:59, PostgreSQL only ±15:59; times are now made UTC
# before they reach the database.
@pytest.mark.parametrize(
    "since", ["0340-05-21T11:36:51+18:21", "2026-04-20T00:00:00+23:59", "2026-04-20T00:00:00-16:00"]
)
def test_since_with_an_offset_postgresql_refuses_is_not_a_server_error(client, make_agent, since):
    me, key = make_agent(ME)
    for path in ("a2a/tasks", "a2a/messages"):
        resp = client.get(f"/api/v1/identities/{me}/{path}", query_string={"since": since}, headers=bearer(key))
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert resp.get_json() == {"items": [], "next_cursor": None}
    resp = post_a2a(
        client,
        key,
        _encode({"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {"filter": {"since": since}}}),
    )
    assert resp.status_code == 200 and resp.get_json()["result"] == {"items": [], "next_cursor": None}, resp.get_json()


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_since_outside_the_utc_calendar_is_422_naming_since(client, make_agent, since):
    me, key = make_agent(ME)
    resp = client.get(f"/api/v1/identities/{me}/a2a/tasks", query_string={"since": since}, headers=bearer(key))
    assert resp.status_code == 422, resp.get_data(as_text=True)
    assert "since" in resp.get_json()["error"]["details"]
    resp = post_a2a(
        client,
        key,
        _encode({"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {"filter": {"since": since}}}),
    )
    error = resp.get_json()["error"]
    assert error["code"] == -32602 and "filter.since" in error["data"]["errors"], error


# The same offset inside a cursor (an opaque value a client can still forge) is a client error too, never a 500.
@pytest.mark.parametrize("stamp,status", [("2026-04-20T00:00:00+18:00", 200), ("0001-01-01T00:00:00+01:00", 422)])
def test_cursor_with_a_far_offset_is_not_a_server_error(client, make_agent, stamp, status):
    me, key = make_agent(ME)
    for path in ("a2a/tasks", "a2a/messages"):
        resp = client.get(
            f"/api/v1/identities/{me}/{path}", query_string={"cursor": _cursor(stamp)}, headers=bearer(key)
        )
        assert resp.status_code == status, resp.get_data(as_text=True)
    resp = post_a2a(
        client,
        key,
        _encode({"jsonrpc": "2.0", "id": 1, "method": "tasks/list", "params": {"page": {"cursor": _cursor(stamp)}}}),
    )
    assert ("result" in resp.get_json()) == (status == 200), resp.get_json()


def _reply_body(extra: bytes) -> bytes:
    return b'{"message":{"parts":[{"type":"text","text":"x"}]},' + extra + b"}"


# Found probing the REST body parser (/a2a already refused these as -32700): NaN, Infinity
# and 1e400 (inf) reached jsonb, and 100,000 levels of nesting raised RecursionError in
# Flask's get_json: all three were 500. They are not JSON PostgreSQL can store: 400
# parse_error, as /a2a's -32700.
@pytest.mark.parametrize(
    "body",
    [
        _reply_body(b'"metadata":{"a":NaN}'),
        _reply_body(b'"metadata":{"a":-Infinity}'),
        _reply_body(b'"metadata":{"a":1e400}'),
        _reply_body(b'"artifacts":[{"type":"api_contract","name":"n","spec":{"a":NaN}}]'),
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["nan", "-infinity", "1e400", "nan-in-artifact", "deep-100000"],
)
def test_rest_body_that_is_not_storable_json_is_400_parse_error(client, rest_world, body):
    me, task = rest_world["steer"]["handle"][0], rest_world["steer"]["task_id"][0]
    resp = client.post(
        f"/api/v1/identities/{me}/a2a/tasks/{task}/messages",
        data=body,
        headers={**bearer(rest_world["key"]), "Content-Type": "application/json"},
    )
    assert resp.status_code == 400, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["code"] == "parse_error" and error["details"]["reason"], error


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


# Found by the same probe: a body the parser accepts but nested ~920 levels deep ran out of
# stack while loading or storing it: 500 on REST, -32603 internal_error on /a2a. Nesting is
# now bounded at 64 levels before anything recurses, and the error names the member.
@pytest.mark.parametrize("where", ["metadata", "part", "artifact"])
def test_params_nested_past_the_bound_are_refused_naming_the_member(client, rest_world, where):
    me, task = rest_world["steer"]["handle"][0], rest_world["steer"]["task_id"][0]
    deep = _deep(920)
    member, extra = {
        "metadata": ("metadata", b'"metadata":{"a":' + deep + b"}"),
        "part": ("message", b'"parts":[{"type":"text","text":"x","extra":' + deep + b"}]"),
        "artifact": ("artifacts", b'"artifacts":[{"type":"api_contract","name":"n","spec":{"a":' + deep + b"}}]"),
    }[where]
    body = (b'{"message":{' + extra + b"}}") if where == "part" else _reply_body(extra)
    headers = {**bearer(rest_world["key"]), "Content-Type": "application/json"}
    resp = client.post(f"/api/v1/identities/{me}/a2a/tasks/{task}/messages", data=body, headers=headers)
    assert resp.status_code == 422, resp.get_data(as_text=True)
    assert resp.get_json()["error"]["details"] == {member: ["must not be nested deeper than 64 levels"]}

    params = b'{"task_id":"' + task.encode() + b'",' + body[1:]
    resp = post_a2a(
        client, rest_world["key"], b'{"jsonrpc":"2.0","id":7,"method":"message/send","params":' + params + b"}"
    )
    error = resp.get_json()["error"]
    assert error["code"] == -32602 and error["data"]["errors"] == {member: ["must not be nested deeper than 64 levels"]}


def test_nesting_up_to_the_bound_is_accepted(client, rest_world):
    me, task = rest_world["steer"]["handle"][0], rest_world["steer"]["task_id"][0]
    headers = {**bearer(rest_world["key"]), "Content-Type": "application/json"}
    # metadata (1) -> "a" (2) -> 62 lists -> 1 at level 64
    resp = client.post(
        f"/api/v1/identities/{me}/a2a/tasks/{task}/messages",
        data=_reply_body(b'"metadata":{"a":' + _deep(62) + b"}"),
        headers=headers,
    )
    assert resp.status_code == 201, resp.get_data(as_text=True)
    resp = client.post(
        f"/api/v1/identities/{me}/a2a/tasks/{task}/messages",
        data=_reply_body(b'"metadata":{"a":' + _deep(63) + b"}"),
        headers=headers,
    )
    assert resp.status_code == 422, resp.get_data(as_text=True)
