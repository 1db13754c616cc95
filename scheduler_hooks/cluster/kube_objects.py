"""Pods, nodes and namespaces as the actuator needs them: values read from API JSON (pure);
and what the extender and the actuator both apply to Kubernetes objects beyond the names and
rules of ``gpumeter.core.kube`` (a tenant's Volcano queue, the protected annotation's reading,
the quota message).

The actuator lists objects from the API server as JSON (camelCase keys, exactly what the
server sent) and turns them into small frozen values here, so every decision about them is
a pure function testable without a cluster.

Rules where Kubernetes leaves a choice to us:

- A pod's tenant is its namespace's tenant by ``gpumeter.core.kube.tenant_of_namespace``, the
  node agent's rule, so the tenant of a quota event (computed from the agent's samples) finds
  the same pods.
- GPUs held are the pod's effective ``nvidia.com/gpu`` request as the kubelet computes it
  (``gpumeter.core.kube.effective_requests``: native sidecars and overhead included).
- Eviction class (``capacity_type``): ``spot`` when the node is spot capacity (its type as
  ``gpumeter.core.kube.capacity_type_of_node`` reads it, the agent's rule) *or* the pod
  declares itself interruptible with the label or annotation ``gpumeter.io/capacity-type:
  spot``; otherwise the node's type, the pod's declared type,
  or on-demand. Billing uses the node alone (what was bought); eviction also honours what the
  workload volunteered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpumeter.core import jsonio, kube
from gpumeter.core.models import CapacityType
from quota.victims import Candidate

QUEUE_PREFIX = "gpumeter-"  # a tenant's Volcano queue is gpumeter-<tenant>

_ZERO = Decimal(0)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


def asks_protection(annotations: Mapping[str, str]) -> bool:
    """The pod carries ``gpumeter.io/protected: "true"``: what it asks, not what it gets."""
    return annotations.get(kube.PROTECTED_ANNOTATION, "").strip().lower() == "true"


def protection_allowed(namespace_labels: Mapping[str, Any] | None) -> bool:
    """The namespace is labelled ``gpumeter.io/protection-allowed: "true"`` (label values are
    exact: an operator writes it)."""
    return (namespace_labels or {}).get(kube.PROTECTION_ALLOWED_LABEL) == "true"


def is_protected(annotations: Mapping[str, str], namespace_labels: Mapping[str, Any] | None) -> bool:
    """Contract 4, amendment "trust": the protected annotation counts only in a namespace
    labelled ``gpumeter.io/protection-allowed: "true"``. A tenant creates its own pods, so the
    annotation alone would let any tenant exempt itself from preemption; namespaces are
    cluster objects its operators own."""
    return asks_protection(annotations) and protection_allowed(namespace_labels)


def quota_message(tenant: str, metric: str, detail: str = "") -> str:
    """Contract 6: starts exactly ``gpumeter: tenant <tenant> over <metric> quota``."""
    base = f"gpumeter: tenant {tenant} over {metric} quota"
    return f"{base}: {detail}" if detail else base


def invalid_tenant_message(namespace: str) -> str:
    """Why a GPU pod of a namespace whose ``gpumeter.io/tenant`` label is not a tenant id is refused."""
    return (f"gpumeter: namespace {namespace} has no valid tenant: its label {kube.TENANT_LABEL} is not a "
            "tenant id ([a-z0-9][a-z0-9-]{0,62}); GPU pods wait until an operator fixes it")


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 timestamp from the API (``2026-11-05T12:00:00Z``), aware; None if absent or bad."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def rfc3339(moment: datetime) -> str:
    """UTC, millisecond precision, ``Z`` suffix: what a human reads in ``kubectl describe``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- the eviction notice --------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    """What the annotation ``gpumeter.io/eviction-notice`` carries on a pod about to be evicted.

    ``cause`` is the quota event id (or ``spot-reclaim:<pending pod uid>``); it is what makes
    the annotation the durable record of an eviction in flight: an actuator restarted mid-grace
    resumes from it, keeping the original deadline.
    """

    cause: str
    reason: str
    deadline: datetime
    metric: str = ""  # the quota metric; "" for a spot reclaim
    beneficiary: str = ""  # spot reclaim: "namespace/name" of the pending pod the room is for

    def __post_init__(self) -> None:
        if self.deadline.tzinfo is None or self.deadline.utcoffset() is None:
            raise ValueError("Notice.deadline must be aware")

    def to_annotation(self) -> str:
        document = {"reason": self.reason, "deadline": rfc3339(self.deadline), "cause": self.cause,
                    "metric": self.metric}
        if self.beneficiary:
            document["for"] = self.beneficiary
        return jsonio.dumps(document)


