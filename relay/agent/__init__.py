"""The agents' kit: ``client`` (typed Python client), ``cli`` (relay-agent), ``mcp`` (relay-mcp).

It speaks only the relay's public HTTP API and imports nothing else of ``relay``
(an import-linter contract), so it can be copied into an agent's own code base.
"""
