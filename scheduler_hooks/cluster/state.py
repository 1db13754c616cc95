"""The extender's in-memory state: the live ``ClusterView`` the policy reads, and how it is fed.

One thread owns it: every mutation runs on the event loop thread (the feeds decode records and
API objects in their own threads and hand finished values over with ``call_soon_threadsafe``),
so a request handler sees one consistent state for the whole of its synchronous policy call.
The view is built once over the state's own dicts, so answering needs no copy.

What is kept (contract 4, 6 and 8):

- quota: every quota event folded by ``(tenant, metric, scope)``, the scope being the period
  for ``gpu_hours``/``spend`` and one ``held`` scope for ``max_gpus`` (as the quota ledger
  keys its crossings). A tenant is *blocked* while some metric is ``exceeded`` and not
  ``recovered``, its ``on_exceed`` is ``block`` or ``preempt`` and the tenants file still
  sets that metric's limit (a removed limit blocks nothing, as in ``quota.accounting``).
  Event ids are deterministic, so an event seen before (a replay) is ignored: a republished
  old ``exceeded`` cannot undo a later ``recovered``.
- trust (contract 4, amendment "trust"): neither kind of event is taken on its word. The open
  ``exceeded`` of a scope and the latest ``recovered`` after it are both kept, and whether the
  tenant is blocked is decided from them against the tenants file the hooks hold
  (``quota.trust.distrust``): an ``exceeded`` whose limit is not the policy's or whose period
  is not the current one blocks nothing, and a ``recovered`` the file disagrees with (another
  limit, a period not begun, its own ``used`` still at the limit) unblocks nothing. Both are
  decided again whenever the fold changes or the tenants file is reloaded, so a ``recovered``
  that a raised limit caused unblocks as soon as the hooks read the raised limit too. The
  usage itself is not known here, so a forged ``recovered`` with the policy's limit, a current
  period and a plausible ``used`` still unblocks; the actuator decides evictions with the same
  rule, and the quota worker's next crossing (a new id) blocks again.
- ``max_gpus`` limits from the tenants file, for tenants whose ``on_exceed`` is ``block`` or
  ``preempt`` only: ``notify`` means the quota is reported, never enforced. GPUs held = Σ the
  GPU requests of the tenant's pods bound to a node and not finished (what the scheduler
  itself counts), so a burst of pods is refused as soon as the binding is watched.
- namespaces -> tenant, pods' capacity type (the node's, else the pod's declared one) and GPU
  requests by the rules of ``gpumeter.core.kube``, the agent's.
- pods: GPUs, node, priority, capacity type, the
  protected annotation and start time; what preemption and victim order need. The annotation
  protects a pod only in a namespace labelled ``gpumeter.io/protection-allowed: "true"``
  (``kube_objects.is_protected``): the namespace watch keeps the set of those namespaces, and
  a label added or removed there re-reads its pods.
- placement: topology and allocation records in a ``PlacementIndex``. The allocation the index
  sees is the agent's last record, minus pods watched gone since, plus pods bound to the node
  that the record does not list yet, on the GPUs the device plugin would give them (the best
  set left): the agent reports once per window, the scheduler places pods in bursts.

Readiness: each feed names its sources (``expect``) and reports each once loaded: quota
events replayed to the end, topology and allocation topics read to the end, and the first
list of pods, nodes and namespaces. Until then the verbs answer 503, never a guess. On
becoming ready the placement fit tables of the common GPU counts are built (``warm``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpumeter.core import kube
from gpumeter.core.grants import Grant
from gpumeter.core.kube import GPU_RESOURCE
from gpumeter.core.models import GpuAssignment, NodeAllocation, NodeTopology, QuotaEvent
from gpumeter.core.tenants import TenantsFile, model_key
from quota.periods import period_end
from quota.trust import distrust
from scheduler_hooks.cluster.kube_json import WireError, gpu_count, pod_gpus
from scheduler_hooks.cluster.kube_objects import asks_protection, protection_allowed, quota_message
from scheduler_hooks.cluster.placement import (
    NodeGpus,
    PlacementIndex,
    best_set,
    replica_pick,
    time_sliced_units,
)

BLOCKING = ("block", "preempt")
METRIC_ORDER = ("gpu_hours", "spend", "max_gpus")  # the metric a refusal names, when several
HELD_SCOPE = "held"
TERMINAL_PHASES = ("Succeeded", "Failed")
# GPU counts pods ask for in practice: their fit tables are built once the state is ready.
COMMON_GPU_COUNTS = (1, 2, 4, 8)
# Pods watched gone lately: their GPUs are free even if the agent's last record lists them.
GONE_MEMORY = 50_000

# Readiness sources (feeds expect them, report them loaded once).
QUOTA_EVENTS = "quota_events"
TOPOLOGY = "topology"
ALLOCATION = "allocation"
PODS = "pods"
NODES = "nodes"
NAMESPACES = "namespaces"

# -- API objects (JSON form) -> the few values kept --------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchedPod:
    uid: str
    namespace: str
    name: str
    node: str  # "" until bound
    gpus: int
    priority: int = 0
    asks_protection: bool = False  # annotated protected; counts only where its namespace allows
    capacity_hint: str | None = None  # the pod's own gpumeter.io/capacity-type (loses to the node)
    started_at: datetime | None = None
    terminal: bool = False

    @property
    def holds_gpus(self) -> bool:
        return bool(self.node) and not self.terminal and self.gpus > 0


@dataclass(frozen=True, slots=True)
class WatchedNode:
    name: str
    capacity_type: str | None = None
    gpus: int | None = None  # allocatable nvidia.com/gpu, None when the node has none listed
    gpu_model: str | None = None  # kube.node_gpu_model of its labels (per-model limits)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _labels(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(value).items() if isinstance(v, str)}


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def watched_pod(obj: Mapping[str, Any]) -> WatchedPod | None:
    """A v1.Pod (JSON, camelCase) as kept; None without a uid. A malformed GPU request counts 0."""
    meta, spec, status = _mapping(obj.get("metadata")), _mapping(obj.get("spec")), _mapping(obj.get("status"))
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    try:
        gpus = pod_gpus(spec)
    except WireError:
        gpus = 0  # the API server validates quantities; nothing real gets here
    annotations = _labels(meta.get("annotations"))
    priority = spec.get("priority")
    node = spec.get("nodeName")
    return WatchedPod(
        uid=uid,
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        node=node if isinstance(node, str) else "",
        gpus=gpus,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
        asks_protection=asks_protection(annotations),
        capacity_hint=kube.declared_capacity_type(meta),
        started_at=_time(status.get("startTime")),
        terminal=status.get("phase") in TERMINAL_PHASES,
    )


def watched_node(obj: Mapping[str, Any]) -> WatchedNode | None:
    meta, status = _mapping(obj.get("metadata")), _mapping(obj.get("status"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    allocatable = _mapping(status.get("allocatable")) or _mapping(status.get("capacity"))
    gpus: int | None = None
    if GPU_RESOURCE in allocatable:
        try:
            gpus = gpu_count(allocatable[GPU_RESOURCE], "allocatable")
        except WireError:
            gpus = None
    labels = _labels(meta.get("labels"))
    return WatchedNode(name, kube.capacity_type_of_node(labels), gpus, kube.node_gpu_model(labels))


def _period_over(key: str, now: datetime) -> bool:
    try:
        return period_end(key) <= now
    except ValueError:
        return True  # not a period: never trusted, nothing to keep


@dataclass(frozen=True, slots=True)
class WatchedNamespace:
    name: str
    tenant: str
    protection_allowed: bool = False


def watched_namespace(obj: Mapping[str, Any]) -> WatchedNamespace | None:
    """A namespace as kept: its tenant by ``gpumeter.core.kube.tenant_of_namespace`` and whether
    protection counts there; None without a name."""
    meta = _mapping(obj.get("metadata"))
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    labels = _labels(meta.get("labels"))
    # A label that is no tenant id: NO_TENANT, whose GPU pods the policy refuses (never folded).
    tenant = kube.tenant_of_namespace(name, labels) or kube.NO_TENANT
    return WatchedNamespace(name, tenant, protection_allowed(labels))


# -- the state ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KnownPod:
    """A running pod the hooks watch, keyed by UID in the view."""

    uid: str
    tenant: str
    gpus: Decimal = Decimal(0)
    capacity_type: str = "on-demand"
    priority: int = 0
    protected: bool = False
    started_at: datetime | None = None

    @property
    def spot(self) -> bool:
        return self.capacity_type == "spot"


@dataclass(frozen=True)
class ClusterView:
    """Snapshot of quota state, placement and pods; values in, never mutated by the policy."""

    placement: PlacementIndex = field(default_factory=PlacementIndex)
    blocked: Mapping[str, str] = field(default_factory=dict)  # tenant -> metric it is blocked on
    max_gpus: Mapping[str, Decimal] = field(default_factory=dict)  # tenant -> limit
    gpus_held: Mapping[str, Decimal] = field(default_factory=dict)  # tenant -> GPUs held now
    namespace_tenants: Mapping[str, str] = field(default_factory=dict)  # from the namespace label
    pods: Mapping[str, KnownPod] = field(default_factory=dict)  # uid -> pod
    # Namespaces labelled gpumeter.io/protection-allowed: "true"
    protection_namespaces: AbstractSet[str] = field(default_factory=frozenset)
    # Per-model limits exhausted: tenant -> the model blocks (metric, key, that metric's keys).
    blocked_models: Mapping[str, tuple[ModelBlock, ...]] = field(default_factory=dict)
    node_models: Mapping[str, str] = field(default_factory=dict)  # node -> its GPU model (labels)
    # Per-model max_gpus limits (tenant -> key -> limit) and the GPUs each tenant's bound pods
    # hold per node (tenant -> node -> GPUs): a pod that would take a key above its limit is
    # refused on that key's nodes, as max_gpus refuses it everywhere.
    max_gpus_by_model: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    held_on_nodes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def model_refusal(self, tenant: str, node: str, gpus: int = 0) -> str | None:
        """The quota message refusing the tenant's ``gpus``-GPU pod on ``node`` because a budget
        of that node's GPU model is exhausted, or the pod would take that model's key above its
        max_gpus; None when neither (or the node's model is unknown)."""
        refuse = self.model_refuser(tenant, gpus)
        return None if refuse is None else refuse(node)

    def model_refusal_needed(self, tenant: str) -> bool:
        """Per-model limits may refuse some node for this tenant's pods (the filter cannot be
        answered from the fit table alone)."""
        return tenant in self.blocked_models or tenant in self.max_gpus_by_model

    def model_refuser(self, tenant: str, gpus: int) -> Callable[[str], str | None] | None:
        """A node -> per-model refusal function for one pod (the keys over their max_gpus are
        found once per request, not per node); None when no per-model limit refuses anything."""
        blocks = self.blocked_models.get(tenant, ())
        limits = self.max_gpus_by_model.get(tenant) if gpus > 0 else None
        over: dict[str, str] = {}
        if limits:
            held = self.held_by_key(tenant, tuple(limits))
            for key, limit in limits.items():
                if held.get(key, 0) + gpus > limit:
                    over[key] = f"holds {held.get(key, 0)} GPUs, pod needs {gpus}, limit {limit}"
        if not blocks and not over:
            return None
        keys = tuple(limits or ())

        def refuse(node: str) -> str | None:
            model = self.node_models.get(node)
            if model is None:
                return None
            where = f"(node {node} has {model})"
            for block in blocks:
                if model_key(block.keys, model) == block.key:
                    return quota_message(tenant, block.metric, f"for {block.key} GPUs {where}")
            key = model_key(keys, model) if over else None
            if key is not None and key in over:
                return quota_message(tenant, "max_gpus", f"for {key} GPUs {where}: {over[key]}")
            return None

        return refuse

    def held_by_key(self, tenant: str, keys: Iterable[str]) -> dict[str, int]:
        """GPUs the tenant's bound pods hold per model key (a node of no key's model counts nowhere)."""
        keys = tuple(keys)
        held: dict[str, int] = {}
        for node, gpus in self.held_on_nodes.get(tenant, {}).items():
            key = model_key(keys, self.node_models.get(node))
            if key is not None:
                held[key] = held.get(key, 0) + gpus
        return held

    def tenant_of(self, namespace: str) -> str:
        """Namespace label ``gpumeter.io/tenant``, else the namespace name."""
        tenant = self.namespace_tenants.get(namespace)
        return tenant if tenant is not None else kube.tenant_of_namespace(namespace) or kube.NO_TENANT

    def protected(self, namespace: str, annotations: Mapping[str, str]) -> bool:
        """A pod of ``namespace`` with these annotations is protected (``is_protected``)."""
        return namespace in self.protection_namespaces and asks_protection(annotations)

    def over_quota(self, tenant: str) -> bool:
        """Blocked on any metric, or holding more GPUs than its max_gpus."""
        if tenant in self.blocked:
            return True
        limit = self.max_gpus.get(tenant)
        return limit is not None and self.gpus_held.get(tenant, Decimal(0)) > limit


@dataclass(frozen=True, slots=True)
class ModelBlock:
    """A per-model limit a tenant is blocked on: ``metric`` of model key ``key``, ``keys`` being
    all that metric's keys in the tenants file (a node's model belongs to the longest match)."""

    metric: str
    key: str
    keys: tuple[str, ...]


class HooksState:
    """Quota, tenants, pods and placement as the policy reads them (module docstring)."""

    def __init__(self, tenants: TenantsFile | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.clock = clock  # "now" for the trust check's current period
        self.placement = PlacementIndex()
        self.blocked: dict[str, str] = {}
        self.max_gpus: dict[str, Decimal] = {}
        self.gpus_held: dict[str, Decimal] = {}
        self.namespace_tenants: dict[str, str] = {}
        self.pods: dict[str, KnownPod] = {}
        self.protection_namespaces: set[str] = set()
        self.blocked_models: dict[str, tuple[ModelBlock, ...]] = {}
        self.node_models: dict[str, str] = {}
        self.max_gpus_by_model: dict[str, dict[str, Decimal]] = {}
        self.held_on_nodes: dict[str, dict[str, int]] = {}
        self.view = ClusterView(
            placement=self.placement,
            blocked=self.blocked,
            max_gpus=self.max_gpus,
            gpus_held=self.gpus_held,
            namespace_tenants=self.namespace_tenants,
            pods=self.pods,
            protection_namespaces=self.protection_namespaces,
            blocked_models=self.blocked_models,
            node_models=self.node_models,
            max_gpus_by_model=self.max_gpus_by_model,
            held_on_nodes=self.held_on_nodes,
        )
        self._tenants = TenantsFile()
        self._grants: Mapping[str, Sequence[Grant]] = {}  # quota_grants, folded per tenant
        # Folded by (metric, scope, model key or ""): a per-model crossing is its own quota.
        self._exceeded: dict[str, dict[tuple[str, str, str], QuotaEvent]] = {}
        # The latest recovered after each exceeded.
        self._recovered: dict[str, dict[tuple[str, str, str], QuotaEvent]] = {}
        self._seen_events: set[str] = set()
        self._watched: dict[str, WatchedPod] = {}
        self._by_namespace: dict[str, set[str]] = {}
        self._by_node: dict[str, set[str]] = {}
        self._held_by_namespace: dict[str, int] = {}
        self._nodes: dict[str, WatchedNode] = {}
        self._topologies: dict[str, NodeTopology] = {}
        self._allocations: dict[str, NodeAllocation] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._pushed: set[str] = set()  # nodes given an allocation (to clear when it empties)
        self._waiting: set[str] = set()
        self.quota_events = 0
        self.set_tenants(tenants or TenantsFile())

    # -- readiness -------------------------------------------------------------------------
    def expect(self, *sources: str) -> None:
        self._waiting.update(sources)

    def loaded(self, source: str) -> None:
        was_ready = self.ready
        self._waiting.discard(source)
        if self.ready and not was_ready:
            self.warm()

    def warm(self, gpu_counts: Iterable[int] = COMMON_GPU_COUNTS) -> None:
        """Build the placement fit tables of these GPU counts now (about 10 ms each at 5,000
        nodes), so no scheduling request pays for it; updates keep them current after."""
        for count in gpu_counts:
            self.placement.fit(count)

    @property
    def ready(self) -> bool:
        return not self._waiting

    @property
    def waiting_for(self) -> list[str]:
        return sorted(self._waiting)

    # -- tenants and quota -------------------------------------------------------------------
    def set_tenants(self, tenants: TenantsFile) -> None:
        self._tenants = tenants
        self.max_gpus.clear()
        self.max_gpus_by_model.clear()
        for policy in tenants.tenants:
            if policy.max_gpus_by_model:
                self.max_gpus_by_model[policy.tenant] = dict(policy.max_gpus_by_model)
            # Contract 6 refuses any pod that would take its tenant above max_gpus, whatever
            # on_exceed says: notify only softens what happens to pods already running.
            if policy.max_gpus is not None:
                self.max_gpus[policy.tenant] = policy.max_gpus
        for tenant in list(self._exceeded) + list(self.blocked) + list(self.blocked_models):
            self._refresh_blocked(tenant)  # the trust check too: limits may have changed

    def set_grants(self, grants: Mapping[str, Sequence[Grant]]) -> None:
        """quota_grants read again: the trust check's limits may have changed (a grant that
        raised a limit is what a worker's ``recovered`` shows), so blocking is decided again."""
        self._grants = dict(grants)
        for tenant in list(self._exceeded) + list(self.blocked) + list(self.blocked_models):
            self._refresh_blocked(tenant)

    def apply_quota_event(self, event: QuotaEvent) -> bool:
        """Fold one event; False when it was seen before (replays) or changes nothing."""
        if event.event_id in self._seen_events:
            return False
        self._seen_events.add(event.event_id)
        self.quota_events += 1
        if event.level == "warning":
            return False
        scope = HELD_SCOPE if event.metric == "max_gpus" else event.period
        key = (event.metric, scope, event.gpu_model or "")
        opened = self._exceeded.get(event.tenant, {})
        recovered = self._recovered.setdefault(event.tenant, {})
        if event.level == "exceeded":
            self._exceeded.setdefault(event.tenant, {})[key] = event
            recovered.pop(key, None)
        elif key in opened:
            recovered[key] = event  # it cancels the exceeded only if the tenants file agrees
        self._forget_past(event.tenant)
        self._refresh_blocked(event.tenant)
        return True

    def refresh_blocked(self) -> None:
        """Every tenant's block again at the clock now: a crossing of a period that has ended
        blocks no more (the trust check wants the current period) even before the quota stage's
        ``recovered`` for it arrives. The demo calls it each window: its fleet's clock runs far
        ahead of wall time, and a tenant with nothing running sends no usage that would move
        its quota clock into the new period."""
        for tenant in list(self._exceeded):
            self._forget_past(tenant)
        for tenant in list(self.blocked):
            self._refresh_blocked(tenant)

    def _forget_past(self, tenant: str) -> None:
        """Drop crossings of periods that are over: they block nothing again (the trust check
        wants the current period), so the fold keeps only what can still matter."""
        now = self.clock()
        opened, recovered = self._exceeded.get(tenant, {}), self._recovered.get(tenant, {})
        for key in [k for k, e in opened.items() if _period_over(e.period, now)]:
            del opened[key]
            recovered.pop(key, None)
        for table in (self._exceeded, self._recovered):
            if not table.get(tenant, True):
                del table[tenant]

    def exceeded(self, tenant: str) -> list[QuotaEvent]:
        """The tenant's ``exceeded`` events that no trusted ``recovered`` cancelled (whatever
        its on_exceed), metric order."""
        policy, now, grants = self._tenants.policy(tenant), self.clock(), self._grants.get(tenant, ())
        recovered = self._recovered.get(tenant, {})
        events = [event for key, event in self._exceeded.get(tenant, {}).items()
                  if key not in recovered or distrust(recovered[key], policy, now, grants) is not None]
        return sorted(events, key=lambda e: (METRIC_ORDER.index(e.metric), e.period, e.gpu_model or ""))

    def _refresh_blocked(self, tenant: str) -> None:
        policy = self._tenants.policy(tenant)
        metric = None
        blocks: list[ModelBlock] = []
        if policy is not None and policy.on_exceed in BLOCKING:
            now = self.clock()
            grants = self._grants.get(tenant, ())
            # distrust also refuses an exceeded of a metric whose limit the file removed.
            trusted = [e for e in self.exceeded(tenant) if distrust(e, policy, now, grants) is None]
            open_metrics = {e.metric for e in trusted if e.gpu_model is None}
            metric = next((m for m in METRIC_ORDER if m in open_metrics), None)
            for event in trusted:
                if event.gpu_model is not None:
                    keys = tuple(getattr(policy, f"{event.metric}_by_model", {}))
                    block = ModelBlock(event.metric, event.gpu_model, keys)
                    if block not in blocks:
                        blocks.append(block)
        if metric is None:
            self.blocked.pop(tenant, None)
        else:
            self.blocked[tenant] = metric
        if blocks:
            self.blocked_models[tenant] = tuple(blocks)
        else:
            self.blocked_models.pop(tenant, None)

    # -- namespaces --------------------------------------------------------------------------
    def upsert_namespace(self, name: str, tenant: str | None, protection_allowed: bool = False) -> None:
        before = self.view.tenant_of(name)
        allowed_before = name in self.protection_namespaces
        if tenant is None:
            self.namespace_tenants.pop(name, None)
        else:
            self.namespace_tenants[name] = tenant
        if protection_allowed:
            self.protection_namespaces.add(name)
        else:
            self.protection_namespaces.discard(name)
        after = self.view.tenant_of(name)
        if after == before:
            if allowed_before != protection_allowed:
                for uid in self._by_namespace.get(name, ()):
                    self._index_known(self._watched[uid])
            return
        if self._held_by_namespace.get(name, 0):
            for uid in self._by_namespace.get(name, ()):
                pod = self._watched[uid]
                if pod.holds_gpus:
                    self._add_held(before, -pod.gpus, pod.node)
                    self._add_held(after, pod.gpus, pod.node)
        for uid in self._by_namespace.get(name, ()):
            self._index_known(self._watched[uid])

    def delete_namespace(self, name: str) -> None:
        self.upsert_namespace(name, None)

    def upsert_watched_namespace(self, namespace: WatchedNamespace) -> None:
        self.upsert_namespace(namespace.name, namespace.tenant, namespace.protection_allowed)

    def replace_namespaces(self, namespaces: Iterable[WatchedNamespace]) -> None:
        fresh = {ns.name: ns for ns in namespaces}
        known = set(self.namespace_tenants) | self.protection_namespaces
        for name in [n for n in known if n not in fresh]:
            self.delete_namespace(name)
        for namespace in fresh.values():
            self.upsert_watched_namespace(namespace)

    # -- nodes -------------------------------------------------------------------------------
    def upsert_node(self, node: WatchedNode) -> None:
        before = self._nodes.get(node.name)
        self._nodes[node.name] = node
        if node.gpu_model is None:
            self.node_models.pop(node.name, None)
        else:
            self.node_models[node.name] = node.gpu_model
        if before is None or before.gpus != node.gpus:
            self.placement.set_capacity(node.name, node.gpus)
            self._refresh_allocation(node.name)
        if before is None or before.capacity_type != node.capacity_type:
            for uid in self._by_node.get(node.name, ()):
                self._index_known(self._watched[uid])

    def delete_node(self, name: str) -> None:
        self.node_models.pop(name, None)
        if self._nodes.pop(name, None) is None:
            return
        self.placement.set_capacity(name, None)
        for uid in self._by_node.get(name, ()):
            self._index_known(self._watched[uid])

    def replace_nodes(self, nodes: Iterable[WatchedNode]) -> None:
        fresh = {node.name: node for node in nodes}
        for name in [n for n in self._nodes if n not in fresh]:
            self.delete_node(name)
        for node in fresh.values():
            self.upsert_node(node)

    # -- pods --------------------------------------------------------------------------------
    def upsert_pod(self, pod: WatchedPod) -> None:
        if pod.terminal:
            self.delete_pod(pod.uid)
            return
        before = self._watched.get(pod.uid)
        if before is not None:
            self._unindex(before)
        self._watched[pod.uid] = pod
        self._by_namespace.setdefault(pod.namespace, set()).add(pod.uid)
        if pod.node:
            self._by_node.setdefault(pod.node, set()).add(pod.uid)
        if pod.holds_gpus:
            self._held_by_namespace[pod.namespace] = self._held_by_namespace.get(pod.namespace, 0) + pod.gpus
            self._add_held(self.view.tenant_of(pod.namespace), pod.gpus, pod.node)
        self._index_known(pod)
        held_before = (before.node, before.gpus) if before is not None and before.holds_gpus else None
        held_now = (pod.node, pod.gpus) if pod.holds_gpus else None
        if held_before != held_now:
            if held_before is not None:
                self._refresh_allocation(held_before[0])
            if held_now is not None and (held_before is None or held_before[0] != held_now[0]):
                self._refresh_allocation(held_now[0])

    def delete_pod(self, uid: str) -> None:
        before = self._watched.pop(uid, None)
        self._gone[uid] = None
        if len(self._gone) > GONE_MEMORY:
            self._gone.popitem(last=False)
        if before is None:
            return
        self._unindex(before)
        self.pods.pop(uid, None)
        if before.holds_gpus:
            self._refresh_allocation(before.node)

    def replace_pods(self, pods: Iterable[WatchedPod]) -> None:
        fresh = {pod.uid: pod for pod in pods}
        for uid in [u for u in self._watched if u not in fresh]:
            self.delete_pod(uid)
        for pod in fresh.values():
            self.upsert_pod(pod)

    def watched(self, uid: str) -> WatchedPod | None:
        return self._watched.get(uid)

    def _unindex(self, pod: WatchedPod) -> None:
        self._by_namespace.get(pod.namespace, set()).discard(pod.uid)
        if pod.node:
            self._by_node.get(pod.node, set()).discard(pod.uid)
        if pod.holds_gpus:
            left = self._held_by_namespace.get(pod.namespace, 0) - pod.gpus
            if left:
                self._held_by_namespace[pod.namespace] = left
            else:
                self._held_by_namespace.pop(pod.namespace, None)
            self._add_held(self.view.tenant_of(pod.namespace), -pod.gpus, pod.node)

    def _add_held(self, tenant: str, gpus: int, node: str) -> None:
        total = self.gpus_held.get(tenant, Decimal(0)) + gpus
        if total:
            self.gpus_held[tenant] = total
        else:
            self.gpus_held.pop(tenant, None)
        on_nodes = self.held_on_nodes.setdefault(tenant, {})
        left = on_nodes.get(node, 0) + gpus
        if left:
            on_nodes[node] = left
        else:
            on_nodes.pop(node, None)
            if not on_nodes:
                del self.held_on_nodes[tenant]

    def _index_known(self, pod: WatchedPod) -> None:
        node = self._nodes.get(pod.node) if pod.node else None
        capacity = (node.capacity_type if node else None) or pod.capacity_hint or "on-demand"
        self.pods[pod.uid] = KnownPod(
            uid=pod.uid,
            tenant=self.view.tenant_of(pod.namespace),
            gpus=Decimal(pod.gpus),
            capacity_type=capacity,
            priority=pod.priority,
            protected=pod.asks_protection and pod.namespace in self.protection_namespaces,
            started_at=pod.started_at,
        )

    # -- topology and allocation --------------------------------------------------------------
    def apply_topology(self, topology: NodeTopology) -> None:
        self._topologies[topology.node] = topology
        self.placement.update_topology(topology)
        self._refresh_allocation(topology.node)

    def remove_topology(self, node: str) -> None:
        """A tombstone on the compacted topic: forget the layout, keep what else is known."""
        if self._topologies.pop(node, None) is None:
            return
        self.placement.remove(node)
        self._pushed.discard(node)
        known = self._nodes.get(node)
        if known is not None:
            self.placement.set_capacity(node, known.gpus)
        self._refresh_allocation(node)

    def apply_allocation(self, allocation: NodeAllocation) -> None:
        self._allocations[allocation.node] = allocation
        self._refresh_allocation(allocation.node)

    def remove_allocation(self, node: str) -> None:
        if self._allocations.pop(node, None) is not None:
            self._refresh_allocation(node)

    def effective_allocation(self, node: str) -> NodeAllocation | None:
        """The agent's record corrected by the pods watched since (module docstring)."""
        record = self._allocations.get(node)
        assignments = [a for a in (record.assignments if record else ()) if a.pod_uid not in self._gone]
        listed = {a.pod_uid for a in assignments}
        unlisted = sorted(
            (self._watched[uid] for uid in self._by_node.get(node, ()) if uid not in listed),
            key=lambda p: (p.started_at or datetime.max.replace(tzinfo=UTC), p.uid),
        )
        unlisted = [pod for pod in unlisted if pod.holds_gpus]
        if record is None and not unlisted:
            return None
        taken = Counter(i for a in assignments for i in a.gpu_indices)
        for pod in unlisted:
            indices = self._device_plugin_pick(node, taken, pod.gpus)
            taken.update(indices)
            assignments.append(GpuAssignment(namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid,
                                             gpu_indices=sorted(indices)))
        return NodeAllocation(
            cluster=record.cluster if record else "",
            node=node,
            assignments=assignments,
            at=record.at if record else datetime.now(UTC),
        )

    def _device_plugin_pick(self, node: str, taken: Counter[int], k: int) -> list[int]:
        """The k GPUs a pod not yet in the record most likely got: the best-connected free set
        (on a time-sliced node, k replicas of the least held GPUs)."""
        topology = self._topologies.get(node)
        if topology is not None:
            replicas = time_sliced_units(topology)
            if replicas is not None:
                return replica_pick(replicas, taken, k)
            gpus = NodeGpus.from_records(topology).with_allocated(taken)
            found = best_set(gpus, k)
            if found is not None:
                return sorted(found[0])
            return list(gpus.free)  # the record and the scheduler disagree; count what is left
        capacity = self._nodes[node].gpus if node in self._nodes else None
        picked: list[int] = []
        index = 0
        while len(picked) < k and (capacity is None or index < capacity):
            if index not in taken:
                picked.append(index)
            index += 1
        return picked

    def _refresh_allocation(self, node: str) -> None:
        allocation = self.effective_allocation(node)
        if allocation is None:
            if node in self._pushed:
                # Nothing allocated as far as anyone knows now: an empty record clears the old one.
                self.placement.update_allocation(
                    NodeAllocation(cluster="", node=node, assignments=[], at=datetime.now(UTC)))
                self._pushed.discard(node)
            return
        self.placement.update_allocation(allocation)
        self._pushed.add(node)

    # -- introspection (metrics, /readyz) ------------------------------------------------------
    @property
    def node_count(self) -> int:
        return len(self.placement)

    @property
    def watched_pods(self) -> int:
        return len(self._watched)
