"""The simulated fleet's nodes and its scheduler: placing queued pods on free devices.

Whole-GPU jobs go first-fit on the nodes of their model and get the best-connected free set
(collectors/sim/allocation.py); a MIG job takes a free MIG device of its profile; a time-sliced
job gets one replica on the GPU with the fewest pods. Jobs that do not fit wait in a FIFO queue
re-scanned every window (backfill); a whole-GPU job waiting ``reserve_after_seconds`` for room
stops backfill on its model (one the admission filter refused does not). A tenant's queue is
capped (``max_queue_per_tenant``), and a blocked tenant's jobs wait (a quota ``block`` action).

With an admission filter (``Scheduler.admit``, what kube-scheduler's extender is to it) a
job is placed only on a node the filter passes among those where it fits; the filter sees
the job and the names of those nodes (kube-scheduler's own filtering first, then the
extender's), and a job it passes nowhere waits and is asked about again at the next pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from collectors.sim.allocation import LinkTable, best_free_set
from collectors.sim.config import FleetConfig
from collectors.sim.hardware import GIB, GPU_SPECS, GpuSpec, gpu_uuid, mig_uuid, node_topology
from collectors.sim.samples import ONE, Device, PodIdentity, PodSampler
from collectors.sim.stats import FleetStats
from collectors.sim.workload import Job, Request
from gpumeter.core.kube import schedulable_units
from gpumeter.core.models import CAPACITY_TYPES, CapacityType, NodeTopology


@dataclass(slots=True)
class Node:
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
    jobs: dict[str, Job] = field(default_factory=dict)  # pod_uid -> job placed here, in start order
    back_at: int | None = None  # reclaimed: the window it exists again
    silent_from: int | None = None  # agent outage: first silent window
    silent_until: int = 0  # agent outage: first window reported again
    reported: bool = True  # reported the window last stepped
    assignments: list[dict[str, Any]] | None = None  # JSON-ready, rebuilt after a change

    @property
    def gone(self) -> bool:
        return self.back_at is not None

    def reports(self, index: int) -> bool:
        """Whether the node's agent reports window ``index`` (it exists and is not silent)."""
        if self.gone:
            return False
        return self.silent_from is None or index >= self.silent_until


# (job, names of the nodes it fits on) -> the names the filter lets it run on.
AdmissionFilter = Callable[[Job, Sequence[str]], Sequence[str]]


