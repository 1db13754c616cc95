"""Kubernetes names and rules every component shares: the agent bills by them, the extender and
the actuator enforce by them, so one definition keeps them from drifting apart.

Inputs are API objects in their JSON form (camelCase keys, what the API server sends and the
kubernetes client's ``sanitize_for_serialization`` gives); no kubernetes import.

* Tenant of a namespace (contract 6): its label ``gpumeter.io/tenant``, else its name; a value
  that is not a tenant id (``[a-z0-9][a-z0-9-]{0,62}``) is no tenant, never folded into one.
* Capacity type of a node: the label ``gpumeter.io/capacity-type``; else the cloud's own spot
  labels (Karpenter, EKS, GKE, AKS); else nothing said. The explicit label wins: it is how an
  operator corrects what a cloud label says (capacity reserved for spot-priced instances). A pod
  may declare its type with the same label or annotation, which counts only where the node says
  nothing: the node is what was bought.
* Protection of a pod: the annotation ``gpumeter.io/protected: "true"`` counts only in a
  namespace labelled ``gpumeter.io/protection-allowed: "true"``.
* Effective request of a pod, the kubelet's rule (KEP-753, native sidecars): the larger of
  Σ app containers + Σ sidecars and, for each regular init container, its request + Σ the
  sidecars started before it; plus the pod overhead. A sidecar is an init container with
  ``restartPolicy: Always``. A container's limit stands in for its missing request (API
  defaulting).
* GPU resources: ``nvidia.com/gpu``, MIG devices ``nvidia.com/mig-<profile>`` and either
  renamed ``.shared`` when time-sliced. The agent bills all of them; the extender refuses a
  blocked tenant any of them, while GPUs held (``max_gpus``) count ``nvidia.com/gpu`` only.
* Schedulable units of a GPU (contract 8): ``replicas`` when the device plugin time-slices it,
  none in MIG mode (handed out as MIG devices, never as ``nvidia.com/gpu``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from gpumeter.core.models import CAPACITY_TYPES, CapacityType, GpuDevice

GPU_RESOURCE = "nvidia.com/gpu"
# The NVIDIA device plugin's other GPU resources: MIG devices under the mixed strategy
# (``nvidia.com/mig-1g.10gb``), and time-sliced replicas when it renames them
# (``renameByDefault``: ``nvidia.com/gpu.shared``, ``nvidia.com/mig-1g.10gb.shared``).
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"
TENANT_LABEL = "gpumeter.io/tenant"
CAPACITY_TYPE_LABEL = "gpumeter.io/capacity-type"  # on a node (what was bought) or a pod (declared)
PROTECTED_ANNOTATION = "gpumeter.io/protected"
# On a namespace: its pods' PROTECTED_ANNOTATION counts (contract 4, amendment "trust"). Tenants
# create their own pods but not namespaces, so the cluster's operators decide who is protected.
PROTECTION_ALLOWED_LABEL = "gpumeter.io/protection-allowed"
EVICTION_NOTICE_ANNOTATION = "gpumeter.io/eviction-notice"
BLOCKED_ON_ANNOTATION = "gpumeter.io/blocked-on"  # on a tenant's Volcano queue
SIDECAR_RESTART_POLICY = "Always"
# A node's GPU model for per-model limits (contract 4, amendment "per-model limits"): our own
# label first (an operator's word, in the agent's model names), else GPU feature discovery's.
GPU_MODEL_LABEL = "gpumeter.io/gpu-model"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

KARPENTER_CAPACITY_LABEL = "karpenter.sh/capacity-type"
EKS_CAPACITY_LABEL = "eks.amazonaws.com/capacityType"
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
GKE_PREEMPTIBLE_LABEL = "cloud.google.com/gke-preemptible"
AKS_PRIORITY_LABEL = "kubernetes.azure.com/scalesetpriority"

# Node label values that mean spot capacity, ours and the clouds' (what a node selector or
# affinity has to rule out to keep a pod off spot nodes).
SPOT_NODE_LABELS: Mapping[str, frozenset[str]] = {
    CAPACITY_TYPE_LABEL: frozenset({"spot"}),
    KARPENTER_CAPACITY_LABEL: frozenset({"spot"}),
    EKS_CAPACITY_LABEL: frozenset({"SPOT"}),
    GKE_SPOT_LABEL: frozenset({"true"}),
    GKE_PREEMPTIBLE_LABEL: frozenset({"true"}),
    AKS_PRIORITY_LABEL: frozenset({"spot"}),
}

# The cloud labels in precedence order, each with what its value says (None: nothing).
_CLOUD_CAPACITY: tuple[tuple[str, Callable[[str], CapacityType | None]], ...] = (
    (
        KARPENTER_CAPACITY_LABEL,
        lambda v: "spot" if v == "spot" else ("reserved" if v == "reserved" else "on-demand"),
    ),
    (EKS_CAPACITY_LABEL, lambda v: "spot" if v.upper() == "SPOT" else "on-demand"),
    (GKE_SPOT_LABEL, lambda v: "spot" if v == "true" else None),
    (GKE_PREEMPTIBLE_LABEL, lambda v: "spot" if v == "true" else None),
    (AKS_PRIORITY_LABEL, lambda v: "spot" if v == "spot" else None),
)

_TENANT_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")
_SUFFIXES: Mapping[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes resource quantity (``2``, ``500m``, ``1.5Gi``, ``2e3``) as an exact Decimal."""
    if isinstance(value, bool):
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    if isinstance(value, int | Decimal):
        return Decimal(value)
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None


