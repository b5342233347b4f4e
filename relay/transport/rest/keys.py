"""``/api/v1/identities/{handle}/keys``: the identity's own API keys."""

from __future__ import annotations

from relay.schemas.agents import KeyOut
from relay.schemas.common import iso
from relay.schemas.rest import KeyCreateBody
from relay.services import agents
from relay.transport.rest import bp, identity, load_json

_key_out = KeyOut()


@bp.get("/identities/<handle>/keys")
def list_keys(handle: str):
    """List this identity's keys (never their secrets)."""
    return {"items": _key_out.dump(agents.list_keys(identity(handle)), many=True)}


@bp.post("/identities/<handle>/keys")
def create_key(handle: str):
    """Issue a new key; its secret is in this response only."""
    agent = identity(handle)
    body = load_json(KeyCreateBody())
    issued = agents.create_key(agent.handle, body["label"])
    return {
        "key_id": str(issued.key_id),
        "api_key": issued.api_key,
        "label": body["label"],
        "created_at": iso(issued.created_at),
    }, 201


@bp.delete("/identities/<handle>/keys/<key_id>")
def revoke_key(handle: str, key_id: str):
    """Revoke one of this identity's keys (the key in use too: it stops on the next request)."""
    key = agents.revoke_key(key_id, owner=identity(handle))
    return _key_out.dump(key)
