"""Per-tenant quota ledger (contract 4, amended): usage in, one QuotaEvent per crossing out.

Measures, all exact Decimal:
- ``gpu_hours``: Σ unit-seconds of gpu usage whose window_start falls in the quota period,
  compared as unit-seconds against ``limit × 3600`` so no division enters a decision;
- ``spend``: Σ streaming list cost (contract 3.3) of every kind over the same period;
- ``max_gpus``: GPUs held now, Σ quantity of each pod's latest gpu window, a pod silent for
  more than ``stale_seconds`` holding none. It has no period: holding GPUs does not reset
  at midnight, so its crossings live in one scope, ``"held"``, across periods.

Each (metric, scope) has a generation: one run of announcements against one limit. Within a
generation a threshold is announced at most once and ``recovered`` at most once; recovery
or a changed limit starts the next generation. Event ids hash (tenant, metric, scope,
level, threshold, generation), so recomputing a crossing from the same ledger (a replay
after a crash) yields the same id, and a later, genuinely new crossing a different one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumeter.core.grants import Grant
from gpumeter.core.models import CapacityType, Kind, QuotaEvent, QuotaLevel, QuotaMetric, RatedUsage
from gpumeter.core.money import CENT, MICRO, SECONDS_PER_HOUR, exact
from gpumeter.core.tenants import TenantPolicy, model_key
from gpumeter.core.validation import DecimalValue, UtcTimestamp
from quota.grants import limit_at, of_file, previous_period
from quota.periods import PeriodKind, period_key

METRICS: tuple[QuotaMetric, ...] = ("gpu_hours", "spend", "max_gpus")
QuotaState = Literal["ok", "warning", "exceeded"]

# A replay re-delivers what was processed after the last committed offset: faust commits
# every few seconds, and even a 1,000-GPU tenant (one sample per device per minute, plus
# cpu/memory/storage per pod) sends ~25 rated records a second, so 1,024 ids cover ~40 s,
# several commit intervals, while keeping the stored ledger near 50 KB. Exactly-once over
# longer horizons is the store's job (contract 1: ClickHouse folds duplicate event_ids).
RECENT_EVENT_IDS = 1024
# Period totals kept per granularity (months, days), newest keys first: the current
# period, the previous one (late samples, the rollover's recovered event) and one spare
# for an agent whose clock runs ahead across a boundary.
KEEP_PERIODS = 3
HELD_SCOPE = "held"
DEFAULT_STALE_SECONDS = 120

_PERIOD_KINDS: tuple[PeriodKind, ...] = ("month", "day")
_ONE = Decimal(1)
_ZERO = Decimal(0)
_FRACTION_QUANTUM = MICRO
_SCALE: Mapping[QuotaMetric, Decimal] = {"gpu_hours": SECONDS_PER_HOUR, "spend": _ONE, "max_gpus": _ONE}


@dataclass(frozen=True)
class Usage:
    """One rated usage record as quota accounting needs it."""

    event_id: str
    tenant: str
    kind: Kind
    namespace: str
    pod: str
    pod_uid: str
    window_start: datetime
    window_end: datetime
    quantity: Decimal
    unit_seconds: Decimal  # quantity x window seconds
    list_cost: Decimal  # streaming list cost, contract 3.3
    capacity_type: CapacityType = "on-demand"
    priority: int = 0
    # The sample's GPU model, for per-model limits (None: not a GPU sample, or no model known).
    gpu_model: str | None = None

    def __post_init__(self) -> None:
        for moment in (self.window_start, self.window_end):
            _require_aware(moment)
        if self.window_end <= self.window_start:
            raise ValueError("window_end must be after window_start")
        for name in ("quantity", "unit_seconds", "list_cost"):
            # A float here would already have lost the exact value; refuse rather than guess.
            if not isinstance(getattr(self, name), Decimal):
                raise TypeError(f"Usage.{name} must be a Decimal")

    @classmethod
    def trusted(
        cls, event_id: str, tenant: str, kind: Kind, namespace: str, pod: str, pod_uid: str,
        window_start: datetime, window_end: datetime, quantity: Decimal, unit_seconds: Decimal,
        list_cost: Decimal, capacity_type: CapacityType, priority: int, gpu_model: str | None,
    ) -> Usage:
        """A Usage of values the caller has already checked as ``__post_init__`` would (aware
        windows, end after start, Decimal amounts), without checking them again: a frozen
        dataclass's __init__ (a setattr per field) and the checks cost ~3 µs a rated line on
        the quota agent's fast path (streams/quota_decode.py). Everyone else: ``Usage(...)``.
        """
        usage = _new(cls)
        _set(usage, "__dict__", {
            "event_id": event_id, "tenant": tenant, "kind": kind, "namespace": namespace, "pod": pod,
            "pod_uid": pod_uid, "window_start": window_start, "window_end": window_end,
            "quantity": quantity, "unit_seconds": unit_seconds, "list_cost": list_cost,
            "capacity_type": capacity_type, "priority": priority, "gpu_model": gpu_model,
        })
        return usage

    @classmethod
    def from_rated(cls, rated: RatedUsage) -> Usage:
        return cls(
            event_id=rated.event_id,
            tenant=rated.tenant,
            kind=rated.kind,
            namespace=rated.namespace,
            pod=rated.pod,
            pod_uid=rated.pod_uid,
            window_start=rated.window_start,
            window_end=rated.window_end,
            quantity=rated.quantity,
            unit_seconds=rated.unit_seconds,
            list_cost=rated.list_cost,
            capacity_type=rated.capacity_type,
            priority=rated.priority,
            gpu_model=rated.gpu_model,
        )


_new = object.__new__
_set = object.__setattr__

_Frozen = ConfigDict(extra="forbid", frozen=True)


class PeriodTotals(BaseModel):
    """What one quota period (a month or a day key) has used so far."""

    model_config = _Frozen

    gpu_unit_seconds: DecimalValue = _ZERO
    list_spend: DecimalValue = _ZERO
    # gpu unit-seconds by the samples' own gpu_model (not by limit key: a reloaded file may
    # change the keys, and the totals then still add up under the new ones).
    gpu_unit_seconds_by_model: dict[str, DecimalValue] = Field(default_factory=dict)


class PodWindow(BaseModel):
    """A pod's latest gpu window and Σ quantity of its samples (one per device)."""

    model_config = _Frozen

    window_start: UtcTimestamp
    window_end: UtcTimestamp
    quantity: DecimalValue
    gpu_model: str | None = None


