"""Idle and wasted GPUs: allocated GPUs whose utilization stays under a threshold for a sustained
time, per pod and tenant, with what they cost per day at list price. Advice only: nothing here
(or anywhere) evicts a pod because of it.

Pure: takes a pod's rated gpu windows (what ``rated_usage`` holds) and returns advice values.

The rule, per pod:
- the pod must be current: its latest window ends within ``stale`` of the evaluation time ``at``
  (a pod that stopped reporting holds nothing any more);
- walking back from that latest window, every window of the run has utilization telemetry under
  ``threshold`` and follows the previous one with at most ``max_gap`` between them (a gap or a
  window without telemetry ends the run: no evidence, no advice);
- the run spans at least ``sustain`` (from its first window's start to its last window's end).
The cost per day is the GPUs the pod holds now x the streaming list price per GPU-hour of its
latest window (unit price x capacity multiplier, contract 3.3) x 24; "wasted so far" is the list
cost of the run's windows.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from gpumeter.core.money import exact, format_money

KIND = "idle_gpu"
STORE = Decimal("1e-12")
SIX = Decimal("0.000001")


@dataclass(frozen=True)
class PodGpus:
    """Whose GPUs, where and of which model: what a window and the advice on its pod share."""

    tenant: str
    cluster: str
    node: str
    namespace: str
    pod: str
    pod_uid: str
    gpu_model: str
    mig_profile: str | None
    capacity_type: str


@dataclass(frozen=True)
class GpuWindow(PodGpus):
    """One rated gpu sample (a row of rated_usage with kind = 'gpu')."""

    window_start: datetime
    window_end: datetime
    quantity: Decimal
    utilization: Decimal | None
    unit_price: Decimal
    capacity_multiplier: Decimal
    list_cost: Decimal
    currency: str = "USD"


@dataclass(frozen=True)
class IdleRule:
    threshold: Decimal = Decimal("0.05")
    sustain: timedelta = timedelta(hours=1)
    stale: timedelta = timedelta(minutes=15)
    max_gap: timedelta = timedelta(seconds=60)

    def __post_init__(self) -> None:
        if not Decimal(0) < self.threshold <= Decimal(1):
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.sustain <= timedelta(0):
            raise ValueError("sustain must be positive")
        if self.stale < timedelta(0) or self.max_gap < timedelta(0):
            raise ValueError("stale and max_gap must not be negative")


@dataclass(frozen=True)
class IdleAdvice(PodGpus):
    advice_id: str
    gpus: Decimal
    idle_since: datetime
    last_seen: datetime
    idle_hours: Decimal
    mean_utilization: Decimal
    max_utilization: Decimal
    threshold: Decimal
    price_per_gpu_hour: Decimal
    cost_per_day: Decimal
    wasted_so_far: Decimal
    currency: str
    detected_at: datetime
    kind: str = KIND

    @property
    def message(self) -> str:
        return (f"{self.gpus.normalize():f} {self.gpu_model} GPU(s) of {self.namespace}/{self.pod} on "
                f"{self.node} under {self.threshold * 100:.0f}% utilization for {self.idle_hours:.1f} h: "
                f"{format_money(self.cost_per_day)} {self.currency}/day at list price (advice only)")

    def to_document(self) -> dict[str, Any]:
        """The advice event (topic gpumeter.advice.v1): decimals as strings, times RFC 3339 UTC."""
        document: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Decimal):
                value = str(value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            document[name] = value
        document["message"] = self.message
        return document


@dataclass(frozen=True)
class TenantIdle:
    tenant: str
    pods: int
    gpus: Decimal
    cost_per_day: Decimal
    currency: str


def advice_id(cluster: str, pod_uid: str) -> str:
    """One advice per pod: a re-evaluation replaces the earlier word on the same pod."""
    return hashlib.sha256(f"{KIND}|{cluster}|{pod_uid}".encode()).hexdigest()[:32]


def _seconds(window: GpuWindow) -> Decimal:
    return Decimal(str((window.window_end - window.window_start).total_seconds()))


def _idle_run(windows: Sequence[GpuWindow], rule: IdleRule) -> list[GpuWindow]:
    """The trailing run of idle windows, oldest first (empty when the latest is not idle)."""
    run: list[GpuWindow] = []
    for window in reversed(windows):
        if window.utilization is None or window.utilization >= rule.threshold:
            break
        if run and window.window_end < run[-1].window_start - rule.max_gap:
            break
        run.append(window)
    run.reverse()
    return run


def pod_advice(windows: Sequence[GpuWindow], at: datetime, rule: IdleRule) -> IdleAdvice | None:
    """The advice for one pod's gpu windows, or None. Windows ending after ``at`` are ignored."""
    seen = sorted((w for w in windows if w.window_end <= at), key=lambda w: (w.window_start, w.window_end))
    if not seen:
        return None
    latest = seen[-1]
    if latest.window_end < at - rule.stale:
        return None
    run = _idle_run(seen, rule)
    if not run or latest.window_end - run[0].window_start < rule.sustain:
        return None
    with exact():
        seconds = sum((_seconds(w) for w in run), Decimal(0))
        weighted = sum((_seconds(w) * (w.utilization or Decimal(0)) for w in run), Decimal(0))
        mean = (weighted / seconds) if seconds else Decimal(0)
        price = latest.unit_price * latest.capacity_multiplier
        # One sample per (pod, device) and window: the pod's GPUs are its latest window's sum.
        last = (latest.window_start, latest.window_end)
        gpus = sum((w.quantity for w in seen if (w.window_start, w.window_end) == last), Decimal(0))
        per_day = gpus * price * 24
        wasted = sum((w.list_cost for w in run), Decimal(0))
        hours = Decimal(str((latest.window_end - run[0].window_start).total_seconds())) / 3600
    return IdleAdvice(
        advice_id=advice_id(latest.cluster, latest.pod_uid),
        tenant=latest.tenant, cluster=latest.cluster, node=latest.node, namespace=latest.namespace,
        pod=latest.pod, pod_uid=latest.pod_uid, gpu_model=latest.gpu_model, mig_profile=latest.mig_profile,
        capacity_type=latest.capacity_type, gpus=gpus,
        idle_since=run[0].window_start, last_seen=latest.window_end,
        idle_hours=hours.quantize(SIX, rounding=ROUND_HALF_UP),
        mean_utilization=mean.quantize(SIX, rounding=ROUND_HALF_UP),
        max_utilization=max(w.utilization or Decimal(0) for w in run),
        threshold=rule.threshold,
        price_per_gpu_hour=price.quantize(STORE, rounding=ROUND_HALF_UP),
        cost_per_day=per_day.quantize(STORE, rounding=ROUND_HALF_UP),
        wasted_so_far=wasted, currency=latest.currency, detected_at=at,
    )


