"""The handoff relay.

Layers, top to bottom (ARCHITECTURE.md): ``relay.transport`` -> ``relay.schemas`` ->
``relay.services`` -> ``relay.models``, over small base modules (config, errors, ids,
crypto, logs, extensions). ``relay.factory.create_app`` assembles the web app;
``relay.context.create_base_app`` the app every other process runs in. ``relay.agent``
is the agents' kit and imports nothing else of this package.
"""