class CrossingState(BaseModel):
    """Announcements made for one (metric, scope) in the current generation."""

    model_config = _Frozen

    generation: Annotated[int, Field(ge=0)] = 0
    crossed: tuple[DecimalValue, ...] = ()  # fractions announced, ascending; 1 = exceeded
    exceeded: bool = False
    limit: DecimalValue | None = None  # the limit the announcements refer to


class TenantLedger(BaseModel):
    """Quota state of one tenant, stored as JSON (Decimals as strings, exact round trip)."""

    model_config = _Frozen

    tenant: str
    periods: dict[str, PeriodTotals] = Field(default_factory=dict)  # by "YYYY-MM" and "YYYY-MM-DD"
    pods: dict[str, PodWindow] = Field(default_factory=dict)  # by pod_uid
    crossings: dict[QuotaMetric, dict[str, CrossingState]] = Field(default_factory=dict)  # metric -> scope
    recent_event_ids: tuple[str, ...] = ()  # oldest first, at most RECENT_EVENT_IDS
    # Per-model limits: metric -> model key -> scope -> state (amendment "per-model limits").
    model_crossings: dict[QuotaMetric, dict[str, dict[str, CrossingState]]] = Field(default_factory=dict)


class MetricStatus(BaseModel):
    """One metric of ``gpumeter quota status``: used and limit in the metric's own unit."""

    model_config = _Frozen

    metric: QuotaMetric
    period: str
    used: Decimal  # hours, money or GPUs, unrounded
    limit: Decimal | None
    fraction: Decimal | None  # used / limit to 6 places; None without a positive limit
    state: QuotaState
    gpu_model: str | None = None  # a per-model limit's key; None: tenant-wide


