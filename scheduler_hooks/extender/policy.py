"""The one placement and quota policy behind both extender wires (contract 6): pure.

A ``ClusterView`` is a snapshot of what the hooks know (blocked tenants, max_gpus limits and
GPUs held, node placement, namespace tenants, known pods); ``Policy`` answers the
kube-scheduler verbs (filter, prioritize, preempt) and Volcano's on top of the same rules.

Decisions where the contracts are silent:

- A node the placement index has no record of (no topology, allocation or GPU count yet)
  passes the filter and scores neutral: kube-scheduler's own resource fit already checks
  ``nvidia.com/gpu`` capacity, and failing it would make a node unusable until its agent
  reports.
- Refusal by quota comes before node fit: a refused pod gets every node unresolvable and no
  preemption; the max_gpus check refuses when ``held + requested > limit`` (reaching the
  limit exactly is allowed).
- A namespace whose ``gpumeter.io/tenant`` label is not a tenant id belongs to no tenant: its
  GPU pods are refused everywhere, as a blocked tenant's are, with a message naming the label
  (contract 6 as amended by issue 31: never folded into a tenant that is one).
- Protected: a pod annotated ``gpumeter.io/protected: "true"`` in a namespace labelled
  ``gpumeter.io/protection-allowed: "true"`` (contract 4, amendment "trust"); in any other
  namespace the annotation is a tenant's own say-so and the pod is a victim like any other.
- Preemption (kube): a node whose victims include a protected pod is dropped whole, because
  the scheduler's victim set is already minimal (after reprieve), so evicting the others
  alone would not make room. Among the remaining nodes, when some need only preferred
  victims (spot pods, pods of tenants over quota), only those nodes are offered.
- Volcano preemptable/reclaimable: protected evictees are removed one by one (Volcano checks
  itself that the victims it keeps make room); the rest are ordered preferred first, then
  lowest priority, then most recently started (contract 4's order).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import cast

from gpumeter.core.kube import NO_TENANT
from scheduler_hooks.cluster.kube_objects import QUEUE_PREFIX, invalid_tenant_message, quota_message

# capacity_message (the filter's FailedNodes reason) is worded where the fit tables store it.
from scheduler_hooks.cluster.placement import NEUTRAL_SCORE, FitTable
from scheduler_hooks.cluster.placement import capacity_message as capacity_message
from scheduler_hooks.cluster.state import ClusterView

# Volcano predicate codes (pkg/scheduler/api status codes) and vote values (plugins/util).
CODE_SUCCESS = 0
CODE_UNSCHEDULABLE = 2
CODE_UNSCHEDULABLE_AND_UNRESOLVABLE = 3
PERMIT, ABSTAIN, REJECT = 1, 0, -1


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What the policy needs from a pod being scheduled (or offered as a victim)."""

    namespace: str
    name: str
    uid: str
    gpus: int = 0
    priority: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    # GPU devices asked by another name than nvidia.com/gpu: MIG devices, renamed time-sliced
    # replicas. Placement and max_gpus count nvidia.com/gpu only (``gpus``); quota refuses both.
    other_gpu_devices: int = 0

    @property
    def asks_gpu(self) -> bool:
        return self.gpus > 0 or self.other_gpu_devices > 0


@dataclass(frozen=True, slots=True)
class FilterResult:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


@dataclass(frozen=True, slots=True)
class Victim:
    """A candidate victim: its UID, plus the pod as the wire showed it, when it did."""

    uid: str
    pod: PodRequest | None = None


