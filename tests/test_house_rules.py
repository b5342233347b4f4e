"""Rules the test suite keeps about itself, checked on its source.

The request helpers for ``POST /a2a`` live in tests/conftest.py only: a module that needs a
variant extends them with a parameter instead of keeping its own copy under their names.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests import conftest

TESTS = Path(__file__).resolve().parent
SHARED = ("rpc_doc", "message_params", "post_a2a", "rpc_answer", "rpc", "rpc_error", "send_message")
# The names a module's own copy would go by.
GENERIC = ("send", "post", "call")
RESERVED = frozenset(prefix + name for name in SHARED + GENERIC for prefix in ("", "_"))


def request_helpers_defined(source: str) -> list[str]:
    """List the top-level functions (and names bound at the top level) of ``source`` that take a
    reserved name: ``["name (line N)", ...]``."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
        else:
            continue
        found += [f"{name} (line {node.lineno})" for name in names if name in RESERVED]
    return found


def test_the_shared_request_helpers_are_in_conftest():
    assert [name for name in SHARED if not callable(getattr(conftest, name, None))] == []


def test_no_test_module_defines_its_own_request_helper():
    found = {
        path.name: names
        for path in sorted(TESTS.glob("test_*.py"))
        if (names := request_helpers_defined(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"use (or extend) the request helpers of tests/conftest.py instead: {found}"


def test_the_rule_finds_a_copy_by_any_reserved_name():
    source = (
        "def _rpc(client):\n    pass\n\n\nasync def send():\n    pass\n\n\npost = print\ndef rpc_like():\n    pass\n"
    )
    assert request_helpers_defined(source) == ["_rpc (line 1)", "send (line 5)", "post (line 9)"]
