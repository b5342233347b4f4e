"""Operators: the humans who sign in to the console, one org each (docs/console.md).

Passwords are generated here, shown once by the CLI and stored only as argon2 hashes
(argon2-cffi's defaults, RFC 9106's low-memory profile); they are never logged. A wrong
email, a wrong password and a disabled operator all get the one answer ``WRONG_CREDENTIALS``,
and an unknown email still costs one hash verification, so neither the answer nor its time
tells whether an email is an operator's.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from sqlalchemy import select, tuple_, update

from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.ids import encode_cursor, iso
from relay.models import Operator, OperatorAudit
from relay.services import unit_of_work
from relay.services.agents import handle_problem

WRONG_CREDENTIALS = "wrong email or password"
MAX_EMAIL = 320
MAX_PASSWORD = 1024  # argon2 hashes any length; a megabyte "password" would only cost CPU
# local@domain with a dot-separated domain; enough to catch a typo, not RFC 5322.
_EMAIL_RE = re.compile(r"[a-z0-9!#$%&'*+/=?^_`{|}~.-]+@[a-z0-9-]+(\.[a-z0-9-]+)*")
PASSWORD_BYTES = 18  # 144 random bits, 24 URL-safe characters
ROLES = ("admin", "viewer")  # an admin acts, a viewer only looks (docs/decisions.md, "Console roles")

T = TypeVar("T")
_hasher = PasswordHasher()
_dummy_hash: list[str] = []


def check_email(raw: object, field: str = "email") -> str:
    """Lower-case and check an operator's email; raise invalid_params naming ``field`` and why."""
    if not isinstance(raw, str) or not raw.strip():
        raise invalid(field, "must be an email address such as you@example.com")
    email = raw.strip().lower()
    if len(email) > MAX_EMAIL:
        raise invalid(field, f"must be at most {MAX_EMAIL} characters")
    if not _EMAIL_RE.fullmatch(email):
        raise invalid(field, f"{raw!r} is not an email address such as you@example.com")
    return email


def check_org(raw: object) -> str:
    """Lower-case and check an org name with the org rule of agent handles (``agents.handle_problem``)."""
    if not isinstance(raw, str) or not raw.strip():
        raise invalid("org", "must be an org such as acme (the part after '@' of its agents' handles)")
    org = raw.strip().lower()
    problem = handle_problem(f"operator@{org}")
    if problem is not None:
        raise invalid("org", f"{raw!r}: {problem}")
    return org


def check_role(raw: object) -> str:
    """Lower-case and check a role (one of :data:`ROLES`); raise invalid_params naming ``role``."""
    role = raw.strip().lower() if isinstance(raw, str) else raw
    if role not in ROLES:
        raise invalid("role", f"must be admin or viewer, got {raw!r}")
    return role


def new_password() -> str:
    """A generated password: 24 URL-safe characters (144 random bits)."""
    return secrets.token_urlsafe(PASSWORD_BYTES)


def get_operator(email: str) -> Operator | None:
    """The operator with this (lower-cased) email, or None."""
    return db.session.scalar(select(Operator).where(Operator.email == email))


def require_operator(email: object) -> Operator:
    """The operator named by ``email``; raise invalid_params (malformed) or not_found."""
    normal = check_email(email)
    operator = get_operator(normal)
    if operator is None:
        raise RelayError("not_found", f"no operator {normal}")
    return operator


def create_operator(email: object, org: object, role: object = "admin") -> tuple[Operator, str]:
    """Create an operator of ``org`` with ``role``; return it and its generated password (shown once).

    Raises invalid_params naming ``email`` (malformed, or an operator already has it),
    ``org`` (breaks the org rule of handles) or ``role`` (not admin or viewer).
    """
    normal, org_name, role_name = check_email(email), check_org(org), check_role(role)
    password = new_password()
    hashed = _hasher.hash(password)
    with unit_of_work() as session:
        if get_operator(normal) is not None:
            raise invalid("email", f"an operator {normal} already exists (relay operators reset-password {normal})")
        operator = Operator(email=normal, org=org_name, password_hash=hashed, role=role_name)
        session.add(operator)
        session.flush()
    return operator, password


def list_operators() -> list[Operator]:
    """Every operator, by email."""
    return list(db.session.scalars(select(Operator).order_by(Operator.email)))


