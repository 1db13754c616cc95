"""`gpumeter quota status`: each tenant's usage against its limits, and its state.

Read from the worker's own ledger state, the compacted changelog of its quota table
(``<prefix><group>-quota-ledgers-changelog``), not from ClickHouse: it is exactly what the
stream evaluates (same event_id dedup, same replay guard, same stale-pod rule), so the
command shows what the next quota decision will see, and no second implementation of
contract 4 in SQL can drift from it. Each tenant is shown as of its quota clock (event
time) unless ``--at`` gives another instant.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from gpumeter.app.cli.arguments import Parser, instant
from gpumeter.app.cli.errors import Failure, UsageError
from gpumeter.core.settings import Settings
from gpumeter.core.tenants import load_tenants
from gpumeter.core.topics import ledger_changelog_topic
from gpumeter.core.validation import TENANT_PATTERN
from quota.accounting import format_value
from quota.overshoot import EnforcementDelays, overshoot_bound
from streams.quota import (
    BadState,
    LedgerState,
    TenantStatus,
    decode_state,
    tenant_status,
)

READ_TIMEOUT_SECONDS = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="quota_command", required=True, parser_class=Parser)
    status = commands.add_parser("status", help="each tenant's usage, limits and state")
    status.add_argument("--tenant", help="one tenant (default: every tenant with a policy or usage)")
    status.add_argument("--at", help="evaluate at this RFC 3339 time (default: the quota clock)")
    status.add_argument("--json", action="store_true", help="machine-readable output")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.quota_command == "status":
        return status(settings, args)
    raise UsageError(f"unknown quota command {args.quota_command!r}")  # argparse refuses it first


def status(settings: Settings, args: argparse.Namespace) -> int:
    at = instant("--at", args.at) if args.at else None
    if args.tenant is not None and not re.match(TENANT_PATTERN, args.tenant):
        raise UsageError(f"--tenant: not a tenant name: {args.tenant!r}")
    policies = load_tenants(settings.tenants)
    changelog = ledger_changelog_topic(settings.kafka.topic_prefix, settings.worker.group)
    states = _read_states(settings, changelog)
    names = sorted({policy.tenant for policy in policies.tenants} | set(states))
    if args.tenant is not None:
        if args.tenant not in names:
            raise UsageError(f"tenant {args.tenant} has no quota policy and no usage")
        names = [args.tenant]
    clocks = [state.clock for state in states.values() if state.clock is not None]
    # A tenant not seen yet is shown at the latest clock of any tenant: the stream's "now".
    fallback = max(clocks) if clocks else datetime.now(UTC)
    report = []
    for name in names:
        state = states.get(name)
        moment = at or (state.clock if state is not None and state.clock is not None else fallback)
        report.append(tenant_status(name, state, policies.policy(name), moment, settings.quota.stale_seconds))
    delays = EnforcementDelays(Decimal(settings.quota.window_seconds), settings.quota.pipeline_lag_seconds)
    grace = {policy.tenant: policy.grace_seconds for policy in policies.tenants}
    documents = [_document(entry, delays, grace.get(entry.tenant, 0)) for entry in report]
    if args.json:
        print(json.dumps({"tenants": documents}, indent=2))
    else:
        _print_table(report, documents)
    return 0



def _read_states(settings: Settings, topic: str) -> dict[str, LedgerState]:
    """The latest LedgerState per tenant in the compacted changelog (empty if it does not exist)."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    from gpumeter.infra import kafka as gkafka

    try:
        consumer = gkafka.make_consumer(settings.kafka, enable_auto_commit=False, group_id=None,
                                        request_timeout_ms=15_000)
    except KafkaError as exc:
        bootstrap = settings.kafka.bootstrap
        raise Failure(f"no Kafka broker answers at {bootstrap} ({type(exc).__name__})") from None
    latest: dict[str, bytes | None] = {}
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return {}
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        remaining = {tp for tp in partitions if ends[tp] > 0}
        deadline = time.monotonic() + READ_TIMEOUT_SECONDS
        while remaining:
            if time.monotonic() > deadline:
                raise Failure(f"reading {topic} took more than {READ_TIMEOUT_SECONDS:.0f} s")
            for messages in consumer.poll(timeout_ms=500).values():
                for message in messages:
                    if message.key is not None:
                        latest[message.key.decode()] = message.value  # None: a tombstone
            remaining = {tp for tp in remaining if consumer.position(tp) < ends[tp]}
    finally:
        consumer.close()
    states: dict[str, LedgerState] = {}
    for tenant, raw in latest.items():
        if raw is None:
            continue
        try:
            states[tenant] = decode_state(raw)
        except BadState as exc:
            print(f"gpumeter: warning: tenant {tenant}: {exc}", file=sys.stderr)
    return states


def _document(entry: TenantStatus, delays: EnforcementDelays, grace_seconds: int) -> dict[str, Any]:
    held = next((metric.used for metric in entry.metrics
                 if metric.metric == "max_gpus" and metric.gpu_model is None), Decimal(0))

    def bound(metric: str) -> str | None:
        hours = overshoot_bound(metric, entry.on_exceed, held, grace_seconds, delays)
        return None if hours is None else format_value("gpu_hours", hours)

    return {
        "tenant": entry.tenant,
        "state": entry.state,
        "on_exceed": entry.on_exceed,
        "blocked": entry.blocked,
        "at": entry.at.isoformat().replace("+00:00", "Z"),
        "metrics": [
            {
                "metric": metric.metric,
                "period": metric.period,
                "used": format_value(metric.metric, metric.used),
                "limit": None if metric.limit is None else format_value(metric.metric, metric.limit),
                "fraction": None if metric.fraction is None else format(metric.fraction, "f"),
                "state": metric.state,
                # GPU-hours past the limit before enforcement ends (null: no bound stated).
                "overshoot_bound": bound(metric.metric),
                **({"gpu_model": metric.gpu_model} if metric.gpu_model is not None else {}),
            }
            for metric in entry.metrics
        ],
    }


_STYLE = {"ok": "green", "warning": "yellow", "exceeded": "red", "blocked": "bold red"}


def _percent(fraction: str | None) -> str:
    if fraction is None:
        return "-"
    return f"{(Decimal(fraction) * 100).quantize(Decimal('0.1'), rounding=ROUND_HALF_UP)}%"


def _print_table(report: list[TenantStatus], documents: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="quota status")
    for column, justify in (("tenant", "left"), ("state", "left"), ("metric", "left"), ("period", "left"),
                            ("used", "right"), ("limit", "right"), ("used %", "right"),
                            ("metric state", "left"), ("overshoot ≤", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for entry, document in zip(report, documents, strict=True):
        for index, metric in enumerate(document["metrics"]):
            table.add_row(
                entry.tenant if index == 0 else (f"[dim]as of {document['at']}[/]" if index == 1 else ""),
                f"[{_STYLE[entry.state]}]{entry.state}[/]" if index == 0 else "",
                # GPUs held are a count now, not a total over the period.
                metric["metric"] + (f" [{metric['gpu_model']}]" if "gpu_model" in metric else ""),
                "now" if metric["metric"] == "max_gpus" else metric["period"],
                metric["used"], metric["limit"] or "-",
                _percent(metric["fraction"]), f"[{_STYLE[metric['state']]}]{metric['state']}[/]",
                "-" if metric["overshoot_bound"] is None else f"{metric['overshoot_bound']} h",
            )
        table.add_section()
    # Piped output keeps whole lines instead of the 80 columns rich assumes without a terminal.
    Console(width=None if sys.stdout.isatty() else 140).print(table)