@dataclass(frozen=True)
class _Crossing:
    level: QuotaLevel
    threshold: Decimal
    generation: int


def apply(
    ledger: TenantLedger,
    usage: Usage,
    policy: TenantPolicy | None,
    now: datetime,
    stale_seconds: int = DEFAULT_STALE_SECONDS,
    grants: Sequence[Grant] = (),
) -> tuple[TenantLedger, list[QuotaEvent]]:
    """Count ``usage`` once (a recently applied event_id is skipped), then evaluate crossings."""
    return reevaluate(count(ledger, usage), policy, now, stale_seconds, grants)


def count(ledger: TenantLedger, usages: Usage | Iterable[Usage]) -> TenantLedger:
    """Count each usage once (a recently counted event_id is skipped) without evaluating crossings.

    For a batch (the samples of one Kafka record): count them all, then reevaluate() once.
    Evaluating between the per-device samples of one window would see a multi-GPU pod's
    hold drop to its first device and flap max_gpus (recovered, then exceeded again). One
    call copies the ledger once, however many usages it counts.
    """
    batch = (usages,) if isinstance(usages, Usage) else tuple(usages)
    for usage in batch:
        if usage.tenant != ledger.tenant:
            raise ValueError(f"usage of tenant {usage.tenant!r} applied to the ledger of {ledger.tenant!r}")
    recent = set(ledger.recent_event_ids)
    counted: list[Usage] = []
    for usage in batch:
        if usage.event_id not in recent:
            recent.add(usage.event_id)
            counted.append(usage)
    if not counted:
        return ledger
    return _count(ledger, counted)


def reevaluate(
    ledger: TenantLedger,
    policy: TenantPolicy | None,
    now: datetime,
    stale_seconds: int = DEFAULT_STALE_SECONDS,
    grants: Sequence[Grant] = (),
) -> tuple[TenantLedger, list[QuotaEvent]]:
    """Crossings as of ``now``: for timer ticks and tenants-file reloads, and after each usage.

    Stale pods stop holding GPUs, a new period recovers the old period's exceeded metrics,
    a raised or removed limit recovers, a lowered one can newly warn or exceed. ``grants``:
    the tenant's (quota.grants), raising the gpu_hours and spend limits of the period; a grant
    that takes effect or expires changes the limit like a reloaded file does.
    """
    _check_policy(ledger, policy)
    _require_aware(now)
    current = period_key(now, _period_kind(policy))
    crossings = {metric: dict(ledger.crossings.get(metric, {})) for metric in METRICS}
    events: list[QuotaEvent] = []

    for metric in ("gpu_hours", "spend"):
        events += _close_past_periods(ledger, crossings[metric], metric, current, now)
        raw = _raw(ledger, metric, current)
        limit = period_limit(ledger, policy, metric, now, grants)
        events += _evaluate(ledger, crossings[metric], metric, current, current, raw, limit, policy, now)

    held = held_gpus(ledger, now, stale_seconds)
    events += _evaluate(ledger, crossings["max_gpus"], "max_gpus", HELD_SCOPE, current, held,
                        _limit(policy, "max_gpus"), policy, now)

    model_crossings = {metric: {key: dict(scopes) for key, scopes in keys.items()}
                       for metric, keys in ledger.model_crossings.items()}
    events += _evaluate_models(ledger, model_crossings, policy, current, now, stale_seconds)

    kept_periods = _retained_periods(ledger.periods, crossings, model_crossings)
    updated = ledger.model_copy(update={
        "periods": kept_periods,
        "pods": {uid: pod for uid, pod in ledger.pods.items() if not _stale(pod, now, stale_seconds)},
        "crossings": {
            metric: {scope: state for scope, state in scopes.items()
                     if scope in (HELD_SCOPE, current) or scope in kept_periods or state.exceeded}
            for metric, scopes in crossings.items() if scopes
        },
        "model_crossings": {
            metric: {key: {scope: state for scope, state in scopes.items()
                           if scope in (HELD_SCOPE, current) or scope in kept_periods or state.exceeded}
                     for key, scopes in keys.items() if scopes}
            for metric, keys in model_crossings.items() if keys
        },
    })
    return updated, events