def disable_operator(email: object) -> Operator:
    """Disable an operator: it can no longer sign in, and its open sessions end on their next request.

    Raises invalid_params (malformed email) or not_found.
    """
    with unit_of_work():
        operator = require_operator(email)
        if operator.disabled_at is None:
            operator.disabled_at = datetime.now(UTC)
            operator.session_version += 1
    return operator


def set_role(email: object, role: object) -> tuple[Operator, str]:
    """Give an operator ``role``; return it and its role before.

    Its open sessions keep going with the new role from their next request (the role is
    read with the session's operator on every request). Raises invalid_params (malformed
    email, unknown role) or not_found.
    """
    role_name = check_role(role)
    with unit_of_work():
        operator = require_operator(email)
        before, operator.role = operator.role, role_name
        # In the org's audit log, in the change's transaction; made by the CLI, not a signed-in operator.
        record(
            "role.set",
            "ok",
            email="relay operators set-role",
            org=operator.org,
            target=f"{operator.email}: {before} -> {role_name}",
            client_addr="cli",
        )
    return operator, before


def reset_password(email: object) -> tuple[Operator, str]:
    """Give an operator a new generated password (returned once) and end its open sessions.

    A disabled operator stays disabled. Raises invalid_params (malformed email) or not_found.
    """
    password = new_password()
    hashed = _hasher.hash(password)
    with unit_of_work():
        operator = require_operator(email)
        operator.password_hash = hashed
        operator.password_changed_at = datetime.now(UTC)
        operator.session_version += 1
    return operator, password


def _verify(hashed: str, password: str) -> bool:
    try:
        return _hasher.verify(hashed, password)
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def authenticate(email: object, password: object, client_addr: str = "") -> Operator:
    """The operator whose email and password these are; raise unauthenticated (WRONG_CREDENTIALS) otherwise.

    Unknown email, wrong password, disabled operator, malformed input: the same error,
    after one hash verification each. A hash made with older parameters is replaced.
    Either way one audit row is written (``sign_in``, or ``sign_in_failed`` in the org of
    the operator the email names, if any).
    """
    normal = email.strip().lower() if isinstance(email, str) else ""
    given = password if isinstance(password, str) and len(password) <= MAX_PASSWORD else None
    # A NUL is no operator's email, and PostgreSQL refuses it in a query.
    operator = get_operator(normal) if normal and len(normal) <= MAX_EMAIL and "\x00" not in normal else None
    if operator is None or operator.disabled_at is not None or given is None:
        if not _dummy_hash:
            _dummy_hash.append(_hasher.hash(secrets.token_urlsafe(16)))
        _verify(_dummy_hash[0], given or "")
        _refused(email, operator, client_addr)
    if not _verify(operator.password_hash, given):
        _refused(email, operator, client_addr)
    with unit_of_work():
        record("sign_in", "ok", operator=operator, client_addr=client_addr)
        operator.last_sign_in_at = datetime.now(UTC)
        if _hasher.check_needs_rehash(operator.password_hash):
            operator.password_hash = _hasher.hash(given)
    return operator


def _refused(email: object, operator: Operator | None, client_addr: str):
    with unit_of_work():
        record(
            "sign_in_failed",
            "disabled" if operator is not None and operator.disabled_at is not None else "unauthenticated",
            email=operator.email if operator is not None else email,
            org=operator.org if operator is not None else None,
            client_addr=client_addr,
        )
    raise RelayError("unauthenticated", WRONG_CREDENTIALS)


def session_operator(operator_id: object, session_version: object) -> Operator | None:
    """The operator a console session names, if it is still enabled and the session still valid.

    None when the id is malformed or unknown, the operator is disabled, or its
    ``session_version`` moved on since the sign-in (a reset or a disable).
    """
    try:
        oid = uuid.UUID(str(operator_id))
    except ValueError:
        return None
    operator = db.session.get(Operator, oid)
    if operator is None or operator.disabled_at is not None or operator.session_version != session_version:
        return None
    return operator


def sign_out(operator: Operator, client_addr: str = "") -> None:
    """End every console session of ``operator`` (a signed cookie cannot be revoked alone); audited."""
    with unit_of_work() as session:
        record("sign_out", "ok", operator=operator, client_addr=client_addr)
        session.execute(
            update(Operator)
            .where(Operator.id == operator.id)
            .values(session_version=Operator.session_version + 1)
            .execution_options(synchronize_session=False)
        )


# --- the audit log of operator actions (docs/console.md) ------------------------------------