@dataclass(frozen=True)
class Policy:
    view: ClusterView

    # -- quota -----------------------------------------------------------------------------
    def refusal(self, pod: PodRequest) -> str | None:
        """The quota message refusing this pod everywhere, or None.

        A pod asking a MIG device or a time-sliced replica under its own resource name is a GPU
        pod too (its hours count against its tenant's gpu_hours and spend), so a blocked tenant
        is refused it; max_gpus counts ``nvidia.com/gpu`` only, as the held GPUs do."""
        if not pod.asks_gpu:
            return None
        tenant = self.view.tenant_of(pod.namespace)
        if tenant == NO_TENANT:
            return invalid_tenant_message(pod.namespace)
        metric = self.view.blocked.get(tenant)
        if metric is not None:
            return quota_message(tenant, metric)
        limit = self.view.max_gpus.get(tenant)
        if limit is not None and pod.gpus > 0:
            held = self.view.gpus_held.get(tenant, Decimal(0))
            if held + pod.gpus > limit:
                detail = f"holds {held} GPUs, pod needs {pod.gpus}, limit {limit}"
                return quota_message(tenant, "max_gpus", detail)
        return None

    def fit_table(self, pod: PodRequest) -> FitTable | None:
        """The fit table answering this pod's filter and prioritize; None where placement does
        not apply: a pod without GPUs (passes everywhere, scores 0) or one refused by quota."""
        if pod.gpus <= 0 or self.refusal(pod) is not None:
            return None
        return self.view.placement.fit(pod.gpus)

    def filter_table(self, pod: PodRequest) -> FitTable | None:
        """The fit table that alone answers this pod's filter (the encoded fast path); None where
        more than fit decides it: also a tenant with a per-model budget exhausted, or a key of
        max_gpus_by_model this pod would take above its limit, whose nodes of that model fail
        with their own reason (``filter``)."""
        # A tenant with per-model max_gpus keeps the encoded path while no key would be exceeded.
        if self.view.model_refuser(self.view.tenant_of(pod.namespace), pod.gpus) is not None:
            return None
        return self.fit_table(pod)

    # -- kube-scheduler verbs --------------------------------------------------------------
    def filter(self, pod: PodRequest, node_names: Iterable[str], *, distinct: bool = True) -> FilterResult:
        """Passed names in input order, failures with their reasons.

        ``distinct``: each name once in ``passed``; False keeps a repeated name as often as
        it was sent (what a NodeNames answer lists, and one pass over 5,000 names less).
        """
        names = list(dict.fromkeys(node_names)) if distinct else list(node_names)
        refused = self.refusal(pod)
        if refused is not None:
            return FilterResult([], {}, dict.fromkeys(names, refused))
        if not pod.asks_gpu:
            return FilterResult(names, {}, {})
        tenant = self.view.tenant_of(pod.namespace)
        if self.view.model_refusal_needed(tenant):
            return self._filter_models(pod, tenant, names)
        return self._fit(pod, names)

    def _filter_models(self, pod: PodRequest, tenant: str, names: list[str]) -> FilterResult:
        """Per-model budgets (contract 4, amendment "per-model limits"): nodes of an exhausted
        model, or of a key of max_gpus_by_model this pod would take above its limit, fail with
        the reason, as FailedNodes, so the pod may land on another model; only when every node
        sent is of such a model is it refused everywhere, unresolvable."""
        refuse = self.view.model_refuser(tenant, pod.gpus)
        if refuse is None:
            return self._fit(pod, names)
        exhausted = {name: reason for name in dict.fromkeys(names) if (reason := refuse(name)) is not None}
        if not exhausted:
            return self._fit(pod, names)
        rest = [name for name in names if name not in exhausted]
        if not rest:
            return FilterResult([], {}, exhausted)
        fitted = self._fit(pod, rest)
        return FilterResult(fitted.passed, {**exhausted, **fitted.failed}, fitted.unresolvable)

    def _fit(self, pod: PodRequest, names: list[str]) -> FilterResult:
        if pod.gpus <= 0:  # MIG devices or replicas only: the fit tables count whole GPUs
            return FilterResult(names, {}, {})
        # The hot path (5,000 names within a few ms): C-level passes over the fit table of
        # this GPU count (kept current by the placement index), no Python loop per name.
        short = self.view.placement.fit(pod.gpus).short
        reasons = list(map(short.get, names))  # None: the node fits (or is unknown, and passes)
        if reasons.count(None) == len(reasons):
            return FilterResult(names, {}, {})
        passed = list(itertools.compress(names, map(operator.is_, reasons, itertools.repeat(None))))
        # A reason is a non-empty string, so the reasons select the failed pairs themselves.
        failed = cast(dict[str, str], dict(itertools.compress(zip(names, reasons, strict=True), reasons)))
        return FilterResult(passed, failed, {})

    def prioritize(self, pod: PodRequest, node_names: Iterable[str]) -> list[tuple[str, int]]:
        """0..10 per node, in input order; 0 everywhere for a pod without GPUs or refused."""
        return list(zip(*self.prioritize_columns(pod, node_names), strict=True))

    def prioritize_columns(self, pod: PodRequest, node_names: Iterable[str]) -> tuple[list[str], list[int]]:
        """``prioritize`` as (names, scores), each name once: what the wire encodes without
        building a tuple per node. One C-level ``map`` over the fit table of the pod's GPU
        count; a node the index does not know scores neutral."""
        names = list(dict.fromkeys(node_names))
        if pod.gpus <= 0 or self.refusal(pod) is not None:
            return names, [0] * len(names)
        scores = self.view.placement.fit(pod.gpus).scores
        return names, list(map(scores.get, names, itertools.repeat(NEUTRAL_SCORE)))

    def preempt(
        self,
        pod: PodRequest,
        node_to_victims: Mapping[str, Sequence[str]],
        observed: Mapping[str, PodRequest] | None = None,
    ) -> dict[str, list[str]]:
        """Victim UIDs per node the scheduler may use (module docstring for the rules)."""
        if self.refusal(pod) is not None:
            return {}
        seen = observed or {}
        offered: dict[str, list[str]] = {}
        cheap: set[str] = set()
        for node, uids in node_to_victims.items():
            victims = [Victim(uid, seen.get(uid)) for uid in uids]
            if not victims or any(self.protected(victim) for victim in victims):
                continue
            offered[node] = list(uids)
            if all(self.preferred(victim) for victim in victims):
                cheap.add(node)
        if cheap:
            return {node: uids for node, uids in offered.items() if node in cheap}
        return offered

    # -- victims ---------------------------------------------------------------------------
    def protected(self, victim: Victim) -> bool:
        """The watched pod is protected, or the pod as the wire showed it (annotated, in a
        namespace labelled gpumeter.io/protection-allowed: "true")."""
        known = self.view.pods.get(victim.uid)
        if known is not None and known.protected:
            return True
        return victim.pod is not None and self.view.protected(victim.pod.namespace, victim.pod.annotations)

    def preferred(self, victim: Victim) -> bool:
        """Spot pods and pods of tenants over quota go first."""
        known = self.view.pods.get(victim.uid)
        if known is not None:
            return known.spot or self.view.over_quota(known.tenant)
        if victim.pod is not None:
            return self.view.over_quota(self.view.tenant_of(victim.pod.namespace))
        return False

    def order_victims(self, victims: Sequence[Victim]) -> list[Victim]:
        """Unprotected victims: preferred first, then lowest priority, then most recently started."""

        def key(victim: Victim) -> tuple[int, int, float]:
            known = self.view.pods.get(victim.uid)
            priority = known.priority if known is not None else victim.pod.priority if victim.pod else 0
            started = known.started_at if known is not None else None
            return (0 if self.preferred(victim) else 1, priority, -started.timestamp() if started else 0.0)

        return sorted((v for v in victims if not self.protected(v)), key=key)

    # -- Volcano ---------------------------------------------------------------------------
    def predicate(self, pod: PodRequest, node: str) -> tuple[int, str]:
        """(code, message): 3 with the quota message, 2 when too few GPUs are free or the node's
        GPU model is over its budget (another node may do), (0, "") ok."""
        if pod.asks_gpu and self.refusal(pod) is None:
            over_model = self.view.model_refusal(self.view.tenant_of(pod.namespace), node, pod.gpus)
            if over_model is not None:
                return CODE_UNSCHEDULABLE, over_model
        result = self.filter(pod, [node])
        if node in result.unresolvable:
            return CODE_UNSCHEDULABLE_AND_UNRESOLVABLE, result.unresolvable[node]
        if node in result.failed:
            return CODE_UNSCHEDULABLE, result.failed[node]
        return CODE_SUCCESS, ""

    def node_scores(self, pod: PodRequest, node_names: Iterable[str], scale: int = 10) -> dict[str, int]:
        """Volcano's nodeScore: the 0..10 score times ``scale`` (0..100, like MaxNodeScore)."""
        return {name: value * scale for name, value in self.prioritize(pod, node_names)}

    def queue_overused(self, queue_name: str) -> bool:
        """True for ``gpumeter-<tenant>`` while that tenant is blocked."""
        if not queue_name.startswith(QUEUE_PREFIX):
            return False
        return queue_name[len(QUEUE_PREFIX) :] in self.view.blocked

    def job_enqueueable(self, namespace: str, gpus: int) -> int:
        """-1 (reject) for a GPU job of a blocked tenant, else 0 (abstain)."""
        tenant = self.view.tenant_of(namespace)
        if gpus > 0 and (tenant == NO_TENANT or tenant in self.view.blocked):
            return REJECT
        return ABSTAIN

    def volcano_victims(self, evictor: PodRequest, evictees: Sequence[Victim]) -> list[Victim]:
        if self.refusal(evictor) is not None:
            return []
        return self.order_victims(evictees)

