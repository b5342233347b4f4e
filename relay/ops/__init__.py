"""Operator tools: ``cli`` (the ``relay`` command), ``embedded`` (PostgreSQL and Redis for
``relay up``), ``migrate`` (Alembic)."""