def status(
    ledger: TenantLedger,
    policy: TenantPolicy | None,
    now: datetime,
    stale_seconds: int = DEFAULT_STALE_SECONDS,
    grants: Sequence[Grant] = (),
) -> list[MetricStatus]:
    """Each metric's use in the current period (max_gpus: now) against the policy and grants."""
    _check_policy(ledger, policy)
    current = period_key(now, _period_kind(policy))
    result = []
    for metric in METRICS:
        raw = held_gpus(ledger, now, stale_seconds) if metric == "max_gpus" else _raw(ledger, metric, current)
        limit = period_limit(ledger, policy, metric, now, grants)
        scale = _SCALE[metric]
        with exact():
            used = raw / scale
            fraction = None
            state: QuotaState = "ok"
            if limit is not None:
                if limit > 0:
                    fraction = (raw / (limit * scale)).quantize(_FRACTION_QUANTUM, rounding=ROUND_HALF_UP)
                # Decided on exact values, never on the rounded fraction.
                if raw >= limit * scale:
                    state = "exceeded"
                elif policy is not None and policy.warn_at and raw >= policy.warn_at[0] * limit * scale:
                    state = "warning"
        result.append(MetricStatus(metric=metric, period=current, used=used, limit=limit,
                                   fraction=fraction, state=state))
    for metric, key, limit in _model_limits(policy):
        raw = _model_raw(ledger, metric, key, current, now, stale_seconds, policy)
        scale = _SCALE[metric]
        with exact():
            fraction = None if limit <= 0 else (raw / (limit * scale)).quantize(
                _FRACTION_QUANTUM, rounding=ROUND_HALF_UP)
            warn = policy is not None and bool(policy.warn_at) and raw >= policy.warn_at[0] * limit * scale
            state = "exceeded" if raw >= limit * scale else ("warning" if warn else "ok")
            result.append(MetricStatus(metric=metric, period=current, used=raw / scale, limit=limit,
                                       fraction=fraction, state=state, gpu_model=key))
    return result


def blocked(ledger: TenantLedger, policy: TenantPolicy | None) -> list[QuotaMetric]:
    """Metrics exceeded and not recovered, when the tenant's on_exceed is block or preempt."""
    if policy is None or policy.on_exceed not in ("block", "preempt"):
        return []
    return [
        metric for metric in METRICS
        # A limit removed by a reload blocks nothing, even before the next reevaluate.
        if _limit(policy, metric) is not None
        and any(state.exceeded for state in ledger.crossings.get(metric, {}).values())
    ]


def period_limit(ledger: TenantLedger, policy: TenantPolicy | None, metric: QuotaMetric, now: datetime,
                 grants: Sequence[Grant] = ()) -> Decimal | None:
    """The metric's limit at ``now``: the policy's, raised by the grants in force (quota.grants),
    whose carried parts need the usage of the period before (kept in the ledger)."""
    base = _limit(policy, metric)
    if metric == "max_gpus" or base is None or policy is None:
        return base
    file_grants = of_file(policy.grants)
    every = [*file_grants, *grants] if file_grants else grants
    if not every:
        return base
    before = _raw(ledger, metric, previous_period(period_key(now, policy.period)))
    with exact():
        return limit_at(base, every, metric, policy.period, now, before / _SCALE[metric])


