"""The one set of builders for contract documents in tests and benchmarks: usage samples
(contract 1), rate cards (contract 2) and tenants (contract 4).

Samples are plain dicts (what a line of `gpumeter ingest` holds), so a test can break any
field on purpose; ``usage_sample`` validates one into the model. Expected values never come
from here: they come from tests/unit/reference_billing.py or from hand arithmetic.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final

from gpumeter.core.config_files import read_yaml
from gpumeter.core.models import UsageSample
from gpumeter.core.ratecard import RateCard, RateCardSet
from gpumeter.core.settings import DEFAULTS_DIR
from gpumeter.core.tenants import TenantsFile

H100: Final = "H100-SXM-80GB"
A100: Final = "A100-SXM-40GB"
L4: Final = "L4-24GB"


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


OMIT: Final = _Omit()
"""A field given as OMIT is left out of the document (to test defaults or missing fields)."""


# --- usage samples (contract 1) ------------------------------------------------------------------


def sample(
    event_id: str = "ev-1",
    *,
    kind: str = "gpu",
    cluster: str = "c1",
    node: str = "node-1",
    tenant: str = "team-a",
    namespace: str = "ns",
    pod: str = "pod-1",
    pod_uid: str = "uid-1",
    start: str | datetime = "2026-11-10T00:00:00Z",
    seconds: int | str = 3600,
    end: str | datetime | None = None,
    quantity: Any = "1",
    capacity_type: str | _Omit = "on-demand",
    gpu_model: str | _Omit | None = H100,
    mig_profile: str | _Omit | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A valid contract-1 sample dict (gpu_model and mig_profile only for kind gpu).

    window_end is ``end`` verbatim when given, else window_start + ``seconds`` in
    window_start's offset. ``fields`` are set last, as given (any value, valid or not);
    a field given as OMIT is left out.
    """
    start_text = start.isoformat() if isinstance(start, datetime) else start
    if end is None:
        begin = datetime.fromisoformat(start_text)
        end = begin + timedelta(microseconds=int(Decimal(str(seconds)) * 1_000_000))
    document: dict[str, Any] = {
        "event_id": event_id,
        "kind": kind,
        "cluster": cluster,
        "node": node,
        "tenant": tenant,
        "namespace": namespace,
        "pod": pod,
        "pod_uid": pod_uid,
        "window_start": start_text,
        "window_end": end.isoformat() if isinstance(end, datetime) else end,
        "quantity": quantity,
        "capacity_type": capacity_type,
    }
    if kind == "gpu":
        document["gpu_model"] = gpu_model
        document["mig_profile"] = mig_profile
    document.update(fields)
    return {key: value for key, value in document.items() if value is not OMIT}


def usage_sample(event_id: str = "ev-1", **fields: Any) -> UsageSample:
    """``sample(...)`` validated into the model (fields left out stay unset, as in a parsed line)."""
    return UsageSample.model_validate(sample(event_id, **fields))


_RANDOM_TENANTS = ("team-a", "team-b", "research", "sandbox")
_RANDOM_GPUS = (
    (H100, None), (A100, "1g.5gb"), (A100, None), ("L40S-48GB", None),
)
_CAPACITY_TYPES = ("on-demand", "reserved", "spot")


def random_samples(seed: int, count: int) -> list[dict[str, Any]]:
    """Samples over late October and November 2026, some with non-UTC offsets near the month edge.

    Deterministic per seed; event ids are ``it-<seed>-<n>``.
    """
    rng = random.Random(seed)
    base = datetime(2026, 10, 28, tzinfo=UTC)
    samples = []
    for index in range(count):
        # The draws keep one order, so a seed always gives the same samples.
        tenant = rng.choice(_RANDOM_TENANTS)
        kind = rng.choices(("gpu", "cpu", "memory", "storage"), weights=(5, 2, 2, 1))[0]
        begin = base + timedelta(minutes=15 * rng.randrange(0, 4 * 24 * 30))
        length = rng.choice((60, 600, 900, 3600))
        offset = rng.choice((UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-5))))
        node = f"node-{rng.randrange(8)}"
        pod = f"pod-{rng.randrange(50)}"
        pod_uid = f"uid-{rng.randrange(50)}"
        capacity_type = rng.choice(_CAPACITY_TYPES)
        priority = rng.choice((0, 100, 1000))
        model: str | None = None
        mig: str | None = None
        if kind == "gpu":
            model, mig = rng.choice(_RANDOM_GPUS)
            quantity = "1" if mig else str(rng.choice((1, 2, 4, 8)))
        else:
            quantity = f"{rng.randrange(1, 512)}.{rng.randrange(0, 1000):03d}"
        samples.append(sample(
            f"it-{seed}-{index}", kind=kind, cluster="it", node=node, tenant=tenant, namespace=tenant,
            pod=pod, pod_uid=pod_uid, start=begin.astimezone(offset),
            end=(begin + timedelta(seconds=length)).astimezone(offset), quantity=quantity,
            capacity_type=capacity_type, gpu_model=model, mig_profile=mig, priority=priority,
        ))
    return samples


