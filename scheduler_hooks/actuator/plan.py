"""What the quota actuator decides, as pure functions (contract 4): values in, values out.

- ``plan_preemption``: for a tenant whose ``on_exceed`` is ``preempt`` and an ``exceeded``
  event, the pods to notice and evict. gpu_hours and spend only grow within a period, so
  every unprotected GPU pod goes; for max_gpus, pods go in eviction order only until the GPUs
  held are within the limit (``quota.victims.select_victims``). "Held" is what the API server
  shows now, not the event's ``used``: the stream's view can be a window old, the pods are
  the truth. Pods already on their way out (a notice from another cause, a deletion under
  way) are not chosen again, and for max_gpus their GPUs count as already gone.
- A replayed event finds its own notices on the pods (the annotation carries the event id):
  those pods are victims again *with their original deadline*, never a new grace period.
- ``classify_eviction``: the Eviction API's answers, 429 + ``DisruptionBudget`` told apart
  from API Priority and Fairness throttling (also 429).
- ``record_id``: sha256 of (cause, subject, action), so a replay republishes the same
  PreemptionRecord ids and ClickHouse's ReplacingMergeTree folds them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

from gpumeter.core import jsonio
from gpumeter.core.kube import EVICTION_NOTICE_ANNOTATION
from gpumeter.core.models import PreemptionAction, PreemptionRecord, QuotaEvent
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy
from quota.victims import eviction_order, select_victims
from scheduler_hooks.cluster.kube_objects import Notice, PodView, quota_message

RECLAIM_PREFIX = "spot-reclaim:"
# on_exceed values that block a tenant (contract 4): its Volcano queue closes while blocked.
BLOCKING = frozenset({"block", "preempt"})

_ZERO = Decimal(0)


def record_id(cause: str, subject: str, action: str) -> str:
    """Deterministic id of one decision: the same cause, pod (or queue) and action, the same id."""
    return hashlib.sha256(f"{cause}|{subject}|{action}".encode()).hexdigest()


def pod_record(cause: str, metric: str, pod: PodView, action: PreemptionAction, detail: str,
               at: datetime) -> PreemptionRecord:
    return PreemptionRecord(
        record_id=record_id(cause, pod.uid, action), tenant=pod.tenant, namespace=pod.namespace,
        pod=pod.name, pod_uid=pod.uid, node=pod.node, gpus=pod.gpus, capacity_type=pod.capacity_type,
        priority=pod.priority, cause=cause, metric=metric, action=action, detail=detail, at=at,
    )


def queue_record(cause: str, metric: str, tenant: str, queue: str, action: PreemptionAction, detail: str,
                 at: datetime) -> PreemptionRecord:
    """A Volcano queue decision; the queue's name stands where a pod's would (namespace empty)."""
    return PreemptionRecord(
        record_id=record_id(cause, f"queue/{queue}", action), tenant=tenant, namespace="", pod=queue,
        pod_uid="", cause=cause, metric=metric, action=action, detail=detail, at=at,
    )


# -- quota preemption -----------------------------------------------------------------------


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


# -- API bodies -----------------------------------------------------------------------------


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def notice_patch(uid: str, notice: Notice) -> dict[str, Any]:
    """JSON merge patch adding the notice; the uid makes it fail (422) on a same-named new pod."""
    return {"metadata": {"uid": uid, "annotations": {EVICTION_NOTICE_ANNOTATION: notice.to_annotation()}}}


def withdraw_patch(notice_text: str) -> list[dict[str, Any]]:
    """JSON patch removing the notice only if it is still exactly the one we put there."""
    path = f"/metadata/annotations/{_pointer(EVICTION_NOTICE_ANNOTATION)}"
    return [{"op": "test", "path": path, "value": notice_text}, {"op": "remove", "path": path}]


def eviction_body(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """policy/v1 Eviction, preconditioned on the uid: never evicts a same-named successor."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }


EvictionOutcome = Literal["evicted", "pdb", "throttled", "gone", "error"]


def classify_eviction(status: int, body: str | bytes | None) -> EvictionOutcome:
    """The Eviction API's answer: 201/200 evicted; 429 with a ``DisruptionBudget`` cause is a
    PodDisruptionBudget refusal, any other 429 is throttling; 404 (pod gone) and 409 (uid
    precondition failed: a new pod took the name) mean our pod is no more."""
    if status in (200, 201):
        return "evicted"
    if status == 429:
        return "pdb" if _disruption_budget(body) else "throttled"
    if status in (404, 409):
        return "gone"
    return "error"


def _disruption_budget(body: str | bytes | None) -> bool:
    if not body:
        return False
    try:
        document = jsonio.loads(body)
    except jsonio.JSONInputError:
        return False
    details = document.get("details") if isinstance(document, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    return any(isinstance(c, dict) and c.get("reason") == "DisruptionBudget" for c in causes or ())


def status_message(body: str | bytes | None) -> str:
    """The ``message`` of a Kubernetes Status body, for records and logs (first 300 chars)."""
    if not body:
        return ""
    try:
        document = jsonio.loads(body)
    except jsonio.JSONInputError:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return text.strip()[:300]
    message = document.get("message") if isinstance(document, dict) else None
    return str(message)[:300] if message else ""


def backoff_seconds(attempt: int, cap: float, base: float = 1.0) -> float:
    """Exponential back-off: base, 2·base, 4·base ... never above ``cap`` (attempt counts from 0)."""
    if attempt < 0:
        raise ValueError("attempt counts from 0")
    # 2**attempt overflows float near attempt 1024; the cap is reached long before.
    return float(min(cap, base * 2 ** min(attempt, 62)))
