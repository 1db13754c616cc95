"""Quota accounting in the stream (contract 4): a thin, faust-free shell around quota/.

``QuotaProcessor`` keeps one ``LedgerState`` per tenant in a ``LedgerStore`` (a faust table
in the worker, a dict in unit tests) and turns rated records, timer ticks and tenants-file
reloads into quota events. The rules themselves (what counts, what crosses, event ids)
stay in quota/accounting.py; this module adds only what streaming needs:

- Replay safety. A rated record names the samples record it came from (source partition
  and offset). Per tenant, the highest source offset applied per source partition is kept
  in the same state the counts are in, and a record at or below it is skipped: a record
  replayed after a crash (of the rating agent, which re-rates samples, or of this one) is
  never counted twice. Within a partition a tenant's records arrive in source order
  (key = tenant), so "at or below" means "already applied".
- The quota clock. Samples carry event time; the clock of a tenant is its event-time
  watermark (the latest window_end seen) advanced by monotonic time since it was seen, so
  a replayed backlog is judged at the time it describes, and a tenant that stops
  reporting still sees its pods go stale and its period roll over. It never runs back.
- Evaluation once per record: every usage of the record is counted, then crossings are
  evaluated once (quota.accounting.count / reevaluate), so a multi-GPU pod whose devices
  report one sample each does not flap max_gpus within its window.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpumeter.core.config_files import ConfigError
from gpumeter.core.grants import Grant
from gpumeter.core.models import CapacityType, Kind, QuotaEvent, QuotaMetric, RatedUsage
from gpumeter.core.records import split
from gpumeter.core.tenants import TenantPolicy, TenantsFile, load_tenants
from gpumeter.core.validation import TENANT_PATTERN, UtcTimestamp
from quota.accounting import (
    DEFAULT_STALE_SECONDS,
    MetricStatus,
    TenantLedger,
    Usage,
    blocked,
    count,
    reevaluate,
    status,
)
from streams.quota_decode import read_usages

log = logging.getLogger("gpumeter.quota")

TenantState = Literal["ok", "warning", "exceeded", "blocked"]


class LedgerState(BaseModel):
    """What the worker stores per tenant (one changelog record, key = tenant)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ledger: TenantLedger
    # samples-topic partition -> highest source offset applied: the replay guard.
    source_offsets: dict[Annotated[int, Field(ge=0)], int] = Field(default_factory=dict)
    # The quota clock at the last evaluation stored; a restarted worker resumes from it.
    clock: UtcTimestamp | None = None


class BadState(ValueError):
    """A stored ledger state that does not have the shape we write."""


def encode_state(state: LedgerState) -> bytes:
    return state.model_dump_json().encode()


def decode_state(raw: bytes) -> LedgerState:
    try:
        return LedgerState.model_validate_json(raw)
    except ValidationError as exc:
        raise BadState(f"unreadable quota ledger state: {_one_line(str(exc))}") from None


class BadRatedRecord(ValueError):
    """A record on the rated topic that does not have the shape the rating agent writes."""


