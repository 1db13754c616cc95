"""A tenant's budget as finance hands it out (issue 33 point 6): pure, values in, values out.

One line per cumulative limit of the current quota period: ``gpu_hours`` and ``spend`` tenant
wide, and each key of ``gpu_hours_by_model``. A line says

- ``base_limit``: the tenants file's limit;
- ``grants``: the grants counted at ``at`` (quota.grants): a grant of this period in full, a
  rollover grant of the period before as its carry; per-model keys have none (grants raise
  tenant-wide limits only);
- ``limit`` = base + Σ grants (``quota.grants.limit_at``, the limit the quota worker decides
  on), ``used`` (given: the caller's ledger or rollup), ``remaining`` = limit − used;
- ``runway``: how long the remaining budget lasts from ``at``. From the insights forecast
  where there is one for this period and limit whose model beat the run rate on backtests
  (insights.forecast.choose: Holt-Winters); otherwise the period's run rate so far
  (used / time elapsed in the period). ``runway.source`` says which.

``max_gpus`` and ``max_gpus_by_model`` cap GPUs held at once, not a budget spent over the
period: they have no runway and are left to ``gpumeter quota status``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal

from gpumeter.core.grants import GRANT_METRICS, Grant, GrantMetric
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy, model_key
from quota.grants import active, carries, home, limit_at, of_file, previous_period
from quota.periods import period_end, period_key, period_start

RunwaySource = Literal["forecast", "run-rate"]
_ZERO = Decimal(0)
_TENTH = Decimal("0.1")


@dataclass(frozen=True)
class ExhaustionForecast:
    """What a forecast says about one limit: when the period's use reaches it.

    ``beats_run_rate``: its model beat the run rate on the backtests (insights' Holt-Winters);
    a forecast that is itself the run rate says nothing the period's run rate does not.
    ``period`` and ``limit``: the quota period and limit it was computed against."""

    beats_run_rate: bool
    model: str
    period: str
    limit: Decimal
    exhaust_at: datetime | None  # None: not reached within the period


@dataclass(frozen=True)
class CountedGrant:
    key: str  # "file:<id>" or "#<number>"
    amount: Decimal  # what counts now: the grant's amount, or its carry
    granted: Decimal  # the grant's own amount (corrections folded in)
    carried: bool  # a rollover grant of the period before, counting as its carry
    rollover: bool
    effective_at: datetime
    expires_at: datetime | None


@dataclass(frozen=True)
class Runway:
    source: RunwaySource
    exhausted: bool
    # Hours from ``at`` until the limit is reached, to 0.1 h; None: not within the period.
    hours: Decimal | None
    until: datetime | None

    def text(self) -> str:
        if self.exhausted:
            return "exhausted"
        how = "forecast" if self.source == "forecast" else "at the current rate"
        if self.hours is None:
            return f"beyond the period ({how})"
        return f"{self.hours} h ({how})"


@dataclass(frozen=True)
class BudgetLine:
    tenant: str
    metric: GrantMetric
    gpu_model: str | None  # a gpu_hours_by_model key; None: tenant-wide
    period: str
    at: datetime
    base_limit: Decimal
    grants: tuple[CountedGrant, ...]
    limit: Decimal
    used: Decimal
    remaining: Decimal
    runway: Runway

    @property
    def granted(self) -> Decimal:
        return sum((grant.amount for grant in self.grants), _ZERO)


def hours_by_key(policy: TenantPolicy, hours_by_model: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """GPU-hours per ``gpu_hours_by_model`` key from GPU-hours per sample ``gpu_model`` (each
    model counted toward the longest key that owns it; contract 4, per-model limits)."""
    keys = tuple(policy.gpu_hours_by_model)
    result = dict.fromkeys(keys, _ZERO)
    with exact():
        for model, hours in hours_by_model.items():
            key = model_key(keys, model)
            if key is not None:
                result[key] += hours
    return result


def budget_view(
    policy: TenantPolicy,
    grants: Sequence[Grant],
    at: datetime,
    used: Mapping[GrantMetric, Decimal],
    used_before: Mapping[GrantMetric, Decimal],
    used_by_model: Mapping[str, Decimal] | None = None,
    forecasts: Mapping[GrantMetric, ExhaustionForecast] | None = None,
) -> list[BudgetLine]:
    """The tenant's budget lines at ``at`` (module doc), tenant-wide metrics first, then model keys.

    ``grants``: the tenant's ``quota_grants`` (folded); the tenants file's are added here.
    ``used``/``used_before``: use of the current period / the period before (for carries), in
    hours or money; ``used_by_model``: GPU-hours of the current period per model key
    (``hours_by_key``); ``forecasts``: the insights forecast per metric, where there is one.
    """
    current = period_key(at, policy.period)
    start, end = period_start(current), period_end(current)
    every = [*of_file(policy.grants), *grants]
    lines: list[BudgetLine] = []
    for metric in GRANT_METRICS:
        base: Decimal | None = getattr(policy, metric)
        if base is None:
            continue
        before = used_before.get(metric, _ZERO)
        limit = limit_at(base, every, metric, policy.period, at, before)
        assert limit is not None  # a base limit gives a limit
        counted = _counted(base, every, metric, policy, at, before)
        spent = used.get(metric, _ZERO)
        forecast = (forecasts or {}).get(metric)
        lines.append(_line(policy.tenant, metric, None, current, at, base, counted, limit, spent,
                           _runway(spent, limit, at, start, end, forecast, current)))
    for key, base in sorted(policy.gpu_hours_by_model.items()):
        spent = (used_by_model or {}).get(key, _ZERO)
        lines.append(_line(policy.tenant, "gpu_hours", key, current, at, base, (), base, spent,
                           _runway(spent, base, at, start, end, None, current)))
    return lines


def _line(tenant: str, metric: GrantMetric, key: str | None, period: str, at: datetime, base: Decimal,
          counted: tuple[CountedGrant, ...], limit: Decimal, used: Decimal, runway: Runway) -> BudgetLine:
    with exact():
        remaining = limit - used
    return BudgetLine(tenant, metric, key, period, at, base, counted, limit, used, remaining, runway)


def _counted(base: Decimal, every: Sequence[Grant], metric: GrantMetric, policy: TenantPolicy,
             at: datetime, used_before: Decimal) -> tuple[CountedGrant, ...]:
    """The grants in the limit at ``at``, each with what it adds (quota.grants.limit_at's terms)."""
    current = period_key(at, policy.period)
    carried = carries(base, every, metric, policy.period, previous_period(current), used_before)
    result = []
    for grant in active(every, metric, policy.period, at):
        is_carry = home(grant, policy.period) != current
        result.append(CountedGrant(
            key=grant.key, amount=carried.get(grant.key, _ZERO) if is_carry else grant.amount,
            granted=grant.amount, carried=is_carry, rollover=grant.rollover,
            effective_at=grant.effective_at, expires_at=grant.expires_at))
    return tuple(result)


def _runway(used: Decimal, limit: Decimal, at: datetime, start: datetime, end: datetime,
            forecast: ExhaustionForecast | None, period: str) -> Runway:
    with exact():
        remaining = limit - used
    usable = (forecast is not None and forecast.beats_run_rate and forecast.period == period
              and forecast.limit == limit)
    source: RunwaySource = "forecast" if usable else "run-rate"
    if remaining <= 0:
        return Runway(source, True, _ZERO, at)
    if forecast is not None and usable:
        if forecast.exhaust_at is None or forecast.exhaust_at >= end:
            return Runway(source, False, None, None)
        ahead = max(forecast.exhaust_at - at, timedelta(0)).total_seconds()
        return _within(source, Decimal(str(ahead)), at)
    elapsed = Decimal(str((at - start).total_seconds()))
    if used <= 0 or elapsed <= 0:
        return Runway(source, False, None, None)  # no use yet: no rate to run out at
    with exact():
        seconds = remaining * elapsed / used
    if seconds >= Decimal(str((end - at).total_seconds())):
        return Runway(source, False, None, None)
    return _within(source, seconds, at)


def _within(source: RunwaySource, seconds: Decimal, at: datetime) -> Runway:
    hours = (seconds / 3600).quantize(_TENTH, rounding=ROUND_HALF_UP)
    return Runway(source, False, hours, at + timedelta(seconds=float(seconds)))
