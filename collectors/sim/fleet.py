"""A seeded, deterministic simulated GPU cluster that emits contract-1 UsageSamples.

The simulated fleet stands in for NVML + kubelet on machines without GPUs (the demo,
tests, benchmarks). It is never presented as NVML: every sample carries the label
``gpumeter.io/source: simulated``.

Model
-----
* Nodes of each configured GPU model, ``gpus_per_node`` GPUs each (a model whose server type
  fixes the count, such as the 4-GPU L4 node, or an entry of ``gpus_per_node_by_model``,
  overrides it), each with its model's real GPU layout (collectors/sim/hardware.py). A node's
  capacity type (on-demand / reserved / spot) is fixed and spread over the fleet by smooth
  weighted round-robin of ``capacity_mix``, so every model gets a mix.
* On models with a MIG profile (A100-SXM-40GB: ``1g.5gb``; H100-SXM-80GB: ``1g.10gb``),
  the first ``mig_gpus_per_node[model]`` GPUs of every node are partitioned into 7
  slices each; the remaining GPUs are handed out whole.
* Tenants submit jobs as a Poisson process per window (``random.Random(seed)``), with a
  daily and weekly rhythm and growth (collectors/sim/rhythm.py). A job asks for 1, 2, 4
  or 8 whole GPUs of one model, or for one MIG slice. It is placed first-fit on the
  nodes of its model (by free count); there it
  gets the free GPUs the device plugin would pick, the best-connected set
  (collectors/sim/allocation.py; on an all-NVLink board, the lowest free indices). Jobs
  that do not fit wait in a FIFO queue that is re-scanned every window (backfill:
  a small job may start ahead of a large one that still does not fit). A whole-GPU job
  that has waited ``reserve_after_seconds`` stops backfill on its GPU model until it
  starts, so 8-GPU jobs do not starve. A tenant's queue is capped
  (``max_queue_per_tenant``); submissions beyond it are dropped and counted. Window 0
  also gets ``warm_start_jobs`` extra submissions per tenant so the fleet is busy at once.
* A job runs one pod for a whole number of windows (minutes to hours of simulated time),
  then releases its GPUs. The clock is simulated: pacing is the caller's job.

Samples
-------
Per running pod and window: one ``gpu`` sample plus ``cpu`` (cores), ``memory`` (GiB) and
``storage`` (GiB) samples. Telemetry (utilization 0-1 with two decimals, power in watts
with one decimal, energy = power x window seconds, GPU memory used) rides on the gpu
sample; the memory sample carries host memory used.

MIG quantities follow contract 1 ("GPUs, fractions for MIG"), exactly as the NVML agent
reports them: a ``1g.5gb`` slice of a 7-slice A100 is ``gpu_share(1, 7)`` =
0.142857142857 GPU (12 places, half-even), with ``mig_profile`` set. The rate card's
(A100-SXM-40GB, 1g.5gb) price is therefore per GPU-hour of MIG capacity. The gpu sample
labels ``gpumeter.io/gpus`` (GPU indices) and ``gpumeter.io/mig-slice`` say which device
it is.

Topology and allocation (contract 8)
------------------------------------
:meth:`SimulatedFleet.topology` gives every node's ``NodeTopology`` (built once: a node's
layout never changes); :meth:`SimulatedFleet.allocations` gives, for the window last
stepped, one ``NodeAllocation`` per node naming the GPU indices each running pod holds (a
MIG slice holds its parent GPU's index; several slices of one GPU share it). Nodes with
nothing running report an empty list, so a freed GPU is seen as free.

Identity and determinism
------------------------
``pod_uid`` is ``uuid5(uuid5(NAMESPACE_URL, "gpumeter-sim/<cluster>/<seed>"), "job/<n>")``.
``event_id`` is ``<kind>-`` + the first 32 hex digits of
``sha256("<cluster>|<node>|<pod_uid>|<kind>|<window_start ISO>")``. The same
configuration (including seed) yields the same samples byte for byte; nothing depends on
wall-clock time, hash randomisation or set ordering.

Two output paths share one simulation step: :meth:`SimulatedFleet.step` returns validated
:class:`~gpumeter.core.models.UsageSample` objects, :meth:`SimulatedFleet.step_dicts` returns
JSON-ready dicts (Decimals as strings, ISO 8601 timestamps with ``+00:00``) shaped like
``UsageSample.model_dump()`` with every field present, for the fast publish path.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from collectors.sim.allocation import LinkTable, best_free_set
from collectors.sim.hardware import GIB, GPU_SPECS, GpuSpec, node_topology
from collectors.sim.rhythm import arrival_factor
from gpumeter.core.models import (
    CAPACITY_TYPES,
    CapacityType,
    GpuAssignment,
    NodeAllocation,
    NodeTopology,
    UsageSample,
    gpu_share,
)
from gpumeter.core.validation import TENANT_PATTERN

__all__ = [
    "DEFAULT_START",
    "DEFAULT_TENANTS",
    "SOURCE_LABEL",
    "FleetConfig",
    "FleetStats",
    "SimulatedFleet",
    "TenantSpec",
]

DEFAULT_START = datetime(2026, 10, 30, tzinfo=UTC)
WHOLE_SIZES: tuple[int, ...] = (1, 2, 4, 8)
SOURCE_LABEL = "gpumeter.io/source"
JOB_LABEL = "gpumeter.io/job"
WORKLOAD_LABEL = "gpumeter.io/workload"
GPUS_LABEL = "gpumeter.io/gpus"
MIG_SLICE_LABEL = "gpumeter.io/mig-slice"
# A simulated pod has one container; the allocation records name it so.
CONTAINER = "main"

# Job duration ranges (minutes of simulated time, log-uniform) per workload.
DURATION_MINUTES: dict[str, tuple[float, float]] = {
    "train": (20.0, 720.0),
    "infer": (60.0, 720.0),
    "notebook": (10.0, 240.0),
}
# Base GPU utilization (percent) per workload; each window adds +-6 points of jitter.
BASE_UTILIZATION: dict[str, tuple[int, int]] = {
    "train": (55, 97),
    "infer": (15, 70),
    "notebook": (0, 35),
}
GPU_MEMORY_PERCENT: dict[str, tuple[int, int]] = {
    "train": (60, 95),
    "infer": (30, 80),
    "notebook": (5, 50),
}
STORAGE_GIB: tuple[int, ...] = (10, 50, 100, 250, 500, 1000, 2000)
MIG_CPU_CORES: tuple[Decimal, ...] = (Decimal("0.5"), Decimal("1"), Decimal("2"))
MIG_MEMORY_GIB: tuple[Decimal, ...] = (Decimal("4"), Decimal("8"), Decimal("16"))

_UTIL_DECIMALS: tuple[Decimal, ...] = tuple(Decimal(p).scaleb(-2) for p in range(101))
_UTIL_STRINGS: tuple[str, ...] = tuple(str(d) for d in _UTIL_DECIMALS)
_TENANT_RE = re.compile(TENANT_PATTERN)


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """How one tenant submits work.

    ``size_weights`` weighs whole-GPU requests of 1, 2, 4 and 8 GPUs; ``mig_share`` is
    the probability that a job asks for one MIG slice instead; ``inference_share`` the
    probability that a job is a long-running inference server rather than training;
    ``priorities`` (priority -> weight) overrides the fleet's priority mix.
    """

    name: str
    arrivals_per_hour: float = 2.0
    size_weights: tuple[float, float, float, float] = (0.4, 0.3, 0.2, 0.1)
    mig_share: float = 0.1
    inference_share: float = 0.1
    priorities: Mapping[int, float] | None = None


# team-a .. inference are in the default tenants file; sandbox deliberately is not
# (a tenant without quota or commitment that must still be billed).
DEFAULT_TENANTS: tuple[TenantSpec, ...] = (
    TenantSpec("team-a", 1.5, (0.35, 0.3, 0.2, 0.15), mig_share=0.05, inference_share=0.1),
    TenantSpec("team-b", 1.5, (0.5, 0.3, 0.15, 0.05), mig_share=0.1, inference_share=0.2),
    TenantSpec("research", 0.6, (0.1, 0.2, 0.3, 0.4), mig_share=0.0, inference_share=0.0),
    TenantSpec(
        "inference",
        1.0,
        (0.7, 0.2, 0.1, 0.0),
        mig_share=0.15,
        inference_share=0.9,
        priorities={1000: 0.7, 100: 0.3},
    ),
    TenantSpec("sandbox", 2.0, (0.8, 0.2, 0.0, 0.0), mig_share=0.6, inference_share=0.0),
)


def _default_nodes() -> dict[str, int]:
    return {"H100-SXM-80GB": 4, "A100-SXM-40GB": 2, "L40S-48GB": 2}


def _default_mig() -> dict[str, int]:
    return {"A100-SXM-40GB": 2}


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
    """

    seed: int = 42
    cluster: str = "sim-cluster"
    nodes: Mapping[str, int] = field(default_factory=_default_nodes)
    gpus_per_node: int = 8
    gpus_per_node_by_model: Mapping[str, int] = field(default_factory=dict)
    mig_gpus_per_node: Mapping[str, int] = field(default_factory=_default_mig)
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
            if spec is None or not spec.mig_profile:
                yield f"{model!r} has no MIG profile in the simulator"
            elif not 0 <= count <= self.gpus_on(model):
                yield f"mig_gpus_per_node[{model}] must be between 0 and gpus_per_node"
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
        if self.max_queue_per_tenant < 0:
            yield "max_queue_per_tenant must be >= 0"
        if self.reserve_after_seconds is not None and self.reserve_after_seconds < 0:
            yield "reserve_after_seconds must be >= 0 or None"
        if self.warm_start_jobs < 0:
            yield "warm_start_jobs must be >= 0"

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