def period_used(ledger: TenantLedger, metric: QuotaMetric, period: str) -> Decimal:
    """``gpu_hours`` (hours) or ``spend`` (money) used in ``period`` by the ledger's count."""
    with exact():
        return _raw(ledger, metric, period) / _SCALE[metric]


def blocked_models(ledger: TenantLedger, policy: TenantPolicy | None) -> list[tuple[QuotaMetric, str]]:
    """(metric, model key) exceeded and not recovered, when on_exceed is block or preempt."""
    if policy is None or policy.on_exceed not in ("block", "preempt"):
        return []
    limits = {(metric, key) for metric, key, _ in _model_limits(policy)}
    return sorted((metric, key) for metric, keys in ledger.model_crossings.items()
                  for key, scopes in keys.items()
                  if (metric, key) in limits and any(state.exceeded for state in scopes.values()))


def held_gpus(ledger: TenantLedger, now: datetime, stale_seconds: int = DEFAULT_STALE_SECONDS) -> Decimal:
    """GPUs the tenant holds now: Σ of each fresh pod's latest-window quantity."""
    _require_aware(now)
    if stale_seconds < 0:
        raise ValueError("stale_seconds must be >= 0")
    with exact():
        return sum(
            (pod.quantity for pod in ledger.pods.values() if not _stale(pod, now, stale_seconds)), _ZERO
        )


def format_value(metric: QuotaMetric, value: Decimal) -> str:
    """A used or limit value as quota events carry it.

    spend: money, exactly 2 places; gpu_hours: exactly 6 places (both half-up, display
    only); max_gpus: the exact GPU count (at most 12 places, trailing zeros dropped), so the
    event never shows "1" for 0.999999999999 GPUs that did not reach a limit of 1.
    """
    if metric == "spend":
        return format(value.quantize(CENT, rounding=ROUND_HALF_UP), "f")
    if metric == "gpu_hours":
        return format(value.quantize(MICRO, rounding=ROUND_HALF_UP), "f")
    return _plain(value)


def crossing_id(tenant: str, metric: QuotaMetric, scope: str, level: QuotaLevel, threshold: str,
                generation: int) -> str:
    """Deterministic event id of one crossing: sha256 hex of its identifying fields."""
    return hashlib.sha256(f"{tenant}|{metric}|{scope}|{level}|{threshold}|{generation}".encode()).hexdigest()


# A pod's latest window, the quantity held in it and its GPU model.
_Hold = tuple[datetime, datetime, Decimal, str | None]


def _count(ledger: TenantLedger, usages: list[Usage]) -> TenantLedger:
    """Add ``usages`` (distinct, not counted before) to the period totals and the pods' holds."""
    gpu_seconds: dict[str, Decimal] = {}
    by_model: dict[str, dict[str, Decimal]] = {}
    spend: dict[str, Decimal] = {}
    keys: dict[datetime, tuple[str, ...]] = {}  # a batch shares few window starts
    holds: dict[str, _Hold] = {}
    with exact():
        for usage in usages:
            gpu = usage.kind == "gpu"
            # Both granularities are kept, so a reload switching month <-> day finds its totals.
            periods_of = keys.get(usage.window_start)
            if periods_of is None:
                periods_of = keys[usage.window_start] = tuple(
                    period_key(usage.window_start, kind) for kind in _PERIOD_KINDS)
            for key in periods_of:
                spend[key] = spend.get(key, _ZERO) + usage.list_cost
                if gpu:
                    gpu_seconds[key] = gpu_seconds.get(key, _ZERO) + usage.unit_seconds
                    if usage.gpu_model is not None:
                        models = by_model.setdefault(key, {})
                        models[usage.gpu_model] = models.get(usage.gpu_model, _ZERO) + usage.unit_seconds
            if gpu:
                _hold(holds, ledger.pods, usage)
        periods = dict(ledger.periods)
        for key, cost in spend.items():
            totals = periods.get(key, PeriodTotals())
            models = dict(totals.gpu_unit_seconds_by_model)
            for model, seconds in by_model.get(key, {}).items():
                models[model] = models.get(model, _ZERO) + seconds
            periods[key] = PeriodTotals(
                gpu_unit_seconds=totals.gpu_unit_seconds + gpu_seconds.get(key, _ZERO),
                list_spend=totals.list_spend + cost,
                gpu_unit_seconds_by_model=models,
            )
    pods = dict(ledger.pods)
    for uid, (start, end, quantity, held_model) in holds.items():
        pods[uid] = PodWindow(window_start=start, window_end=end, quantity=quantity, gpu_model=held_model)
    recent = (*ledger.recent_event_ids, *(usage.event_id for usage in usages))[-RECENT_EVENT_IDS:]
    return ledger.model_copy(update={"periods": periods, "pods": pods, "recent_event_ids": recent})


