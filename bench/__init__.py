"""Benchmarks: ``python -m bench run [--quick]`` and ``python -m bench scale``."""
