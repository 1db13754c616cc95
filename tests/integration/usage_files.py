"""Deterministic usage for integration tests: valid samples, duplicates and malformed lines."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from gpumeter.core.settings import DEFAULTS_DIR

TENANTS = ("team-a", "team-b", "research", "sandbox")
GPU_CHOICES = (
    ("H100-SXM-80GB", None), ("A100-SXM-40GB", "1g.5gb"), ("A100-SXM-40GB", None), ("L40S-48GB", None),
)
CAPACITY = ("on-demand", "reserved", "spot")
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


def load_cards_as_documents() -> list[dict[str, Any]]:
    """The default rate cards as plain YAML documents, for the independent reference."""
    return [yaml.safe_load(path.read_text()) for path in sorted((DEFAULTS_DIR / "ratecards").glob("*.yaml"))]


def load_tenants_as_documents() -> list[dict[str, Any]]:
    return list(yaml.safe_load((DEFAULTS_DIR / "tenants.yaml").read_text())["tenants"])


def make_samples(seed: int, count: int) -> list[dict[str, Any]]:
    """Samples over late October and November 2026, some with non-UTC offsets near the month edge."""
    rng = random.Random(seed)
    base = datetime(2026, 10, 28, tzinfo=UTC)
    samples = []
    for index in range(count):
        tenant = rng.choice(TENANTS)
        kind = rng.choices(("gpu", "cpu", "memory", "storage"), weights=(5, 2, 2, 1))[0]
        start = base + timedelta(minutes=15 * rng.randrange(0, 4 * 24 * 30))
        length = rng.choice((60, 600, 900, 3600))
        offset = rng.choice((UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5))))
        sample: dict[str, Any] = {
            "event_id": f"it-{seed}-{index}",
            "kind": kind,
            "cluster": "it",
            "node": f"node-{rng.randrange(8)}",
            "tenant": tenant,
            "namespace": tenant,
            "pod": f"pod-{rng.randrange(50)}",
            "pod_uid": f"uid-{rng.randrange(50)}",
            "window_start": start.astimezone(offset).isoformat(),
            "window_end": (start + timedelta(seconds=length)).astimezone(offset).isoformat(),
            "capacity_type": rng.choice(CAPACITY),
            "priority": rng.choice((0, 100, 1000)),
        }
        if kind == "gpu":
            model, mig = rng.choice(GPU_CHOICES)
            sample["gpu_model"] = model
            sample["mig_profile"] = mig
            sample["quantity"] = "1" if mig else str(rng.choice((1, 2, 4, 8)))
        else:
            sample["quantity"] = f"{rng.randrange(1, 512)}.{rng.randrange(0, 1000):03d}"
        samples.append(sample)
    return samples


def big_h100_user(seed: int, windows: int) -> list[dict[str, Any]]:
    """team-a holding 8 H100s for ``windows`` hours in November: crosses the 1000 h tier edge."""
    start = datetime(2026, 11, 5, tzinfo=UTC)
    return [
        {
            "event_id": f"h100-{seed}-{i}", "kind": "gpu", "cluster": "it", "node": "node-h100",
            "tenant": "team-a", "namespace": "team-a", "pod": "trainer", "pod_uid": "uid-trainer",
            "window_start": (start + timedelta(hours=i)).isoformat(),
            "window_end": (start + timedelta(hours=i + 1)).isoformat(),
            "quantity": "8", "gpu_model": "H100-SXM-80GB", "capacity_type": "on-demand",
        }
        for i in range(windows)
    ]


def write_usage_file(path: Path, valid: list[dict[str, Any]], duplicates: int, seed: int) -> int:
    """Valid samples, ``duplicates`` repeated lines and every MALFORMED line, shuffled. Returns line count."""
    rng = random.Random(seed)
    lines = [json.dumps(sample) for sample in valid]
    lines += [json.dumps(rng.choice(valid)) for _ in range(duplicates)]
    lines += list(MALFORMED)
    rng.shuffle(lines)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)
