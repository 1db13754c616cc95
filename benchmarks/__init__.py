"""Benchmarks, each run from the repository root as ``python -m benchmarks.<name>`` (so this
checkout's packages and testkit/ are the ones imported)."""
