"""The node's allocation record (contract 8): which GPU indices the kubelet assigned, to which pod.

Built every window from the same PodResources list and pod metadata the samples of that
window are built from, so the two never disagree about who holds a GPU:

* one ``GpuAssignment`` per (namespace, pod, container) holding GPU devices, with the
  indices of those devices as NVML numbers them: a whole GPU's own index, a MIG device's
  parent GPU, a time-sliced replica (``<uuid>::<n>``) its GPU (so one index may appear under
  several pods);
* a pod that has finished (Succeeded or Failed) holds nothing at the record's time, although
  the kubelet keeps listing its devices until the pod object is deleted: its GPUs are free
  (the device plugin hands them to the next pod), exactly as the GPU samples stop billing
  them (samples.py);
* the pod's UID comes from the pod metadata; a pod the metadata does not know (yet) is
  still listed, with an empty UID, because its GPUs are taken all the same;
* a device NVML does not report has no index: it is left out and counted;
* no GPU assigned: an empty list, so a freed GPU is seen as free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from collectors.agent.nvml_inventory import GpuInfo, MigInstance
from collectors.agent.podmeta import PodInfo
from collectors.agent.podresources import DeviceAllocation
from gpumeter.core.models import GpuAssignment, NodeAllocation

DeviceLookup = Callable[[str], tuple[GpuInfo, MigInstance | None] | None]


@dataclass
class AllocationStats:
    records: int = 0
    unknown_devices: int = 0  # assigned devices NVML did not report: no index to publish
    unknown_pods: int = 0  # assignments of pods the metadata did not know (published with no UID)
    finished_pods: int = 0  # listings of finished pods, left out: their GPUs are free


@dataclass
class AllocationBuilder:
    cluster: str
    node: str
    stats: AllocationStats = field(default_factory=AllocationStats)

    def build(
        self,
        *,
        at: datetime,
        allocations: Iterable[DeviceAllocation],
        device_lookup: DeviceLookup,
        pods: Iterable[PodInfo],
    ) -> NodeAllocation:
        pods = list(pods)
        uids = {(pod.namespace, pod.name): pod.uid for pod in pods}
        finished = {(pod.namespace, pod.name) for pod in pods if pod.finished}
        held: dict[tuple[str, str, str], set[int]] = {}
        for allocation in allocations:
            if (allocation.namespace, allocation.pod) in finished:
                self.stats.finished_pods += 1
                continue
            found = device_lookup(allocation.device_uuid)
            if found is None:
                self.stats.unknown_devices += 1
                continue
            gpu, _mig = found  # a MIG device sits on its parent GPU: the parent's index
            key = (allocation.namespace, allocation.pod, allocation.container)
            held.setdefault(key, set()).add(gpu.index)
        assignments = []
        for (namespace, pod, container), indices in sorted(held.items()):
            uid = uids.get((namespace, pod), "")
            if not uid:
                self.stats.unknown_pods += 1
            assignments.append(
                GpuAssignment(
                    namespace=namespace,
                    pod=pod,
                    pod_uid=uid,
                    container=container,
                    gpu_indices=sorted(indices),
                )
            )
        self.stats.records += 1
        return NodeAllocation(cluster=self.cluster, node=self.node, assignments=assignments, at=at)
