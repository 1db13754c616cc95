"""Small value builders for the quota tests: readable times, policies and usage records."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from gpumeter.core.models import Kind
from gpumeter.core.tenants import TenantPolicy
from quota.accounting import Usage

TENANT = "team-a"


def ts(text: str) -> datetime:
    """An aware datetime from RFC 3339 text, e.g. ts("2026-11-10T00:00:00Z")."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def policy(**fields: Any) -> TenantPolicy:
    """A TenantPolicy for TENANT; decimals given as strings, as the tenants file carries them."""
    return TenantPolicy.model_validate({"tenant": TENANT, "on_exceed": "block", **fields})


def usage(
    event_id: str,
    start: str,
    *,
    kind: Kind = "gpu",
    quantity: str = "1",
    seconds: int = 3600,
    cost: str = "0",
    pod_uid: str = "uid-1",
    tenant: str = TENANT,
) -> Usage:
    """One rated record; unit_seconds = quantity x seconds, as rating computes it."""
    window_start = ts(start)
    return Usage(
        event_id=event_id,
        tenant=tenant,
        kind=kind,
        namespace="ml",
        pod=f"pod-{pod_uid}",
        pod_uid=pod_uid,
        window_start=window_start,
        window_end=window_start + timedelta(seconds=seconds),
        quantity=Decimal(quantity),
        unit_seconds=Decimal(quantity) * seconds,
        list_cost=Decimal(cost),
    )
