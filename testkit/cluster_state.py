"""API objects (JSON form, as the API server returns them) for agent tests and benchmarks."""

from __future__ import annotations

from typing import Any


def pod(
    namespace: str,
    name: str,
    uid: str,
    *,
    node: str = "gpu-node-1",
    phase: str = "Running",
    start: str | None = "2026-11-03T09:00:00Z",
    cpu: str | None = None,
    memory: str | None = None,
    ephemeral: str | None = None,
    gpus: int = 0,
    priority: int | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    claims: tuple[str, ...] = (),
    init_containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    if ephemeral:
        requests["ephemeral-storage"] = ephemeral
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}],
        "volumes": [{"name": c, "persistentVolumeClaim": {"claimName": c}} for c in claims],
    }
    if priority is not None:
        spec["priority"] = priority
    if init_containers:
        spec["initContainers"] = init_containers
    status: dict[str, Any] = {"phase": phase}
    if start:
        status["startTime"] = start
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": spec,
        "status": status,
    }


def pvc(namespace: str, name: str, uid: str, capacity: str | None, request: str = "1Gi") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Bound"}
    if capacity:
        status["capacity"] = {"storage": capacity}
    return {
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"resources": {"requests": {"storage": request}}},
        "status": status,
    }