class Scheduler:
    """The fleet's nodes, the queue of waiting jobs and the jobs running on the nodes."""

    def __init__(
        self, config: FleetConfig, uid_namespace: uuid.UUID, at: datetime, stats: FleetStats
    ) -> None:
        self.config = config
        self.stats = stats
        self._uid_namespace = uid_namespace
        self._seconds = config.window_seconds
        self.nodes = self._build_nodes(at)
        self.nodes_by_model: dict[str, list[Node]] = {}
        for node in self.nodes:
            self.nodes_by_model.setdefault(node.spec.model, []).append(node)
        self.queue: list[Job] = []
        self._queued_per_tenant: dict[str, int] = {t.name: 0 for t in config.tenant_specs}
        self.running: dict[str, Job] = {}  # pod_uid -> job, in start order
        self._ends: dict[int, list[Job]] = {}
        self._blocked: set[str] = set()
        self._last_blocked: frozenset[str] = frozenset()
        self._evict: dict[str, int | None] = {}  # pod uid -> when (seconds since the start; None: now)
        self._ending_evicted: set[str] = set()  # evicted at a moment of a window not stepped yet
        self.admit: AdmissionFilter | None = None
        self._refused: set[str] = set()  # pod uids the filter refused in this pass
        self.dirty = False  # capacity freed since the last scheduling pass
        reserve = config.reserve_after_seconds
        self._reserve_after = None if reserve is None else -(-reserve // config.window_seconds)

    # ------------------------------------------------------------------ nodes

    def _build_nodes(self, at: datetime) -> list[Node]:
        config = self.config
        mix = [(kind, config.capacity_mix.get(kind, 0.0)) for kind in CAPACITY_TYPES]
        mix = [(kind, weight) for kind, weight in mix if weight > 0]
        total = sum(weight for _, weight in mix)
        current = {kind: 0.0 for kind, _ in mix}
        nodes: list[Node] = []
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
                topology = self._topology(name, spec, gpus, mig_gpus, 0, at, shared)
                node = Node(
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
        self, name: str, spec: GpuSpec, gpus: int, mig_gpus: int, generation: int, at: datetime, shared: bool
    ) -> NodeTopology:
        return node_topology(
            cluster=self.config.cluster,
            node=name,
            spec=spec,
            gpus_per_node=gpus,
            namespace=self._uid_namespace,
            at=at,
            mig_gpus=mig_gpus,
            generation=generation,
            replicas=self.config.time_slice_replicas if shared else 1,
        )

    def _reset_free(self, node: Node) -> None:
        if node.shared:
            node.free_whole, node.free_mig = [], []
            node.free_replicas = {g.index: list(range(schedulable_units(g))) for g in node.topology.gpus}
            return
        node.free_whole = list(range(node.mig_gpus, node.gpus))
        node.free_mig = [(g, s) for g in range(node.mig_gpus) for s in range(len(node.spec.mig_layout))]
        node.free_replicas = {}

    def replace_machine(self, node: Node, at: datetime) -> None:
        """A reclaimed node back under its name on another machine: new GPU UUIDs, a new topology."""
        node.generation += 1
        node.topology = self._topology(node.name, node.spec, node.gpus, node.mig_gpus, node.generation, at,
                                       node.shared)
        node.links = LinkTable.from_topology(node.topology)
        self._reset_free(node)
        node.assignments = None
        self.dirty = True

    def node(self, name: str) -> Node | None:
        return next((node for node in self.nodes if node.name == name), None)

    def capacity(self, request: Request) -> dict[str, int]:
        """Free units of each model for a kind of request (at start: the fleet's capacity)."""
        capacity: dict[str, int] = {}
        for model, nodes in self.nodes_by_model.items():
            if request == "whole":
                units = sum(len(n.free_whole) for n in nodes)
            elif request == "mig":
                units = sum(len(n.free_mig) for n in nodes)
            else:
                units = sum(len(r) for n in nodes for r in n.free_replicas.values())
            if units:
                capacity[model] = units
        return capacity

    # ------------------------------------------------------------------ queue

    def enqueue(self, job: Job) -> bool:
        """Queue a submitted job; False (dropped) when its tenant's queue is full."""
        if self._queued_per_tenant[job.tenant] >= self.config.max_queue_per_tenant:
            return False
        self.queue.append(job)
        self._queued_per_tenant[job.tenant] += 1
        return True

    def requeue(self, job: Job) -> None:
        """Queue a job whatever the cap (a recreated pod, an explicit submission); placed at the next step."""
        self.queue.append(job)
        self._queued_per_tenant[job.tenant] = self._queued_per_tenant.get(job.tenant, 0) + 1
        self.dirty = True

    def set_admission(self, tenant: str, allowed: bool) -> None:
        if allowed:
            self._blocked.discard(tenant)
        else:
            self._blocked.add(tenant)

    def blocked_changed(self) -> bool:
        current = frozenset(self._blocked)
        if current != self._last_blocked:
            self._last_blocked = current
            return True
        return False

    def request_eviction(self, pod_uid: str, at_second: int | None = None) -> bool:
        """Evict a running pod: at the start of the next window stepped (``at_second`` None), or
        at ``at_second`` (seconds since the fleet's start), billed up to then."""
        if pod_uid not in self.running or pod_uid in self._evict:
            return False
        self._evict[pod_uid] = at_second
        return True

    def evict_requested(self, index: int) -> None:
        """Carry out the evictions asked for before window ``index`` is stepped. One timed inside
        or after that window ends the pod there (its last sample bills the part it held, as the
        agent bills a terminated pod); one timed before it, or untimed, ends it before."""
        window_start = index * self._seconds
        for pod_uid, at_second in self._evict.items():
            job = self.running.get(pod_uid)
            if job is None:
                continue
            if at_second is None or at_second <= max(window_start, job.started):
                self.remove(job)
                self.stats.jobs_evicted += 1
            elif at_second < job.finished:
                job.duration = at_second - job.started
                job.end_window = (job.finished - 1) // self._seconds
                self._ends.setdefault(job.end_window, []).append(job)
                self._ending_evicted.add(pod_uid)
        self._evict.clear()

    def end_window(self, index: int) -> None:
        """Take off their nodes the pods that end in window ``index``."""
        for job in self._ends.pop(index, ()):
            if self.running.get(job.pod_uid) is job:
                self.remove(job)
                if job.pod_uid in self._ending_evicted:
                    self._ending_evicted.discard(job.pod_uid)
                    self.stats.jobs_evicted += 1
                else:
                    self.stats.jobs_finished += 1

    # ------------------------------------------------------------------ placement

    def schedule(self, index: int) -> None:
        self._refused.clear()
        waiting: list[Job] = []
        reserved: set[str] = set()  # models held for a starving whole-GPU job
        reserve_after = self._reserve_after
        for job in self.queue:
            if job.tenant in self._blocked:
                waiting.append(job)
                continue
            whole = job.request == "whole"
            if (whole and job.model in reserved) or not self._place(job):
                # Only a job starving for room reserves its model: one the admission filter
                # refused (a blocked tenant's) holds nothing, as kube-scheduler holds nothing
                # for a pod its extender refuses; it would stop backfill for as long as a
                # quota block lasts.
                if (whole and reserve_after is not None and index - job.submitted >= reserve_after
                        and job.pod_uid not in self._refused):
                    reserved.add(job.model)
                waiting.append(job)
                continue
            self._queued_per_tenant[job.tenant] -= 1
            job.started = index * self._seconds
            job.end_window = (job.finished - 1) // self._seconds
            self._ends.setdefault(job.end_window, []).append(job)
            self.running[job.pod_uid] = job
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
        self.queue = waiting

    def _place(self, job: Job) -> bool:
        nodes = [node for node in self.nodes_by_model.get(job.model, ()) if not node.gone]
        if self.admit is not None:
            fitting = [node for node in nodes if self._fits(node, job)]
            if not fitting:
                return False
            passed = set(self.admit(job, [node.name for node in fitting]))
            nodes = [node for node in fitting if node.name in passed]
            if not nodes:
                self._refused.add(job.pod_uid)
                self.dirty = True  # asked again at the next pass, as kube-scheduler retries
        for node in nodes:
            placed = self._devices_on(node, job)
            if placed is not None:
                job.node = node
                job.devices, job.slots = placed
                return True
        return False

    @staticmethod
    def _fits(node: Node, job: Job) -> bool:
        """Whether ``_devices_on`` would find the job's devices free on the node."""
        if job.request == "whole":
            return len(node.free_whole) >= job.gpus
        if job.request == "mig":
            assert job.mig_profile is not None
            name = job.mig_profile.name
            return any(node.spec.mig_layout[slot].name == name for _, slot in node.free_mig)
        return any(node.free_replicas.values())

    def _devices_on(self, node: Node, job: Job) -> tuple[tuple[Device, ...], tuple[int, ...]] | None:
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

    def remove(self, job: Job) -> None:
        """The pod leaves its node (ended, evicted or reclaimed); its devices are free again."""
        self.running.pop(job.pod_uid, None)
        node = job.node
        assert node is not None
        node.jobs.pop(job.pod_uid, None)
        node.assignments = None
        self.dirty = True
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
