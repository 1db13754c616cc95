"""Usage files for `gpumeter ingest` in integration tests: valid samples (from testkit.builders),
repeated lines and malformed lines, shuffled."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

MALFORMED = (
    "this is not json",
    "[1, 2, 3]",
    '{"event_id": "bad-kind", "kind": "tpu"}',
    '{"event_id":"bad-neg","kind":"cpu","cluster":"c","node":"n","tenant":"team-a","namespace":"n",'
    '"pod":"p","pod_uid":"u","window_start":"2026-11-03T00:00:00Z","window_end":"2026-11-03T01:00:00Z",'
    '"quantity":"-1"}',
    '{"event_id":"bad-model","kind":"gpu","cluster":"c","node":"n","tenant":"team-a","namespace":"n",'
    '"pod":"p","pod_uid":"u","window_start":"2026-11-03T00:00:00Z","window_end":"2026-11-03T01:00:00Z",'
    '"quantity":"1"}',
    '{"event_id":"bad-time","kind":"cpu","cluster":"c","node":"n","tenant":"team-a","namespace":"n",'
    '"pod":"p","pod_uid":"u","window_start":"2026-11-03T02:00:00Z","window_end":"2026-11-03T01:00:00Z",'
    '"quantity":"1"}',
    '{"event_id":"bad-extra","kind":"cpu","cluster":"c","node":"n","tenant":"team-a","namespace":"n",'
    '"pod":"p","pod_uid":"u","window_start":"2026-11-03T00:00:00Z","window_end":"2026-11-03T01:00:00Z",'
    '"quantity":"1","colour":"blue"}',
)


def write_usage_file(path: Path, valid: list[dict[str, Any]], duplicates: int, seed: int) -> int:
    """Valid samples, ``duplicates`` repeated lines and every MALFORMED line, shuffled. Returns line count."""
    rng = random.Random(seed)
    lines = [json.dumps(sample) for sample in valid]
    lines += [json.dumps(rng.choice(valid)) for _ in range(duplicates)]
    lines += list(MALFORMED)
    rng.shuffle(lines)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)
