"""Multi-sample Kafka records (gpumeter/core/records.py): split, join, batching, grouping."""

from __future__ import annotations

import json

from gpumeter.core import jsonio
from gpumeter.core.records import RecordBatcher, split, tenant_records
from testkit import builders


def sample(event_id: str, tenant: str = "team-a", quantity: str = "1") -> bytes:
    """One minute of cpu as a sample line."""
    document = builders.sample(
        event_id, kind="cpu", tenant=tenant, namespace=tenant, start="2026-11-03T00:00:00Z", seconds=60,
        quantity=quantity,
    )
    return json.dumps(document).encode()


def test_a_single_object_record_is_one_line() -> None:
    assert split(sample("a")) == [sample("a")]
    assert split(b"\n" + sample("a") + b"\n\n") == [sample("a")]


def test_batches_keep_order_per_key_and_respect_the_count_bound() -> None:
    batcher = RecordBatcher(max_samples=3)
    payloads = [(b"team-a" if i % 2 else b"team-b", sample(f"e{i}")) for i in range(10)]
    records = [ready for key, value in payloads if (ready := batcher.add(key, value))]
    records += list(batcher.drain())
    for key in (b"team-a", b"team-b"):
        lines = [line for k, record, count in records if k == key for line in split(record)]
        assert lines == [value for k, value in payloads if k == key]
    assert all(count == len(split(record)) <= 3 for _, record, count in records)
    assert sum(count for _, _, count in records) == 10
    assert list(batcher.drain()) == []


def test_batches_respect_the_byte_bound() -> None:
    line = sample("x")
    batcher = RecordBatcher(max_samples=1000, max_bytes=3 * (len(line) + 1))
    records = [ready for _ in range(7) if (ready := batcher.add(b"k", line))]
    records += list(batcher.drain())
    assert [count for _, _, count in records] == [3, 3, 1]
    assert all(len(record) <= 3 * (len(line) + 1) for _, record, _ in records)


def test_tenant_records_key_each_sample_document_by_its_tenant_in_order() -> None:
    documents = [json.loads(sample(f"e{i}", tenant="team-a" if i % 2 else "team-b")) for i in range(5)]
    records = list(tenant_records(documents))
    assert [key for key, _ in records] == [b"team-b", b"team-a"]
    for key, record in records:
        expected = [jsonio.dumpb(d) for d in documents if d["tenant"].encode() == key]
        assert split(record) == expected


def test_group_by_key_maps_every_message_to_one_bounded_record_in_order() -> None:
    from gpumeter.core.records import group_by_key

    messages = [(b"a" if i % 3 else b"b", sample(f"e{i}")) for i in range(11)]
    groups = group_by_key(messages, max_samples=3)
    assert sorted(i for _, members in groups for i in members) == list(range(11))
    for key, members in groups:
        assert all(messages[i][0] == key for i in members)
        assert members == sorted(members) and len(members) <= 3
    # Per key, records come in message order: concatenated they give the key's messages.
    for key in (b"a", b"b"):
        ordered = [i for k, members in groups if k == key for i in members]
        assert ordered == [i for i, (k, _) in enumerate(messages) if k == key]


def test_an_oversized_sample_is_rejected_with_its_size() -> None:
    from gpumeter.core.models import MAX_SAMPLE_BYTES, SampleRejected, parse_sample

    document = json.loads(sample("big"))
    document["labels"] = {f"k{i}": "v" * 100 for i in range(MAX_SAMPLE_BYTES // 100)}
    raw = json.dumps(document).encode()
    try:
        parse_sample(raw)
    except SampleRejected as exc:
        assert exc.code == "too_large" and str(len(raw)) in exc.reason
    else:
        raise AssertionError("an oversized sample was accepted")
