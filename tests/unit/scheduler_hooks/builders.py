"""Test builders: node topologies as the agent publishes them, allocations, pods and Volcano tasks.

Layouts are written out from the hardware facts, not taken from the simulator:
8x H100 SXM on NVSwitch (every pair NV18), 8x A100 SXM (every pair NV12), 4x L40S on PCIe
(pairs (0,1) and (2,3) on one switch, PIX; across, SYS or NODE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpumeter.core.models import GpuAssignment, GpuDevice, NodeAllocation, NodeTopology
from scheduler_hooks.cluster.placement import PlacementIndex

AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"


def topology(node: str, model: str, count: int, link: Callable[[int, int], str]) -> NodeTopology:
    gpus = [
        GpuDevice(index=i, uuid=f"GPU-{node}-{i}", model=model, numa_node=i * 2 // count)
        for i in range(count)
    ]
    links = {f"{a}-{b}": link(a, b) for a in range(count) for b in range(a + 1, count)}
    return NodeTopology(cluster="test", node=node, gpus=gpus, links=links, at=AT)


def h100(node: str = "h100-0") -> NodeTopology:
    return topology(node, "H100-SXM-80GB", 8, lambda a, b: "NV18")


def a100(node: str = "a100-0") -> NodeTopology:
    return topology(node, "A100-SXM-40GB", 8, lambda a, b: "NV12")


def l40s(node: str = "l40s-0", across: str = "SYS") -> NodeTopology:
    return topology(node, "L40S-48GB", 4, lambda a, b: "PIX" if a // 2 == b // 2 else across)


def pcie_with_bridge(node: str = "bridge-0") -> NodeTopology:
    """4 PCIe GPUs: (0,1) on one switch (PIX), (2,3) joined by an NVLink bridge (NV4), rest SYS."""
    classes = {(0, 1): "PIX", (2, 3): "NV4"}
    return topology(node, "A100-PCIE-80GB", 4, lambda a, b: classes.get((a, b), "SYS"))


def time_sliced_l4(node: str = "l4-ts-0", replicas: int = 4, count: int = 1) -> NodeTopology:
    """L4s the device plugin time-slices ``replicas`` ways each (PCIe, PHB between them)."""
    gpus = [
        GpuDevice(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA L4", replicas=replicas) for i in range(count)
    ]
    links = {f"{a}-{b}": "PHB" for a in range(count) for b in range(a + 1, count)}
    return NodeTopology(cluster="test", node=node, gpus=gpus, links=links, at=AT)


def shared_allocation(node: str, *holders: tuple[str, list[int]]) -> NodeAllocation:
    """One assignment per pod (name, GPU indices): pods sharing a time-sliced GPU list its index each."""
    assignments = [
        GpuAssignment(namespace="other", pod=name, pod_uid=f"uid-{name}", gpu_indices=indices)
        for name, indices in holders
    ]
    return NodeAllocation(cluster="test", node=node, assignments=assignments, at=AT)


def allocation(node: str, *indices: int, pod: str = "holder") -> NodeAllocation:
    assignments = [GpuAssignment(namespace="other", pod=pod, pod_uid=f"uid-{pod}", gpu_indices=list(indices))]
    return NodeAllocation(cluster="test", node=node, assignments=assignments if indices else [], at=AT)


SAMPLE_NODES = ["h100-a", "h100-b", "l40s-a", "l40s-b", "mystery"]


def sample_placement() -> PlacementIndex:
    """h100-a: 2 free (an NVLink pair); h100-b: 8 free; l40s-a: 4 free; l40s-b: 1 free; mystery: no record."""
    index = PlacementIndex()
    index.update_topology(h100("h100-a"))
    index.update_allocation(allocation("h100-a", 0, 1, 2, 3, 4, 5))
    index.update_topology(h100("h100-b"))
    index.update_topology(l40s("l40s-a"))
    index.update_topology(l40s("l40s-b"))
    index.update_allocation(allocation("l40s-b", 0, 1, 2))
    return index


def pod_json(
    *,
    namespace: str = "team-a",
    name: str = "trainer",
    uid: str = "uid-trainer",
    gpus: int | str | None = None,
    priority: int | None = None,
    annotations: Mapping[str, str] | None = None,
    containers: Iterable[Mapping[str, Any]] | None = None,
    init_containers: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A v1.Pod as the API server (and the scheduler) serialise it: lower-case json tags."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if containers is None:
        resources: dict[str, Any] = {}
        if gpus is not None:
            resources = {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}
        containers = [{"name": "main", "image": "trainer:1", "resources": resources}]
    spec: dict[str, Any] = {"containers": list(containers)}
    if init_containers is not None:
        spec["initContainers"] = list(init_containers)
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def container(name: str, *, limits: int | None = None, requests: int | None = None,
              restart_policy: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = {GPU: str(limits)}
    if requests is not None:
        resources["requests"] = {GPU: str(requests)}
    body: dict[str, Any] = {"name": name, "image": "busybox", "resources": resources}
    if restart_policy is not None:
        body["restartPolicy"] = restart_policy
    return body


def task_json(
    *,
    uid: str = "uid-trainer",
    namespace: str = "team-a",
    name: str = "trainer",
    milli_gpus: int = 0,
    priority: int = 1,
    annotations: Mapping[str, str] | None = None,
    node_name: str = "",
) -> dict[str, Any]:
    """A Volcano TaskInfo as encoding/json writes it: Go field names, TransactionContext flattened."""
    scalars = {GPU: milli_gpus} if milli_gpus else None
    resreq = {"MilliCPU": 4000, "Memory": 17179869184, "ScalarResources": scalars, "MaxTaskNum": 0}
    return {
        "UID": uid,
        "Job": f"{namespace}/job-{name}",
        "Name": name,
        "Namespace": namespace,
        "TaskRole": "worker",
        "Resreq": resreq,
        "InitResreq": dict(resreq),
        "NodeName": node_name,
        "EvictionOccurred": False,
        "JobAllocatedHyperNode": "",
        "Status": 1,
        "LastTransaction": None,
        "Priority": priority,
        "VolumeReady": False,
        "Preemptable": False,
        "BestEffort": False,
        "HasRestartableInitContainer": False,
        "SchGated": False,
        "RevocableZone": "",
        "NumaInfo": None,
        "Pod": pod_json(namespace=namespace, name=name, uid=uid, gpus=milli_gpus // 1000 or None,
                        annotations=annotations),
        "CustomBindErrHandlerSucceeded": False,
    }


def node_info_json(name: str, *, idle_milli_gpus: int = 8000) -> dict[str, Any]:
    """A Volcano NodeInfo: Go field names, the v1.Node inside with lower-case keys."""
    resource = {"MilliCPU": 96000, "Memory": 1099511627776, "ScalarResources": {GPU: idle_milli_gpus},
                "MaxTaskNum": 110}
    return {
        "Name": name,
        "Node": {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                 "spec": {}, "status": {"allocatable": {GPU: "8", "cpu": "96"}}},
        "State": {"Phase": 1, "Reason": ""},
        "Releasing": {"MilliCPU": 0, "Memory": 0, "ScalarResources": None, "MaxTaskNum": 0},
        "Pipelined": {"MilliCPU": 0, "Memory": 0, "ScalarResources": None, "MaxTaskNum": 0},
        "Idle": resource,
        "Used": {"MilliCPU": 0, "Memory": 0, "ScalarResources": None, "MaxTaskNum": 0},
        "Allocatable": resource,
        "Capacity": resource,
        "Tasks": {},
        "NumaInfo": None,
        "RevocableZone": "",
        "Others": {},
        "OversubscriptionNode": False,
        "OfflineJobEvicting": False,
    }
