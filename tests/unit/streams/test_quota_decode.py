"""The quota agent's fast (native) reading of rated records against RatedLine, on the same bytes.

Reference: ``decode_rated`` (RatedLine, pydantic), the definition of a rated line. For the
rating agent's own records the fast path must answer, with equal usages (values and their
text, so ledgers serialise the same); for every variation of a line it either answers
exactly what RatedLine answers or declines (None), never accepts what RatedLine refuses.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

import streams.quota_decode as quota_decode
from gpumeter.core import jsonio
from gpumeter.core.records import join
from quota.accounting import Usage
from streams.quota import BadRatedRecord, decode_rated
from streams.quota_decode import read_usages
from streams.stage import RatingStage, encode_rated
from testkit.builders import card_set, random_samples

Located = tuple[int, int, Usage]
Reader = Callable[[bytes], "list[Located] | None"]


@pytest.fixture
def read() -> Reader:
    """The native reader (what read_usages uses when the extension is built)."""
    assert quota_decode._NATIVE is not None, "gpumeter_native is not built: `make install` builds it"
    return read_usages


def reference(record: bytes) -> list[Located]:
    return [(line.source_partition, line.source_offset, line.usage()) for line in decode_rated(record)]


def texts(located: list[Located]) -> list[str]:
    return [repr(entry) for entry in located]  # Decimals and datetimes by their repr: exponent, tz


def rated_records() -> list[bytes]:
    stage = RatingStage(card_set(), "samples")
    samples = random_samples(seed=11, count=400)
    records = []
    for first in range(0, len(samples), 25):
        outcomes = [stage.process(jsonio.dumpb(s), 3, first) for s in samples[first:first + 25]]
        records.append(join([encode_rated(o.rated) for o in outcomes if o.rated is not None]))
    return records


RECORDS = rated_records()


def test_the_rating_agents_records_are_read_fast_and_alike(read: Reader) -> None:
    lines = 0
    for record in RECORDS:
        fast = read(record)
        assert fast is not None
        expected = reference(record)
        assert fast == expected
        assert texts(fast) == texts(expected)
        lines += len(fast)
    assert lines > 300  # most of the 400 samples rated (October and November cards)


def test_the_fast_path_carries_each_lines_gpu_model(read: Reader) -> None:
    """Per-model limits count by the line's gpu_model: the fast path gives each line's own
    (None for a line without one), as the JSON of the line says it."""
    written: list[str | None] = []
    taken: list[str | None] = []
    for record in RECORDS:
        written += [orjson.loads(line).get("gpu_model") for line in record.split(b"\n")]
        taken += [usage.gpu_model for _partition, _offset, usage in read(record) or []]
    assert taken == written
    assert {"A100-SXM-40GB", "H100-SXM-80GB", None} <= set(taken)


def test_the_fast_paths_usages_pass_the_checked_constructor(read: Reader) -> None:
    """read_usages builds with Usage.trusted (no __post_init__): every usage it builds, and
    every usage of a varied line it takes, is one the checked constructor accepts as equal."""
    taken = [read(record) for record in RECORDS]
    taken += [read(varied(name, value)) for name, value in VARIATIONS]
    checked = 0
    for located in taken:
        for _partition, _offset, usage in located or []:
            assert Usage(*dataclasses.astuple(usage)) == usage
            checked += 1
    assert checked > 300


LINE: dict[str, Any] = orjson.loads(RECORDS[0].split(b"\n")[0])

# Each variation replaces (or with None-as-missing, removes) one field of a real line.
MISSING = object()
VARIATIONS: list[tuple[str, Any]] = [
    ("event_id", ""), ("event_id", 7), ("event_id", MISSING),
    ("kind", "gpu "), ("kind", "GPU"), ("kind", ["gpu"]), ("kind", MISSING),
    ("tenant", "Team-A"), ("tenant", "team-a\n"), ("tenant", "-team"), ("tenant", "a" * 64), ("tenant", 3),
    ("namespace", None), ("pod", 1), ("pod_uid", MISSING),
    ("window_start", "2026-10-30T02:00:00+02:00"), ("window_start", "2026-10-30T00:00:00"),
    ("window_start", "2026-10-30 00:00:00Z"), ("window_start", "2026-10-30T00:00:00.123456789Z"),
    ("window_start", 1793318400), ("window_start", "2026-10-30T00:01:00Z"),
    ("window_end", "2026-10-29T23:00:00Z"),
    ("quantity", "1.000000000000"), ("quantity", " 1"), ("quantity", "1_0"), ("quantity", "+1"),
    ("quantity", "1e2"), ("quantity", "\u0663"), ("quantity", "NaN"), ("quantity", "Infinity"),
    ("quantity", "-0"),
    ("quantity", "-1"), ("quantity", 1), ("quantity", 1.5), ("quantity", "0x10"), ("quantity", ".5"),
    ("unit_seconds", "0E-18"), ("unit_seconds", MISSING), ("list_cost", "0E-18"), ("list_cost", "-0.1"),
    ("capacity_type", "spot"), ("capacity_type", "Spot"), ("capacity_type", MISSING), ("capacity_type", None),
    ("priority", -2147483648), ("priority", 1.0), ("priority", True), ("priority", "5"), ("priority", 2**70),
    ("priority", MISSING), ("source_partition", MISSING), ("source_offset", -7), ("source_offset", 2.5),
    ("gpu_model", "H100-SXM-80GB"), ("gpu_model", None), ("gpu_model", MISSING), ("gpu_model", ""),
    ("gpu_model", "H100\u00e9"), ("gpu_model", 'H100"SXM'), ("gpu_model", 100), ("gpu_model", ["H100"]),
    ("extra_field", {"nested": [1, 2]}),
]


def varied(name: str, value: Any) -> bytes:
    document = dict(LINE)
    if value is MISSING:
        document.pop(name, None)
    else:
        document[name] = value
    return json.dumps(document, separators=(",", ":")).encode()  # json: big ints too


def assert_read_alike_or_left(read: Reader, record: bytes) -> None:
    """The fast path reads ``record`` exactly as RatedLine does, or leaves it to RatedLine (None);
    a record RatedLine refuses is never read by the fast path."""
    fast = read(record)
    try:
        expected = reference(record)
    except BadRatedRecord:
        assert fast is None
        return
    assert fast is None or (fast == expected and texts(fast) == texts(expected))


@pytest.mark.parametrize(("name", "value"), VARIATIONS, ids=[f"{n}={v!r}"[:40] for n, v in VARIATIONS])
def test_a_varied_line_is_read_alike_or_left_to_rated_line(read: Reader, name: str, value: Any) -> None:
    assert_read_alike_or_left(read, join([RECORDS[0].split(b"\n")[1], varied(name, value)]))


@pytest.mark.parametrize(
    "line",
    [b"not json", b"[1, 2]", b'{"event_id": "e1"', b"null", b'"text"',
     # duplicate keys: whichever copy a parser keeps, the fast path must keep the same one
     varied("tenant", "team-a")[:-1] + b',"tenant":"team-b"}'],
    ids=["not-json", "array", "truncated", "null", "string", "duplicate-key"],
)
def test_lines_that_are_no_rated_object(read: Reader, line: bytes) -> None:
    assert_read_alike_or_left(read, join([RECORDS[0].split(b"\n")[0], line]))


def test_the_canonical_variations_are_taken_by_the_fast_path(read: Reader) -> None:
    """Values the rating agent writes in other forms (a zero cost, other capacity types)."""
    for name, value in [("list_cost", "0E-18"), ("capacity_type", "spot"), ("capacity_type", MISSING),
                        ("quantity", "1.000000000000"), ("priority", -2147483648),
                        ("gpu_model", "H100-SXM-80GB"), ("gpu_model", None), ("gpu_model", MISSING)]:
        assert read(varied(name, value)) is not None, name


def test_remembered_texts_give_the_answers_read_afresh(read: Reader, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timestamps and decimal texts are remembered once read (by the native reader's caches,
    and by ``_moment`` and ``_number`` behind them): with the Python caches cold, warm, and
    overflowing (a limit of 2 clears them constantly) the fast path answers alike."""
    monkeypatch.setattr(quota_decode, "_CACHE_LIMIT", 2)
    for name in ("_numbers", "_moments"):
        monkeypatch.setattr(quota_decode, name, {})
    for _round in ("cold", "warm"):
        answered = 0
        for record in RECORDS[:6] + [varied(name, value) for name, value in VARIATIONS]:
            fast = read(record)
            try:
                expected = reference(record)
            except BadRatedRecord:
                assert fast is None
                continue
            if fast is not None:
                assert fast == expected and texts(fast) == texts(expected)
                answered += 1
        assert answered > 10
        assert len(quota_decode._numbers) <= 2 and len(quota_decode._moments) <= 2


def test_without_the_extension_every_record_is_left_to_rated_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """No second reader stands in for the native one: RatedLine, the definition, reads them all."""
    monkeypatch.setattr(quota_decode, "_NATIVE", None)
    assert all(read_usages(record) is None for record in RECORDS)