class RatedLine(BaseModel):
    """What quota accounting reads of a rated record's line (a RatedUsage; other fields ignored).

    Decoding only these, with pydantic's native types, costs a fraction of a full RatedUsage:
    the quota agent reads every rated record the rating agent writes, in the same worker.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: Annotated[str, Field(min_length=1)]
    kind: Kind
    tenant: Annotated[str, Field(pattern=TENANT_PATTERN)]
    namespace: str
    pod: str
    pod_uid: str
    window_start: AwareDatetime
    window_end: AwareDatetime
    quantity: Annotated[Decimal, Field(ge=0)]
    unit_seconds: Annotated[Decimal, Field(ge=0)]
    list_cost: Annotated[Decimal, Field(ge=0)]
    capacity_type: CapacityType = "on-demand"
    priority: int = 0
    gpu_model: str | None = None
    source_partition: int = -1
    source_offset: int = -1

    @model_validator(mode="after")
    def _window(self) -> RatedLine:
        if self.window_end <= self.window_start:
            raise ValueError("window_end must be after window_start")
        return self

    def usage(self) -> Usage:
        return Usage(
            event_id=self.event_id, tenant=self.tenant, kind=self.kind, namespace=self.namespace,
            pod=self.pod, pod_uid=self.pod_uid, window_start=self.window_start.astimezone(UTC),
            window_end=self.window_end.astimezone(UTC), quantity=self.quantity,
            unit_seconds=self.unit_seconds, list_cost=self.list_cost, capacity_type=self.capacity_type,
            priority=self.priority, gpu_model=self.gpu_model,
        )


def decode_rated(record: bytes) -> list[RatedLine]:
    """The lines of one rated record (gpumeter/core/records.py framing)."""
    try:
        return [RatedLine.model_validate_json(line) for line in split(record)]
    except ValidationError as exc:
        raise BadRatedRecord(f"unreadable rated record: {_one_line(str(exc))}") from None


def encode_event(event: QuotaEvent) -> bytes:
    # exclude_none drops only gpu_model (every other field is required): a tenant-wide event is
    # the JSON it always was, which consumers that forbid unknown fields still read.
    return event.model_dump_json(exclude_none=True).encode()


class BadQuotaEvent(ValueError):
    """A record on the quota events topic that is not a QuotaEvent."""


def decode_event(payload: bytes) -> QuotaEvent:
    try:
        return QuotaEvent.model_validate_json(payload)
    except ValidationError as exc:
        raise BadQuotaEvent(f"unreadable quota event: {_one_line(str(exc))}") from None


class LedgerStore(Protocol):
    """Per-tenant ledger states. ``tenants()`` lists only the tenants this worker owns."""

    def get(self, tenant: str) -> LedgerState | None: ...

    def put(self, tenant: str, state: LedgerState) -> None: ...

    def tenants(self) -> Iterable[str]: ...


class MemoryLedgerStore:
    """A LedgerStore in a dict: for one process and for tests."""

    def __init__(self) -> None:
        self.states: dict[str, LedgerState] = {}

    def get(self, tenant: str) -> LedgerState | None:
        return self.states.get(tenant)

    def put(self, tenant: str, state: LedgerState) -> None:
        self.states[tenant] = state

    def tenants(self) -> Iterable[str]:
        return list(self.states)


@dataclass
class QuotaCounters:
    records: int = 0  # (tenant, source record) groups applied
    replayed: int = 0  # skipped: at or below the tenant's source offset for that partition
    events: int = 0


class QuotaProcessor:
    """Per-tenant quota ledgers over a LedgerStore; every method returns the events to publish.

    The caller publishes the returned events before it persists the states this call put
    into the store, so a crash between the two can only replay a crossing (same
    deterministic event id, folded by consumers), never lose one.
    """

    def __init__(
        self,
        store: LedgerStore,
        policies: TenantsFile,
        stale_seconds: int = DEFAULT_STALE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        grants: Mapping[str, Sequence[Grant]] | None = None,
    ) -> None:
        self.store = store
        self.stale_seconds = stale_seconds
        self.counters = QuotaCounters()
        self._monotonic = monotonic
        # tenant -> (quota clock, monotonic reading when it was that)
        self._clocks: dict[str, tuple[datetime, float]] = {}
        self._policies: dict[str, TenantPolicy] = {}
        self._set_policies(policies)
        self._grants: Mapping[str, Sequence[Grant]] = dict(grants or {})

    def grants(self, tenant: str) -> Sequence[Grant]:
        return self._grants.get(tenant, ())

    def set_grants(self, grants: Mapping[str, Sequence[Grant]]) -> list[QuotaEvent]:
        """Grants read again (quota.grants.fold of ``quota_grants``): re-evaluate every owned
        tenant against them. The limit is a function of the whole set, so a grant read twice,
        or read again after a restart, is never added twice."""
        self._grants = dict(grants)
        return self.tick()

    def policy(self, tenant: str) -> TenantPolicy | None:
        return self._policies.get(tenant)

    def process_record(self, record: bytes) -> list[QuotaEvent]:
        """One rated record: its usages grouped by the samples record they came from."""
        # The rating agent's own records, read fast (gpu_model too, for per-model limits); else
        # RatedLine.
        located = read_usages(record)
        if located is None:
            located = [(line.source_partition, line.source_offset, line.usage())
                       for line in decode_rated(record)]
        groups: dict[tuple[int, int], list[Usage]] = {}
        for partition, offset, usage in located:
            groups.setdefault((partition, offset), []).append(usage)
        events: list[QuotaEvent] = []
        for (partition, offset), usages in groups.items():
            events += self._process(usages, partition, offset)
        return events

    def process(
        self, rated: Sequence[RatedUsage], source_partition: int, source_offset: int
    ) -> list[QuotaEvent]:
        """Count the usages of one samples record (once), then evaluate each tenant once.

        A negative source partition (usage not read from the samples topic) has no replay
        guard; recently seen event_ids are still counted once (quota.accounting).
        """
        return self._process([Usage.from_rated(usage) for usage in rated], source_partition, source_offset)

    def _process(
        self, usages: Sequence[Usage], source_partition: int, source_offset: int
    ) -> list[QuotaEvent]:
        by_tenant: dict[str, list[Usage]] = {}
        for usage in usages:
            by_tenant.setdefault(usage.tenant, []).append(usage)
        events: list[QuotaEvent] = []
        for tenant, group in by_tenant.items():
            events += self._process_tenant(tenant, group, source_partition, source_offset)
        self.counters.events += len(events)
        return events

    def tick(self, now: datetime | None = None) -> list[QuotaEvent]:
        """Re-evaluate every owned tenant at its clock (or ``now``, if later): stale pods, rollover."""
        events: list[QuotaEvent] = []
        for tenant in sorted(self.store.tenants()):
            events += self._reevaluate(tenant, now)
        self.counters.events += len(events)
        return events

    def reload(self, policies: TenantsFile) -> list[QuotaEvent]:
        """A changed tenants file: every owned tenant is re-evaluated against its new policy."""
        self._set_policies(policies)
        return self.tick()

    def clock(self, tenant: str) -> datetime | None:
        """The tenant's quota clock now; None before anything of it was seen or stored."""
        return self._clock(tenant, self.store.get(tenant), self._monotonic())

    def _set_policies(self, policies: TenantsFile) -> None:
        self._policies = {policy.tenant: policy for policy in policies.tenants}

    def _process_tenant(
        self, tenant: str, usages: list[Usage], source_partition: int, source_offset: int
    ) -> list[QuotaEvent]:
        state = self.store.get(tenant)
        if state is None:
            state = LedgerState(ledger=TenantLedger(tenant=tenant))
        guarded = source_partition >= 0
        if guarded and source_offset <= state.source_offsets.get(source_partition, -1):
            self.counters.replayed += 1
            return []
        ledger = count(state.ledger, usages)
        now = self._advance(tenant, state, max(usage.window_end for usage in usages))
        ledger, events = reevaluate(ledger, self.policy(tenant), now, self.stale_seconds, self.grants(tenant))
        offsets = state.source_offsets
        if guarded:
            offsets = {**offsets, source_partition: source_offset}
        self.store.put(tenant, LedgerState(ledger=ledger, source_offsets=offsets, clock=now))
        self.counters.records += 1
        return events

    def _reevaluate(self, tenant: str, at_least: datetime | None) -> list[QuotaEvent]:
        state = self.store.get(tenant)
        if state is None:
            return []
        reading = self._monotonic()
        now = self._clock(tenant, state, reading)
        if at_least is not None and (now is None or at_least > now):
            now = at_least
        if now is None:
            return []
        self._clocks[tenant] = (now, reading)
        ledger, events = reevaluate(state.ledger, self.policy(tenant), now, self.stale_seconds,
                                    self.grants(tenant))
        # Unchanged state is not written again: a tick must not flood the changelog.
        if events or ledger != state.ledger:
            self.store.put(tenant, state.model_copy(update={"ledger": ledger, "clock": now}))
        return events

    def _clock(self, tenant: str, state: LedgerState | None, reading: float) -> datetime | None:
        candidates = []
        running = self._clocks.get(tenant)
        if running is not None:
            candidates.append(running[0] + timedelta(seconds=max(0.0, reading - running[1])))
        # The stored clock wins when another worker advanced it (a partition handed back).
        if state is not None and state.clock is not None:
            candidates.append(state.clock)
        return max(candidates) if candidates else None

    def _advance(self, tenant: str, state: LedgerState, seen: datetime) -> datetime:
        reading = self._monotonic()
        current = self._clock(tenant, state, reading)
        now = seen if current is None or seen > current else current
        self._clocks[tenant] = (now, reading)
        return now