def parse_notice(text: Any) -> Notice | None:
    """The notice in an annotation value; None when absent or not one of ours (bad JSON, fields)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        document = jsonio.loads(text)
    except jsonio.JSONInputError:
        return None
    if not isinstance(document, dict):
        return None
    cause, reason = document.get("cause"), document.get("reason")
    metric, beneficiary = document.get("metric", ""), document.get("for", "")
    deadline = parse_time(document.get("deadline"))
    if not isinstance(cause, str) or not cause or not isinstance(reason, str) or deadline is None:
        return None
    return Notice(cause, reason, deadline, metric if isinstance(metric, str) else "",
                  beneficiary if isinstance(beneficiary, str) else "")


# -- scheduling constraints (for spot reclaim) ----------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One node selector requirement (``matchExpressions`` or ``matchFields``)."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()
    field: bool = False  # matchFields (only metadata.name exists)

    def matches(self, node_name: str, labels: Mapping[str, str]) -> bool:
        if self.field:
            present, value = self.key == "metadata.name", node_name
        else:
            present, value = self.key in labels, labels.get(self.key, "")
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("Gt", "Lt") and present and len(self.values) == 1:
            try:
                have, bound = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > bound if self.operator == "Gt" else have < bound
        return False  # an operator the API would have refused: match nothing, safely


NodeSelectorTerm = tuple[Requirement, ...]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


# -- nodes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: Decimal  # allocatable nvidia.com/gpu
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False

    @property
    def capacity_type(self) -> CapacityType:
        return kube.capacity_type_of_node(self.labels) or "on-demand"


def node_view(node: Mapping[str, Any]) -> NodeView:
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        gpus = kube.parse_quantity(allocatable.get(kube.GPU_RESOURCE, 0))
    except ValueError:
        gpus = _ZERO
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in spec.get("taints") or () if isinstance(t, Mapping)
    )
    return NodeView(
        name=str(metadata.get("name", "")),
        gpus=gpus,
        labels=dict(metadata.get("labels") or {}),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable")),
    )


# -- pods -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodView:
    """A pod as the actuator decides about it."""

    namespace: str
    name: str
    uid: str
    tenant: str
    node: str = ""  # "" while unbound
    phase: str = "Pending"
    gpus: Decimal = _ZERO  # nvidia.com/gpu: whole GPUs taken on its node
    # MIG devices and renamed time-sliced replicas it asks (kube.other_gpu_device_request): no
    # whole GPU, but GPU hours the quota counts.
    other_gpu_devices: Decimal = _ZERO
    priority: int = 0
    started_at: datetime | None = None
    created_at: datetime | None = None
    protected: bool = False
    capacity_type: CapacityType = "on-demand"  # eviction class, see module docstring
    deleting: bool = False
    notice: Notice | None = None
    notice_text: str = ""  # the annotation exactly as stored (a withdrawal tests against it)
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    affinity: tuple[NodeSelectorTerm, ...] | None = None  # required node affinity terms (ORed)
    tolerations: tuple[Toleration, ...] = ()
    unschedulable: bool = False  # PodScheduled=False, reason Unschedulable: the scheduler gave up for now
    gated: bool = False  # schedulingGates present: not the scheduler's to place yet
    gpu_model: str | None = None  # its node's GPU model (kube.node_gpu_model), for per-model limits

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def holds_gpus(self) -> bool:
        """Bound, not finished, requesting GPUs: the scheduler counts its GPUs as taken."""
        return bool(self.node) and self.phase not in TERMINAL_PHASES and self.gpus > 0

    @property
    def holds_gpu_devices(self) -> bool:
        """Bound, not finished, asking any GPU device (whole, MIG or shared): its hours count in
        its tenant's gpu_hours and spend."""
        return (bool(self.node) and self.phase not in TERMINAL_PHASES
                and (self.gpus > 0 or self.other_gpu_devices > 0))

    @property
    def evictable(self) -> bool:
        """Holds GPU devices and no deletion is under way (a second eviction would be accepted
        again)."""
        return self.holds_gpu_devices and not self.deleting

    @property
    def pending(self) -> bool:
        return not self.node and self.phase == "Pending" and not self.deleting

    def candidate(self, *, devices: bool = False) -> Candidate:
        """As a victim candidate counting its whole GPUs (max_gpus), or with ``devices`` every
        GPU device it asks (a period budget evicts MIG and shared pods too)."""
        gpus = self.gpus + self.other_gpu_devices if devices else self.gpus
        return Candidate(
            namespace=self.namespace, name=self.name, uid=self.uid, tenant=self.tenant, gpus=gpus,
            capacity_type=self.capacity_type, priority=self.priority, started_at=self.started_at,
            protected=self.protected,
        )


