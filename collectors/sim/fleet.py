"""A seeded, deterministic simulated GPU cluster that emits contract-1 UsageSamples.

The simulated fleet stands in for NVML + kubelet on machines without GPUs (the demo,
tests, benchmarks). It emits what node agents would (collectors/agent/samples.py), so a
dashboard built on the demo reads production data the same way; it is never presented as
NVML: every sample carries the label ``gpumeter.io/source: simulated``
(collectors/sim/samples.py states the shape rules).

Model
-----
* Nodes of each configured GPU model (H100, H200, B200, A100, L40S, L4; collectors/sim/hardware.py),
  ``gpus_per_node`` GPUs each (a model whose server type fixes the count, such as the 4-GPU L4
  node, or an entry of ``gpus_per_node_by_model``, overrides it), each with its model's real GPU
  layout. A node's capacity type (on-demand / reserved / spot) is fixed and spread over the fleet
  by smooth weighted round-robin of ``capacity_mix``, so every model gets a mix.
* MIG: the first ``mig_gpus_per_node[model]`` GPUs of every node of a MIG-capable model are in MIG
  mode, each split into the ``all-balanced`` layout (2 x 1g, 1 x 2g, 1 x 3g of 7 compute slices);
  they are never handed out whole (contract 8: ``mig_enabled``).
* Time-slicing: the first ``time_sliced_nodes[model]`` nodes of a model run the device plugin
  with ``time_slice_replicas`` replicas per GPU: a pod gets one replica (``<uuid>::<n>``) on the
  GPU with the fewest pods, and holds 1/replicas of it. Those nodes have no MIG and no whole GPUs.
* Tenants submit jobs as a Poisson process per window (``random.Random(seed)``), with a daily and
  weekly rhythm and growth (collectors/sim/rhythm.py). A job asks for 1, 2, 4 or 8 whole GPUs of
  one model, one MIG device of a profile (1-slice profiles most often), or one time-sliced
  replica. Whole-GPU jobs are placed first-fit on the nodes of their model and get the
  best-connected free set (collectors/sim/allocation.py). Jobs that do not fit wait in a FIFO
  queue re-scanned every window (backfill; a whole-GPU job waiting ``reserve_after_seconds``
  stops backfill on its model). A tenant's queue is capped (``max_queue_per_tenant``). Window 0
  gets ``warm_start_jobs`` extra submissions per tenant.
* A pod starts at a window boundary and runs a whole number of *seconds*, so it usually ends
  inside a window: that last window bills the part it held, as the agent bills a finished pod.

Realism events (drawn from their own ``random.Random``, as telemetry is)
-----------------------------------------------------------------------
* Spot reclaim: each window a spot node is reclaimed by the provider with probability
  ``spot_reclaims_per_day`` x window / day, at a moment inside the window. Its pods end then and
  are resubmitted as new pods (their controller recreates them) for the rest of their run; the node's
  agent dies with it, so that window is never reported (neither samples nor allocation), and the node
  is gone for ``spot_downtime_minutes``. It comes back under its name on another machine: new GPU
  UUIDs, a new ``NodeTopology``.
* Agent outage ("node loss": the node stops emitting): each window a node goes silent with
  probability ``agent_outages_per_day`` x window / day, for ``agent_outage_minutes``. Kubernetes
  carries on (pods keep running, start and end there); nothing is reported. When the agent is back
  it reports its window and backfills the most recent ``max_backfill_windows`` missed windows as
  collectors/agent/windows.py does: from what it observes now (the pods on the node now, each from
  its start), quantities only, labelled ``backfilled``; older missed windows and pods that ended
  meanwhile are not billed.

Topology and allocation (contract 8)
------------------------------------
:meth:`SimulatedFleet.topology` gives the ``NodeTopology`` of every node that exists now;
:meth:`SimulatedFleet.allocations` gives, for the window last stepped, one ``NodeAllocation`` per
node that reported it, naming the GPU indices each pod holds at the window's end (a MIG device or a
replica its GPU's index, so an index may appear under several pods; pods that ended in the window
hold nothing). A reporting node with nothing running reports an empty list.

Identity and determinism
------------------------
``pod_uid`` is ``uuid5(uuid5(NAMESPACE_URL, "gpumeter-sim/<cluster>/<seed>"), "job/<n>")``;
``event_id`` is the agent's (collectors/sim/samples.py). The same configuration (including seed)
yields the same samples byte for byte; nothing depends on wall-clock time, hash randomisation or
set ordering.

:meth:`SimulatedFleet.step_dicts` returns JSON-ready dicts shaped like ``UsageSample.model_dump()``
through JSON, with every field present (the fast publish path); :meth:`SimulatedFleet.step`
returns the same samples validated as :class:`~gpumeter.core.models.UsageSample`.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, TypeVar

from collectors.sim.allocation import LinkTable, best_free_set
from collectors.sim.config import DEFAULT_START, DEFAULT_TENANTS, FleetConfig, TenantSpec
from collectors.sim.hardware import GIB, GPU_SPECS, GpuSpec, MigProfile, gpu_uuid, mig_uuid, node_topology
from collectors.sim.rhythm import arrival_factor
from collectors.sim.samples import (
    CONTAINER,
    ONE,
    SOURCE_LABEL,
    Device,
    HostUsage,
    PodIdentity,
    PodSampler,
    Reading,
    held_fraction,
    six,
)
from gpumeter.core.kube import schedulable_units
from gpumeter.core.models import (
    CAPACITY_TYPES,
    CapacityType,
    GpuAssignment,
    NodeAllocation,
    NodeTopology,
    UsageSample,
)

__all__ = [
    "CONTAINER",
    "DEFAULT_START",
    "DEFAULT_TENANTS",
    "SOURCE_LABEL",
    "FleetConfig",
    "FleetStats",
    "SimulatedFleet",
    "TenantSpec",
]

WHOLE_SIZES: tuple[int, ...] = (1, 2, 4, 8)
DAY_SECONDS = 86_400

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
# CPU used as a percentage of the request (above 100: a burst over the request, which bills),
# and host memory working set as a percentage of the request; each window adds jitter.
CPU_PERCENT: tuple[int, int] = (30, 115)
HOST_MEMORY_PERCENT: tuple[int, int] = (40, 95)
EPHEMERAL_GIB: tuple[int, ...] = (10, 20, 50, 100)
PVC_GIB: tuple[int, ...] = (100, 250, 500, 1000, 2000)
PVC_SHARE = 0.7  # training and inference jobs that mount a data volume
SMALL_CPU_CORES: tuple[Decimal, ...] = (Decimal("0.5"), Decimal("1"), Decimal("2"))
SMALL_MEMORY_GIB: tuple[Decimal, ...] = (Decimal("4"), Decimal("8"), Decimal("16"))
# Which MIG profile a MIG job asks for, by the profile's compute slices: small ones most often.
MIG_PROFILE_WEIGHTS: dict[int, float] = {1: 0.6, 2: 0.25, 3: 0.15}

_UTIL_TEXT: tuple[str, ...] = tuple(six(Decimal(p).scaleb(-2)) for p in range(101))

Request = Literal["whole", "mig", "shared"]


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
    jobs_reclaimed: int = 0  # pods ended by a spot reclaim (each resubmitted as a new pod)
    spot_reclaims: int = 0
    agent_outages: int = 0
    windows_backfilled: int = 0  # node-windows reported late by a returning agent
    windows_unreported: int = 0  # node-windows never reported (reclaimed, or beyond the backfill)
    queued: int = 0
    running: int = 0


@dataclass(slots=True)
class _Node:
    name: str
    spec: GpuSpec
    capacity_type: CapacityType
    gpus: int
    mig_gpus: int
    shared: bool  # time-sliced: every GPU handed out as replicas
    topology: NodeTopology
    links: LinkTable
    generation: int = 0
    free_whole: list[int] = field(default_factory=list)
    free_mig: list[tuple[int, int]] = field(default_factory=list)  # (gpu, slot in the MIG layout)
    free_replicas: dict[int, list[int]] = field(default_factory=dict)  # gpu -> free replica numbers
    jobs: dict[str, _Job] = field(default_factory=dict)  # pod_uid -> job placed here, in start order
    back_at: int | None = None  # reclaimed: the window it exists again
    silent_from: int | None = None  # agent outage: first silent window
    silent_until: int = 0  # agent outage: first window reported again
    reported: bool = True  # reported the window last stepped
    assignments: list[dict[str, Any]] | None = None  # JSON-ready, rebuilt after a change

    @property
    def gone(self) -> bool:
        return self.back_at is not None


@dataclass(slots=True)
class _Job:
    number: int
    tenant: str
    workload: str
    model: str
    request: Request
    gpus: int  # whole GPUs; 1 device for a MIG or shared request
    mig_profile: MigProfile | None
    duration: int  # seconds
    priority: int
    base_util: int
    gpu_mem_percent: int
    cpu_percent: int
    host_mem_percent: int
    cpu: Decimal
    memory_gib: Decimal
    ephemeral_gib: Decimal
    pvc: tuple[str, str, Decimal] | None
    pod: str
    pod_uid: str
    submitted: int  # window index
    # Set at placement.
    node: _Node | None = None
    devices: tuple[Device, ...] = ()
    slots: tuple[int, ...] = ()  # per device: its MIG layout slot or replica number (0 for a whole GPU)
    started: int = 0  # seconds since the fleet's start
    end_window: int = 0  # the window in which the pod ends
    sampler: PodSampler | None = None

    @property
    def finished(self) -> int:
        return self.started + self.duration

    @property
    def gpu_indices(self) -> list[int]:
        return sorted({device.index for device in self.devices})


class SimulatedFleet:
    """A deterministic cluster simulation; see the module docstring for the model."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        # Telemetry, reclaims and outages draw from streams of their own (a string seed hashes
        # with SHA-512): a silent node draws no telemetry and leaves the jobs as they would be.
        self._telemetry = random.Random(f"gpumeter-sim-telemetry/{config.seed}")
        self._events = random.Random(f"gpumeter-sim-events/{config.seed}")
        self._uid_namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"gpumeter-sim/{config.cluster}/{config.seed}")
        self._tenants = config.tenant_specs
        self._window = config.window
        self._seconds = config.window_seconds
        self._origin = config.start.astimezone(UTC)
        self._clock = self._origin
        self._index = 0
        self._nodes = self._build_nodes()
        self._nodes_by_model: dict[str, list[_Node]] = {}
        for node in self._nodes:
            self._nodes_by_model.setdefault(node.spec.model, []).append(node)
        self._whole_capacity = self._capacity("whole")
        self._mig_capacity = self._capacity("mig")
        self._shared_capacity = self._capacity("shared")
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
        self._dirty = False  # capacity freed since the last scheduling pass
        self._forced_reclaims: dict[str, tuple[int, int]] = {}  # node -> (offset s, downtime windows)
        self._forced_outages: dict[str, int] = {}  # node -> silent windows
        self._readings: dict[tuple[str, int, int], Reading] = {}  # immutable, so shared
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
            gpus = config.gpus_on(model)
            shared_nodes = config.time_sliced_nodes.get(model, 0)
            for i in range(count):
                # Smooth weighted round-robin: interleaves capacity types across the fleet.
                for kind, weight in mix:
                    current[kind] += weight
                chosen = max(mix, key=lambda item: current[item[0]])[0]
                current[chosen] -= total
                shared = i < shared_nodes
                mig_gpus = 0 if shared or not spec.mig_layout else config.mig_gpus_per_node.get(model, 0)
                name = f"{spec.short}-node-{i:02d}"
                topology = self._topology(name, spec, gpus, mig_gpus, 0, shared)
                node = _Node(
                    name=name,
                    spec=spec,
                    capacity_type=chosen,
                    gpus=gpus,
                    mig_gpus=mig_gpus,
                    shared=shared,
                    topology=topology,
                    links=LinkTable.from_topology(topology),
                )
                self._reset_free(node)
                nodes.append(node)
        return nodes

    def _topology(
        self, name: str, spec: GpuSpec, gpus: int, mig_gpus: int, generation: int, shared: bool
    ) -> NodeTopology:
        return node_topology(
            cluster=self.config.cluster,
            node=name,
            spec=spec,
            gpus_per_node=gpus,
            namespace=self._uid_namespace,
            at=self._clock,
            mig_gpus=mig_gpus,
            generation=generation,
            replicas=self.config.time_slice_replicas if shared else 1,
        )

    def _reset_free(self, node: _Node) -> None:
        if node.shared:
            node.free_whole, node.free_mig = [], []
            node.free_replicas = {g.index: list(range(schedulable_units(g))) for g in node.topology.gpus}
            return
        node.free_whole = list(range(node.mig_gpus, node.gpus))
        node.free_mig = [(g, s) for g in range(node.mig_gpus) for s in range(len(node.spec.mig_layout))]
        node.free_replicas = {}

    def _capacity(self, request: Request) -> dict[str, int]:
        capacity: dict[str, int] = {}
        for model, nodes in self._nodes_by_model.items():
            if request == "whole":
                units = sum(len(n.free_whole) for n in nodes)
            elif request == "mig":
                units = sum(len(n.free_mig) for n in nodes)
            else:
                units = sum(len(r) for n in nodes for r in n.free_replicas.values())
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

    def time_sliced_nodes(self) -> list[str]:
        return [node.name for node in self._nodes if node.shared]

    def topology(self) -> list[NodeTopology]:
        """GPU layout of every node that exists now (a reclaimed spot node has none until it is back)."""
        return [node.topology for node in self._nodes if not node.gone]

    def allocations(self) -> list[NodeAllocation]:
        """One record per node that reported the last stepped window: the GPU indices each pod holds.

        ``at`` is the end of that window (the fleet's start before the first step). Pods are
        listed by namespace and name; a node with nothing running has no assignments.
        """
        return [NodeAllocation.model_validate(record) for record in self.allocation_dicts()]

    def allocation_dicts(self) -> list[dict[str, Any]]:
        """Like :meth:`allocations`, JSON-ready (``NodeAllocation.model_dump()`` through JSON).

        A node's assignments are rebuilt only when a pod started or left it.
        """
        at = self._clock.isoformat()
        records = []
        for node in self._nodes:
            if not node.reported:
                continue
            if node.assignments is None:
                node.assignments = [
                    GpuAssignment(
                        namespace=job.tenant,
                        pod=job.pod,
                        pod_uid=job.pod_uid,
                        container=CONTAINER,
                        gpu_indices=job.gpu_indices,
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
                    "request": job.request,
                    "gpus": job.gpus if job.request == "whole" else 0,
                    "gpu_indices": job.gpu_indices,
                    "device_ids": [device.device_id for device in job.devices],
                    "mig_profile": job.mig_profile.name if job.mig_profile else None,
                    "capacity_type": job.node.capacity_type,
                    "priority": job.priority,
                    "started": self._origin + timedelta(seconds=job.started),
                    "ends": self._origin + timedelta(seconds=job.finished),
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

    def submit(
        self, tenant: str, *, model: str, duration_seconds: int, request: Request = "whole", gpus: int = 1,
        mig_profile: str | None = None, priority: int = 0, cpu: Decimal = Decimal(1),
        memory_gib: Decimal = Decimal(4), ephemeral_gib: Decimal = Decimal(10),
        pvc_gib: Decimal | None = None,
    ) -> str:
        """Queue one job explicitly (tests, scripted scenarios); it is placed at the next step.

        Returns the pod UID. Raises ValueError for a request the fleet cannot describe.
        """
        spec = GPU_SPECS.get(model)
        if spec is None or model not in self._nodes_by_model:
            raise ValueError(f"no node of model {model!r} in this fleet")
        profile = None
        if request == "mig":
            profile = next((p for p in spec.mig_profiles if p.name == mig_profile), None)
            if profile is None:
                raise ValueError(f"{model} has no MIG profile {mig_profile!r} in the simulator")
        if duration_seconds < 1 or gpus < 1 or (request != "whole" and gpus != 1):
            raise ValueError("duration_seconds and gpus must be >= 1 (gpus = 1 unless whole GPUs)")
        self._job_counter += 1
        number = self._job_counter
        pvc = None
        if pvc_gib is not None:
            pvc = (str(uuid.uuid5(self._uid_namespace, f"pvc/{number}")), f"data-{number:06d}", pvc_gib)
        job = self._job(
            number, tenant, "train" if request == "whole" else "notebook", model, request, gpus, profile,
            duration_seconds, priority, base_util=50, gpu_mem_percent=50, cpu_percent=100,
            host_mem_percent=50, cpu=cpu, memory_gib=memory_gib, ephemeral_gib=ephemeral_gib, pvc=pvc,
        )
        self._queue.append(job)
        self._queued_per_tenant[tenant] = self._queued_per_tenant.get(tenant, 0) + 1
        self._dirty = True
        self.stats.jobs_submitted += 1
        return job.pod_uid

    def reclaim(self, node_name: str, offset_seconds: int, downtime_windows: int) -> bool:
        """Reclaim a spot node ``offset_seconds`` into the next window, for ``downtime_windows``
        windows (the random events do the same; tests call this directly). False when the node
        is not a spot node that exists and reports."""
        node = self._node(node_name)
        if node is None or node.capacity_type != "spot" or node.gone or node.silent_from is not None:
            return False
        self._forced_reclaims[node.name] = (offset_seconds, downtime_windows)
        return True

    def silence(self, node_name: str, windows: int) -> bool:
        """Stop the node's agent for the next ``windows`` windows (an outage); False if it cannot."""
        node = self._node(node_name)
        if node is None or node.gone or node.silent_from is not None or windows < 1:
            return False
        self._forced_outages[node.name] = windows
        return True

    def step(self) -> list[UsageSample]:
        """Advance one window; validated samples of every node that reports it."""
        return [UsageSample.model_validate(sample) for sample in self.step_dicts()]

    def step_dicts(self) -> list[dict[str, Any]]:
        """Advance one window; JSON-ready dicts (the same samples :meth:`step` would give)."""
        return self._advance()

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

    def _node(self, name: str) -> _Node | None:
        return next((node for node in self._nodes if node.name == name), None)

    # ------------------------------------------------------------------ simulation

    def _advance(self) -> list[dict[str, Any]]:
        index = self._index
        start = self._clock
        end = start + self._window

        self._restore_nodes(index)
        for pod_uid in self._evict:
            job_or_none = self._running.get(pod_uid)
            if job_or_none is not None:
                self._remove(job_or_none)
                self.stats.jobs_evicted += 1
        self._evict.clear()
        submitted = self._submit(index, start)
        if submitted or self._dirty or self._blocked_changed():
            self._dirty = False
            self._schedule(index)
        self._events_for(index)

        out: list[dict[str, Any]] = []
        start_iso, end_iso = start.isoformat(), end.isoformat()
        for node in self._nodes:
            node.reported = self._reports(node, index)
            if node.reported:
                if node.jobs:
                    out.extend(self._node_window(node, index, start_iso, end_iso))
                if node.silent_until == index and node.silent_from is not None:
                    out.extend(self._backfill(node, index))
                    node.silent_from = None

        for job in self._ends.pop(index, ()):
            if self._running.get(job.pod_uid) is job:
                self._remove(job)
                self.stats.jobs_finished += 1

        self._index = index + 1
        self._clock = end
        self.stats.windows += 1
        self.stats.samples += len(out)
        self.stats.running = len(self._running)
        self.stats.queued = len(self._queue)
        return out

    def _reports(self, node: _Node, index: int) -> bool:
        if node.gone:
            return False
        return node.silent_from is None or index >= node.silent_until

    def _restore_nodes(self, index: int) -> None:
        for node in self._nodes:
            if node.back_at is not None and node.back_at <= index:
                node.back_at = None
                node.generation += 1
                node.topology = self._topology(
                    node.name, node.spec, node.gpus, node.mig_gpus, node.generation, node.shared
                )
                node.links = LinkTable.from_topology(node.topology)
                self._reset_free(node)
                node.assignments = None
                self._dirty = True

    def _events_for(self, index: int) -> None:
        """Spot reclaims and agent outages starting in window ``index`` (module docstring)."""
        config = self.config
        rng = self._events
        reclaim_p = config.spot_reclaims_per_day * self._seconds / DAY_SECONDS
        outage_p = config.agent_outages_per_day * self._seconds / DAY_SECONDS
        forced_reclaims, self._forced_reclaims = self._forced_reclaims, {}
        forced_outages, self._forced_outages = self._forced_outages, {}
        for node in self._nodes:
            if node.gone or node.silent_from is not None:
                continue
            if node.name in forced_reclaims:
                offset, downtime = forced_reclaims[node.name]
                self._reclaim_node(node, index, offset, downtime)
                continue
            if node.name in forced_outages:
                self._silence_node(node, index, forced_outages[node.name])
                continue
            if node.capacity_type == "spot" and reclaim_p > 0 and rng.random() < reclaim_p:
                offset = rng.randint(1, self._seconds - 1) if self._seconds > 1 else 0
                minutes = rng.uniform(*config.spot_downtime_minutes)
                self._reclaim_node(node, index, offset, self._windows_of(minutes))
            elif outage_p > 0 and rng.random() < outage_p:
                self._silence_node(node, index, self._windows_of(rng.uniform(*config.agent_outage_minutes)))

    def _windows_of(self, minutes: float) -> int:
        return max(1, round(minutes * 60.0 / self._seconds))

    def _reclaim_node(self, node: _Node, index: int, offset: int, downtime: int) -> None:
        """The provider takes the machine ``offset`` seconds into window ``index``: its pods end
        then, unreported (the agent dies with the node), and are recreated as new pods."""
        moment = index * self._seconds + offset
        for job in list(node.jobs.values()):
            self._remove(job)
            remaining = job.finished - moment
            if remaining > 0:
                self.stats.jobs_reclaimed += 1
                self._resubmit(job, remaining, index)
            else:
                self.stats.jobs_finished += 1  # it had ended just before the machine went
        node.back_at = index + max(1, downtime)
        node.assignments = None
        self.stats.spot_reclaims += 1
        self.stats.windows_unreported += max(1, downtime)

    def _silence_node(self, node: _Node, index: int, windows: int) -> None:
        node.silent_from = index
        node.silent_until = index + windows
        self.stats.agent_outages += 1

    def _blocked_changed(self) -> bool:
        current = frozenset(self._blocked)
        if current != self._last_blocked:
            self._last_blocked = current
            return True
        return False

    def _submit(self, index: int, start: datetime) -> bool:
        rng = self._rng
        hours = self._seconds / 3600.0
        factor = arrival_factor(start, self.config.start) if self.config.diurnal else 1.0
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

    def _request(self, rng: random.Random, tenant: TenantSpec) -> Request:
        draw = rng.random()
        if draw < tenant.mig_share and self._mig_capacity:
            return "mig"
        if draw < tenant.mig_share + tenant.shared_share and self._shared_capacity:
            return "shared"
        if self._whole_capacity:
            return "whole"
        return "mig" if self._mig_capacity else "shared"

    def _new_job(self, tenant: TenantSpec) -> _Job:
        rng = self._rng
        inference = rng.random() < tenant.inference_share
        request = self._request(rng, tenant)
        profile: MigProfile | None = None
        gpus = 1
        if request == "whole":
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
        elif request == "mig":
            model = _weighted(rng, self._mig_capacity)
            spec = GPU_SPECS[model]
            profile = _weighted(rng, {p: MIG_PROFILE_WEIGHTS.get(p.slices, 0.1) for p in spec.mig_profiles})
        else:
            model = _weighted(rng, self._shared_capacity)
            spec = GPU_SPECS[model]
        workload = "infer" if inference else "train" if request == "whole" else "notebook"
        low, high = DURATION_MINUTES[workload]
        duration = max(1, round(math.exp(rng.uniform(math.log(low), math.log(high))) * 60.0))
        priority = _weighted(rng, tenant.priorities or self.config.priorities)
        if request == "whole":
            share = rng.randint(2, 4)
            cpu = Decimal(max(1, gpus * spec.host_cores_per_gpu * share // 4))
            memory = Decimal(max(1, gpus * spec.host_memory_gib_per_gpu * share // 4))
        else:
            cpu = rng.choice(SMALL_CPU_CORES)
            memory = rng.choice(SMALL_MEMORY_GIB)
        self._job_counter += 1
        number = self._job_counter
        pvc = None
        if workload != "notebook" and rng.random() < PVC_SHARE:
            claim_uid = str(uuid.uuid5(self._uid_namespace, f"pvc/{number}"))
            pvc = (claim_uid, f"data-{number:06d}", Decimal(rng.choice(PVC_GIB)))
        return self._job(
            number, tenant.name, workload, model, request, gpus, profile, duration, priority,
            base_util=rng.randint(*BASE_UTILIZATION[workload]),
            gpu_mem_percent=rng.randint(*GPU_MEMORY_PERCENT[workload]),
            cpu_percent=rng.randint(*CPU_PERCENT),
            host_mem_percent=rng.randint(*HOST_MEMORY_PERCENT),
            cpu=cpu, memory_gib=memory, ephemeral_gib=Decimal(rng.choice(EPHEMERAL_GIB)), pvc=pvc,
        )

    def _job(
        self, number: int, tenant: str, workload: str, model: str, request: Request, gpus: int,
        profile: MigProfile | None, duration: int, priority: int, **host: Any,
    ) -> _Job:
        pod_uid = str(uuid.uuid5(self._uid_namespace, f"job/{number}"))
        return _Job(
            number=number, tenant=tenant, workload=workload, model=model, request=request, gpus=gpus,
            mig_profile=profile, duration=duration, priority=priority,
            pod=f"{workload}-{number:06d}-{pod_uid[:5]}", pod_uid=pod_uid, submitted=self._index, **host,
        )

    def _resubmit(self, job: _Job, remaining: int, index: int) -> None:
        """The pod's controller recreates it: a new pod (name, UID) for the rest of the run, same volume."""
        self._job_counter += 1
        copy = self._job(
            self._job_counter, job.tenant, job.workload, job.model, job.request, job.gpus, job.mig_profile,
            remaining, job.priority, base_util=job.base_util, gpu_mem_percent=job.gpu_mem_percent,
            cpu_percent=job.cpu_percent, host_mem_percent=job.host_mem_percent, cpu=job.cpu,
            memory_gib=job.memory_gib, ephemeral_gib=job.ephemeral_gib, pvc=job.pvc,
        )
        copy.submitted = index
        self._queue.append(copy)
        self._queued_per_tenant[copy.tenant] += 1
        self._dirty = True

    def _schedule(self, index: int) -> None:
        waiting: list[_Job] = []
        reserved: set[str] = set()  # models held for a starving whole-GPU job
        reserve_after = self._reserve_after
        for job in self._queue:
            if job.tenant in self._blocked:
                waiting.append(job)
                continue
            whole = job.request == "whole"
            if (whole and job.model in reserved) or not self._place(job):
                if whole and reserve_after is not None and index - job.submitted >= reserve_after:
                    reserved.add(job.model)
                waiting.append(job)
                continue
            self._queued_per_tenant[job.tenant] -= 1
            job.started = index * self._seconds
            job.end_window = (job.finished - 1) // self._seconds
            self._ends.setdefault(job.end_window, []).append(job)
            self._running[job.pod_uid] = job
            node = job.node
            assert node is not None
            node.jobs[job.pod_uid] = job
            node.assignments = None
            identity = PodIdentity(
                job.tenant, job.tenant, job.pod, job.pod_uid, node.capacity_type, job.priority
            )
            job.sampler = PodSampler(
                self.config.cluster, node.name, node.spec.model, identity, job.devices, cpu_request=job.cpu,
                memory_request=int(job.memory_gib * GIB), ephemeral_gib=job.ephemeral_gib, pvc=job.pvc,
            )
            self.stats.jobs_started += 1
        self._queue = waiting

    def _place(self, job: _Job) -> bool:
        for node in self._nodes_by_model.get(job.model, ()):
            if node.gone:
                continue
            placed = self._devices_on(node, job)
            if placed is not None:
                job.node = node
                job.devices, job.slots = placed
                return True
        return False

    def _devices_on(self, node: _Node, job: _Job) -> tuple[tuple[Device, ...], tuple[int, ...]] | None:
        """Take the devices the device plugin would hand ``job`` on ``node``; None if they are not free."""
        spec, ns, gen = node.spec, self._uid_namespace, node.generation
        if job.request == "whole":
            if len(node.free_whole) < job.gpus:
                return None
            chosen = best_free_set(node.free_whole, job.gpus, node.links)
            assert chosen is not None  # enough GPUs are free
            node.free_whole = [g for g in node.free_whole if g not in chosen]
            devices = tuple(
                Device(g, u, u, "whole", ONE, spec.memory_bytes)
                for g in chosen
                for u in (gpu_uuid(ns, node.name, g, gen),)
            )
            return devices, (0,) * len(devices)
        if job.request == "mig":
            assert job.mig_profile is not None
            for gpu, slot in node.free_mig:
                profile = spec.mig_layout[slot]
                if profile.name == job.mig_profile.name:
                    node.free_mig.remove((gpu, slot))
                    u = mig_uuid(ns, node.name, gpu, slot, gen)
                    share = Decimal(profile.slices) / Decimal(spec.mig_slices)
                    return (Device(gpu, u, u, "mig", share, profile.memory_gb * GIB, profile.name),), (slot,)
            return None
        if not node.free_replicas:
            return None
        # The GPU with the most free replicas (the fewest pods), lowest index on a tie.
        gpu = max(node.free_replicas, key=lambda g: (len(node.free_replicas[g]), -g))
        if not node.free_replicas[gpu]:
            return None
        replica = node.free_replicas[gpu].pop(0)
        replicas = self.config.time_slice_replicas
        u = gpu_uuid(ns, node.name, gpu, gen)
        share = ONE / Decimal(replicas)
        device = Device(gpu, f"{u}::{replica}", u, "shared", share, spec.memory_bytes // replicas)
        return (device,), (replica,)

    def _remove(self, job: _Job) -> None:
        self._running.pop(job.pod_uid, None)
        node = job.node
        assert node is not None
        node.jobs.pop(job.pod_uid, None)
        node.assignments = None
        self._dirty = True
        if node.gone:
            return
        for device, slot in zip(job.devices, job.slots, strict=True):
            if device.kind == "whole":
                node.free_whole.append(device.index)
            elif device.kind == "mig":
                node.free_mig.append((device.index, slot))
            else:
                node.free_replicas[device.index].append(slot)
                node.free_replicas[device.index].sort()
        node.free_whole.sort()
        node.free_mig.sort()

    # ------------------------------------------------------------------ samples

    def _node_window(self, node: _Node, index: int, start_iso: str, end_iso: str) -> list[dict[str, Any]]:
        """What the node's agent reports for window ``index``: every pod on it, telemetry included."""
        begin, finish = index * self._seconds, (index + 1) * self._seconds
        jobs = list(node.jobs.values())
        # Pods per device in this window: a time-sliced GPU's telemetry is the GPU's, not one pod's.
        holders: dict[str, int] = {}
        for job in jobs:
            for device in job.devices:
                holders[device.uuid] = holders.get(device.uuid, 0) + 1
        rng_random = self._telemetry.random
        out: list[dict[str, Any]] = []
        for job in jobs:
            assert job.sampler is not None
            fraction = held_fraction(job.started, job.finished, begin, finish)
            readings = []
            for device in job.devices:
                pct = job.base_util + int(rng_random() * 13) - 6
                pct = 0 if pct < 0 else 100 if pct > 100 else pct
                readings.append(self._reading(node, job, device, pct, holders[device.uuid] == 1))
            cpu_pct = max(1, job.cpu_percent + int(rng_random() * 11) - 5)
            mem_pct = min(100, max(1, job.host_mem_percent + int(rng_random() * 7) - 3))
            usage = HostUsage(job.cpu * cpu_pct / 100, int(job.memory_gib * GIB) * mem_pct // 100)
            out.extend(job.sampler.window(start_iso, end_iso, fraction, readings, usage))
        return out

    def _reading(self, node: _Node, job: _Job, device: Device, pct: int, exclusive: bool) -> Reading:
        """NVML's view of the device (collectors/sim/samples.py): MIG and shared GPUs have memory only."""
        memory = device.memory_bytes * job.gpu_mem_percent // 100
        key = (node.spec.model, memory, pct if exclusive and device.kind != "mig" else -1)
        cached = self._readings.get(key)
        if cached is not None:
            return cached
        memory_text = f"{memory}.000000"
        if key[2] < 0:
            reading = Reading(memory_used_bytes=memory_text)
        else:
            spec = node.spec
            p10 = spec.idle_watts * 10 + (spec.tdp_watts - spec.idle_watts) * pct // 10  # tenths of a watt
            energy = p10 * self._seconds
            reading = Reading(
                utilization=_UTIL_TEXT[pct],
                memory_used_bytes=memory_text,
                power_watts=f"{p10 // 10}.{p10 % 10}00000",
                energy_joules=f"{energy // 10}.{energy % 10}00000",
            )
        self._readings[key] = reading
        return reading

    def _backfill(self, node: _Node, index: int) -> list[dict[str, Any]]:
        """The returning agent's backfill: the last ``max_backfill_windows`` missed windows, from the
        pods on the node now, each from its start; quantities at the requests, no telemetry."""
        assert node.silent_from is not None
        missed = index - node.silent_from
        recent = min(missed, self.config.max_backfill_windows)
        self.stats.windows_unreported += missed - recent
        self.stats.windows_backfilled += recent
        out: list[dict[str, Any]] = []
        for window in range(index - recent, index):
            start = self._origin + timedelta(seconds=window * self._seconds)
            start_iso, end_iso = start.isoformat(), (start + self._window).isoformat()
            begin, finish = window * self._seconds, (window + 1) * self._seconds
            for job in node.jobs.values():
                assert job.sampler is not None
                fraction = held_fraction(job.started, job.finished, begin, finish)
                if fraction > 0:
                    out.extend(job.sampler.window(start_iso, end_iso, fraction, None, HostUsage(), True))
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
