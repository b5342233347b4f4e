"""``/mcp``'s routes: POST serves the agent kit's MCP tools (relay/transport/mcp_served.py).

The MCP face loads on a web process's first ``/mcp`` request, not with the app: the MCP
SDK's types and the kit's tool table take about 30 MiB a process, which a web process
that never serves MCP does not carry (docs/performance.md, "Memory"). The routes are
here so that the app's URL map is whole from the start.
"""

from __future__ import annotations

from flask import Blueprint

bp = Blueprint("mcp", __name__)


@bp.route("/mcp", methods=["GET", "DELETE"])
def not_served():
    """No server-initiated stream and no session: 405, POST only."""
    from relay.transport import mcp_served

    return mcp_served.not_served()


@bp.route("/mcp", methods=["POST"])
def post():
    """One JSON-RPC message in, one JSON answer out (or 202 for a notification)."""
    from relay.transport import mcp_served

    return mcp_served.post()