def find_idle(windows: Iterable[GpuWindow], at: datetime, rule: IdleRule | None = None) -> list[IdleAdvice]:
    """Advice for every idle pod among ``windows``, most expensive per day first."""
    rule = rule or IdleRule()
    by_pod: dict[tuple[str, str], list[GpuWindow]] = defaultdict(list)
    for window in windows:
        by_pod[(window.cluster, window.pod_uid)].append(window)
    found = [advice for pod in by_pod.values() if (advice := pod_advice(pod, at, rule)) is not None]
    return sorted(found, key=lambda a: (-a.cost_per_day, a.tenant, a.namespace, a.pod))


def per_tenant(advice: Iterable[IdleAdvice]) -> list[TenantIdle]:
    """Idle pods, GPUs and cost per day summed per tenant (and currency), most expensive first."""
    totals: dict[tuple[str, str], list[Any]] = {}
    for item in advice:
        entry = totals.setdefault((item.tenant, item.currency), [0, Decimal(0), Decimal(0)])
        entry[0] += 1
        entry[1] += item.gpus
        entry[2] += item.cost_per_day
    summary = [TenantIdle(tenant, pods, gpus, cost, currency)
               for (tenant, currency), (pods, gpus, cost) in totals.items()]
    return sorted(summary, key=lambda t: (-t.cost_per_day, t.tenant))
