"""relay-mcp: the handoff relay as Model Context Protocol tools for a coding agent.

One tool table (``tools.TOOLS``: name, description, pydantic argument and answer models,
annotations, a function per tool) serves two servers: ``relay-mcp`` (``server.py``, a
process per agent over stdio or streamable HTTP) and the relay's own ``POST /mcp``
(``relay/transport/mcp.py``, authenticated by the agent's key). Each tool is a call of
:class:`relay.agent.client.RelayClient` on the relay's public HTTP API, made with the
agent's own key; this package imports nothing of the server (no services, models or Flask).

Results are JSON objects, as text and as ``structuredContent``, the whole response under
MAX_OUTPUT characters as sent. A relay error is a tool error (``isError: true``) whose
text is one line, ``symbol: message (hint: ...)``.
"""

from __future__ import annotations

from relay.agent.mcp.budget import MAX_OUTPUT
from relay.agent.mcp.core import Tool, UnknownTool, call_tool, tool_definitions
from relay.agent.mcp.server import INSTRUCTIONS, build_server, main, server_version
from relay.agent.mcp.tools import TOOL_NAMES, TOOLS

__all__ = [
    "INSTRUCTIONS",
    "MAX_OUTPUT",
    "TOOLS",
    "TOOL_NAMES",
    "Tool",
    "UnknownTool",
    "build_server",
    "call_tool",
    "main",
    "server_version",
    "tool_definitions",
]
