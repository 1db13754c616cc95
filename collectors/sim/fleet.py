"""A seeded, deterministic simulated GPU cluster that emits contract-1 UsageSamples.

The simulated fleet stands in for NVML + kubelet on machines without GPUs (the demo,
tests, benchmarks). It emits what node agents would (collectors/agent/samples.py), so a
dashboard built on the demo reads production data the same way; it is never presented as
NVML: every sample carries the label ``gpumeter.io/source: simulated``
(collectors/sim/samples.py states the shape rules).

Model
-----
The jobs are drawn in collectors/sim/workload.py, placed by collectors/sim/scheduler.py;
reclaims and outages happen in collectors/sim/events.py. This module composes them and reports.

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
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from collectors.sim.config import DEFAULT_START, DEFAULT_TENANTS, FleetConfig, TenantSpec
from collectors.sim.events import NodeEvents
from collectors.sim.hardware import GIB, GPU_SPECS
from collectors.sim.kube_objects import node_object, pod_object
from collectors.sim.samples import (
    CONTAINER,
    SOURCE_LABEL,
    Device,
    HostUsage,
    Reading,
    held_fraction,
    six,
)
from collectors.sim.scheduler import AdmissionFilter, Node, Scheduler
from collectors.sim.stats import FleetStats
from collectors.sim.workload import Job, Request, Workload
from gpumeter.core.models import (
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
    "SimulatedFleet",
    "TenantSpec",
]

_UTIL_TEXT: tuple[str, ...] = tuple(six(Decimal(p).scaleb(-2)) for p in range(101))


class SimulatedFleet:
    """A deterministic cluster simulation; see the module docstring for the model."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        # Jobs, telemetry and events draw from streams of their own (a string seed hashes with
        # SHA-512): a silent node draws no telemetry and leaves the jobs as they would be.
        self._telemetry = random.Random(f"gpumeter-sim-telemetry/{config.seed}")
        uid_namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"gpumeter-sim/{config.cluster}/{config.seed}")
        self._window = config.window
        self._seconds = config.window_seconds
        self._origin = config.start.astimezone(UTC)
        self._clock = self._origin
        self._index = 0
        self.stats = FleetStats()
        self._scheduler = Scheduler(config, uid_namespace, self._clock, self.stats)
        scheduler = self._scheduler
        self._workload = Workload(
            config, uid_namespace,
            {"whole": scheduler.capacity("whole"), "mig": scheduler.capacity("mig"),
             "shared": scheduler.capacity("shared")},
            {model: max(len(node.free_whole) for node in nodes)
             for model, nodes in scheduler.nodes_by_model.items()},
        )
        self._events = NodeEvents(config, scheduler, self._workload, self.stats)
        self._readings: dict[tuple[str, int, int], Reading] = {}  # immutable, so shared

    # ------------------------------------------------------------------ public API

    @property
    def clock(self) -> datetime:
        """Start of the next window :meth:`step` will produce (UTC)."""
        return self._clock

    @property
    def window_index(self) -> int:
        return self._index

    def node_names(self) -> list[str]:
        return [node.name for node in self._scheduler.nodes]

    def node_capacity_types(self) -> dict[str, CapacityType]:
        return {node.name: node.capacity_type for node in self._scheduler.nodes}

    def time_sliced_nodes(self) -> list[str]:
        return [node.name for node in self._scheduler.nodes if node.shared]

    def topology(self) -> list[NodeTopology]:
        """GPU layout of every node that exists now (a reclaimed spot node has none until it is back)."""
        return [node.topology for node in self._scheduler.nodes if not node.gone]

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
        for node in self._scheduler.nodes:
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
        for job in self._scheduler.running.values():
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

    def evict(self, pod_uid: str, at: datetime | None = None) -> bool:
        """Ask the fleet to evict a running pod. Without ``at`` it emits no samples from the next
        window on (the demo's fleet time jumps a window at a time). With ``at`` (a fleet run in
        real time, where the eviction lands inside the window being metered) the pod ends at
        that moment, rounded up to the second: the window it ends in bills the part it held.

        Returns False when no such pod is running. The evicted job is not resubmitted.
        """
        at_second = None if at is None else math.ceil((at - self._origin).total_seconds())
        return self._scheduler.request_eviction(pod_uid, at_second)

    def set_admission_filter(self, admit: AdmissionFilter | None) -> None:
        """Ask ``admit`` before placing a job (collectors/sim/scheduler.py): the extender's filter."""
        self._scheduler.admit = admit

    def kube_pods(self, annotations: Mapping[str, Mapping[str, str]] | None = None,
                  namespace: str | None = None) -> list[dict[str, Any]]:
        """Running and queued pods as the API server lists them (collectors/sim/kube_objects.py);
        ``annotations``: by pod uid, what was written on the pods; ``namespace``: only its pods
        (a tenant's namespace is named after it)."""
        notes = annotations or {}
        jobs = [*self._scheduler.running.values(), *self._scheduler.queue]
        if namespace is not None:
            jobs = [job for job in jobs if job.tenant == namespace]
        return [pod_object(job, self._origin, self._seconds, notes.get(job.pod_uid)) for job in jobs]

    def kube_nodes(self) -> list[dict[str, Any]]:
        """The nodes that exist now as the API server lists them."""
        replicas = self.config.time_slice_replicas
        return [node_object(node.name, node.spec.model, node.capacity_type,
                            node.gpus * replicas if node.shared else node.gpus - node.mig_gpus)
                for node in self._scheduler.nodes if not node.gone]

    def tenants(self) -> list[str]:
        return [spec.name for spec in self.config.tenant_specs]

    def set_admission(self, tenant: str, allowed: bool) -> None:
        """Block (or unblock) placement of a tenant's queued jobs: a quota ``block`` action."""
        self._scheduler.set_admission(tenant, allowed)

    def submit(
        self, tenant: str, *, model: str, duration_seconds: int, request: Request = "whole", gpus: int = 1,
        mig_profile: str | None = None, priority: int = 0, cpu: Decimal = Decimal(1),
        memory_gib: Decimal = Decimal(4), ephemeral_gib: Decimal = Decimal(10),
        pvc_gib: Decimal | None = None, idle: bool = False,
    ) -> str:
        """Queue one job explicitly (tests, scripted scenarios); it is placed at the next step.

        ``idle``: the pod's GPUs show 0 % utilization throughout (a forgotten notebook).
        Returns the pod UID. Raises ValueError for a request the fleet cannot describe.
        """
        if GPU_SPECS.get(model) is None or model not in self._scheduler.nodes_by_model:
            raise ValueError(f"no node of model {model!r} in this fleet")
        job = self._workload.explicit(
            tenant, self._index, model=model, duration_seconds=duration_seconds, request=request, gpus=gpus,
            mig_profile=mig_profile, priority=priority, cpu=cpu, memory_gib=memory_gib,
            ephemeral_gib=ephemeral_gib, pvc_gib=pvc_gib,
        )
        job.idle = idle
        self._scheduler.requeue(job)
        self.stats.jobs_submitted += 1
        return job.pod_uid

    def reclaim(self, node_name: str, offset_seconds: int, downtime_windows: int) -> bool:
        """Reclaim a spot node ``offset_seconds`` into the next window, for ``downtime_windows``
        windows (the random events do the same; tests call this directly). False when the node
        is not a spot node that exists and reports."""
        node = self._scheduler.node(node_name)
        if node is None or node.capacity_type != "spot" or node.gone or node.silent_from is not None:
            return False
        self._events.force_reclaim(node, offset_seconds, downtime_windows)
        return True

    def silence(self, node_name: str, windows: int) -> bool:
        """Stop the node's agent for the next ``windows`` windows (an outage); False if it cannot."""
        node = self._scheduler.node(node_name)
        if node is None or node.gone or node.silent_from is not None or windows < 1:
            return False
        self._events.force_outage(node, windows)
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

    # ------------------------------------------------------------------ simulation

    def _advance(self) -> list[dict[str, Any]]:
        index = self._index
        start = self._clock
        end = start + self._window
        scheduler = self._scheduler

        self._events.restore(index, start)
        scheduler.evict_requested(index)
        submitted = self._submit(index, start)
        if submitted or scheduler.dirty or scheduler.blocked_changed():
            scheduler.dirty = False
            scheduler.schedule(index)
        self._events.draw(index)

        out: list[dict[str, Any]] = []
        start_iso, end_iso = start.isoformat(), end.isoformat()
        for node in scheduler.nodes:
            node.reported = node.reports(index)
            if node.reported:
                if node.jobs:
                    out.extend(self._node_window(node, index, start_iso, end_iso))
                if node.silent_until == index and node.silent_from is not None:
                    out.extend(self._backfill(node, index))
                    node.silent_from = None

        scheduler.end_window(index)

        self._index = index + 1
        self._clock = end
        self.stats.windows += 1
        self.stats.samples += len(out)
        self.stats.running = len(scheduler.running)
        self.stats.queued = len(scheduler.queue)
        return out

    def _submit(self, index: int, start: datetime) -> bool:
        submitted = False
        for job in self._workload.arrivals(index, start):
            self.stats.jobs_submitted += 1
            if not self._scheduler.enqueue(job):
                self.stats.jobs_dropped += 1
                continue
            submitted = True
        return submitted

    # ------------------------------------------------------------------ samples

    def _node_window(self, node: Node, index: int, start_iso: str, end_iso: str) -> list[dict[str, Any]]:
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
                pct = 0 if pct < 0 or job.idle else 100 if pct > 100 else pct
                readings.append(self._reading(node, job, device, pct, holders[device.uuid] == 1))
            cpu_pct = max(1, job.cpu_percent + int(rng_random() * 11) - 5)
            mem_pct = min(100, max(1, job.host_mem_percent + int(rng_random() * 7) - 3))
            usage = HostUsage(job.cpu * cpu_pct / 100, int(job.memory_gib * GIB) * mem_pct // 100)
            out.extend(job.sampler.window(start_iso, end_iso, fraction, readings, usage))
        return out

    def _reading(self, node: Node, job: Job, device: Device, pct: int, exclusive: bool) -> Reading:
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

    def _backfill(self, node: Node, index: int) -> list[dict[str, Any]]:
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

