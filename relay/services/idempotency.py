"""Client idempotency keys: the first answer to a keyed call is kept and replayed.

docs/api.md, "Conventions": scoped to the calling agent, kept 24 hours; the same key with
the same params returns the first result, with different params -32011; concurrent
requests with one key create exactly one thread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flask import current_app
from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert

from relay.errors import RelayError
from relay.models import Agent, IdempotencyRecord
from relay.services import unit_of_work


def request_hash(operation: str, params: dict[str, Any]) -> str:
    """Return a stable digest of an operation and its loaded params."""
    canonical = json.dumps([operation, params], sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _stored(session, agent: Agent, key: str, digest: str) -> dict | None:
    record = session.scalar(
        select(IdempotencyRecord).where(
            IdempotencyRecord.agent_id == agent.id,
            IdempotencyRecord.key == key,
            IdempotencyRecord.expires_at > func.now(),
        )
    )
    if record is None:
        return None
    if record.request_hash != digest:
        raise RelayError(
            "duplicate_idempotency_key",
            "client_idempotency_key was already used with different params",
            {"client_idempotency_key": key},
        )
    return record.response


# The two-int4 form of the advisory lock: a key space apart from the bigint locks of the
# feeds, contexts and webhook claims. "idmp"
_LOCK_CLASS = 0x69646D70


def lock_key(agent_id, key: str) -> int:
    """The second int4 of the advisory lock serialising one agent's calls with ``key``."""
    digest = hashlib.sha256(agent_id.bytes + key.encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def run_once(
    agent: Agent, key: str | None, operation: str, params: dict[str, Any], work: Callable[[Any], dict]
) -> dict:
    """Run ``work(session)`` in one transaction unless ``key`` already answered; return the answer.

    A replay is answered from the stored record before any other check (docs/decisions.md).
    Otherwise the call takes a transaction-scoped advisory lock on (agent, key), reads the
    record again, and claims it in the same transaction as the work: a concurrent call with
    the same key waits on the lock until the first commits and then replays its answer; if
    the first rolls back, the next one does the work. The lock stands in for a unique
    constraint, which the partitioned table cannot have on (agent, key) alone (migration
    0009); it ends with the transaction, so it holds behind a transaction-mode pooler.
    Raises RelayError(duplicate_idempotency_key) on a params mismatch.
    """
    if key is None:
        with unit_of_work() as session:
            return work(session)
    digest = request_hash(operation, params)
    with unit_of_work() as session:
        replay = _stored(session, agent, key, digest)
        if replay is not None:
            return replay
    ttl = timedelta(seconds=current_app.config["RELAY"].idempotency_ttl_seconds)
    with unit_of_work() as session:
        session.execute(select(func.pg_advisory_xact_lock(_LOCK_CLASS, lock_key(agent.id, key))))
        replay = _stored(session, agent, key, digest)
        if replay is not None:
            return replay
        # An expired record of this key is no answer any more: one record a key, so a
        # replay never has two to choose from (retention drops the rest with its partition).
        session.execute(
            delete(IdempotencyRecord).where(
                IdempotencyRecord.agent_id == agent.id,
                IdempotencyRecord.key == key,
                IdempotencyRecord.expires_at <= func.now(),
            )
        )
        claimed = session.execute(
            insert(IdempotencyRecord)
            .values(agent_id=agent.id, key=key, request_hash=digest, response={}, expires_at=func.now() + ttl)
            .returning(IdempotencyRecord.id)
        ).scalar_one()
        response = work(session)
        session.execute(
            IdempotencyRecord.__table__.update().where(IdempotencyRecord.id == claimed).values(response=response)
        )
    return response
