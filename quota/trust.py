"""Whether the tenants file agrees with a quota event (contract 4, amendment "trust"): pure.

The actuator and the extender never take a quota event's word for what to do: whoever can
write to the quota events topic would otherwise evict any tenant (a forged ``exceeded``) or
unblock one (a forged ``recovered``). They act on an event only when the policy they hold
themselves agrees with it; ``distrust`` names what disagrees (a metric label and a log line),
None when nothing does.

An ``exceeded`` agrees when the tenant is in the file, the metric has a limit there, the
event's ``limit`` is that limit as events carry it (``quota.accounting.format_value``:
money to 2 places, hours to 6, GPUs exact; compared as Decimals, so ``"10"`` and
``"10.000000"`` agree), and its ``period`` is the current one for the tenant's ``period``
setting (UTC month or day of ``now``).

A ``recovered`` is emitted in three legitimate ways (``quota.accounting``): usage back under
the limit, a reloaded file raising or removing the limit, a new period starting. So it
agrees when the tenant is in the file and:

- the metric has no limit any more (a removed limit recovers; the event shows the old one), or
- its ``limit`` is the policy's and its period is the current one with ``used`` under the
  limit, or another period that has begun: a new period recovering the old one (whose usage
  may well be over), or a period of the other kind after the tenant switched between
  ``month`` and ``day``.

A recovered of a period not begun yet, or one claiming the current period while its own ``used``
is still at or over the limit, does not agree. One that merely claims a plausible ``used``
cannot be told from a real one without the usage itself: the file alone cannot do better.
``warning`` events change nothing and are never distrusted.

Grants (amendment "grants"): the limit of ``gpu_hours`` and ``spend`` is the base limit plus
the grants of the event's period (the file's and ``quota_grants``', given as ``grants``). A
carried part depends on the usage of the period before, which neither the actuator nor the
extender holds, so the event's limit agrees when it lies within ``quota.grants.bounds``: from
no carry to every candidate carry in full. With no rollover grant in play the bounds are one
value and the check is exact, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Literal

from gpumeter.core.grants import Grant
from gpumeter.core.models import QuotaEvent, QuotaMetric
from gpumeter.core.money import exact
from gpumeter.core.tenants import TenantPolicy
from quota.accounting import format_value
from quota.grants import bounds, of_file
from quota.periods import period_key, period_start
from quota.periods import period_kind as period_kind_of

Distrust = Literal["unknown_tenant", "no_limit", "limit_mismatch", "period_not_current", "bad_period",
                   "still_over"]


def policy_limit(policy: TenantPolicy, metric: QuotaMetric, gpu_model: str | None = None) -> Decimal | None:
    """The policy's limit for ``metric`` (of model key ``gpu_model``) as quota events carry it
    (None: no limit)."""
    if gpu_model is not None:
        by_model: dict[str, Decimal] = getattr(policy, f"{metric}_by_model", {})
        model_limit = by_model.get(gpu_model)
        return None if model_limit is None else Decimal(format_value(metric, model_limit))
    limit: Decimal | None = getattr(policy, metric)
    return None if limit is None else Decimal(format_value(metric, limit))


def distrust(event: QuotaEvent, policy: TenantPolicy | None, now: datetime,
             grants: Sequence[Grant] = ()) -> Distrust | None:
    """What in the tenants file (and ``grants``, the tenant's ``quota_grants``) disagrees with
    ``event`` (module docstring); None: it agrees."""
    if event.level == "warning":
        return None
    if policy is None:
        return "unknown_tenant"
    limit = policy_limit(policy, event.metric, event.gpu_model)
    if event.level == "recovered" and limit is None:
        return None  # a removed limit recovers, showing the limit it recovered from
    if limit is None:
        return "no_limit"
    try:
        started = period_start(event.period)
    except ValueError:
        started = None
    # Grants raise tenant-wide limits only, never a per-model one.
    tenant_wide = event.metric != "max_gpus" and event.gpu_model is None
    every = [*of_file(policy.grants), *grants] if tenant_wide else []
    if not any(grant.metric == event.metric for grant in every):
        with exact():
            if event.limit != limit:
                return "limit_mismatch"
    elif started is not None and not _within(event, policy, every, now):
        return "limit_mismatch"
    if started is None:
        return "bad_period"
    if event.period == period_key(now, policy.period):
        with exact():
            return "still_over" if event.level == "recovered" and event.used >= event.limit else None
    if event.level == "recovered" and started <= now:
        return None
    return "period_not_current"


def _within(event: QuotaEvent, policy: TenantPolicy, grants: Sequence[Grant], now: datetime) -> bool:
    """The event's limit lies within the bounds of its period's limit, as events carry limits."""
    metric = event.metric
    if metric == "max_gpus" or period_kind_of(event.period) != policy.period:
        # A period of the other kind (the tenant switched month <-> day): the file's base alone.
        return event.limit == policy_limit(policy, metric)
    limits = bounds(getattr(policy, metric), grants, metric, policy.period, event.period, now)
    if limits is None:
        return False
    with exact():
        low, high = (Decimal(format_value(metric, value)) for value in (limits.low, limits.high))
        return low <= event.limit <= high