def _terms(spec: Mapping[str, Any]) -> tuple[NodeSelectorTerm, ...] | None:
    node_affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    raw_terms = required.get("nodeSelectorTerms")
    if not raw_terms:
        return None
    terms: list[NodeSelectorTerm] = []
    for term in raw_terms:
        if not isinstance(term, Mapping):
            continue
        requirements = [
            Requirement(str(e.get("key", "")), str(e.get("operator", "")),
                        tuple(str(v) for v in e.get("values") or ()), field=is_field)
            for is_field, source in ((False, "matchExpressions"), (True, "matchFields"))
            for e in term.get(source) or () if isinstance(e, Mapping)
        ]
        terms.append(tuple(requirements))
    return tuple(terms)


def _unschedulable(status: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ()
    )


def eviction_class(pod_metadata: Mapping[str, Any], node_labels: Mapping[str, str] | None) -> CapacityType:
    node_type = kube.capacity_type_of_node(node_labels)
    declared = kube.declared_capacity_type(pod_metadata)
    if node_type == "spot" or declared == "spot":
        return "spot"
    return node_type or declared or "on-demand"


def pod_view(pod: Mapping[str, Any], tenant: str, node_labels: Mapping[str, str] | None = None,
             namespace_labels: Mapping[str, Any] | None = None) -> PodView:
    """A pod object (API JSON) as a PodView; ``tenant`` and ``namespace_labels`` come from its
    namespace (the labels decide whether its protected annotation counts)."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    notice_text = annotations.get(kube.EVICTION_NOTICE_ANNOTATION, "")
    priority = spec.get("priority")
    return PodView(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        tenant=tenant,
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        gpus=kube.gpu_request(spec),
        other_gpu_devices=kube.other_gpu_device_request(spec),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        started_at=parse_time(status.get("startTime")),
        created_at=parse_time(metadata.get("creationTimestamp")),
        protected=is_protected(annotations, namespace_labels),
        capacity_type=eviction_class(metadata, node_labels),
        deleting=metadata.get("deletionTimestamp") is not None,
        gpu_model=kube.node_gpu_model(node_labels),
        notice=parse_notice(notice_text),
        notice_text=notice_text if isinstance(notice_text, str) else "",
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        affinity=_terms(spec),
        tolerations=tuple(
            Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                       str(t.get("effect") or ""))
            for t in spec.get("tolerations") or () if isinstance(t, Mapping)
        ),
        unschedulable=_unschedulable(status),
        gated=bool(spec.get("schedulingGates")),
    )


def namespace_labels(namespaces: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Namespace name -> its labels, for namespace objects as listed."""
    out: dict[str, dict[str, str]] = {}
    for ns in namespaces:
        metadata = ns.get("metadata") or {}
        labels = metadata.get("labels") or {}
        out[str(metadata.get("name", ""))] = {str(k): str(v) for k, v in labels.items() if isinstance(v, str)}
    return out


def tenants_of(labels_by_namespace: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Namespace name -> tenant (``gpumeter.core.kube.tenant_of_namespace``), from ``namespace_labels``."""
    return {name: kube.tenant_of_namespace(name, labels) or kube.NO_TENANT
            for name, labels in labels_by_namespace.items()}
