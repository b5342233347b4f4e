"""API keys: format, uniqueness, and digest-only storage (docs/operations.md, the administration CLI)."""

from __future__ import annotations

import hashlib
import re

from sqlalchemy import text

from relay.extensions import db
from relay.services.agents import generate_api_key

KEY_FORMAT = re.compile(r"^ah_live_[a-z2-7]{32}$")


def test_generated_key_matches_format():
    for _ in range(50):
        key = generate_api_key()
        assert KEY_FORMAT.fullmatch(key), key


def test_thousand_generated_keys_are_distinct():
    keys = [generate_api_key() for _ in range(1000)]
    assert len(set(keys)) == 1000


def test_issued_key_matches_format(make_agent):
    _handle, key = make_agent("frank@acme")
    assert KEY_FORMAT.fullmatch(key), key


def _api_key_rows(app):
    with app.app_context():
        result = db.session.execute(text("SELECT * FROM api_keys"))
        columns = list(result.keys())
        rows = [dict(zip(columns, r)) for r in result.fetchall()]
        db.session.rollback()
    return rows


def _as_text(value) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("latin-1")
    return str(value)


def test_plaintext_key_never_stored_in_any_column(app, make_agent):
    _handle, key = make_agent("frank@acme")
    rows = _api_key_rows(app)
    assert len(rows) == 1
    secret_part = key[len("ah_live_") :]
    for column, value in rows[0].items():
        if value is None:
            continue
        rendered = _as_text(value)
        assert key not in rendered, column
        assert secret_part not in rendered, column


def test_stored_digest_is_sha256_of_key(app, make_agent):
    _handle, key = make_agent("frank@acme")
    rows = _api_key_rows(app)
    assert len(rows) == 1
    assert bytes(rows[0]["digest"]) == hashlib.sha256(key.encode("utf-8")).digest()
