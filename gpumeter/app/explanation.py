"""Why a GPU pod waits (`gpumeter explain pod`): a pure rule, values in, a document and text out.

The command gathers the facts (the pod, its tenant, that tenant's quotas as `quota status`
and `budget show` compute them, the GPUs the tenant's bound pods hold as the extender counts
them, and the running extender's own answer to a filter request for the pod); this module
says what holds the pod and what would change that. No I/O here.

What holds a pod is read from the extender's reasons, which name their kind (contract 6 as
amended by issue 33): ``gpumeter: tenant <t> over <metric> quota`` and ``gpumeter: namespace
<ns> has no valid tenant`` are *quota*, ``gpumeter: capacity: ...`` *capacity*,
``gpumeter: topology: ...`` *topology*; anything else is *other* (a newer extender's words).
A pod the extender passes on some node is held by none of them: if it is still pending,
kube-scheduler's own filters (resources other than GPUs, selectors, taints) hold it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

KINDS = ("quota", "capacity", "topology", "other")  # the order `held_by` lists them in
_FREE = re.compile(r"node has (\d+) (?:whole )?free GPUs")
CLOSEST = 3  # nodes named in "what would change" for capacity or topology



@dataclass(frozen=True)
class QuotaLine:
    """One quota of the tenant, as `quota status` shows it (values already formatted)."""

    metric: str  # gpu_hours | spend | max_gpus
    period: str
    used: Decimal
    limit: Decimal | None
    state: str  # ok | warning | exceeded
    gpu_model: str | None = None  # a per-model key; None: tenant-wide
    grants: Sequence[tuple[str, Decimal]] = ()  # (grant key, amount) counted in the limit now


@dataclass(frozen=True)
class ExtenderAnswer:
    """The extender's answer to the pod's filter request; ``error`` set when there was none."""

    url: str
    error: str | None = None
    passed: Sequence[str] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    namespace: str
    name: str
    gpus: int
    phase: str
    node: str | None  # bound to, None while pending
    tenant: str | None  # None: the namespace's tenant label is not a tenant id
    on_exceed: str | None  # the tenant's policy (None: no policy)
    blocked: Sequence[str]  # metrics the tenant is blocked on (tenant-wide), `quota status`'s rule
    quotas: Sequence[QuotaLine]
    period_end: datetime | None  # the end of the tenant's current quota period
    max_gpus: Decimal | None  # the tenant's max_gpus limit
    held: Decimal  # GPUs the tenant's bound pods hold now (the extender's count), this pod excluded
    max_gpus_by_model: Mapping[str, Decimal] = field(default_factory=dict)
    held_by_key: Mapping[str, Decimal] = field(default_factory=dict)  # as ``held``, per model key
    extender: ExtenderAnswer | None = None
    # MIG devices and shared replicas it asks: quotas hold such a pod, max_gpus and fit do not.
    gpu_devices: int = 0


def kind_of(reason: str) -> str:
    """quota, capacity, topology or other: what an extender reason says holds the pod there."""
    if reason.startswith(("gpumeter: tenant ", "gpumeter: namespace ")):
        return "quota"
    if reason.startswith("gpumeter: capacity:"):
        return "capacity"
    if reason.startswith("gpumeter: topology:"):
        return "topology"
    return "other"


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _show(metric: str, value: Decimal) -> str:
    if metric == "spend":
        return format(value.quantize(Decimal("0.01")), "f")
    if metric == "gpu_hours":
        return format(value.quantize(Decimal("0.000001")), "f")
    return format(value.normalize(), "f")


def _quota_changes(facts: Facts) -> list[str]:
    """What would lift each quota that refuses the pod (an empty list when none does)."""
    tenant = facts.tenant
    changes: list[str] = []
    if tenant is None:
        return [f"namespace {facts.namespace}: its label gpumeter.io/tenant must be a tenant id "
                "([a-z0-9][a-z0-9-]{0,62})"]
    ending = f"the period ending {_when(facts.period_end)}" if facts.period_end else "a new period"
    blocking = facts.on_exceed in ("block", "preempt")
    for line in facts.quotas:
        if line.metric == "max_gpus" or line.limit is None or not blocking or line.state != "exceeded":
            continue
        if line.gpu_model is None and line.metric not in facts.blocked:
            continue
        # Exceeded at used >= limit, recovered only under it: a grant must be more than this.
        unit = " GPU-hours" if line.metric == "gpu_hours" else ""
        amount = _show(line.metric, line.used - line.limit) + unit
        if line.gpu_model is None:
            changes.append(f"{tenant} is {amount} over its {line.metric} limit: a grant of more "
                           f"than that, or {ending}")
        else:
            changes.append(f"{tenant} is {amount} over its {line.metric} limit for {line.gpu_model} GPUs "
                           f"(grants raise tenant-wide limits only): that key's limit raised in the "
                           f"tenants file, {ending}, or the pod placed on another model")
    if facts.gpus > 0 and facts.max_gpus is not None and facts.held + facts.gpus > facts.max_gpus:
        free = facts.held + facts.gpus - facts.max_gpus
        changes.append(f"{_show('max_gpus', free)} GPUs of {tenant} must be freed (holds "
                       f"{_show('max_gpus', facts.held)}, pod needs {facts.gpus}, max_gpus "
                       f"{_show('max_gpus', facts.max_gpus)})")
    for key, limit in sorted(facts.max_gpus_by_model.items()):
        held = facts.held_by_key.get(key, Decimal(0))
        if facts.gpus > 0 and held + facts.gpus > limit:
            free = held + facts.gpus - limit
            changes.append(f"{_show('max_gpus', free)} GPUs of {tenant} on {key} nodes must be freed "
                           f"(holds {_show('max_gpus', held)}, pod needs {facts.gpus}, limit "
                           f"{_show('max_gpus', limit)}), or the pod placed on another model")
    return changes


def _closest(reasons: Mapping[str, str], kind: str, needed: int) -> str | None:
    """The nodes refused for ``kind`` with the most free GPUs, said as what they lack."""
    found = []
    for node, reason in reasons.items():
        if kind_of(reason) != kind:
            continue
        match = _FREE.search(reason)
        found.append((-int(match.group(1)) if match else 1, node))
    if not found:
        return None
    named = []
    for negative, node in sorted(found)[:CLOSEST]:
        free = -negative
        named.append(f"{node} ({free} free)" if free >= 0 else node)
    return (f"{kind}: {needed} free GPUs on one node; closest: " + ", ".join(named))


def explain(facts: Facts) -> dict[str, Any]:
    """The document `gpumeter explain pod --json` prints (docs/operations.md has its shape)."""
    answer = facts.extender
    held_by: list[str] | None
    reasons: dict[str, str] = {}
    if answer is not None and answer.error is None:
        reasons = {**answer.failed, **answer.unresolvable}
        kinds = {kind_of(reason) for reason in reasons.values()}
        held_by = [] if answer.passed else [kind for kind in KINDS if kind in kinds]
    else:
        held_by = None  # the extender did not say; the quota part below still stands
    changes = _quota_changes(facts) if held_by is None or "quota" in held_by else []
    if held_by is None and changes:
        held_by = ["quota"]  # from the quota state alone: what the extender's quota check reads
    for kind in ("capacity", "topology"):
        if held_by and kind in held_by:
            closest = _closest(reasons, kind, facts.gpus)
            if closest is not None:
                changes.append(closest)
    extender: dict[str, Any] | None = None
    if answer is not None:
        extender = {"url": answer.url, "answered": answer.error is None, "error": answer.error,
                    "passed": list(answer.passed), "failed": dict(answer.failed),
                    "unresolvable": dict(answer.unresolvable)}
    return {
        "pod": f"{facts.namespace}/{facts.name}",
        "phase": facts.phase,
        "node": facts.node,
        "gpus": facts.gpus,
        "gpu_devices": facts.gpu_devices,
        "tenant": facts.tenant,
        "on_exceed": facts.on_exceed,
        "quotas": [
            {"metric": line.metric, "gpu_model": line.gpu_model, "period": line.period,
             "used": _show(line.metric, line.used),
             "limit": None if line.limit is None else _show(line.metric, line.limit),
             "grants": [{"grant": key, "amount": _show(line.metric, amount)} for key, amount in line.grants],
             "state": line.state}
            for line in facts.quotas
        ],
        "held": {"gpus": _show("max_gpus", facts.held),
                 "by_model": {key: _show("max_gpus", value)
                              for key, value in sorted(facts.held_by_key.items())}},
        "extender": extender,
        "held_by": held_by,
        "would_change": changes,
    }


def render(document: Mapping[str, Any]) -> str:
    """The human text of ``explain``'s document."""
    lines = [f"pod {document['pod']}: {document['phase']}"
             + (f" on {document['node']}" if document["node"] else "")
             + f", {document['gpus']} GPUs"]
    tenant = document["tenant"]
    shown = tenant if tenant is not None else "(none: the namespace label is not a tenant id)"
    terms = f" (on_exceed {document['on_exceed']})" if document["on_exceed"] else ""
    lines.append(f"tenant: {shown}{terms}")
    if not document["quotas"]:
        lines.append("  no quota")
    for quota in document["quotas"]:
        name = quota["metric"] + (f" [{quota['gpu_model']}]" if quota["gpu_model"] else "")
        grants = "".join(f" + {g['grant']} {g['amount']}" for g in quota["grants"])
        limit = quota["limit"] if quota["limit"] is not None else "none"
        lines.append(f"  {name} {quota['period']}: used {quota['used']} / limit {limit}"
                     + (f" (grants{grants})" if grants else "") + f"  {quota['state']}")
    extender = document["extender"]
    if extender is not None and not extender["answered"]:
        lines.append(f"extender: no answer from {extender['url']}: {extender['error']}")
    held_by = document["held_by"]
    if held_by is None:
        lines.append("held by: unknown (the extender did not answer; no quota refuses the pod)")
    elif not held_by:
        passed = extender["passed"] if extender else []
        lines.append(f"held by: nothing of gpumeter's: the extender passes it on {len(passed)} node(s)"
                     + (" (if it is pending, kube-scheduler's own filters hold it)"
                        if document["phase"] == "Pending" else ""))
    else:
        lines.append(f"held by: {', '.join(held_by)}")
    if extender is not None and extender["answered"]:
        refused = {**extender["failed"], **extender["unresolvable"]}
        distinct: dict[str, list[str]] = {}
        for node, reason in refused.items():
            distinct.setdefault(reason, []).append(node)
        for reason, nodes in sorted(distinct.items(), key=lambda item: (-len(item[1]), item[0])):
            lines.append(f"  {len(nodes)} node(s): {reason}")
    for change in document["would_change"]:
        lines.append(f"would change it: {change}")
    return "\n".join(lines)
