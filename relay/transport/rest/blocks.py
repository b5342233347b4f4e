"""``/api/v1/identities/{handle}/blocks``: list, block, unblock."""

from __future__ import annotations

from relay.schemas.common import iso
from relay.services import blocks
from relay.transport.rest import bp, identity


@bp.get("/identities/<handle>/blocks")
def list_blocks(handle: str):
    """List the agents this identity blocks."""
    agent = identity(handle)
    return {
        "items": [
            {"handle": a.handle, "name": a.name, "role": a.role, "created_at": iso(b.created_at)}
            for a, b in blocks.list_blocks(agent)
        ]
    }


@bp.put("/identities/<handle>/blocks/<blocked_handle>")
def block(handle: str, blocked_handle: str):
    """Block a sender: its new handoffs fail with teammate_blocked."""
    target = blocks.block(identity(handle), blocked_handle)
    return {"handle": target.handle, "blocked": True}


@bp.delete("/identities/<handle>/blocks/<blocked_handle>")
def unblock(handle: str, blocked_handle: str):
    """Unblock a sender (no error if it was not blocked)."""
    blocks.unblock(identity(handle), blocked_handle)
    return "", 204
