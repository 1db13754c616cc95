"""The stated overshoot of a quota: how far past its limit a tenant can get before enforcement ends.

Enforcement is not instantaneous. Between the sample that crosses a `gpu_hours` limit and the
last eviction, the tenant keeps its GPUs for at most:

- one agent window (the crossing sample reports usage already spent when it is published),
- the pipeline's lag (sample -> rating -> quota crossing -> quota event -> actuator), stated by
  the operator from `benchmarks/quota_latency.py` (its p99),
- the policy's `grace_seconds` (the eviction notice),

so the GPU-hours used past the limit are at most ``GPUs held x (window + lag + grace)``. Only
`on_exceed: preempt` ends usage: `block` stops new pods and lets running ones finish, `notify`
acts on nothing, so neither has a bound. `max_gpus` is enforced at admission (the extender
refuses a pod that would take the tenant over) and `spend` accrues from every kind of
resource, of which only the GPU pods are evicted: neither has a bound of this form.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal

from gpumeter.core.money import MICRO, exact

SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True)
class EnforcementDelays:
    """The delays between a crossing and the end of the tenant's usage, in seconds."""

    window_seconds: Decimal  # the agent's sample window
    lag_seconds: Decimal  # the pipeline's stated p99 lag, crossing sample -> eviction request

    def total(self, grace_seconds: int) -> Decimal:
        return self.window_seconds + self.lag_seconds + Decimal(grace_seconds)


def overshoot_bound(metric: str, on_exceed: str | None, gpus_held: Decimal, grace_seconds: int,
                    delays: EnforcementDelays) -> Decimal | None:
    """GPU-hours a tenant holding ``gpus_held`` GPUs can use past a `gpu_hours` limit (per-model
    limits too: the GPUs held of every model bound those of one), rounded up to 6 places; None
    where the policy states no bound (see the module's docstring)."""
    if metric != "gpu_hours" or on_exceed != "preempt":
        return None
    if gpus_held < 0:
        raise ValueError(f"GPUs held cannot be negative: {gpus_held}")
    with exact():
        hours = gpus_held * delays.total(grace_seconds) / SECONDS_PER_HOUR
    return hours.quantize(MICRO, rounding=ROUND_CEILING)


# -- the overshoot measured from stored usage (benchmarks/quota_overshoot.py) ----------------------


@dataclass(frozen=True)
class WindowUsage:
    """One window of a tenant's stored gpu usage (each event_id once)."""

    window_start: datetime
    unit_seconds: Decimal  # Σ unit_seconds of the tenant's gpu samples of the window
    gpus_held: Decimal  # Σ quantity of those samples: the GPUs held, as `max_gpus` counts them


@dataclass(frozen=True)
class MeasuredOvershoot:
    crossing_window: datetime  # the first window at whose end the use reached the limit
    gpus_held: Decimal  # GPUs held in that window
    used: Decimal  # GPU-hours up to and including the window ``until`` names
    overshoot: Decimal  # used - limit (negative: the limit was never passed by then)


def measured_overshoot(windows: Iterable[WindowUsage], limit: Decimal,
                       until: datetime) -> MeasuredOvershoot | None:
    """The GPU-hours a tenant used past ``limit`` by the end of the window starting at ``until``
    (the one its last victim ended in), from its stored windows in any order; None when its
    use up to ``until`` never reached the limit. Exact: no rounding of the sums."""
    ordered = sorted(windows, key=lambda w: w.window_start)
    with exact():
        seconds = Decimal(0)
        crossing: WindowUsage | None = None
        for window in ordered:
            if window.window_start > until:
                break
            seconds += window.unit_seconds
            if crossing is None and seconds / SECONDS_PER_HOUR >= limit:
                crossing = window
        if crossing is None:
            return None
        used = seconds / SECONDS_PER_HOUR
        return MeasuredOvershoot(crossing.window_start, crossing.gpus_held, used, used - limit)