class TenantsWatcher:
    """Re-reads the tenants file when its content changes; a bad file is refused, once.

    A file that does not parse is logged in one line naming the file and the field, and
    the last good one stays in force until the file is fixed.
    """

    def __init__(self, path: Path | None) -> None:
        """Load the file now: a bad file at start raises ConfigError (there is no last good one)."""
        self.path = path
        # Digest first, then load: a change in between is seen by the next poll, never missed.
        self._digest = self._read_digest()
        self.current = load_tenants(path)

    def poll(self) -> TenantsFile | None:
        """The new tenants file when it changed and parses; None when unchanged or refused."""
        if self.path is None:
            return None
        digest = self._read_digest()
        if digest == self._digest:
            return None
        self._digest = digest
        try:
            loaded = load_tenants(self.path)
        except ConfigError as exc:
            log.error("tenants file refused, the last good one stays in force: %s", _one_line(str(exc)))
            return None
        self.current = loaded
        log.warning("tenants file %s reloaded: %d tenants", self.path, len(loaded.tenants))
        return loaded

    def _read_digest(self) -> str | None:
        if self.path is None:
            return None
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as exc:
            # Unreadable is a content of its own: refused once, re-read when it reappears.
            return f"unreadable: {exc.strerror}"


class TenantStatus(BaseModel):
    """One tenant for `gpumeter quota status`."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    state: TenantState
    on_exceed: str | None
    blocked: list[QuotaMetric]
    at: datetime
    metrics: list[MetricStatus]


def tenant_status(
    tenant: str,
    state: LedgerState | None,
    policy: TenantPolicy | None,
    at: datetime,
    stale_seconds: int = DEFAULT_STALE_SECONDS,
    grants: Sequence[Grant] = (),
) -> TenantStatus:
    """Usage against limits as of ``at``, and the tenant's state.

    blocked: a metric exceeded and not recovered, with on_exceed block or preempt (contract
    4); otherwise the worst metric state (exceeded > warning > ok).
    """
    ledger = state.ledger if state is not None else TenantLedger(tenant=tenant)
    metrics = status(ledger, policy, at, stale_seconds, grants)
    stopped = blocked(ledger, policy)
    overall: TenantState = "blocked" if stopped else _worst({metric.state for metric in metrics})
    return TenantStatus(tenant=tenant, state=overall, on_exceed=policy.on_exceed if policy else None,
                        blocked=stopped, at=at, metrics=metrics)


def _worst(states: set[str]) -> TenantState:
    if "exceeded" in states:
        return "exceeded"
    return "warning" if "warning" in states else "ok"


def _one_line(text: str) -> str:
    return " ".join(text.split())