# -- tenant -------------------------------------------------------------------------------------


# What the hooks keep as the tenant of a namespace whose label is not a tenant id: never a
# tenant id itself, so it matches no tenant's quota, limit or pods.
NO_TENANT = ""


def is_tenant_id(text: str) -> bool:
    """``[a-z0-9][a-z0-9-]{0,62}``: contract 1's tenant, and every namespace name (a DNS label)."""
    return _TENANT_ID.fullmatch(text) is not None


def invalid_tenant_label(labels: Mapping[str, Any] | None) -> str | None:
    """The namespace's ``gpumeter.io/tenant`` value when it is set and is not a tenant id, else None."""
    label = (labels or {}).get(TENANT_LABEL)
    if isinstance(label, str) and label and not is_tenant_id(label):
        return label
    return None


def tenant_of_namespace(name: str, labels: Mapping[str, Any] | None = None) -> str | None:
    """The tenant of namespace ``name`` with these labels: ``gpumeter.io/tenant``, else the name;
    None when that value is not a tenant id.

    Never folded: ``TEAM_B`` or ``Team.B`` (valid label values) are not ``team-b``. Folding made
    two labels one tenant, so one was billed and held to quota as the other; a value that is not
    a tenant id belongs to no tenant, and each component says so (the agent withholds the pod's
    samples and counts them, the extender refuses its GPU pods naming the label).
    """
    label = (labels or {}).get(TENANT_LABEL)
    value = label if isinstance(label, str) and label else name
    return value if is_tenant_id(value) else None


# -- capacity type ------------------------------------------------------------------------------


def node_gpu_model(labels: Mapping[str, str] | None) -> str | None:
    """The GPU model a node's labels name (GPU_MODEL_LABEL, else GPU_PRODUCT_LABEL); None: none."""
    labels = labels or {}
    for label in (GPU_MODEL_LABEL, GPU_PRODUCT_LABEL):
        value = labels.get(label)
        if isinstance(value, str) and value:
            return value
    return None


def capacity_type_of_node(labels: Mapping[str, str] | None) -> CapacityType | None:
    """What a node's labels say it is (module docstring); None when they say nothing."""
    labels = labels or {}
    value = labels.get(CAPACITY_TYPE_LABEL)
    if value in CAPACITY_TYPES:
        return value
    for label, convert in _CLOUD_CAPACITY:
        found = labels.get(label)
        if isinstance(found, str):
            converted = convert(found)
            if converted is not None:
                return converted
    return None


def declared_capacity_type(pod_metadata: Mapping[str, Any]) -> CapacityType | None:
    """The type a pod declares with the label, else the annotation ``gpumeter.io/capacity-type``."""
    for source in (pod_metadata.get("labels") or {}, pod_metadata.get("annotations") or {}):
        value = source.get(CAPACITY_TYPE_LABEL) if isinstance(source, Mapping) else None
        if value in CAPACITY_TYPES:
            return value
    return None


