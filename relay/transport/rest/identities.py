"""``/api/v1/identities/...``: who the caller is."""

from __future__ import annotations

from relay.schemas.agents import AgentOut
from relay.transport.auth import current_agent
from relay.transport.rest import bp

_agent_out = AgentOut()


@bp.get("/identities/me")
def me():
    """Return the caller's ``{handle, name, role, org, created_at}``."""
    return _agent_out.dump(current_agent())
