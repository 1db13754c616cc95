"""Spot reclaim (issue 9, item 4), pure: which spot pods to evict so a pod that may not run
on spot capacity, pending for lack of GPUs, finds room.

A pending pod qualifies when it requests GPUs, the scheduler has marked it Unschedulable
(PodScheduled=False, reason Unschedulable: it tried and found no room), it is not gated, its
tenant is not blocked (the extender refuses those; room would not help), and its node
selector or required node affinity rules out spot nodes. Its candidate nodes are those its
selector, affinity and the nodes' NoSchedule/NoExecute taints allow. For each, the GPUs
missing are ``request - (allocatable - Σ requests of pods bound there) - GPUs already on
their way out`` (pods being deleted or carrying an eviction notice); ``quota.victims.
spot_reclaim`` picks the fewest spot-class pods that free them, and the node needing the
fewest victims (then fewest GPUs, then name) wins.

Pending pods are served highest priority first, then oldest; what one is promised (free
GPUs, victims) is taken out of the picture before the next is considered, so two pending
pods never count the same room, and a pod whose room is already being freed (victims noticed
in an earlier round) triggers nothing new.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpumeter.core.kube import SPOT_NODE_LABELS
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from quota.victims import spot_reclaim
from scheduler_hooks.actuator.plan import Victim
from scheduler_hooks.cluster.kube_objects import NodeView, Notice, PodView

RECLAIM_PREFIX = "spot-reclaim:"  # a reclaim notice's cause: this prefix and the pending pod's uid
_ZERO = Decimal(0)
DEFAULT_GRACE = TenantPolicy(tenant="default").grace_seconds
_FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Reclaim:
    pending: PodView
    node: str
    victims: tuple[PodView, ...]

    @property
    def cause(self) -> str:
        return f"{RECLAIM_PREFIX}{self.pending.uid}"


def node_allows(pod: PodView, node: NodeView) -> bool:
    """Whether the pod's node selector, required node affinity and tolerations admit the node."""
    if node.unschedulable:
        return False
    if any(node.labels.get(key) != value for key, value in pod.node_selector.items()):
        return False
    if pod.affinity is not None and not any(
        all(r.matches(node.name, node.labels) for r in term) for term in pod.affinity
    ):
        return False
    return all(
        any(t.tolerates(taint) for t in pod.tolerations)
        for taint in node.taints if taint.effect in _BLOCKING_EFFECTS
    )


def excludes_spot(pod: PodView) -> bool:
    """The pod may not run on spot capacity: its selector or required affinity rejects every
    node carrying a spot label (ours or a cloud's)."""
    for label, spot_values in SPOT_NODE_LABELS.items():
        wanted = pod.node_selector.get(label)
        if wanted is not None and wanted not in spot_values:
            return True
    if not pod.affinity:
        return False
    # Every term (they are ORed) must rule spot out through a requirement on a spot label.
    return all(
        any(
            r.key in SPOT_NODE_LABELS and not r.field
            and not any(r.matches("", {r.key: value}) for value in SPOT_NODE_LABELS[r.key])
            for r in term
        )
        for term in pod.affinity
    )


def qualifies(pod: PodView, blocked: Collection[str]) -> bool:
    return (pod.pending and pod.unschedulable and not pod.gated and pod.gpus > 0
            and pod.tenant not in blocked and excludes_spot(pod))


def plan_spot_reclaim(nodes: Iterable[NodeView], pods: Iterable[PodView],
                      blocked: Collection[str] = ()) -> list[Reclaim]:
    """Reclaims for every qualifying pending pod that spot evictions can help, in serving order."""
    all_pods = list(pods)
    node_list = sorted(nodes, key=lambda n: n.name)
    free: dict[str, Decimal] = {n.name: n.gpus for n in node_list}
    spot_on: dict[str, list[PodView]] = {n.name: [] for n in node_list}
    with exact():
        for pod in all_pods:
            if not pod.holds_gpus or pod.node not in free:
                continue
            leaving = pod.deleting or pod.notice is not None
            # A pod on its way out still holds its GPUs, but they are as good as free: count
            # them so the same room is not reclaimed twice.
            if not leaving:
                free[pod.node] -= pod.gpus
                if pod.capacity_type == "spot" and not pod.protected:
                    spot_on[pod.node].append(pod)
    waiting = sorted(
        (p for p in all_pods if qualifies(p, blocked)),
        key=lambda p: (-p.priority, p.created_at or _FAR_PAST, p.namespace, p.name),
    )
    taken: set[str] = set()
    plans: list[Reclaim] = []
    with exact():
        for pending in waiting:
            eligible = [n for n in node_list if node_allows(pending, n)]
            roomy = [n for n in eligible if free[n.name] >= pending.gpus]
            if roomy:
                free[roomy[0].name] -= pending.gpus  # it fits (or will, once the leaving go): promise it
                continue
            best: tuple[int, Decimal, str, list[PodView]] | None = None
            for node in eligible:
                candidates = {p.uid: p for p in spot_on[node.name] if p.uid not in taken}
                missing = pending.gpus - free[node.name]
                chosen = spot_reclaim([p.candidate() for p in candidates.values()], missing)
                if not chosen:
                    continue
                option = (len(chosen), sum((c.gpus for c in chosen), _ZERO), node.name,
                          [candidates[c.uid] for c in chosen])
                if best is None or option[:3] < best[:3]:
                    best = option
            if best is None:
                continue
            _count, freed, node_name, victims = best
            taken.update(v.uid for v in victims)
            free[node_name] += freed - pending.gpus
            plans.append(Reclaim(pending, node_name, tuple(victims)))
    return plans


def reclaim_victims(plan: Reclaim, tenants: TenantsFile, now: datetime) -> list[Victim]:
    """The notices of one reclaim: each victim gets its own tenant's grace period."""
    pending = plan.pending
    victims = []
    for pod in plan.victims:
        policy = tenants.policy(pod.tenant)
        grace = policy.grace_seconds if policy is not None else DEFAULT_GRACE
        reason = (f"gpumeter: spot pod reclaimed for {pending.key}, which may not run on spot "
                  f"capacity and waits for {pending.gpus} GPUs; evicted through the Eviction API "
                  f"after {grace}s")
        notice = Notice(cause=plan.cause, reason=reason, deadline=now + timedelta(seconds=grace),
                        beneficiary=pending.key)
        victims.append(Victim(pod, notice, False))
    return victims