def capacity_type_of(pod_metadata: Mapping[str, Any], node_labels: Mapping[str, str] | None) -> CapacityType:
    """A pod's capacity type: its node's, else its own declared one, else on-demand."""
    return capacity_type_of_node(node_labels) or declared_capacity_type(pod_metadata) or "on-demand"


# -- effective request --------------------------------------------------------------------------

Amounts = dict[str, Decimal]


def container_requests(container: Mapping[str, Any], resources: Collection[str] | None = None) -> Amounts:
    """A container's requests (a limit stands in for a missing request); unreadable quantities
    are left out (the API server refuses them, nothing real has one)."""
    spec = container.get("resources") if isinstance(container, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}
    values: dict[str, Any] = {}
    for kind in ("limits", "requests"):  # requests last: they win
        found = spec.get(kind)
        if isinstance(found, Mapping):
            values.update(found)
    out: Amounts = {}
    for name, value in values.items():
        if resources is not None and name not in resources:
            continue
        try:
            out[name] = parse_quantity(value)
        except ValueError:
            continue
    return out


def _plus(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Amounts:
    out = dict(a)
    for name, amount in b.items():
        out[name] = out.get(name, Decimal(0)) + amount
    return out


def _peak(a: Mapping[str, Decimal], b: Mapping[str, Decimal]) -> Amounts:
    out = dict(a)
    for name, amount in b.items():
        out[name] = max(out.get(name, Decimal(0)), amount)
    return out


def effective_requests(spec: Mapping[str, Any], resources: Collection[str] | None = None) -> Amounts:
    """The pod's effective request per resource (module docstring): what the scheduler reserves
    and the kubelet admits. ``resources`` limits the answer to those names (all when None)."""
    running: Amounts = {}
    for container in spec.get("containers") or ():
        running = _plus(running, container_requests(container, resources))
    sidecars: Amounts = {}
    init_peak: Amounts = {}
    for container in spec.get("initContainers") or ():
        requests = container_requests(container, resources)
        if isinstance(container, Mapping) and container.get("restartPolicy") == SIDECAR_RESTART_POLICY:
            sidecars = _plus(sidecars, requests)  # keeps running beside everything started after it
        else:
            init_peak = _peak(init_peak, _plus(sidecars, requests))
    total = _peak(_plus(running, sidecars), init_peak)
    overhead = container_requests({"resources": {"requests": spec.get("overhead")}}, resources)
    return _plus(total, overhead)


def gpu_request(spec: Mapping[str, Any]) -> Decimal:
    """The pod's effective ``nvidia.com/gpu`` request."""
    return effective_requests(spec, (GPU_RESOURCE,)).get(GPU_RESOURCE, Decimal(0))


def is_gpu_resource(resource_name: str) -> bool:
    """A resource the device plugin hands out as GPU devices: ``nvidia.com/gpu``, a MIG
    profile's ``nvidia.com/mig-<profile>``, or either renamed ``.shared`` when time-sliced."""
    base = resource_name.removesuffix(SHARED_SUFFIX)
    return base == GPU_RESOURCE or base.startswith(MIG_RESOURCE_PREFIX)


def other_gpu_device_request(spec: Mapping[str, Any]) -> Decimal:
    """The pod's effective request of GPU devices by any name but ``nvidia.com/gpu`` (MIG
    devices, renamed time-sliced replicas), summed over those resources: a pod asking one of
    them is a GPU pod whose hours its tenant's quota counts, though it asks no whole GPU."""
    names = [name for name in _resource_names(spec) if name != GPU_RESOURCE and is_gpu_resource(name)]
    if not names:
        return Decimal(0)
    return sum(effective_requests(spec, names).values(), Decimal(0))


def _resource_names(spec: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ()),
                  {"resources": {"requests": spec.get("overhead")}}]
    for container in containers:
        resources = container.get("resources") if isinstance(container, Mapping) else None
        for kind in ("limits", "requests"):
            found = resources.get(kind) if isinstance(resources, Mapping) else None
            if isinstance(found, Mapping):
                names.update(name for name in found if isinstance(name, str))
    return names


# -- GPU sharing ------------------------------------------------------------------------------


def schedulable_units(gpu: GpuDevice) -> int:
    """How many ``nvidia.com/gpu`` the device plugin advertises for this GPU: its time-slicing
    replicas (1 when not shared), none in MIG mode."""
    return 0 if gpu.mig_enabled else gpu.replicas
