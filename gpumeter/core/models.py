"""Event models: contract 1 (UsageSample) and what the pipeline derives from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Annotated, Any, Literal, NotRequired, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
    with_config,
)
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from gpumeter.core import jsonio
from gpumeter.core.money import exact, product
from gpumeter.core.validation import (
    EARLIEST,
    END_OF_RANGE,
    TENANT_PATTERN,
    AwareTimestamp,
    DecimalValue,
    NonNegativeDecimal,
    UtcTimestamp,
    checked_timestamp,
    json_decimal,
    non_negative_decimal,
    sub_microsecond_ns,
    within_places,
)

Kind = Literal["gpu", "cpu", "memory", "storage"]
CapacityType = Literal["on-demand", "spot", "reserved"]
CAPACITY_TYPES: tuple[CapacityType, ...] = ("on-demand", "reserved", "spot")
KINDS: tuple[Kind, ...] = ("gpu", "cpu", "memory", "storage")

MAX_WINDOW_SECONDS = 3600
# Quantities carry at most 12 decimal places and stay below 10^9 units, so
# unit-seconds (quantity x seconds, microsecond timestamps) fit Decimal(38, 18) exactly.
QUANTITY_PLACES = 12
MAX_QUANTITY = Decimal(10) ** 9

# Non-empty and not blank: the pattern asks for at least one non-space character.
# Contract 1, amended: what storage holds. A Kubernetes pod priority is an Int32 column;
# telemetry goes to Decimal(18, 6) (utilization) and Decimal(38, 6) columns; timestamps lie
# in 1970-2299 (DateTime64's range, with the Unix epoch as the floor).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
Int32 = Annotated[StrictInt, Field(ge=INT32_MIN, le=INT32_MAX)]
UTILIZATION_LIMIT = Decimal(10) ** 12
TELEMETRY_LIMIT = Decimal(10) ** 32

NonEmpty = Annotated[str, Field(min_length=1, max_length=253, pattern=r"\S")]
_MAX_WINDOW = timedelta(seconds=MAX_WINDOW_SECONDS)
_ZERO = timedelta(0)


# One sample's constrained strings, shared by the model and its JSON fast path below.
EventId = Annotated[str, Field(min_length=1, max_length=128)]
TenantName = Annotated[str, Field(pattern=TENANT_PATTERN)]
GpuModelName = Annotated[str, Field(min_length=1, max_length=128)]
MigProfileName = Annotated[str, Field(min_length=1, max_length=64)]


class UsageSample(BaseModel):
    """One window of one resource held by one pod (contract 1). Strict: unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

    event_id: EventId
    kind: Kind
    cluster: NonEmpty
    node: NonEmpty
    tenant: TenantName
    namespace: NonEmpty
    pod: NonEmpty
    pod_uid: NonEmpty
    window_start: AwareTimestamp
    window_end: AwareTimestamp
    quantity: non_negative_decimal(QUANTITY_PLACES)  # type: ignore[valid-type]
    gpu_model: GpuModelName | None = None
    mig_profile: MigProfileName | None = None
    capacity_type: CapacityType = "on-demand"
    priority: Int32 = 0
    utilization: Annotated[NonNegativeDecimal, Field(lt=UTILIZATION_LIMIT)] | None = None
    memory_used_bytes: Annotated[NonNegativeDecimal, Field(lt=TELEMETRY_LIMIT)] | None = None
    power_watts: Annotated[NonNegativeDecimal, Field(lt=TELEMETRY_LIMIT)] | None = None
    energy_joules: Annotated[NonNegativeDecimal, Field(lt=TELEMETRY_LIMIT)] | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_nanoseconds(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> UsageSample:
        sample: UsageSample = handler(data)
        if isinstance(data, dict):
            seconds = _exact_window(
                sample.window_start, sample.window_end,
                sub_microsecond_ns(data.get("window_start")), sub_microsecond_ns(data.get("window_end")),
            )
            if seconds <= 0:
                raise ValueError("window_end must be after window_start")
            if seconds > MAX_WINDOW_SECONDS:
                raise ValueError(
                    f"window_start to window_end is {seconds} s; the maximum is {MAX_WINDOW_SECONDS} s"
                )
            # Not a field and not a pydantic private attribute (those cost a Python-level
            # __getattr__ per read on the rating hot path): a plain instance-dict entry, which
            # serialization and equality ignore. It remembers the window it was computed for.
            sample.__dict__[_WINDOW_CACHE] = (sample.window_start, sample.window_end, seconds)
        return sample

    @model_validator(mode="after")
    def _check_rules(self) -> UsageSample:
        if self.window_start < EARLIEST or self.window_end >= END_OF_RANGE:
            raise ValueError("window_start and window_end must lie between 1970 and 2299 (UTC)")
        length = self.window_end - self.window_start
        if length < _ZERO:
            raise ValueError("window_end must be after window_start")
        if length > _MAX_WINDOW:
            raise ValueError(
                f"window_start to window_end is {length.total_seconds()} s; "
                f"the maximum is {MAX_WINDOW_SECONDS} s"
            )
        if self.quantity >= MAX_QUANTITY:
            raise ValueError(f"quantity must be below {MAX_QUANTITY}")
        if self.kind == "gpu":
            if self.gpu_model is None:
                raise ValueError("gpu_model is required when kind is gpu")
        elif self.gpu_model is not None or self.mig_profile is not None:
            raise ValueError("gpu_model and mig_profile are only valid when kind is gpu")
        return self

    @property
    def window_seconds(self) -> Decimal:
        """Exact window length in seconds, to the nanosecond the sender gave."""
        cached = self.__dict__.get(_WINDOW_CACHE)
        if cached is not None and cached[0] is self.window_start and cached[1] is self.window_end:
            return cached[2]
        return _exact_window(self.window_start, self.window_end, 0, 0)

    @property
    def unit_seconds(self) -> Decimal:
        """quantity x seconds: exact (60-digit context), unlike unit-hours, which divide by 3600."""
        return product(self.quantity, self.window_seconds)

    @property
    def period_month(self) -> str:
        """The invoice month: the UTC calendar month of window_start (contract 3, step 4)."""
        return utc_month(self.window_start)


_WINDOW_CACHE = "_gpumeter_window"


def _exact_window(start: datetime, end: datetime, start_ns: int, end_ns: int) -> Decimal:
    """end - start in seconds; start_ns/end_ns are the nanoseconds below the microsecond."""
    delta = end - start
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    nanos = micros * 1000 + end_ns - start_ns
    # Microsecond input keeps its 6-place form (and every stored value its old shape).
    return Decimal(nanos // 1000).scaleb(-6) if nanos % 1000 == 0 else Decimal(nanos).scaleb(-9)


def utc_month(moment: datetime) -> str:
    utc = moment.astimezone(UTC)
    return f"{utc.year:04d}-{utc.month:02d}"  # strftime is several times slower on the rating path


class SampleRejected(ValueError):
    """A sample that fails contract 1, with a one-line reason."""

    def __init__(self, reason: str, code: str = "invalid") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each failing field and why."""
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(item) for item in error["loc"]) or "sample"
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{location}: {message}")
    return "; ".join(parts)


# A real sample is well under 2 KiB; the bound keeps one record (and Kafka's 1 MiB message
# limit) safe from a sample padded with labels.
MAX_SAMPLE_BYTES = 64 * 1024


M = TypeVar("M", bound=BaseModel)


def trusted(model: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
    """An instance of ``model`` holding ``values`` as they are: every field, in declaration
    order, already validated (or derived by exact arithmetic from validated values).

    What ``model_construct`` does for a model without aliases, extras, private attributes or
    a __new__ of its own, minus its per-field Python loop (~25 µs per rated sample).
    """
    instance: M = _new(model)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", fields_set)
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


_new = object.__new__
_set = object.__setattr__


JsonQuantity = Annotated[Decimal, json_decimal(MAX_QUANTITY)]
JsonUtilization = Annotated[Decimal, json_decimal(UTILIZATION_LIMIT)]
JsonTelemetry = Annotated[Decimal, json_decimal(TELEMETRY_LIMIT)]


@with_config(ConfigDict(extra="forbid"))
class _SampleJson(TypedDict):
    """UsageSample's fields as pydantic-core alone validates them from JSON: the model's own
    annotations for strings and integers, json_decimal for decimals (quantity's places are
    checked after), timestamps kept as text for checked_timestamp."""

    event_id: EventId
    kind: Kind
    cluster: NonEmpty
    node: NonEmpty
    tenant: TenantName
    namespace: NonEmpty
    pod: NonEmpty
    pod_uid: NonEmpty
    window_start: StrictStr
    window_end: StrictStr
    quantity: JsonQuantity
    gpu_model: NotRequired[GpuModelName | None]
    mig_profile: NotRequired[MigProfileName | None]
    capacity_type: NotRequired[CapacityType]
    priority: NotRequired[Int32]
    utilization: NotRequired[JsonUtilization | None]
    memory_used_bytes: NotRequired[JsonTelemetry | None]
    power_watts: NotRequired[JsonTelemetry | None]
    energy_joules: NotRequired[JsonTelemetry | None]
    labels: NotRequired[dict[str, str]]


_SAMPLE_JSON: TypeAdapter[_SampleJson] = TypeAdapter(_SampleJson)


# (window_start text, window_end text) -> (start, end, exact seconds), or None where the
# sample's window breaks a rule. Samples of one window share both texts, so the two timestamp
# checks and the exact length become one dict lookup for nearly every sample.
_WINDOWS: dict[tuple[str, str], tuple[datetime, datetime, Decimal] | None] = {}
_WINDOW_CACHE_SIZE = 4096


def checked_window(start_text: str, end_text: str) -> tuple[datetime, datetime, Decimal] | None:
    key = (start_text, end_text)
    try:
        return _WINDOWS[key]
    except KeyError:
        pass
    window: tuple[datetime, datetime, Decimal] | None = None
    start = checked_timestamp(start_text)
    end = checked_timestamp(end_text)
    if start is not None and end is not None and start[2] and end[2]:
        length = end[0] - start[0]
        seconds = _exact_window(start[0], end[0], start[1], end[1])
        if _ZERO <= length <= _MAX_WINDOW and 0 < seconds <= MAX_WINDOW_SECONDS:
            window = (start[0], end[0], seconds)
    if len(_WINDOWS) >= _WINDOW_CACHE_SIZE:
        _WINDOWS.clear()
    _WINDOWS[key] = window
    return window


def read_sample_json(raw: bytes | str) -> UsageSample | None:
    """The UsageSample of one JSON line through pydantic-core's JSON parser, or None.

    None means "not decided here": anything unusual (a JSON float, a field that breaks a rule,
    not JSON at all) goes to UsageSample.model_validate, which rejects with the contract's
    reason or accepts. What this accepts, the model accepts with the same values
    (tests/unit/core/test_sample_json.py checks both paths agree), so every sample gets one
    verdict whichever path decided it; this one skips a Python JSON parse and the model's
    Python-level validators, ~4x faster for a typical sample.
    """
    try:
        document = _SAMPLE_JSON.validate_json(raw)
    except ValidationError:
        return None
    window = checked_window(document["window_start"], document["window_end"])
    quantity = document["quantity"]
    if window is None or not within_places(quantity, QUANTITY_PLACES):
        return None
    kind = document["kind"]
    gpu_model = document.get("gpu_model")
    mig_profile = document.get("mig_profile")
    if (gpu_model is None) if kind == "gpu" else (gpu_model is not None or mig_profile is not None):
        return None
    values = {
        "event_id": document["event_id"], "kind": kind, "cluster": document["cluster"],
        "node": document["node"], "tenant": document["tenant"], "namespace": document["namespace"],
        "pod": document["pod"], "pod_uid": document["pod_uid"],
        "window_start": window[0], "window_end": window[1], "quantity": quantity,
        "gpu_model": gpu_model, "mig_profile": mig_profile,
        "capacity_type": document.get("capacity_type", "on-demand"), "priority": document.get("priority", 0),
        "utilization": document.get("utilization"), "memory_used_bytes": document.get("memory_used_bytes"),
        "power_watts": document.get("power_watts"), "energy_joules": document.get("energy_joules"),
        "labels": document.get("labels", {}),
        _WINDOW_CACHE: window,
    }
    return trusted(UsageSample, values, set(document))


def parse_sample(raw: bytes | str | dict[str, Any]) -> UsageSample:
    """Bytes, text or a parsed object to a UsageSample, or SampleRejected with the reason."""
    if isinstance(raw, dict):
        document: Any = raw
    elif len(raw) > MAX_SAMPLE_BYTES:
        raise SampleRejected(f"sample is {len(raw)} bytes; the limit is {MAX_SAMPLE_BYTES}", code="too_large")
    else:
        sample = read_sample_json(raw)
        if sample is not None:
            return sample
        try:
            document = jsonio.loads(raw)
        except jsonio.JSONInputError as exc:
            raise SampleRejected(str(exc), code="not_json") from None
    if not isinstance(document, dict):
        raise SampleRejected(f"expected a JSON object, got {type(document).__name__}", code="not_object")
    try:
        return UsageSample.model_validate(document)
    except ValidationError as exc:
        raise SampleRejected(describe_validation_error(exc)) from None


class RatedUsage(BaseModel):
    """A sample with its price attached (contract 3, steps 1-3): what the rated topic carries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str
    kind: Kind
    cluster: str
    node: str
    tenant: str
    namespace: str
    pod: str
    pod_uid: str
    window_start: UtcTimestamp
    window_end: UtcTimestamp
    period: str
    quantity: NonNegativeDecimal
    unit_seconds: NonNegativeDecimal
    gpu_model: str | None
    mig_profile: str | None
    capacity_type: CapacityType
    priority: int
    rate_card: str
    currency: str
    unit_price: NonNegativeDecimal
    capacity_multiplier: NonNegativeDecimal
    list_cost: NonNegativeDecimal
    utilization: NonNegativeDecimal | None = None
    energy_joules: NonNegativeDecimal | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    source_partition: int = -1
    source_offset: int = -1


class DeadLetter(BaseModel):
    """A rejected input with enough context to find, fix and replay it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason_code: str
    reason: str
    raw: str
    source_topic: str
    source_partition: int
    source_offset: int
    source_index: int = 0  # line within a multi-sample record (gpumeter/core/records.py)
    event_id: str | None = None
    tenant: str | None = None
    rejected_at: UtcTimestamp


QuotaMetric = Literal["gpu_hours", "spend", "max_gpus"]
QuotaLevel = Literal["warning", "exceeded", "recovered"]


class QuotaEvent(BaseModel):
    """A quota crossing (contract 4): emitted once per crossing, not per sample.

    ``threshold`` is the fraction crossed ("0.8", "1"); ``used`` and ``limit`` are decimal
    strings on the wire (money 2 places, hours 6 places). ``event_id`` is deterministic for
    one crossing, so a replay republishes the same id and consumers fold it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str
    tenant: str
    metric: QuotaMetric
    level: QuotaLevel
    threshold: DecimalValue
    used: DecimalValue
    limit: DecimalValue
    period: str
    at: UtcTimestamp
    # Amendment "per-model limits": the model key of a per-model limit (``A100-``); absent for
    # tenant-wide metrics, and then left out of the JSON, so consumers that predate it read on.
    gpu_model: str | None = None


PreemptionAction = Literal["noticed", "evicted", "pdb_refused", "failed", "dry_run", "queue_closed",
                           "queue_opened", "skipped_protected", "cancelled"]


class PreemptionRecord(BaseModel):
    """One decision of the quota actuator (contract 4): topic gpumeter.preemptions.v1 and ClickHouse.

    ``record_id`` is deterministic (quota event or reclaim id, pod uid, action), so a replayed
    quota event republishes the same records and consumers fold them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    record_id: str
    tenant: str
    namespace: str
    pod: str
    pod_uid: str
    node: str = ""
    gpus: DecimalValue = Decimal(0)
    capacity_type: str = ""
    priority: int = 0
    # What caused it: a quota event id, or "spot-reclaim:<pending pod uid>".
    cause: str
    metric: str = ""
    action: PreemptionAction
    detail: str = ""
    at: UtcTimestamp


class GpuDevice(BaseModel):
    """One GPU of a node's topology record (contract 8)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    uuid: str
    model: str
    nvlink_peers: list[int] = Field(default_factory=list)
    numa_node: int | None = None
    memory_bytes: int | None = None
    pci_bus_id: str | None = None
    # A GPU in MIG mode is handed out as MIG devices, never whole: not free for nvidia.com/gpu.
    mig_enabled: bool = False
    # Time-slicing replicas the device plugin advertises for it (contract 8 amendment); 1: not shared.
    replicas: int = Field(default=1, ge=1)


class NodeTopology(BaseModel):
    """GPU layout of one node, published compacted by node name for the extender."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str
    node: str
    gpus: list[GpuDevice]
    # Pairwise link class by GPU index, e.g. {"0-1": "NV18", "0-4": "SYS"}.
    links: dict[str, str] = Field(default_factory=dict)
    at: UtcTimestamp


class GpuAssignment(BaseModel):
    """GPU indices the kubelet assigned to one container of one pod (contract 8)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str
    pod: str
    pod_uid: str
    container: str = ""
    gpu_indices: list[int]


class NodeAllocation(BaseModel):
    """Which GPU indices of a node are assigned, and to which pod, every window (contract 8)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str
    node: str
    assignments: list[GpuAssignment] = Field(default_factory=list)
    at: UtcTimestamp


def dead_letter(
    raw: bytes, code: str, reason: str, source_topic: str, partition: int, offset: int,
    sample: UsageSample | None = None, index: int = 0,
) -> DeadLetter:
    """A dead letter for ``raw``, naming its event_id and tenant when they can be read."""
    event_id, tenant = (sample.event_id, sample.tenant) if sample else _readable_ids(raw)
    return DeadLetter(
        reason_code=code, reason=reason, raw=jsonio.raw_text(raw), source_topic=source_topic,
        source_partition=partition, source_offset=offset, source_index=index, event_id=event_id,
        tenant=tenant,
        rejected_at=datetime.now(UTC),
    )


def _readable_ids(raw: bytes) -> tuple[str | None, str | None]:
    try:
        document = jsonio.loads(raw)
    except jsonio.JSONInputError:
        return None, None
    if not isinstance(document, dict):
        return None, None
    event_id, tenant = document.get("event_id"), document.get("tenant")
    return (
        event_id[:128] if isinstance(event_id, str) else None,
        tenant[:63] if isinstance(tenant, str) else None,
    )


_QUANTITY_QUANTUM = Decimal(1).scaleb(-QUANTITY_PLACES)


def quantize_quantity(value: Decimal) -> Decimal:
    """A held quantity at contract precision (12 places), e.g. a MIG share such as 1/7 GPU.

    Contract 1 counts GPUs, fractions for MIG and shared devices; every collector rounds a
    fraction the same way (half-even) so one device-window always has one quantity.
    """
    with exact():
        return value.quantize(_QUANTITY_QUANTUM, rounding=ROUND_HALF_EVEN)


def gpu_share(slices: int, slices_per_gpu: int) -> Decimal:
    """The fraction of a GPU that ``slices`` of its ``slices_per_gpu`` compute slices are."""
    return quantize_quantity(Decimal(slices) / Decimal(slices_per_gpu))
