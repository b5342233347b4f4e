"""Blocks: an agent refuses new handoffs from a sender (docs/api.md)."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert

from relay.errors import RelayError, invalid
from relay.extensions import db
from relay.models import Agent, Block
from relay.services import unit_of_work
from relay.services.agents import get_agent, normalize_handle


def _target(handle: str) -> Agent:
    target = get_agent(normalize_handle(handle, "blocked_handle"))
    if target is None:
        raise RelayError("identity_not_found", f"no agent {handle!r}")
    return target


def list_blocks(agent: Agent) -> list[tuple[Agent, Block]]:
    """Return the agents ``agent`` blocks, with when, newest first."""
    return list(
        db.session.execute(
            select(Agent, Block)
            .join(Block, Block.blocked_id == Agent.id)
            .where(Block.blocker_id == agent.id)
            .order_by(Block.created_at.desc())
        ).all()
    )


def block(agent: Agent, handle: str) -> Agent:
    """Block ``handle`` (idempotent). Existing threads carry on; new handoffs fail teammate_blocked."""
    with unit_of_work() as session:
        target = _target(handle)
        if target.id == agent.id:
            raise invalid("blocked_handle", "you cannot block yourself")
        session.execute(insert(Block).values(blocker_id=agent.id, blocked_id=target.id).on_conflict_do_nothing())
    return target


def unblock(agent: Agent, handle: str) -> bool:
    """Remove a block; return whether one existed."""
    with unit_of_work() as session:
        target = _target(handle)
        result = session.execute(delete(Block).where(Block.blocker_id == agent.id, Block.blocked_id == target.id))
    return bool(result.rowcount)