def _hold(holds: dict[str, _Hold], stored: Mapping[str, PodWindow], usage: Usage) -> None:
    """Fold one gpu sample into its pod's latest window: same window sums, newer replaces."""
    latest = holds.get(usage.pod_uid)
    if latest is None and usage.pod_uid in stored:
        pod = stored[usage.pod_uid]
        latest = (pod.window_start, pod.window_end, pod.quantity, pod.gpu_model)
    window = (usage.window_start, usage.window_end)
    if latest is not None and window < latest[:2]:
        return  # an older window: billed and counted, but no longer what the pod holds
    quantity = usage.quantity
    if latest is not None and window == latest[:2]:
        quantity += latest[2]
    model = usage.gpu_model if usage.gpu_model is not None else (latest[3] if latest is not None else None)
    holds[usage.pod_uid] = (*window, quantity, model)


def _close_past_periods(
    ledger: TenantLedger, scopes: dict[str, CrossingState], metric: QuotaMetric, current: str, now: datetime,
    model: str | None = None,
) -> list[QuotaEvent]:
    """A new period starts from zero: an exceeded metric of any other period recovers."""
    events = []
    for scope in sorted(scopes):
        state = scopes[scope]
        if scope == current or not state.exceeded:
            continue
        recovered = _Crossing("recovered", _ONE, state.generation)
        raw = _raw(ledger, metric, scope) if model is None else _model_seconds(ledger, scope, model, ())
        events.append(_event(ledger, metric, scope, scope, recovered, raw, _or_zero(state.limit), now, model))
        scopes[scope] = state.model_copy(update={"exceeded": False, "generation": state.generation + 1})
    return events


def _evaluate(
    ledger: TenantLedger,
    scopes: dict[str, CrossingState],
    metric: QuotaMetric,
    scope: str,
    period: str,
    raw: Decimal,
    limit: Decimal | None,
    policy: TenantPolicy | None,
    now: datetime,
    model: str | None = None,
) -> list[QuotaEvent]:
    """Step one scope's state against ``limit``; store it in ``scopes``; return events."""
    thresholds = (*(policy.warn_at if policy else ()), _ONE)
    before = scopes.get(scope)
    state, crossings = _step(before, raw, limit, thresholds, _SCALE[metric])
    if state is not None:
        scopes[scope] = state
    # A removed limit still reports the one it recovered from: an event always has a limit.
    shown_limit = limit if limit is not None else _or_zero(before.limit if before else None)
    return [_event(ledger, metric, scope, period, crossing, raw, shown_limit, now, model)
            for crossing in crossings]