AUDIT_ACTIONS = (
    "sign_in",
    "sign_in_failed",
    "sign_out",
    "cancel",
    "block",
    "unblock",
    "key.create",
    "key.revoke",
    "webhook.enable",
    "webhook.disable",
    "webhook.test",
    "webhook.redrive",
    "webhook.recover",
    "webhook.bulk_redrive",
    "role.set",
)
MAX_TARGET = 500
AUDIT_PAGE = 50


def _printable(raw: object, limit: int) -> str:
    """``raw`` as text of at most ``limit`` characters, control characters replaced (it is shown)."""
    text_ = raw if isinstance(raw, str) else ("" if raw is None else str(raw))
    return "".join(c if c.isprintable() else "\ufffd" for c in text_[:limit])  # NUL too: PostgreSQL refuses it


def record(
    action: str,
    outcome: str,
    *,
    operator: Operator | None = None,
    email: object = None,
    org: str | None = None,
    target: object = "",
    client_addr: object = "",
) -> None:
    """Add one audit row to the current transaction (flushed, so it commits with it).

    ``action`` is one of :data:`AUDIT_ACTIONS`; ``outcome`` ``ok`` or the refusal's
    symbol. Without ``operator`` (a failed sign-in) ``email`` is what was typed, cut to
    320 characters. Raises ValueError for an unknown action (a programming error).
    """
    if action not in AUDIT_ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    row = OperatorAudit(
        operator_id=operator.id if operator is not None else None,
        operator_email=operator.email if operator is not None else _printable(email, MAX_EMAIL),
        org=operator.org if operator is not None else org,
        action=action,
        target=_printable(target, MAX_TARGET),
        outcome=_printable(outcome, 64),
        client_addr=_printable(client_addr, 64),
    )
    db.session.add(row)
    db.session.flush()


def record_alone(action: str, outcome: str, **row) -> None:
    """:func:`record` in a transaction of its own (a refusal: nothing else is written)."""
    with unit_of_work():
        record(action, outcome, **row)


def audited(run: Callable[[], T], action: str, **row) -> T:
    """Run ``run`` (a use case) with its audit row in its transaction; return what it returns.

    The row (``outcome`` ok; ``row`` as for :func:`record`) is flushed first, so the use
    case's unit of work commits it with what it writes, and a use case that writes nothing
    commits it alone. If ``run`` raises RelayError its rollback takes the row too: the
    refusal (``outcome`` its symbol) is recorded alone and the error re-raised.
    """
    record(action, "ok", **row)
    try:
        result = run()
        with unit_of_work():
            pass
    except RelayError as exc:
        db.session.rollback()
        record_alone(action, exc.symbol, **row)
        raise
    return result


def audit_page(
    org: str,
    *,
    email: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: tuple[datetime, int] | None = None,
    limit: int = AUDIT_PAGE,
) -> dict:
    """One page of ``org``'s audit rows, newest first: ``{"items": [row dicts], "next_cursor"}``.

    Filters: the operator's ``email``, the ``action``, ``since`` (inclusive) and ``until``
    (exclusive), UTC. Keyset paging on ``(created_at, id)``; ``next_cursor`` is None on
    the last page. A row dict has ``at`` (ISO 8601, UTC), ``operator``, ``org``, ``action``,
    ``target``, ``outcome``, ``client_addr``.
    """
    stmt = select(OperatorAudit).where(OperatorAudit.org == org)
    if email:
        stmt = stmt.where(OperatorAudit.operator_email == email.strip().lower())
    if action:
        stmt = stmt.where(OperatorAudit.action == action)
    if since is not None:
        stmt = stmt.where(OperatorAudit.created_at >= since)
    if until is not None:
        stmt = stmt.where(OperatorAudit.created_at < until)
    if cursor is not None:
        stmt = stmt.where(tuple_(OperatorAudit.created_at, OperatorAudit.id) < tuple_(*cursor))
    rows = list(
        db.session.scalars(stmt.order_by(OperatorAudit.created_at.desc(), OperatorAudit.id.desc()).limit(limit + 1))
    )
    more, rows = len(rows) > limit, rows[:limit]
    return {
        "items": [audit_view(r) for r in rows],
        "next_cursor": encode_cursor(rows[-1].created_at, rows[-1].id) if more else None,
    }


def audit_view(row: OperatorAudit) -> dict:
    """An audit row's public record (see :func:`audit_page`)."""
    return {
        "at": iso(row.created_at),
        "operator": row.operator_email,
        "org": row.org,
        "action": row.action,
        "target": row.target,
        "outcome": row.outcome,
        "client_addr": row.client_addr,
    }
