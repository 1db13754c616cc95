"""`gpumeter budget`: grants and top-ups (contract 4, amendment "grants").

``budget grant`` appends a numbered row to ClickHouse ``quota_grants`` (never edited: a
correction is a new negative grant, ``--corrects N``). The quota worker, the actuator and the
extender re-read that table every ``quota.grants_poll_seconds``; a grant that lifts a tenant
above its use makes the worker emit ``recovered``, which the extender follows.

``budget show`` prints the tenant's budget lines (quota.budget, as the finance report shows
them): per gpu_hours/spend limit and per gpu_hours_by_model key, the base limit, the grants
counted now, the limit, used, remaining and the runway (the insights forecast where its model
beat the run rate, else the period's run rate; it says which). Used comes from the quota
worker's own ledger (as ``gpumeter quota status``), so it is what the next quota decision sees.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import ValidationError

from gpumeter.app.cli.arguments import Parser, instant
from gpumeter.app.cli.errors import Failure, UsageError
from gpumeter.core.config_files import ConfigError
from gpumeter.core.grants import AMOUNT_PLACES, GrantMetric, GrantRecord
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import TenantPolicy, load_tenants
from gpumeter.core.validation import TENANT_PATTERN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="budget_command", required=True, parser_class=Parser)
    grant = commands.add_parser("grant", help="add GPU-hours or spend to a tenant's budget (append-only)")
    grant.add_argument("--tenant", required=True)
    amount = grant.add_mutually_exclusive_group(required=True)
    amount.add_argument("--gpu-hours", help="GPU-hours to add (negative with --corrects)")
    amount.add_argument("--spend", help="money to add, 2 places (negative with --corrects)")
    grant.add_argument("--effective", help="RFC 3339 time it counts from (default: now)")
    grant.add_argument("--expires", help="RFC 3339 time it stops counting (default: never)")
    grant.add_argument("--rollover", action="store_true",
                       help="carry the unused part into the next period")
    grant.add_argument("--corrects", type=int, help="a correction: the number of the grant it takes from")
    grant.add_argument("--note", default="", help="why (kept with the grant)")
    show = commands.add_parser("show", help="a tenant's limit, grants, used, remaining and runway")
    show.add_argument("--tenant", required=True)
    show.add_argument("--at", help="evaluate at this RFC 3339 time (default: the quota clock)")
    show.add_argument("--json", action="store_true", help="machine-readable output")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if not re.match(TENANT_PATTERN, args.tenant):
        raise UsageError(f"--tenant: not a tenant name: {args.tenant!r}")
    if args.budget_command == "grant":
        return grant(settings, args)
    return show(settings, args)


def grant(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.infra import grants as store
    from quota.grants import GrantError, check_new

    metric: GrantMetric = "gpu_hours" if args.gpu_hours is not None else "spend"
    flag = "--gpu-hours" if metric == "gpu_hours" else "--spend"
    amount = _amount(flag, args.gpu_hours if metric == "gpu_hours" else args.spend, metric)
    now = datetime.now(UTC)
    if args.corrects is not None and (args.effective or args.expires or args.rollover):
        raise UsageError("--corrects: a correction counts over the range of the grant it corrects; "
                         "give no --effective, --expires or --rollover")
    policy = _tenant_policy(settings, args.tenant)
    client = _client(settings)
    try:
        before = store.read(client, args.tenant)
        terms: dict[str, Any] = {
            "effective_at": instant("--effective", args.effective) if args.effective else now,
            "expires_at": instant("--expires", args.expires) if args.expires else None,
            "rollover": args.rollover,
        }
        if args.corrects is not None:
            target = next((r for r in before if r.number == args.corrects), None)
            if target is None:
                raise UsageError(f"--corrects: #{args.corrects} is not a grant of tenant {args.tenant}")
            terms = {"effective_at": target.effective_at, "expires_at": target.expires_at,
                     "rollover": target.rollover}
        try:
            draft = GrantRecord.model_validate({
                "number": 1, "tenant": args.tenant, "metric": metric, "amount": amount,
                "corrects": args.corrects, "note": args.note, "granted_at": now, **terms})
        except ValueError as exc:
            raise UsageError(_field_error(exc)) from None

        def check(candidate: GrantRecord, earlier: Any) -> None:
            check_new(candidate, [r for r in earlier if r.tenant == candidate.tenant], policy, now)

        try:
            stored = store.append(client, draft, check)
        except GrantError as exc:
            raise UsageError(str(exc)) from None
    finally:
        client.close()
    what = "correction" if stored.corrects is not None else "grant"
    print(f"{what} #{stored.number}: {args.tenant} {metric} {_show_amount(metric, stored.amount)} "
          f"effective {_when(stored.effective_at)}"
          + (f" until {_when(stored.expires_at)}" if stored.expires_at else "")
          + (" rollover" if stored.rollover else "")
          + (f" (corrects #{stored.corrects})" if stored.corrects is not None else ""))
    return 0


def show(settings: Settings, args: argparse.Namespace) -> int:
    from dashboards.budget_report import stored_exhaustions
    from gpumeter.app.cli.quota import _read_states
    from gpumeter.core.topics import ledger_changelog_topic
    from gpumeter.infra import grants as store
    from quota.accounting import TenantLedger, period_used, status
    from quota.budget import budget_view
    from quota.grants import GrantError, fold, previous_period
    from quota.periods import period_key

    policy = _tenant_policy(settings, args.tenant)
    client = _client(settings)
    try:
        records = store.read(client, args.tenant)
        forecasts = stored_exhaustions(client, args.tenant)
    finally:
        client.close()
    try:
        table_grants = fold(records).get(args.tenant, [])
    except GrantError as exc:
        raise Failure(f"quota_grants: {exc}") from None
    changelog = ledger_changelog_topic(settings.kafka.topic_prefix, settings.worker.group)
    states = _read_states(settings, changelog)
    state = states.get(args.tenant)
    at = (instant("--at", args.at) if args.at else
          state.clock if state is not None and state.clock is not None else datetime.now(UTC))
    ledger = state.ledger if state is not None else TenantLedger(tenant=args.tenant)
    # Used as the quota worker counts it (its ledger, as `quota status`); the lines (limit,
    # grants, runway) as the report's (quota.budget).
    entries = status(ledger, policy, at, settings.quota.stale_seconds, table_grants)
    states_of = {(e.metric, e.gpu_model): e.state for e in entries}
    used: dict[GrantMetric, Decimal] = {e.metric: e.used for e in entries
                                        if e.metric != "max_gpus" and e.gpu_model is None}
    by_model = {e.gpu_model: e.used for e in entries if e.metric == "gpu_hours" and e.gpu_model is not None}
    previous = previous_period(period_key(at, policy.period))
    before: dict[GrantMetric, Decimal] = {m: period_used(ledger, m, previous) for m in ("gpu_hours", "spend")}
    lines = budget_view(policy, table_grants, at, used, before, by_model, forecasts)
    metrics: list[dict[str, Any]] = []
    for line in lines:
        metric = line.metric
        metrics.append({
            "metric": metric, "gpu_model": line.gpu_model, "period": line.period,
            "base_limit": _show_amount(metric, line.base_limit),
            "grants": [{"grant": g.key, "amount": _show_amount(metric, g.amount),
                        "granted": _show_amount(metric, g.granted), "carried": g.carried,
                        "effective_at": _when(g.effective_at),
                        "expires_at": _when(g.expires_at) if g.expires_at else None, "rollover": g.rollover}
                       for g in line.grants],
            "limit": _show_amount(metric, line.limit), "used": _show_amount(metric, line.used),
            "remaining": _show_amount(metric, line.remaining),
            "state": states_of.get((metric, line.gpu_model), "ok"),
            "runway": line.runway.text(), "runway_from": line.runway.source,
            "runway_hours": None if line.runway.hours is None else str(line.runway.hours),
            "runway_until": _when(line.runway.until) if line.runway.until else None,
        })
    document = {"tenant": args.tenant, "at": _when(at), "on_exceed": policy.on_exceed, "metrics": metrics}
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{args.tenant} (on_exceed {policy.on_exceed}) as of {document['at']}")
    if not metrics:
        print("  no gpu_hours or spend limit")
    for item in metrics:
        scope = f" {item['gpu_model']}" if item["gpu_model"] else ""
        print(f"  {item['metric']}{scope} {item['period']}: limit {item['limit']} = base {item['base_limit']}"
              + "".join(f" + {g['grant']} {g['amount']}" + (" (carried)" if g["carried"] else "")
                        for g in item["grants"]))
        print(f"    used {item['used']}  remaining {item['remaining']}  ({item['state']})  "
              f"runway {item['runway']}")
    return 0


def _tenant_policy(settings: Settings, tenant: str) -> TenantPolicy:
    """``tenant``'s policy in the tenants file; a usage error when it is not there."""
    try:
        policies = load_tenants(settings.tenants)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    policy = policies.policy(tenant)
    if policy is None:
        raise UsageError(f"--tenant: {tenant} is not in the tenants file ({settings.tenants})")
    return policy


def _client(settings: Settings) -> Any:
    from gpumeter.app import schema
    from gpumeter.infra import clickhouse

    try:
        client = clickhouse.connect(settings.clickhouse.connection_dsn(), create_database=False)
        schema.require_current(client, clickhouse.parse_dsn(settings.clickhouse.dsn).url)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return client


def _amount(flag: str, text: str, metric: GrantMetric) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise UsageError(f"{flag}: not a number: {text!r}") from None
    places = AMOUNT_PLACES[metric]
    if not value.is_finite() or value != round(value, places):
        raise UsageError(f"{flag}: {text!r} is not a number with at most {places} decimal places")
    if value == 0:
        raise UsageError(f"{flag}: a grant of 0 changes nothing")
    return value



def _field_error(exc: ValueError) -> str:
    """The first error of a refused grant, one line, led by the field it concerns."""
    if not isinstance(exc, ValidationError) or not exc.errors():
        return " ".join(str(exc).split())
    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    where = ".".join(str(part) for part in first["loc"])
    if where and not message.startswith(f"{where}:"):
        message = f"{where}: {message}"
    return " ".join(message.split())


def _show_amount(metric: GrantMetric, value: Decimal) -> str:
    from quota.accounting import format_value

    return format_value(metric, value)


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")

