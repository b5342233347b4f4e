"""Bounds named in the error: every size is bounded, and an error over a bound names the bound.

One past each bound of ``message/send`` is refused with -32602 whose message names the
field and the bound's number, and nothing is stored; the bound itself is accepted.
"""

from __future__ import annotations

import json
import re

import pytest

from relay.schemas.handoffs import MessageSendParams
from tests.conftest import bearer, sql

TEXT = 262_144
PARTS = 20
ARTIFACTS = 50
DIFF = 512 * 1024
METADATA = 16 * 1024


def _part(text="x"):
    return {"type": "text", "text": text}


def _ref(n):
    return {"type": "file_ref", "path": f"src/file_{n}.py"}


def _diff(size):
    return {"type": "file_diff", "path": "src/big.py", "diff": "d" * size}


def _metadata(size):
    """A metadata object whose JSON (json.dumps, as the relay measures it) is ``size`` bytes."""
    value = {"k": ""}
    value["k"] = "m" * (size - len(json.dumps(value)))
    assert len(json.dumps(value)) == size
    return value


# (case, params beyond the bound, the field path named, the bound's number in the message)
OVER = [
    ("text", {"message": {"parts": [_part("t" * (TEXT + 1))]}}, "message.parts.0.text", "262144"),
    ("parts", {"message": {"parts": [_part()] * (PARTS + 1)}}, "message.parts", "20"),
    ("artifacts", {"artifacts": [_ref(n) for n in range(ARTIFACTS + 1)]}, "artifacts", "50"),
    ("diff", {"artifacts": [_diff(DIFF + 1)]}, "artifacts.0.diff", "524288"),
    ("metadata", {"metadata": _metadata(METADATA + 1)}, "metadata", "16384"),
]
AT_BOUND = [
    {"message": {"parts": [_part("t" * TEXT)]}},
    {"message": {"parts": [_part()] * PARTS}},
    {"artifacts": [_ref(n) for n in range(ARTIFACTS)]},
    {"artifacts": [_diff(DIFF)]},
    {"metadata": _metadata(METADATA)},
]


def _params(extra, recipient):
    return {"recipient": recipient, "message": {"parts": [_part("please review")]}, **extra}


@pytest.mark.parametrize(("extra", "field", "bound"), [o[1:] for o in OVER], ids=[o[0] for o in OVER])
def test_bounds_named_in_the_error(app, client, alice, bob, extra, field, bound):
    _a, a_key = alice
    b_handle, _b = bob
    resp = client.post(
        "/a2a",
        json={"jsonrpc": "2.0", "id": 7, "method": "message/send", "params": _params(extra, b_handle)},
        headers=bearer(a_key),
    )
    assert resp.status_code == 200, resp.get_data(as_text=True)[:2000]
    body = resp.get_json()
    assert "error" in body, str(body)[:2000]
    error = body["error"]
    assert (body["id"], error["code"], error["data"]["symbol"]) == (7, -32602, "invalid_params"), error
    named = re.compile(rf"(?<![\d.]){bound}(?!\d)")  # the number itself, not a part of another
    assert field in error["message"] and named.search(error["message"]), error["message"]
    assert list(error["data"]["errors"]) == [field], error["data"]
    assert any(named.search(reason) for reason in error["data"]["errors"][field]), error["data"]
    assert sql(app, "SELECT count(*) FROM messages")[0][0] == 0


def test_bounds_themselves_are_accepted(alice):
    for extra in AT_BOUND:
        MessageSendParams().load(_params(extra, "bob@acme"))  # raises if refused
