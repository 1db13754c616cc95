"""The simulated fleet's pods, nodes and namespaces as the Kubernetes API server shows them (JSON).

What the demo's simulated cluster answers in place of an API server (cluster_gateway.py) and
what its scheduler sends the extender in the kube-scheduler wire format (extender_client.py):
the fields gpumeter's hooks read, nothing more. A tenant's pods live in the namespace of the
tenant's name; a whole-GPU or time-sliced job asks ``nvidia.com/gpu``, a MIG job its profile's
resource (``nvidia.com/mig-<profile>``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from collectors.sim.workload import Job
from gpumeter.core.kube import CAPACITY_TYPE_LABEL, GPU_RESOURCE, TENANT_LABEL

GPU_MODEL_LABEL = "nvidia.com/gpu.product"


def rfc3339(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def job_resources(job: Job) -> dict[str, str]:
    if job.request == "mig":
        assert job.mig_profile is not None
        return {f"nvidia.com/mig-{job.mig_profile.name}": "1"}
    return {GPU_RESOURCE: str(job.gpus if job.request == "whole" else 1)}


def pod_object(job: Job, origin: datetime, window_seconds: int,
               annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job's pod: bound and Running once placed, Pending (no node) while queued."""
    created = origin + timedelta(seconds=job.submitted * window_seconds)
    placed = job.node is not None and job.sampler is not None
    resources = job_resources(job)
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job.pod,
            "namespace": job.tenant,
            "uid": job.pod_uid,
            "creationTimestamp": rfc3339(created),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "priority": job.priority,
            "containers": [{"name": "main", "resources": {"requests": resources, "limits": resources}}],
            "nodeSelector": {GPU_MODEL_LABEL: job.model},
        },
        "status": {"phase": "Pending"},
    }
    if placed:
        assert job.node is not None
        pod["spec"]["nodeName"] = job.node.name
        pod["status"] = {"phase": "Running", "startTime": rfc3339(origin + timedelta(seconds=job.started))}
    return pod


def node_object(name: str, model: str, capacity_type: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {CAPACITY_TYPE_LABEL: capacity_type, GPU_MODEL_LABEL: model}},
        "status": {"allocatable": {GPU_RESOURCE: str(gpus)}, "capacity": {GPU_RESOURCE: str(gpus)}},
    }


def namespace_object(tenant: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": tenant, "labels": {TENANT_LABEL: tenant}}}