def _step(
    state: CrossingState | None,
    raw: Decimal,
    limit: Decimal | None,
    thresholds: Iterable[Decimal],
    scale: Decimal,
) -> tuple[CrossingState | None, list[_Crossing]]:
    """The pure threshold machine of one (metric, scope)."""
    if limit is None:
        if state is None or (state.limit is None and not state.exceeded):
            return state, []
        # No limit any more: the quota is gone, so an exceeded metric is back under.
        gone = [_Crossing("recovered", _ONE, state.generation)] if state.exceeded else []
        return CrossingState(generation=state.generation + 1), gone
    if state is None:
        state = CrossingState(limit=limit)
    with exact():
        reached = {t for t in thresholds if raw >= t * limit * scale}
    generation, crossed, exceeded = state.generation, set(state.crossed), state.exceeded
    crossings: list[_Crossing] = []
    recovers = exceeded and _ONE not in reached
    if recovers or (state.limit is not None and state.limit != limit):
        if recovers:
            crossings.append(_Crossing("recovered", _ONE, generation))
            exceeded = False
        generation += 1
        # Still-reached levels already announced stay announced: falling from exceeded into
        # a warning band is what `recovered` (with used and limit) says. Levels no longer
        # reached under a new limit may be announced again, under the new generation.
        crossed &= reached
    for threshold in sorted(reached - crossed):
        crossings.append(_Crossing("exceeded" if threshold == _ONE else "warning", threshold, generation))
        exceeded = exceeded or threshold == _ONE
    crossed |= reached
    return CrossingState(generation=generation, crossed=tuple(sorted(crossed)), exceeded=exceeded,
                         limit=limit), crossings


def _event(
    ledger: TenantLedger,
    metric: QuotaMetric,
    scope: str,
    period: str,
    crossing: _Crossing,
    raw: Decimal,
    limit: Decimal,
    now: datetime,
    model: str | None = None,
) -> QuotaEvent:
    threshold = _plain(crossing.threshold)
    with exact():
        used = raw / _SCALE[metric]
    # A per-model crossing hashes its key with its scope: tenant-wide ids are what they were.
    hashed_scope = scope if model is None else f"{scope}|model={model}"
    return QuotaEvent(
        event_id=crossing_id(ledger.tenant, metric, hashed_scope, crossing.level, threshold,
                             crossing.generation),
        tenant=ledger.tenant,
        metric=metric,
        level=crossing.level,
        threshold=threshold,
        used=format_value(metric, used),
        limit=format_value(metric, limit),
        period=period,
        at=now,
        gpu_model=model,
    )


def _raw(ledger: TenantLedger, metric: QuotaMetric, key: str) -> Decimal:
    """A period's use in the unit decisions are made in: unit-seconds or money."""
    totals = ledger.periods.get(key)
    if totals is None:
        return _ZERO
    return totals.gpu_unit_seconds if metric == "gpu_hours" else totals.list_spend


def _limit(policy: TenantPolicy | None, metric: QuotaMetric) -> Decimal | None:
    if policy is None:
        return None
    limit: Decimal | None = getattr(policy, metric)
    return limit


def _period_kind(policy: TenantPolicy | None) -> PeriodKind:
    return policy.period if policy is not None else "month"


def _retained_periods(
    periods: dict[str, PeriodTotals], crossings: dict[QuotaMetric, dict[str, CrossingState]],
    model_crossings: Mapping[QuotaMetric, Mapping[str, Mapping[str, CrossingState]]] | None = None,
) -> dict[str, PeriodTotals]:
    """The newest KEEP_PERIODS keys of each granularity, and any period still exceeded."""
    exceeded = {scope for scopes in crossings.values() for scope, state in scopes.items() if state.exceeded}
    exceeded |= {scope for keys in (model_crossings or {}).values() for scopes in keys.values()
                 for scope, state in scopes.items() if state.exceeded}
    # Zero-padded keys of one length sort chronologically as strings.
    months = sorted(key for key in periods if len(key) == 7)[-KEEP_PERIODS:]
    days = sorted(key for key in periods if len(key) == 10)[-KEEP_PERIODS:]
    keep = {*months, *days, *exceeded}
    return {key: totals for key, totals in periods.items() if key in keep}


