"""The pipeline's migrations from a version on, as the tests that rewind a database expect them
applied: read from the declared list, so a new migration does not break every such test."""

from __future__ import annotations

from gpumeter.infra.schema import PIPELINE


def pipeline_since(first: int) -> list[str]:
    return [f"pipeline/{m.version}" for m in PIPELINE.migrations if m.version >= first]
