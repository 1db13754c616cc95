"""What the quota actuator decides for quota events, as pure functions (contract 4): values
in, values out.

- ``plan_preemption``: for a tenant whose ``on_exceed`` is ``preempt`` and an ``exceeded``
  event, the pods to notice and evict. gpu_hours and spend only grow within a period, so
  every unprotected GPU pod goes; for max_gpus, pods go in eviction order only until the GPUs
  held are within the limit (``quota.victims.select_victims``). "Held" is what the API server
  shows now, not the event's ``used``: the stream's view can be a window old, the pods are
  the truth. Pods already on their way out (a notice from another cause, a deletion under
  way) are not chosen again, and for max_gpus their GPUs count as already gone.
- A replayed event finds its own notices on the pods (the annotation carries the event id):
  those pods are victims again *with their original deadline*, never a new grace period.
- ``superseded``: crossings a later ``recovered`` in the same backlog made moot.
- ``blocked_after``: the metrics each tenant is blocked on after an event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from gpumeter.core.models import QuotaEvent
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy
from quota.victims import eviction_order, select_victims
from scheduler_hooks.cluster.kube_objects import Notice, PodView, quota_message

# on_exceed values that block a tenant (contract 4): its Volcano queue closes while blocked.
BLOCKING = frozenset({"block", "preempt"})

_ZERO = Decimal(0)


@dataclass(frozen=True)
class Victim:
    pod: PodView
    notice: Notice
    resumed: bool  # the pod already carries this notice (a replay, or a restart mid-grace)


@dataclass(frozen=True)
class PreemptionPlan:
    event_id: str
    tenant: str
    metric: str
    victims: tuple[Victim, ...]
    protected: tuple[PodView, ...]  # pods the order passed over because they are protected


def notice_reason(event: QuotaEvent, grace_seconds: int) -> str:
    detail = f"used {event.used} of {event.limit}; evicted through the Eviction API after {grace_seconds}s"
    return quota_message(event.tenant, event.metric, detail)


def plan_preemption(event: QuotaEvent, policy: TenantPolicy | None, pods: Iterable[PodView],
                    now: datetime) -> PreemptionPlan | None:
    """Victims for one quota event, or None when the event asks for no preemption.

    ``pods`` are the tenant's pods (any state); only pods bound to a node and holding GPUs
    count.
    """
    if event.level != "exceeded" or policy is None or policy.on_exceed != "preempt":
        return None
    holding = [p for p in pods if p.holds_gpus and p.tenant == event.tenant]
    ours = {p.uid for p in holding if p.notice is not None and p.notice.cause == event.event_id}
    resumed = [p for p in holding if p.uid in ours and not p.deleting]
    leaving = [p for p in holding if p.deleting or (p.notice is not None and p.uid not in ours)]
    gone = {p.uid for p in resumed} | {p.uid for p in leaving}
    candidates = [p for p in holding if p.uid not in gone]
    by_uid = {p.uid: p for p in candidates}

    limit: Decimal | None = event.limit if event.metric == "max_gpus" else None
    with exact():
        held = sum((p.gpus for p in holding), _ZERO) - sum((p.gpus for p in resumed + leaving), _ZERO)
    chosen = [by_uid[c.uid] for c in select_victims([p.candidate() for p in candidates], held, limit)]
    deadline = now + timedelta(seconds=policy.grace_seconds)
    fresh = Notice(cause=event.event_id, reason=notice_reason(event, policy.grace_seconds), deadline=deadline,
                   metric=event.metric)
    victims = [Victim(p, p.notice, True) for p in resumed if p.notice is not None]
    victims += [Victim(p, fresh, False) for p in chosen]
    return PreemptionPlan(event.event_id, event.tenant, event.metric, tuple(victims),
                          passed_over(candidates, held, limit))


def passed_over(candidates: Sequence[PodView], held: Decimal, limit: Decimal | None) -> tuple[PodView, ...]:
    """Protected pods the eviction order reached before the tenant was back within its limit."""
    protected = {p.uid: p for p in candidates if p.protected and p.gpus > 0}
    if not protected:
        return ()
    # The same order as select_victims, with protection lifted so protected pods keep their place.
    order = eviction_order(replace(p.candidate(), protected=False) for p in candidates)
    skipped: list[PodView] = []
    remaining = held
    with exact():
        for candidate in order:
            if limit is not None and remaining <= limit:
                break
            if candidate.uid in protected:
                skipped.append(protected[candidate.uid])
            else:
                remaining -= candidate.gpus
    return tuple(skipped)


def superseded(events: Sequence[QuotaEvent]) -> set[str]:
    """Ids of ``exceeded`` events followed, later in ``events``, by ``recovered`` of the same
    tenant and metric: acting on them would evict for a state already over (a backlog read after
    downtime), so they are recorded nowhere and acted on never."""
    out: set[str] = set()
    recovered_later: set[tuple[str, str]] = set()
    for event in reversed(events):
        key = (event.tenant, event.metric)
        if event.level == "recovered":
            recovered_later.add(key)
        elif event.level == "exceeded" and key in recovered_later:
            out.add(event.event_id)
    return out


def blocked_after(blocked: Mapping[str, frozenset[str]], event: QuotaEvent,
                  policy: TenantPolicy | None) -> dict[str, frozenset[str]]:
    """Metrics each tenant is blocked on after ``event`` (contract 4: exceeded, not recovered,
    on_exceed block or preempt)."""
    out = dict(blocked)
    metrics = set(out.get(event.tenant, frozenset()))
    if event.level == "exceeded" and policy is not None and policy.on_exceed in BLOCKING:
        metrics.add(event.metric)
    elif event.level == "recovered":
        metrics.discard(event.metric)
    else:
        return out
    if metrics:
        out[event.tenant] = frozenset(metrics)
    else:
        out.pop(event.tenant, None)
    return out