@dataclass
class FleetStats:
    """Counters of the simulated scheduler, for progress displays and tests."""

    windows: int = 0
    samples: int = 0
    jobs_submitted: int = 0
    jobs_started: int = 0
    jobs_finished: int = 0
    jobs_evicted: int = 0
    jobs_dropped: int = 0
    queued: int = 0
    running: int = 0


@dataclass(slots=True)
class _Node:
    name: str
    spec: GpuSpec
    capacity_type: CapacityType
    free_whole: list[int]
    free_slices: list[tuple[int, int]]
    topology: NodeTopology
    links: LinkTable
    jobs: dict[str, _Job] = field(default_factory=dict)  # pod_uid -> running job, placed here
    assignments: list[dict[str, Any]] | None = None  # JSON-ready, rebuilt after a change


@dataclass(slots=True)
class _Job:
    number: int
    tenant: str
    workload: str
    model: str
    gpus: int  # whole GPUs; 0 for a MIG slice
    duration: int  # windows
    priority: int
    base_util: int
    gpu_mem_percent: int
    cpu: Decimal
    memory_gib: Decimal
    storage_gib: Decimal
    pod: str
    pod_uid: str
    submitted: int  # window index
    # Set at placement.
    node: _Node | None = None
    gpu_indices: tuple[int, ...] = ()
    mig_slot: tuple[int, int] | None = None
    end_window: int = 0
    idle_p10: int = 0  # power at 0 % utilization, tenths of a watt
    span_p10: int = 0  # extra power at 100 %, tenths of a watt (already divided for MIG)
    gpu_mem_used: int = 0
    host_mem_used: int = 0
    key_prefix: str = ""
    dict_templates: tuple[dict[str, Any], ...] = ()
    model_templates: tuple[dict[str, Any], ...] = ()


