"""The simulated fleet's configuration: nodes, GPU sharing, tenants' job mix, realism events.

Equal configurations give equal sample streams (collectors/sim/fleet.py). Every value is checked
at construction and a bad one is refused with all the reasons at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from collectors.sim.hardware import GPU_SPECS
from gpumeter.core.models import CAPACITY_TYPES, CapacityType
from gpumeter.core.validation import TENANT_PATTERN

DEFAULT_START = datetime(2026, 10, 30, tzinfo=UTC)
_TENANT_RE = re.compile(TENANT_PATTERN)


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """How one tenant submits work.

    ``size_weights`` weighs whole-GPU requests of 1, 2, 4 and 8 GPUs; ``mig_share`` is the
    probability that a job asks for one MIG device instead, ``shared_share`` for one time-sliced
    GPU replica; ``inference_share`` the probability that a job is a long-running inference server
    rather than training; ``priorities`` (priority -> weight) overrides the fleet's priority mix.
    """

    name: str
    arrivals_per_hour: float = 2.0
    size_weights: tuple[float, float, float, float] = (0.4, 0.3, 0.2, 0.1)
    mig_share: float = 0.1
    inference_share: float = 0.1
    priorities: Mapping[int, float] | None = None
    shared_share: float = 0.0


# team-a .. inference are in the default tenants file; sandbox deliberately is not
# (a tenant without quota or commitment that must still be billed).
DEFAULT_TENANTS: tuple[TenantSpec, ...] = (
    TenantSpec("team-a", 1.5, (0.35, 0.3, 0.2, 0.15), mig_share=0.05, inference_share=0.1),
    TenantSpec("team-b", 1.5, (0.5, 0.3, 0.15, 0.05), mig_share=0.1, inference_share=0.2, shared_share=0.1),
    TenantSpec("research", 0.6, (0.1, 0.2, 0.3, 0.4), mig_share=0.0, inference_share=0.0),
    TenantSpec(
        "inference",
        1.0,
        (0.7, 0.2, 0.1, 0.0),
        mig_share=0.15,
        inference_share=0.9,
        priorities={1000: 0.7, 100: 0.3},
        shared_share=0.3,
    ),
    TenantSpec("sandbox", 2.0, (0.8, 0.2, 0.0, 0.0), mig_share=0.5, inference_share=0.0, shared_share=0.2),
)


def _default_nodes() -> dict[str, int]:
    return {
        "H100-SXM-80GB": 3,
        "H200-SXM-141GB": 1,
        "B200-SXM-180GB": 1,
        "A100-SXM-40GB": 2,
        "L40S-48GB": 1,
        "L4-24GB": 2,
    }


def _default_mig() -> dict[str, int]:
    return {"A100-SXM-40GB": 2, "H100-SXM-80GB": 1}


def _default_time_sliced() -> dict[str, int]:
    return {"L4-24GB": 1}


def _default_capacity_mix() -> dict[CapacityType, float]:
    return {"on-demand": 0.5, "reserved": 0.25, "spot": 0.25}


def _default_priorities() -> dict[int, float]:
    return {0: 0.5, 100: 0.35, 1000: 0.15}


@dataclass(frozen=True)
class FleetConfig:
    """Everything that defines a simulated fleet; equal configs give equal sample streams.

    ``tenants`` takes :class:`TenantSpec` objects or bare names (default job mix).
    ``end`` (exclusive, on window starts) bounds :meth:`SimulatedFleet.windows`; ``None``
    runs forever. ``start`` defaults to 2026-10-30T00:00:00Z so a run of a few simulated
    days crosses the 2026-11-01 rate-card switch and the October/November month boundary.
    Rates of the realism events are per node and day; 0 turns an event off.
    """

    seed: int = 42
    cluster: str = "sim-cluster"
    nodes: Mapping[str, int] = field(default_factory=_default_nodes)
    gpus_per_node: int = 8
    gpus_per_node_by_model: Mapping[str, int] = field(default_factory=dict)
    mig_gpus_per_node: Mapping[str, int] = field(default_factory=_default_mig)
    time_sliced_nodes: Mapping[str, int] = field(default_factory=_default_time_sliced)
    time_slice_replicas: int = 4
    tenants: Sequence[TenantSpec | str] = DEFAULT_TENANTS
    window_seconds: int = 60
    start: datetime = DEFAULT_START
    end: datetime | None = None
    capacity_mix: Mapping[CapacityType, float] = field(default_factory=_default_capacity_mix)
    priorities: Mapping[int, float] = field(default_factory=_default_priorities)
    max_queue_per_tenant: int = 32
    reserve_after_seconds: int | None = 3600
    warm_start_jobs: int = 2
    diurnal: bool = True
    spot_reclaims_per_day: float = 0.5
    spot_downtime_minutes: tuple[float, float] = (20.0, 180.0)
    agent_outages_per_day: float = 0.2
    agent_outage_minutes: tuple[float, float] = (5.0, 60.0)
    max_backfill_windows: int = 8  # the agent's default (collectors/agent/windows.py)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("invalid simulated fleet config: " + "; ".join(problems))

    def _problems(self) -> Iterator[str]:
        if not self.cluster.strip():
            yield "cluster must not be blank"
        if not isinstance(self.window_seconds, int) or not 1 <= self.window_seconds <= 3600:
            yield "window_seconds must be an integer from 1 to 3600"
        if self.start.tzinfo is None or self.start.utcoffset() is None:
            yield "start must be timezone-aware"
        if self.end is not None and (self.end.tzinfo is None or self.end.utcoffset() is None):
            yield "end must be timezone-aware"
        if self.gpus_per_node < 1:
            yield "gpus_per_node must be >= 1"
        for model, count in self.nodes.items():
            if model not in GPU_SPECS:
                yield f"unknown GPU model {model!r} (known: {', '.join(GPU_SPECS)})"
            if count < 0:
                yield f"node count for {model} must be >= 0"
        if sum(self.nodes.values()) < 1:
            yield "the fleet needs at least one node"
        for model, count in self.gpus_per_node_by_model.items():
            if model not in GPU_SPECS:
                yield f"gpus_per_node_by_model: unknown GPU model {model!r}"
            elif count < 1:
                yield f"gpus_per_node_by_model[{model}] must be >= 1"
        for model, count in self.mig_gpus_per_node.items():
            spec = GPU_SPECS.get(model)
            if spec is None or not spec.mig_layout:
                yield f"{model!r} has no MIG profile in the simulator"
            elif not 0 <= count <= self.gpus_on(model):
                yield f"mig_gpus_per_node[{model}] must be between 0 and gpus_per_node"
        for model, count in self.time_sliced_nodes.items():
            if model not in GPU_SPECS:
                yield f"time_sliced_nodes: unknown GPU model {model!r}"
            elif count < 0 or count > self.nodes.get(model, count):  # a model the fleet lacks: no-op
                yield f"time_sliced_nodes[{model}] must be between 0 and the model's node count"
        if not isinstance(self.time_slice_replicas, int) or self.time_slice_replicas < 2:
            yield "time_slice_replicas must be an integer >= 2"
        yield from self._event_problems()
        yield from self._mix_problems()
        if self.max_queue_per_tenant < 0:
            yield "max_queue_per_tenant must be >= 0"
        if self.reserve_after_seconds is not None and self.reserve_after_seconds < 0:
            yield "reserve_after_seconds must be >= 0 or None"
        if self.warm_start_jobs < 0:
            yield "warm_start_jobs must be >= 0"

    def _event_problems(self) -> Iterator[str]:
        for name in ("spot_reclaims_per_day", "agent_outages_per_day"):
            if getattr(self, name) < 0:
                yield f"{name} must be >= 0"
        for name in ("spot_downtime_minutes", "agent_outage_minutes"):
            low, high = getattr(self, name)
            if not 0 < low <= high:
                yield f"{name} must be (low, high) with 0 < low <= high"
        if self.max_backfill_windows < 0:
            yield "max_backfill_windows must be >= 0"

    def _mix_problems(self) -> Iterator[str]:
        for kind, weight in self.capacity_mix.items():
            if kind not in CAPACITY_TYPES:
                yield f"unknown capacity type {kind!r}"
            if weight < 0:
                yield f"capacity_mix[{kind}] must be >= 0"
        if sum(self.capacity_mix.values()) <= 0:
            yield "capacity_mix needs a positive weight"
        if not self.priorities or sum(self.priorities.values()) <= 0:
            yield "priorities needs a positive weight"
        names: set[str] = set()
        for spec_or_name in self.tenants:
            name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
            if not _TENANT_RE.match(name):
                yield f"tenant name {name!r} does not match {TENANT_PATTERN}"
            if name in names:
                yield f"tenant {name!r} listed twice"
            names.add(name)
        if not names:
            yield "at least one tenant is needed"

    def gpus_on(self, model: str) -> int:
        """GPUs per node of ``model``: the override, else the server type's count, else ``gpus_per_node``."""
        if model in self.gpus_per_node_by_model:
            return self.gpus_per_node_by_model[model]
        spec = GPU_SPECS.get(model)
        return (spec.board_gpus if spec is not None else None) or self.gpus_per_node

    @property
    def tenant_specs(self) -> tuple[TenantSpec, ...]:
        return tuple(TenantSpec(t) if isinstance(t, str) else t for t in self.tenants)

    @property
    def window(self) -> timedelta:
        return timedelta(seconds=self.window_seconds)
