"""Pod manifests the kube tests create: a placeholder workload requesting CPU, memory and GPUs."""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from gpumeter.core.kube import GPU_RESOURCE

# Each test keeps its pods on its own nodes: the nodes carry this label, the pods select it.
POOL_LABEL = "gpumeter.io/test-pool"


def pod_manifest(
    name: str,
    *,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    node_name: str | None = None,
    pool: str | None = None,
    extra: dict[str, str] | None = None,
) -> k8s.V1Pod:
    """``gpus`` GPUs requested (and limited); ``extra`` other resources so (a MIG device);
    ``pool`` keeps the pod on that pool's nodes; ``node_name`` binds it directly, as a running
    workload would be, with no scheduler involved."""
    resources: dict[str, str] = {"cpu": "100m", "memory": "64Mi", **(extra or {})}
    if gpus:
        resources[GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/gpumeter/workload:test",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if node_name:
        spec["nodeName"] = node_name
    if pool:
        spec["nodeSelector"] = {POOL_LABEL: pool}
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }
    return k8s.V1Pod.model_validate(manifest)