_KIND_ORDER = ("gpu", "cpu", "memory", "storage")


class SimulatedFleet:
    """A deterministic cluster simulation; see the module docstring for the model."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._uid_namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"gpumeter-sim/{config.cluster}/{config.seed}")
        self._tenants = config.tenant_specs
        self._window = config.window
        self._clock = config.start.astimezone(UTC)
        self._index = 0
        self._nodes = self._build_nodes()
        self._nodes_by_model: dict[str, list[_Node]] = {}
        for node in self._nodes:
            self._nodes_by_model.setdefault(node.spec.model, []).append(node)
        self._whole_capacity = self._capacity(mig=False)
        self._slice_capacity = self._capacity(mig=True)
        self._max_whole = {
            model: max(len(node.free_whole) for node in nodes)
            for model, nodes in self._nodes_by_model.items()
        }
        self._queue: list[_Job] = []
        self._queued_per_tenant: dict[str, int] = {t.name: 0 for t in self._tenants}
        self._running: dict[str, _Job] = {}  # pod_uid -> job, in start order
        self._ends: dict[int, list[_Job]] = {}
        self._blocked: set[str] = set()
        self._last_blocked: frozenset[str] = frozenset()
        self._evict: list[str] = []
        self._job_counter = 0
        reserve = config.reserve_after_seconds
        self._reserve_after = None if reserve is None else -(-reserve // config.window_seconds)
        self.stats = FleetStats()

    # ------------------------------------------------------------------ set-up

    def _build_nodes(self) -> list[_Node]:
        config = self.config
        mix = [(kind, config.capacity_mix.get(kind, 0.0)) for kind in CAPACITY_TYPES]
        mix = [(kind, weight) for kind, weight in mix if weight > 0]
        total = sum(weight for _, weight in mix)
        current = {kind: 0.0 for kind, _ in mix}
        nodes: list[_Node] = []
        for model, count in config.nodes.items():
            spec = GPU_SPECS[model]
            mig_gpus = config.mig_gpus_per_node.get(model, 0) if spec.mig_profile else 0
            gpus = config.gpus_on(model)
            for i in range(count):
                # Smooth weighted round-robin: interleaves capacity types across the fleet.
                for kind, weight in mix:
                    current[kind] += weight
                chosen = max(mix, key=lambda item: current[item[0]])[0]
                current[chosen] -= total
                name = f"{spec.short}-node-{i:02d}"
                topology = node_topology(
                    cluster=config.cluster,
                    node=name,
                    spec=spec,
                    gpus_per_node=gpus,
                    namespace=self._uid_namespace,
                    at=self._clock,
                    mig_gpus=mig_gpus,
                )
                nodes.append(
                    _Node(
                        name=name,
                        spec=spec,
                        capacity_type=chosen,
                        free_whole=list(range(mig_gpus, gpus)),
                        free_slices=[(g, s) for g in range(mig_gpus) for s in range(spec.mig_slices)],
                        topology=topology,
                        links=LinkTable.from_topology(topology),
                    )
                )
        return nodes

    def _capacity(self, *, mig: bool) -> dict[str, int]:
        capacity: dict[str, int] = {}
        for model, nodes in self._nodes_by_model.items():
            units = sum(len(n.free_slices) if mig else len(n.free_whole) for n in nodes)
            if units:
                capacity[model] = units
        return capacity

    # ------------------------------------------------------------------ public API

    @property
    def clock(self) -> datetime:
        """Start of the next window :meth:`step` will produce (UTC)."""
        return self._clock

    @property
    def window_index(self) -> int:
        return self._index

    def node_names(self) -> list[str]:
        return [node.name for node in self._nodes]

    def node_capacity_types(self) -> dict[str, CapacityType]:
        return {node.name: node.capacity_type for node in self._nodes}

    def topology(self) -> list[NodeTopology]:
        """GPU layout of every node (collectors/sim/hardware.py), as of the fleet's start."""
        return [node.topology for node in self._nodes]

    def allocations(self) -> list[NodeAllocation]:
        """One record per node: the GPU indices each pod running in the last stepped window holds.

        ``at`` is the end of that window (the fleet's start before the first step). Pods are
        listed by namespace and name; a node with nothing running has no assignments.
        """
        return [NodeAllocation.model_validate(record) for record in self.allocation_dicts()]

    def allocation_dicts(self) -> list[dict[str, Any]]:
        """Like :meth:`allocations`, JSON-ready (``NodeAllocation.model_dump()`` through JSON).

        A node's assignments are rebuilt only when a pod started or left it, so the
        per-window cost is one small dict per node.
        """
        at = self._clock.isoformat()
        records = []
        for node in self._nodes:
            if node.assignments is None:
                node.assignments = [
                    GpuAssignment(
                        namespace=job.tenant,
                        pod=job.pod,
                        pod_uid=job.pod_uid,
                        container=CONTAINER,
                        gpu_indices=list(job.gpu_indices),
                    ).model_dump()
                    for job in sorted(node.jobs.values(), key=lambda j: (j.tenant, j.pod))
                ]
            records.append(
                {
                    "cluster": self.config.cluster,
                    "node": node.name,
                    "assignments": [dict(a, gpu_indices=list(a["gpu_indices"])) for a in node.assignments],
                    "at": at,
                }
            )
        return records

    def running_pods(self) -> list[dict[str, Any]]:
        """Pods running now: what a scheduler hook would list (tenant, priority, capacity...)."""
        pods = []
        for job in self._running.values():
            assert job.node is not None
            pods.append(
                {
                    "pod_uid": job.pod_uid,
                    "pod": job.pod,
                    "namespace": job.tenant,
                    "tenant": job.tenant,
                    "node": job.node.name,
                    "gpu_model": job.model,
                    "gpus": job.gpus,
                    "gpu_indices": list(job.gpu_indices),
                    "mig_profile": job.node.spec.mig_profile if job.mig_slot else None,
                    "capacity_type": job.node.capacity_type,
                    "priority": job.priority,
                    "started_window": job.end_window - job.duration,
                }
            )
        return pods

    def evict(self, pod_uid: str) -> bool:
        """Ask the fleet to evict a running pod; it emits no samples from the next window on.

        Returns False when no such pod is running. The evicted job is not resubmitted.
        """
        if pod_uid not in self._running or pod_uid in self._evict:
            return False
        self._evict.append(pod_uid)
        return True

    def set_admission(self, tenant: str, allowed: bool) -> None:
        """Block (or unblock) placement of a tenant's queued jobs: a quota ``block`` action."""
        if allowed:
            self._blocked.discard(tenant)
        else:
            self._blocked.add(tenant)

    def step(self) -> list[UsageSample]:
        """Advance one window; validated samples for every running pod."""
        start, end, records = self._advance()
        return self._models(start, end, records)

    def step_dicts(self) -> list[dict[str, Any]]:
        """Advance one window; JSON-ready dicts (the same samples :meth:`step` would give)."""
        start, end, records = self._advance()
        return self._dicts(start, end, records)

    def windows(self) -> Iterator[tuple[datetime, list[UsageSample]]]:
        """(window start, samples) until ``config.end`` (forever when it is None)."""
        while self._more():
            start = self._clock
            yield start, self.step()

    def windows_dicts(self) -> Iterator[tuple[datetime, list[dict[str, Any]]]]:
        """Like :meth:`windows`, with JSON-ready dicts."""
        while self._more():
            start = self._clock
            yield start, self.step_dicts()

    def _more(self) -> bool:
        return self.config.end is None or self._clock < self.config.end

    # ------------------------------------------------------------------ simulation

    def _advance(self) -> tuple[datetime, datetime, list[tuple[_Job, int, int]]]:
        index = self._index
        start = self._clock
        end = start + self._window
        changed = False

        for job in self._ends.pop(index, ()):
            if self._running.pop(job.pod_uid, None) is not None:
                self._release(job)
                self.stats.jobs_finished += 1
                changed = True
        for pod_uid in self._evict:
            job_or_none = self._running.pop(pod_uid, None)
            if job_or_none is not None:
                self._release(job_or_none)
                self.stats.jobs_evicted += 1
                changed = True
        self._evict.clear()

        changed = self._submit(index, start) or changed
        if changed or self._blocked_changed():
            self._schedule(index)

        rng_random = self._rng.random
        records: list[tuple[_Job, int, int]] = []
        for job in self._running.values():
            pct = job.base_util + int(rng_random() * 13) - 6
            pct = 0 if pct < 0 else 100 if pct > 100 else pct
            p10 = job.idle_p10 + job.span_p10 * pct // 100
            records.append((job, pct, p10))

        self._index = index + 1
        self._clock = end
        self.stats.windows += 1
        self.stats.samples += 4 * len(records)
        self.stats.running = len(self._running)
        self.stats.queued = len(self._queue)
        return start, end, records

    def _blocked_changed(self) -> bool:
        current = frozenset(self._blocked)
        if current != self._last_blocked:
            self._last_blocked = current
            return True
        return False

    def _submit(self, index: int, start: datetime) -> bool:
        rng = self._rng
        hours = self.config.window_seconds / 3600.0
        factor = 1.0
        if self.config.diurnal:
            factor = arrival_factor(start, self.config.start)
        submitted = False
        for tenant in self._tenants:
            count = _poisson(rng, tenant.arrivals_per_hour * hours * factor)
            if index == 0:
                count += self.config.warm_start_jobs
            for _ in range(count):
                job = self._new_job(tenant)
                self.stats.jobs_submitted += 1
                if self._queued_per_tenant[tenant.name] >= self.config.max_queue_per_tenant:
                    self.stats.jobs_dropped += 1
                    continue
                self._queue.append(job)
                self._queued_per_tenant[tenant.name] += 1
                submitted = True
        return submitted

    def _new_job(self, tenant: TenantSpec) -> _Job:
        rng = self._rng
        inference = rng.random() < tenant.inference_share
        mig = rng.random() < tenant.mig_share and bool(self._slice_capacity)
        if not mig and not self._whole_capacity:
            mig = bool(self._slice_capacity)
        if mig:
            model = _weighted(rng, self._slice_capacity)
            spec = GPU_SPECS[model]
            gpus = 0
        else:
            model = _weighted(rng, self._whole_capacity)
            spec = GPU_SPECS[model]
            # Never ask for more whole GPUs than one node of the model has.
            largest = self._max_whole[model]
            weights = {
                size: weight
                for size, weight in zip(WHOLE_SIZES, tenant.size_weights, strict=True)
                if size <= largest and weight > 0
            }
            gpus = _weighted(rng, weights) if weights else max(s for s in WHOLE_SIZES if s <= largest)
        workload = "infer" if inference else "notebook" if mig else "train"
        low, high = DURATION_MINUTES[workload]
        minutes = math.exp(rng.uniform(math.log(low), math.log(high)))
        duration = max(1, round(minutes * 60.0 / self.config.window_seconds))
        priority = _weighted(rng, tenant.priorities or self.config.priorities)
        base_util = rng.randint(*BASE_UTILIZATION[workload])
        gpu_mem_percent = rng.randint(*GPU_MEMORY_PERCENT[workload])
        if mig:
            cpu = rng.choice(MIG_CPU_CORES)
            memory = rng.choice(MIG_MEMORY_GIB)
        else:
            share = rng.randint(2, 4)
            cpu = Decimal(max(1, gpus * spec.host_cores_per_gpu * share // 4))
            memory = Decimal(max(1, gpus * spec.host_memory_gib_per_gpu * share // 4))
        storage = Decimal(rng.choice(STORAGE_GIB))
        self._job_counter += 1
        number = self._job_counter
        pod_uid = str(uuid.uuid5(self._uid_namespace, f"job/{number}"))
        return _Job(
            number=number,
            tenant=tenant.name,
            workload=workload,
            model=model,
            gpus=gpus,
            duration=duration,
            priority=priority,
            base_util=base_util,
            gpu_mem_percent=gpu_mem_percent,
            cpu=cpu,
            memory_gib=memory,
            storage_gib=storage,
            pod=f"{workload}-{number:06d}-{pod_uid[:5]}",
            pod_uid=pod_uid,
            submitted=self._index,
        )

    def _schedule(self, index: int) -> None:
        waiting: list[_Job] = []
        reserved: set[str] = set()  # models held for a starving whole-GPU job
        reserve_after = self._reserve_after
        for job in self._queue:
            if job.tenant in self._blocked:
                waiting.append(job)
                continue
            whole = job.gpus > 0
            if (whole and job.model in reserved) or not self._place(job):
                if whole and reserve_after is not None and index - job.submitted >= reserve_after:
                    reserved.add(job.model)
                waiting.append(job)
                continue
            self._queued_per_tenant[job.tenant] -= 1
            job.end_window = index + job.duration
            self._ends.setdefault(job.end_window, []).append(job)
            self._running[job.pod_uid] = job
            assert job.node is not None
            job.node.jobs[job.pod_uid] = job
            job.node.assignments = None
            self._prepare(job)
            self.stats.jobs_started += 1
        self._queue = waiting

    def _place(self, job: _Job) -> bool:
        for node in self._nodes_by_model.get(job.model, ()):
            if job.gpus == 0:
                if node.free_slices:
                    job.node = node
                    job.mig_slot = node.free_slices.pop(0)
                    job.gpu_indices = (job.mig_slot[0],)
                    return True
            elif len(node.free_whole) >= job.gpus:
                chosen = best_free_set(node.free_whole, job.gpus, node.links)
                assert chosen is not None  # enough GPUs are free
                job.node = node
                job.gpu_indices = chosen
                node.free_whole = [g for g in node.free_whole if g not in chosen]
                return True
        return False

    def _release(self, job: _Job) -> None:
        node = job.node
        assert node is not None
        node.jobs.pop(job.pod_uid, None)
        node.assignments = None
        if job.mig_slot is not None:
            node.free_slices.append(job.mig_slot)
            node.free_slices.sort()
        else:
            node.free_whole.extend(job.gpu_indices)
            node.free_whole.sort()

    # ------------------------------------------------------------------ sample shapes

    def _prepare(self, job: _Job) -> None:
        """Per-pod constants: power model and the four sample templates (dict and model)."""
        node = job.node
        assert node is not None
        spec = node.spec
        mig = job.mig_slot is not None
        gpu_units = 1 if mig else job.gpus
        idle = spec.idle_watts * 10 * gpu_units
        span = (spec.tdp_watts - spec.idle_watts) * 10 * gpu_units
        if mig:
            idle //= spec.mig_slices
            span //= spec.mig_slices
            gpu_memory = spec.memory_bytes // 8 * job.gpu_mem_percent // 100
        else:
            gpu_memory = spec.memory_bytes * job.gpus * job.gpu_mem_percent // 100
        job.idle_p10 = idle
        job.span_p10 = span
        job.gpu_mem_used = gpu_memory
        job.host_mem_used = int(job.memory_gib * GIB) * job.gpu_mem_percent // 100
        job.key_prefix = f"{self.config.cluster}|{node.name}|{job.pod_uid}|"

        base_labels = {
            SOURCE_LABEL: "simulated",
            JOB_LABEL: f"job-{job.number:06d}",
            WORKLOAD_LABEL: job.workload,
        }
        gpu_labels = dict(base_labels)
        gpu_labels[GPUS_LABEL] = ",".join(str(i) for i in job.gpu_indices)
        if job.mig_slot is not None:
            gpu_labels[MIG_SLICE_LABEL] = str(job.mig_slot[1])
        quantities = {
            "gpu": gpu_share(1, spec.mig_slices) if mig else Decimal(job.gpus),
            "cpu": job.cpu,
            "memory": job.memory_gib,
            "storage": job.storage_gib,
        }
        model_templates = []
        dict_templates = []
        for kind in _KIND_ORDER:
            is_gpu = kind == "gpu"
            template: dict[str, Any] = {
                "event_id": "",
                "kind": kind,
                "cluster": self.config.cluster,
                "node": node.name,
                "tenant": job.tenant,
                "namespace": job.tenant,
                "pod": job.pod,
                "pod_uid": job.pod_uid,
                "window_start": None,
                "window_end": None,
                "quantity": quantities[kind],
                "gpu_model": spec.model if is_gpu else None,
                "mig_profile": spec.mig_profile if is_gpu and mig else None,
                "capacity_type": node.capacity_type,
                "priority": job.priority,
                "utilization": None,
                "memory_used_bytes": Decimal(job.host_mem_used) if kind == "memory" else None,
                "power_watts": None,
                "energy_joules": None,
                "labels": gpu_labels if is_gpu else base_labels,
            }
            model_templates.append(template)
            as_json = {
                key: (str(value) if isinstance(value, Decimal) else value) for key, value in template.items()
            }
            dict_templates.append(as_json)
        job.model_templates = tuple(model_templates)
        job.dict_templates = tuple(dict_templates)

    def _event_ids(self, job: _Job, start_iso: str) -> tuple[str, str, str, str]:
        prefix = job.key_prefix
        suffix = "|" + start_iso
        sha = hashlib.sha256
        return (
            "gpu-" + sha(f"{prefix}gpu{suffix}".encode()).hexdigest()[:32],
            "cpu-" + sha(f"{prefix}cpu{suffix}".encode()).hexdigest()[:32],
            "memory-" + sha(f"{prefix}memory{suffix}".encode()).hexdigest()[:32],
            "storage-" + sha(f"{prefix}storage{suffix}".encode()).hexdigest()[:32],
        )

    def _dicts(
        self, start: datetime, end: datetime, records: list[tuple[_Job, int, int]]
    ) -> list[dict[str, Any]]:
        start_iso = start.isoformat()
        end_iso = end.isoformat()
        seconds = self.config.window_seconds
        out: list[dict[str, Any]] = []
        append = out.append
        for job, pct, p10 in records:
            ids = self._event_ids(job, start_iso)
            for i, template in enumerate(job.dict_templates):
                sample = template.copy()
                sample["event_id"] = ids[i]
                sample["window_start"] = start_iso
                sample["window_end"] = end_iso
                sample["labels"] = template["labels"].copy()
                if i == 0:
                    energy = p10 * seconds
                    sample["utilization"] = _UTIL_STRINGS[pct]
                    sample["memory_used_bytes"] = str(job.gpu_mem_used)
                    sample["power_watts"] = f"{p10 // 10}.{p10 % 10}"
                    sample["energy_joules"] = f"{energy // 10}.{energy % 10}"
                append(sample)
        return out

    def _models(
        self, start: datetime, end: datetime, records: list[tuple[_Job, int, int]]
    ) -> list[UsageSample]:
        start_iso = start.isoformat()
        seconds = self.config.window_seconds
        out: list[UsageSample] = []
        append = out.append
        for job, pct, p10 in records:
            ids = self._event_ids(job, start_iso)
            for i, template in enumerate(job.model_templates):
                fields = template.copy()
                fields["event_id"] = ids[i]
                fields["window_start"] = start
                fields["window_end"] = end
                if i == 0:
                    fields["utilization"] = _UTIL_DECIMALS[pct]
                    fields["memory_used_bytes"] = Decimal(job.gpu_mem_used)
                    fields["power_watts"] = Decimal(p10).scaleb(-1)
                    fields["energy_joules"] = Decimal(p10 * seconds).scaleb(-1)
                append(UsageSample.model_validate(fields))
        return out


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method: fine for the small per-window means the fleet uses."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit = math.exp(-mean)
    count = 0
    product = rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


_K = TypeVar("_K")


def _weighted(rng: random.Random, weights: Mapping[_K, float]) -> _K:
    keys = list(weights)
    return rng.choices(keys, weights=[float(weights[k]) for k in keys])[0]
