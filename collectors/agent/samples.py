"""Turning one window of observations into contract-1 UsageSamples.

Billing rules (units *held* during the window):

* gpu: one sample per (pod, device): quantity 1 for a whole GPU, the MIG
  instance's share of its GPU (compute slices / slices per GPU) for a MIG
  device, 1/replicas for a time-sliced replica (of a GPU or of a MIG device:
  the two multiply). A DRA device (ResourceClaim) held by several pods is split
  evenly among them. Held = allocated by the kubelet (PodResources), whatever
  the NVML telemetry says; telemetry rides along.
* cpu: max(effective request, measured usage) cores.
* memory: max(effective request, working set) GiB.
* storage: the pod's ephemeral storage, max(request, used) GiB (device
  ``ephemeral``); and every PVC the pod mounts at its capacity, one sample per
  claim whose event_id omits node and pod (device ``pvc:<claim uid>``), so a
  claim mounted by several pods, on this node or others, bills once per window.
* A pod that started inside the window holds its units for the part of the
  window after its start: the quantity is scaled by that fraction.
* cpu, memory and storage are billed for Running pods; gpu for every pod the
  kubelet lists as holding a device (it holds it whether or not it runs yet),
  except pods that have finished: a Succeeded or Failed pod holds its units up
  to its last container's end (``finishedAt``) and nothing after, although the
  kubelet keeps listing its devices until the pod object is deleted (and may
  give the same device to the next pod meanwhile, which must not bill it twice).

Windows are aligned to the interval: ``window_start = floor(t / interval) * interval``;
the sample for a window is emitted just after it ends. ``event_id`` is a sha256
prefix of (cluster, node, pod UID, kind, device, window start), so a restarted
agent emits the same ids for the same window.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from collectors.agent.kubelet_stats import NodeStats, PodUsage
from collectors.agent.nvml_inventory import GpuInfo, MigInstance
from collectors.agent.nvml_telemetry import DeviceReading
from collectors.agent.podmeta import ClaimInfo, PodInfo
from collectors.agent.podresources import DeviceAllocation
from gpumeter.core.models import UsageSample, quantize_quantity

log = logging.getLogger(__name__)

GIB = Decimal(2) ** 30
_TELEMETRY_QUANTUM = Decimal("0.000001")
EVENT_ID_HEX = 40


def window_bounds(now: float, interval: int) -> tuple[datetime, datetime]:
    """The most recent *complete* window before ``now`` (epoch seconds)."""
    end = int(now // interval) * interval
    return datetime.fromtimestamp(end - interval, UTC), datetime.fromtimestamp(end, UTC)


def window_start_of(now: float, interval: int) -> int:
    return int(now // interval) * interval


def event_id(cluster: str, node: str, pod_uid: str, kind: str, device: str, window_start: datetime) -> str:
    """Deterministic idempotency key: same inputs, same id, across agent restarts."""
    stamp = window_start.astimezone(UTC).isoformat()
    material = "\x1f".join((cluster, node, pod_uid, kind, device, stamp)).encode()
    return hashlib.sha256(material).hexdigest()[:EVENT_ID_HEX]


def quantity(value: Decimal) -> Decimal:
    return quantize_quantity(value) if value else Decimal(0)


def _telemetry(value: Decimal | int | None) -> Decimal | None:
    if value is None:
        return None
    number = Decimal(value)
    return number.quantize(_TELEMETRY_QUANTUM) if number >= 0 else None


def held_fraction(pod: PodInfo, window_start: datetime, window_end: datetime) -> Decimal:
    """Part of the window the pod held its units: after its start and, once it finished, before its end.

    A pod that started earlier (or whose start is unknown) holds from the window's start. A
    Succeeded or Failed pod holds until its last container ended, and nothing when that end is
    not recorded: the kubelet keeps listing a finished pod's devices until the pod object is
    deleted, and may hand the same device to the next pod meanwhile.
    """
    begin = window_start
    if pod.start_time is not None and pod.start_time > window_start:
        begin = pod.start_time
    end = window_end
    if pod.finished:
        if pod.finish_time is None:
            return Decimal(0)
        end = min(end, pod.finish_time)
    if end <= begin:
        return Decimal(0)
    if begin == window_start and end == window_end:
        return Decimal(1)
    held = (end - begin).total_seconds()
    total = (window_end - window_start).total_seconds()
    return Decimal(str(round(held / total, 6)))


@dataclass
class BuildStats:
    unattributed: int = 0  # devices held by a pod the metadata cache does not know (yet)
    unknown_devices: int = 0  # devices NVML never reported
    finished_holders: int = 0  # devices still listed for a pod that had finished before the window
    invalid: int = 0  # samples that failed contract 1 (a bug: logged)
    # Samples withheld: their namespace's gpumeter.io/tenant label is not a tenant id (never folded).
    invalid_tenant_label: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)


@dataclass
class SampleBuilder:
    cluster: str
    node: str
    interval: int
    stats: BuildStats = field(default_factory=BuildStats)
    _warned_namespaces: set[str] = field(default_factory=set)

    def _make(self, **fields: Any) -> UsageSample | None:
        if fields.get("tenant") is None:  # a label that is no tenant id: billed to no one, counted
            self.stats.invalid_tenant_label += 1
            namespace = str(fields.get("namespace"))
            if namespace not in self._warned_namespaces:
                self._warned_namespaces.add(namespace)
                log.error("namespace %s: its gpumeter.io/tenant label is not a tenant id "
                          "([a-z0-9][a-z0-9-]{0,62}); its pods are not metered until it is fixed "
                          "(gpumeter_agent_invalid_tenant_label_total counts the samples withheld)",
                          namespace)
            return None
        try:
            return UsageSample(**fields)
        except ValueError as exc:
            self.stats.invalid += 1
            log.error(
                "dropping an invalid %s sample for pod %s: %s", fields.get("kind"), fields.get("pod"), exc
            )
            return None

    def _common(self, pod: PodInfo, kind: str, device: str, start: datetime, end: datetime) -> dict[str, Any]:
        return {
            "event_id": event_id(self.cluster, self.node, pod.uid, kind, device, start),
            "kind": kind,
            "cluster": self.cluster,
            "node": self.node,
            "tenant": pod.tenant,
            "namespace": pod.namespace,
            "pod": pod.name,
            "pod_uid": pod.uid,
            "window_start": start,
            "window_end": end,
            "capacity_type": pod.capacity_type,
            "priority": pod.priority,
        }

    def build(
        self,
        *,
        window_start: datetime,
        window_end: datetime,
        pods: Iterable[PodInfo],
        allocations: Iterable[DeviceAllocation],
        device_lookup: Callable[[str], tuple[GpuInfo, MigInstance | None] | None],
        readings: Mapping[str, DeviceReading],
        node_stats: NodeStats | None,
        claim_lookup: Callable[[str, str], ClaimInfo | None],
        pid_pods: Mapping[int, str] | None = None,
    ) -> list[UsageSample]:
        by_name = {(pod.namespace, pod.name): pod for pod in pods}
        samples: list[UsageSample] = []
        samples.extend(
            self._gpu_samples(
                window_start, window_end, by_name, allocations, device_lookup, readings, pid_pods or {}
            )
        )
        usage = node_stats.pods if node_stats is not None else {}
        seen_claims: set[str] = set()
        for pod in by_name.values():
            # Running pods, and pods that finished inside the window (for the part before their end).
            if not pod.uid or not (pod.phase == "Running" or pod.finished):
                continue
            fraction = held_fraction(pod, window_start, window_end)
            if fraction <= 0:
                continue
            samples.extend(
                self._host_samples(
                    pod, usage.get(pod.uid), fraction, window_start, window_end, claim_lookup, seen_claims
                )
            )
        return samples

    def _gpu_samples(
        self,
        start: datetime,
        end: datetime,
        by_name: Mapping[tuple[str, str], PodInfo],
        allocations: Iterable[DeviceAllocation],
        device_lookup: Callable[[str], tuple[GpuInfo, MigInstance | None] | None],
        readings: Mapping[str, DeviceReading],
        pid_pods: Mapping[int, str],
    ) -> list[UsageSample]:
        out: list[UsageSample] = []
        emitted: set[tuple[str, str]] = set()
        held: list[tuple[DeviceAllocation, PodInfo, Decimal, GpuInfo, MigInstance | None]] = []
        for allocation in allocations:
            pod = by_name.get((allocation.namespace, allocation.pod))
            if pod is None or not pod.uid:
                self.stats.unattributed += 1
                continue
            if (pod.uid, allocation.device_id) in emitted:
                continue  # the same device listed for two containers of one pod
            emitted.add((pod.uid, allocation.device_id))
            found = device_lookup(allocation.device_uuid)
            if found is None:
                self.stats.unknown_devices += 1
                continue
            fraction = held_fraction(pod, start, end)
            if fraction <= 0:
                if pod.finished:
                    self.stats.finished_holders += 1
                continue
            held.append((allocation, pod, fraction, *found))
        # Who holds each device during this window: distinct pods, finished ones left out (the kubelet
        # keeps listing a finished pod's device, and hands it to the next pod meanwhile).
        holders: dict[str, set[str]] = {}
        claimants: dict[str, set[str]] = {}  # a DRA device -> the live pods whose claims hold it
        for allocation, pod, *_ in held:
            holders.setdefault(allocation.device_uuid, set()).add(pod.uid)
            if allocation.claim is not None:
                claimants.setdefault(allocation.device_id, set()).add(pod.uid)
        for allocation, pod, fraction, gpu, mig in held:
            # A MIG device's share of its GPU, times the replica's share when the MIG device is time-sliced.
            share = allocation.share * mig.share if mig is not None else allocation.share
            if allocation.claim is not None:
                # A DRA device shared by several pods (one claim used by all, or a consumable share):
                # split evenly among them, so the device bills at most once.
                share = share / len(claimants[allocation.device_id])
            # Whole-GPU telemetry never rides on a slice of it (a MIG profile billed on its parent).
            slice_of_parent = mig is None and gpu.mig_enabled
            reading = None if slice_of_parent else readings.get(allocation.device_uuid)
            fields = self._common(pod, "gpu", allocation.device_id, start, end)
            fields.update(
                quantity=quantity(share * fraction),
                gpu_model=gpu.model,
                mig_profile=(mig.profile if mig is not None else None) or allocation.mig_profile,
                labels={
                    "gpu_uuid": allocation.device_uuid,
                    "gpu_index": str(gpu.index),
                    "container": allocation.container,
                },
            )
            if reading is not None and not reading.lost:
                exclusive = len(holders[allocation.device_uuid]) == 1
                memory_used: Decimal | int | None = reading.memory_used_bytes
                if not exclusive:
                    # A shared (time-sliced) GPU: this pod's processes only, when the PIDs are visible.
                    owned = [p.used_bytes or 0 for p in reading.processes if pid_pods.get(p.pid) == pod.uid]
                    memory_used = sum(owned) if owned else None
                fields.update(
                    utilization=_telemetry(reading.utilization) if exclusive else None,
                    memory_used_bytes=_telemetry(memory_used),
                    power_watts=_telemetry(reading.power_watts) if exclusive and mig is None else None,
                    energy_joules=_telemetry(reading.energy_joules) if exclusive and mig is None else None,
                )
            elif reading is not None and reading.lost:
                fields["labels"] = {**fields["labels"], "gpu_state": "lost"}
            sample = self._make(**fields)
            if sample is not None:
                out.append(sample)
        return out

    def _host_samples(
        self,
        pod: PodInfo,
        usage: PodUsage | None,
        fraction: Decimal,
        start: datetime,
        end: datetime,
        claim_lookup: Callable[[str, str], ClaimInfo | None],
        seen_claims: set[str],
    ) -> list[UsageSample]:
        out: list[UsageSample] = []
        requests = pod.requests
        cpu = requests.cpu_cores
        memory = requests.memory_bytes
        ephemeral = requests.ephemeral_bytes
        if usage is not None:
            cpu = max(cpu, usage.cpu_cores or Decimal(0))
            memory = max(memory, Decimal(usage.memory_working_set_bytes or 0))
            ephemeral = max(ephemeral, Decimal(usage.ephemeral_used_bytes or 0))
        for kind, amount, device in (
            ("cpu", cpu, "cpu"),
            ("memory", memory / GIB, "memory"),
            ("storage", ephemeral / GIB, "ephemeral"),
        ):
            if amount <= 0:
                continue
            fields = self._common(pod, kind, device, start, end)
            fields["quantity"] = quantity(amount * fraction)
            if kind == "memory" and usage is not None and usage.memory_working_set_bytes is not None:
                fields["memory_used_bytes"] = Decimal(usage.memory_working_set_bytes)
            if kind == "cpu" and usage is not None and usage.cpu_cores is not None and requests.cpu_cores > 0:
                fields["utilization"] = _telemetry(usage.cpu_cores / requests.cpu_cores)
            sample = self._make(**fields)
            if sample is not None:
                out.append(sample)
        for claim_name in pod.pvc_claims:
            claim = claim_lookup(pod.namespace, claim_name)
            if claim is None or claim.uid in seen_claims or claim.capacity_bytes <= 0:
                continue
            seen_claims.add(claim.uid)
            fields = self._common(pod, "storage", f"pvc:{claim.uid}", start, end)
            # Cluster-wide id: every pod (on any node) mounting the claim yields the same event_id.
            fields["event_id"] = event_id(self.cluster, "", "", "storage", f"pvc:{claim.uid}", start)
            fields["quantity"] = quantity(claim.capacity_bytes / GIB)  # a claim is held whole, from creation
            fields["labels"] = {"pvc": claim.name}
            sample = self._make(**fields)
            if sample is not None:
                out.append(sample)
        return out
