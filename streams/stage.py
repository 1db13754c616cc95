"""The rating stage as a plain object: raw sample bytes in, a rated record or a dead letter out.

Kept free of faust, Kafka and ClickHouse clients (an import-linter contract in pyproject.toml)
so it is unit-testable and benchmarkable on its own; the faust agent in
streams/rating_agent.py only moves bytes between topics around it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from decimal import Decimal
from operator import attrgetter, itemgetter
from typing import NamedTuple

import orjson

from gpumeter.core import jsonio
from gpumeter.core.models import (
    DeadLetter,
    RatedUsage,
    SampleRejected,
    UsageSample,
    dead_letter,
    parse_sample,
)
from gpumeter.core.ratecard import RateCardSet
from gpumeter.core.records import split
from gpumeter.infra.rows import Row, rated_row
from gpumeter.infra.schema import RATED_USAGE
from pricing.rating import Rater
from streams import native_rating
from streams.native_rating import NativeRating


@dataclass
class StageCounters:
    received: int = 0
    rated: int = 0
    dead: int = 0
    duplicates: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)


class Outcome(NamedTuple):
    """One sample's fate. A NamedTuple: a frozen dataclass's __init__ cost ~1 µs a sample."""

    rated: RatedUsage | None = None
    dead: DeadLetter | None = None
    duplicate: bool = False


_DUPLICATE = Outcome(duplicate=True)


# What billing depends on: two samples with one event_id must agree on these. A rated sample
# gives the same fingerprint as its sample (its windows are the same instants in UTC, and aware
# datetimes compare by instant) without working out unit_seconds a second time.
_FINGERPRINT_FIELDS = (
    "tenant", "kind", "window_start", "window_end", "unit_seconds", "quantity",
    "gpu_model", "mig_profile", "capacity_type",
)
_fingerprint = attrgetter(*_FINGERPRINT_FIELDS)  # of a sample (unit_seconds is worked out)
_rated_fingerprint = itemgetter(*_FINGERPRINT_FIELDS)  # of a rated sample's instance dict
_row_fingerprint = itemgetter(*(RATED_USAGE.insert_columns.index(name) for name in _FINGERPRINT_FIELDS))


class RatingStage:
    """Validate, deduplicate (recent event_ids) and rate samples.

    The in-memory dedup window only saves downstream work: it is lost on restart, and the
    ClickHouse sink is the authoritative guard against double billing.
    """

    def __init__(self, cards: RateCardSet, source_topic: str, dedup_window: int = 200_000,
                 native: bool = True) -> None:
        self.rater = Rater(cards)
        self.native = native and native_rating.BUILT
        self._native = NativeRating(self.rater) if self.native else None
        self.source_topic = source_topic
        self.dedup_window = dedup_window
        self._seen: OrderedDict[str, tuple[object, ...]] = OrderedDict()
        self.counters = StageCounters()

    def forget(self) -> None:
        """Drop the recent-ids window: after a rebalance, samples seen here may be read again
        because their batch was dropped unstored; the window must not call them duplicates
        (the store, which knows what was stored, decides)."""
        self._seen.clear()

    def use_cards(self, cards: RateCardSet) -> None:
        """Price from now on with ``cards`` (a fresh rater: its rate cache belonged to the old set)."""
        self.rater = Rater(cards)
        self._native = NativeRating(self.rater) if self.native else None

    def rate_record(self, record: bytes, partition: int, offset: int) -> tuple[list[Row], list[DeadLetter]]:
        """What the worker's rating agent makes of a record: the rated_usage rows of its rated
        samples, each carrying its rated line (``rated_row(rated, encode_rated(rated))``), and
        the dead letters of the others; duplicates of recent samples give neither.

        The native path rates the samples it plainly accepts (streams/native_rating.py); the
        others, and any whose event_id was seen recently, go through ``process``.
        """
        lines = split(record)
        native = self._native.rate_lines(lines, partition, offset) if self._native is not None else None
        rows: list[Row] = []
        dead: list[DeadLetter] = []
        for index, line in enumerate(lines):
            row = native[index] if native is not None else None
            if row is not None and row[0] not in self._seen:
                self.counters.received += 1
                self._remember(row[0], _row_fingerprint(row))
                self.counters.rated += 1
                rows.append(row)
                continue
            outcome = self.process(line, partition, offset, index)
            if outcome.rated is not None:
                rows.append(rated_row(outcome.rated, encode_rated(outcome.rated)))
            elif outcome.dead is not None:
                dead.append(outcome.dead)
        return rows, dead

    def process_record(self, record: bytes, partition: int, offset: int) -> list[Outcome]:
        """Every sample of a (possibly multi-line) Kafka record; see gpumeter/core/records.py."""
        return [self.process(line, partition, offset, index) for index, line in enumerate(split(record))]

    def process(self, raw: bytes, partition: int, offset: int, index: int = 0) -> Outcome:
        self.counters.received += 1
        try:
            sample = parse_sample(raw)
        except SampleRejected as exc:
            return self._dead(raw, partition, offset, index, exc.code, exc.reason)
        previous = self._seen.get(sample.event_id)
        if previous is not None:
            self._seen.move_to_end(sample.event_id)
            if previous != _fingerprint(sample):
                return self._dead(
                    raw, partition, offset, index, "duplicate_conflict",
                    f"event_id {sample.event_id} was already seen with different billing fields",
                    sample,
                )
            self.counters.duplicates += 1
            return _DUPLICATE
        try:
            rated = self.rater.rate(sample, partition, offset)
        except SampleRejected as exc:
            return self._dead(raw, partition, offset, index, exc.code, exc.reason, sample)
        self._remember(sample.event_id, _rated_fingerprint(rated.__dict__))
        self.counters.rated += 1
        return Outcome(rated=rated)

    def _remember(self, event_id: str, fingerprint: tuple[object, ...]) -> None:
        self._seen[event_id] = fingerprint
        if len(self._seen) > self.dedup_window:
            self._seen.popitem(last=False)

    def _dead(self, raw: bytes, partition: int, offset: int, index: int, code: str, reason: str,
              sample: UsageSample | None = None) -> Outcome:
        self.counters.dead += 1
        self.counters.by_reason[code] = self.counters.by_reason.get(code, 0) + 1
        return Outcome(
            dead=dead_letter(raw, code, reason, self.source_topic, partition, offset, sample, index)
        )


def _decimal_text(value: object) -> str:
    if isinstance(value, Decimal):
        return str(value)  # as pydantic writes a Decimal: never a JSON number a float parser reads
    raise TypeError(f"cannot serialise {type(value).__name__}")


def encode_rated(rated: RatedUsage) -> bytes:
    """The same bytes as ``rated.model_dump_json()`` (Decimals as strings, UTC as "Z"), by
    orjson over the model's field values: a third of the time (tests/unit/streams/test_stage.py
    compares both)."""
    try:
        return orjson.dumps(rated.__dict__, default=_decimal_text, option=orjson.OPT_UTC_Z)
    except TypeError:  # a value orjson does not take as pydantic would: let pydantic write it
        return rated.model_dump_json().encode()


def encode_dead(dead: DeadLetter) -> bytes:
    return jsonio.dumpb(dead.model_dump())