_MODEL_METRICS: tuple[tuple[QuotaMetric, str], ...] = (
    ("gpu_hours", "gpu_hours_by_model"), ("max_gpus", "max_gpus_by_model"))


def _model_limits(policy: TenantPolicy | None) -> list[tuple[QuotaMetric, str, Decimal]]:
    """(metric, model key, limit) of every per-model limit of the policy."""
    if policy is None:
        return []
    return [(metric, key, limit) for metric, field in _MODEL_METRICS
            for key, limit in sorted(getattr(policy, field).items())]


def _model_seconds(ledger: TenantLedger, period: str, key: str, keys: Iterable[str]) -> Decimal:
    """gpu unit-seconds of ``period`` on the models ``key`` owns among ``keys`` (longest match;
    no keys given: every model the key matches, for a period closed under other keys)."""
    totals = ledger.periods.get(period)
    if totals is None:
        return _ZERO
    every = tuple(keys) or (key,)
    with exact():
        return sum((seconds for model, seconds in totals.gpu_unit_seconds_by_model.items()
                    if model_key(every, model) == key), _ZERO)


def _model_raw(ledger: TenantLedger, metric: QuotaMetric, key: str, current: str, now: datetime,
               stale_seconds: int, policy: TenantPolicy | None) -> Decimal:
    keys = tuple(getattr(policy, dict(_MODEL_METRICS)[metric]).keys()) if policy is not None else (key,)
    if metric == "gpu_hours":
        return _model_seconds(ledger, current, key, keys)
    with exact():
        return sum((pod.quantity for pod in ledger.pods.values()
                    if not _stale(pod, now, stale_seconds)
                    and model_key(keys or (key,), pod.gpu_model) == key), _ZERO)


def _evaluate_models(
    ledger: TenantLedger,
    crossings: dict[QuotaMetric, dict[str, dict[str, CrossingState]]],
    policy: TenantPolicy | None,
    current: str,
    now: datetime,
    stale_seconds: int,
) -> list[QuotaEvent]:
    """Per-model limits: each (metric, key) as its own quota, with scopes as the tenant-wide
    metric has them (the period for gpu_hours, ``held`` for max_gpus). A key the file no
    longer names has no limit: an exceeded one recovers (``_step``)."""
    limits = {(metric, key): limit for metric, key, limit in _model_limits(policy)}
    events: list[QuotaEvent] = []
    pairs = sorted(set(limits) | {(metric, key) for metric, keys in crossings.items() for key in keys})
    for metric, key in pairs:
        scopes = crossings.setdefault(metric, {}).setdefault(key, {})
        limit = limits.get((metric, key))
        raw = _model_raw(ledger, metric, key, current, now, stale_seconds, policy)
        if metric == "gpu_hours":
            events += _close_past_periods(ledger, scopes, metric, current, now, key)
            events += _evaluate(ledger, scopes, metric, current, current, raw, limit, policy, now, key)
        else:
            events += _evaluate(ledger, scopes, metric, HELD_SCOPE, current, raw, limit, policy, now, key)
    return events


def _stale(pod: PodWindow, now: datetime, stale_seconds: int) -> bool:
    return now - pod.window_end > timedelta(seconds=stale_seconds)


def _plain(value: Decimal) -> str:
    """Exact value without exponent or trailing zeros: 0.80 -> "0.8", 1E+2 -> "100"."""
    return format(value.normalize(), "f")


def _or_zero(value: Decimal | None) -> Decimal:
    return _ZERO if value is None else value


def _require_aware(moment: datetime) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"expected an aware datetime, got naive {moment.isoformat()}")


def _check_policy(ledger: TenantLedger, policy: TenantPolicy | None) -> None:
    if policy is not None and policy.tenant != ledger.tenant:
        raise ValueError(f"policy of tenant {policy.tenant!r} used for the ledger of {ledger.tenant!r}")