def big_h100_user(seed: int, windows: int) -> list[dict[str, Any]]:
    """team-a holding 8 H100s for ``windows`` hours from 2026-11-05: crosses the 1000 h tier edge."""
    start = datetime(2026, 11, 5, tzinfo=UTC)
    return [
        sample(
            f"h100-{seed}-{i}", cluster="it", node="node-h100", namespace="team-a", pod="trainer",
            pod_uid="uid-trainer", start=start + timedelta(hours=i), end=start + timedelta(hours=i + 1),
            quantity="8", mig_profile=OMIT,
        )
        for i in range(windows)
    ]


# --- rate cards (contract 2) ---------------------------------------------------------------------

# The shipped default cards written out, so tests do not depend on the defaults staying as they are.
CARD_OCT: Final[dict[str, Any]] = {
    "version": "2026-10",
    "currency": "USD",
    "effective_from": "2026-10-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.4"},
    "rates": [
        {
            "kind": "gpu",
            "gpu_model": H100,
            "unit_price": "2.75",
            "tiers": [{"up_to": 1000, "unit_price": "2.75"}, {"up_to": None, "unit_price": "2.40"}],
        },
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.45"},
        {"kind": "gpu", "unit_price": "1.90"},
        {"kind": "cpu", "unit_price": "0.045"},
        {"kind": "memory", "unit_price": "0.005"},
        {"kind": "storage", "unit_price": "0.0002"},
    ],
}

CARD_NOV: Final[dict[str, Any]] = {
    "version": "2026-11",
    "currency": "USD",
    "effective_from": "2026-11-01T00:00:00Z",
    "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.35"},
    "rates": [
        {
            "kind": "gpu",
            "gpu_model": H100,
            "unit_price": "2.50",
            "tiers": [
                {"up_to": 1000, "unit_price": "2.50"},
                {"up_to": 10000, "unit_price": "2.25"},
                {"up_to": None, "unit_price": "2.00"},
            ],
        },
        {"kind": "gpu", "gpu_model": A100, "mig_profile": "1g.5gb", "unit_price": "0.40"},
        {"kind": "gpu", "unit_price": "1.80"},
        {"kind": "cpu", "unit_price": "0.04"},
        {"kind": "memory", "unit_price": "0.005"},
        {"kind": "storage", "unit_price": "0.0002"},
    ],
}

CARDS: Final[list[dict[str, Any]]] = [CARD_OCT, CARD_NOV]


def rate_card(**changes: Any) -> dict[str, Any]:
    """A small valid card (version v1 from 2026-11-01: a GPU fallback and cpu), ``changes`` set last."""
    card: dict[str, Any] = {
        "version": "v1",
        "currency": "USD",
        "effective_from": "2026-11-01T00:00:00Z",
        "capacity_multipliers": {"on-demand": "1", "reserved": "0.6", "spot": "0.35"},
        "rates": [{"kind": "gpu", "unit_price": "1.80"}, {"kind": "cpu", "unit_price": "0.04"}],
    }
    card.update(changes)
    return card


def card_set(cards: Sequence[Mapping[str, Any]] = CARDS) -> RateCardSet:
    return RateCardSet(cards=[RateCard.model_validate(card) for card in cards])


def shipped_rate_card_documents() -> list[dict[str, Any]]:
    """The shipped default cards as plain documents (read without floats), for the reference."""
    return [read_yaml(path) for path in sorted((DEFAULTS_DIR / "ratecards").glob("*.yaml"))]


# --- tenants (contract 4) ------------------------------------------------------------------------

TENANTS: Final[list[dict[str, Any]]] = [
    {"tenant": "team-a", "commitment": "1000.00", "credits": "250.00"},
    {"tenant": "research", "commitment": "15000.00"},
    {"tenant": "inference", "credits": "100.00"},
    {"tenant": "rich", "credits": "100000.00"},
]


def tenants_file(tenants: Sequence[Mapping[str, Any]] = TENANTS) -> TenantsFile:
    return TenantsFile.model_validate({"tenants": list(tenants)})


def shipped_tenant_documents() -> list[dict[str, Any]]:
    """The shipped default tenants file's entries as plain documents."""
    return list(read_yaml(DEFAULTS_DIR / "tenants.yaml")["tenants"])
