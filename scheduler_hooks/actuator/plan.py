"""What the quota actuator decides for quota events, as pure functions (contract 4): values
in, values out.

- ``plan_preemption``: for a tenant whose ``on_exceed`` is ``preempt`` and an ``exceeded``
  event, the pods to notice and evict. gpu_hours and spend only grow within a period, so
  every unprotected GPU pod goes; for max_gpus, pods go in eviction order only until the GPUs
  held are within the limit (``quota.victims.select_victims``). "Held" is what the API server
  shows now, not the event's ``used``: the stream's view can be a window old, the pods are
  the truth. Pods already on their way out (a notice from another cause, a deletion under
  way) are not chosen again, and for max_gpus their GPUs count as already gone.
  The limit is the policy's, never the event's (contract 4, amendment "trust"): the event
  only says that a crossing happened; how many GPUs the tenant may keep is the tenants file's
  to say.
- A replayed event finds its own notices on the pods (the annotation carries the event id):
  those pods are victims again *with their original deadline*, never a new grace period.
- ``Recoveries``: which ``exceeded`` a later ``recovered`` of the same tenant, metric and
  period has cancelled, however far apart on the topic the two are.
- ``blocked_after``: the metrics each tenant is blocked on after an event the tenants file
  agrees with (``quota.trust``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from gpumeter.core.grants import Grant
from gpumeter.core.models import QuotaEvent
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy, model_key
from quota.trust import distrust
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


def notice_metric(event: QuotaEvent) -> str:
    """What a notice names as its metric: ``gpu_hours``, or ``gpu_hours:H100-`` for a per-model
    budget, so a recovery withdraws only notices of its own quota."""
    return event.metric if event.gpu_model is None else f"{event.metric}:{event.gpu_model}"


_CROSSING_REASONS = {"warning": "QuotaWarning", "exceeded": "QuotaExceeded", "recovered": "QuotaRecovered"}


def crossing_event(event: QuotaEvent) -> tuple[str, str, bool]:
    """(reason, message, warning) of the Kubernetes Event a crossing posts on the tenant's
    namespaces: what a person reads with ``kubectl get events``."""
    quota = f"{event.metric} quota" + ("" if event.gpu_model is None else f" for {event.gpu_model} GPUs")
    if event.level == "warning":
        what = f"reached {event.threshold * 100:f}".rstrip("0").rstrip(".") + "% of its"
    elif event.level == "exceeded":
        what = "over its"
    else:
        what = "back under its"
    message = (f"gpumeter: tenant {event.tenant} {what} {quota}: used {event.used} of "
               f"{event.limit} (period {event.period})")
    return _CROSSING_REASONS[event.level], message, event.level != "recovered"


def notice_reason(event: QuotaEvent, grace_seconds: int) -> str:
    detail = f"used {event.used} of {event.limit}; evicted through the Eviction API after {grace_seconds}s"
    if event.gpu_model is not None:
        detail = f"on {event.gpu_model} GPUs {detail}"
    return quota_message(event.tenant, event.metric, detail)


def plan_preemption(event: QuotaEvent, policy: TenantPolicy | None, pods: Iterable[PodView],
                    now: datetime) -> PreemptionPlan | None:
    """Victims for one quota event, or None when the event asks for no preemption.

    ``pods`` are the tenant's pods (any state); only pods bound to a node and holding GPUs
    count.
    """
    if event.level != "exceeded" or policy is None or policy.on_exceed != "preempt":
        return None
    # A period budget (gpu_hours, spend) counts every GPU device's hours, MIG and shared too: all
    # such pods go. max_gpus counts whole GPUs (nvidia.com/gpu): only a pod holding some frees any.
    devices = event.metric != "max_gpus"
    holding = [p for p in pods if p.tenant == event.tenant
               and (p.holds_gpu_devices if devices else p.holds_gpus)]
    model_limit: Decimal | None = None
    if event.gpu_model is not None:
        # A per-model budget: only pods on nodes of the models its key owns (longest match).
        by_model: dict[str, Decimal] = getattr(policy, f"{event.metric}_by_model", {})
        if event.gpu_model not in by_model:
            return None
        model_limit = by_model[event.gpu_model]
        holding = [p for p in holding if model_key(tuple(by_model), p.gpu_model) == event.gpu_model]
    ours = {p.uid for p in holding if p.notice is not None and p.notice.cause == event.event_id}
    resumed = [p for p in holding if p.uid in ours and not p.deleting]
    leaving = [p for p in holding if p.deleting or (p.notice is not None and p.uid not in ours)]
    gone = {p.uid for p in resumed} | {p.uid for p in leaving}
    candidates = [p for p in holding if p.uid not in gone]
    by_uid = {p.uid: p for p in candidates}

    limit: Decimal | None = None
    if event.metric == "max_gpus" and event.gpu_model is not None:
        limit = model_limit
    elif event.metric == "max_gpus":
        if policy.max_gpus is None:
            return None  # no limit in the file: nothing to bring the tenant back within
        limit = policy.max_gpus
    with exact():
        held = sum((p.gpus for p in holding), _ZERO) - sum((p.gpus for p in resumed + leaving), _ZERO)
    chosen = [by_uid[c.uid] for c in select_victims([p.candidate(devices=devices) for p in candidates],
                                                    held, limit)]
    deadline = now + timedelta(seconds=policy.grace_seconds)
    fresh = Notice(cause=event.event_id, reason=notice_reason(event, policy.grace_seconds), deadline=deadline,
                   metric=notice_metric(event))
    victims = [Victim(p, p.notice, True) for p in resumed if p.notice is not None]
    victims += [Victim(p, fresh, False) for p in chosen]
    return PreemptionPlan(event.event_id, event.tenant, event.metric, tuple(victims),
                          passed_over(candidates, held, limit, devices=devices))


def passed_over(candidates: Sequence[PodView], held: Decimal, limit: Decimal | None, *,
                devices: bool = False) -> tuple[PodView, ...]:
    """Protected pods the eviction order reached before the tenant was back within its limit."""
    protected = {p.uid: p for p in candidates if p.protected and p.candidate(devices=devices).gpus > 0}
    if not protected:
        return ()
    # The same order as select_victims, with protection lifted so protected pods keep their place.
    order = eviction_order(replace(p.candidate(devices=devices), protected=False) for p in candidates)
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


Position = tuple[int, int]  # (partition, offset) of an event on the quota events topic
CrossingKey = tuple[str, str, str, str]  # (tenant, metric, period, model key or "")


def crossing_key(event: QuotaEvent) -> CrossingKey:
    return (event.tenant, event.metric, event.period, event.gpu_model or "")


@dataclass
class Recoveries:
    """The latest ``recovered`` of each (tenant, metric, period) seen on the topic, and how far
    each partition has been read.

    Fed with every event the actuator reads, the consumer's fetches and the read-ahead alike
    (service.py reads to the end of the partition before evicting for an ``exceeded``): an
    ``exceeded`` is cancelled when a ``recovered`` of its key sits after it on its partition,
    however many events lie between. A tenant's events share one partition (key = tenant),
    so positions on it are its order. Nothing is persisted: after a restart the consumer
    replays from the committed offset, and the read-ahead finds every later event again.
    """

    _recovered: dict[CrossingKey, Position] = field(default_factory=dict)
    _read_to: dict[int, int] = field(default_factory=dict)  # partition -> highest offset observed

    def observe(self, event: QuotaEvent, position: Position) -> None:
        partition, offset = position
        self._read_to[partition] = max(offset, self._read_to.get(partition, -1))
        if event.level != "recovered":
            return
        key = crossing_key(event)
        seen = self._recovered.get(key)
        if seen is None or seen[0] != partition or seen[1] < offset:
            self._recovered[key] = position

    def read_to(self, partition: int) -> int:
        """The highest offset observed on ``partition`` (-1: none)."""
        return self._read_to.get(partition, -1)

    def cancelled(self, event: QuotaEvent, position: Position) -> bool:
        """An ``exceeded`` followed, later on its partition, by a ``recovered`` of its key."""
        if event.level != "exceeded":
            return False
        seen = self._recovered.get(crossing_key(event))
        return seen is not None and seen[0] == position[0] and seen[1] > position[1]


def blocked_after(blocked: Mapping[str, frozenset[str]], event: QuotaEvent,
                  policy: TenantPolicy | None, now: datetime,
                  grants: Sequence[Grant] = ()) -> dict[str, frozenset[str]]:
    """Metrics each tenant is blocked on after ``event`` (contract 4: exceeded, not recovered,
    on_exceed block or preempt); an event the tenants file (and the tenant's ``grants``)
    disagrees with changes nothing."""
    out = dict(blocked)
    # A per-model budget blocks pods on its models only (the extender), never the whole tenant.
    if event.gpu_model is not None or distrust(event, policy, now, grants) is not None:
        return out
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
