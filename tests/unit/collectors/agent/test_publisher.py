"""Publisher logic against an in-memory producer double (the real-broker test is
tests/integration/test_agent_spool_kafka.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from collectors.agent.publisher import Publisher, decode_message
from collectors.agent.samples import event_id
from collectors.agent.spool import Spool
from gpumeter.core import jsonio
from gpumeter.core.models import NodeTopology, UsageSample, parse_sample
from gpumeter.core.records import split
from gpumeter.core.settings import KafkaSettings
from testkit.builders import OMIT, usage_sample
from tests.unit.collectors.agent.fake_kafka import Broker

pytestmark = pytest.mark.agent

START = datetime(2026, 11, 3, 10, 15, tzinfo=UTC)
END = datetime(2026, 11, 3, 10, 15, 15, tzinfo=UTC)


def sample(n: int, tenant: str = "team-a") -> UsageSample:
    """One agent window of 1.5 cpu for pod ``n``, with the agent's own event id."""
    return usage_sample(
        event_id("c", "n", f"uid-{n}", "cpu", "cpu", START), kind="cpu", cluster="c", node="n",
        tenant=tenant, namespace=tenant, pod=f"p{n}", pod_uid=f"uid-{n}", start=START, end=END,
        quantity="1.5", capacity_type=OMIT,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def broker() -> Broker:
    return Broker()


def make(broker: Broker, tmp_path: Path, clock: Clock | None = None) -> Publisher:
    return Publisher(
        KafkaSettings(topic_prefix="t."),
        Spool(tmp_path / "spool"),
        producer_factory=broker.factory,
        send_timeout=0.1,
        retry_seconds=5.0,
        clock=clock or Clock(),
    )


def test_samples_go_to_the_samples_topic_keyed_by_tenant(broker: Broker, tmp_path: Path) -> None:
    publisher = make(broker, tmp_path)
    result = publisher.publish([sample(1), sample(2, tenant="team-b")])
    assert result.sent == 2 and result.spooled == 0
    assert [(t, k) for t, k, _ in broker.log] == [
        ("t.gpumeter.usage.samples.v1", b"team-a"),
        ("t.gpumeter.usage.samples.v1", b"team-b"),
    ]
    assert parse_sample(broker.log[0][2]) == sample(1)


def test_outage_spools_then_replays_oldest_first(broker: Broker, tmp_path: Path) -> None:
    clock = Clock()
    publisher = make(broker, tmp_path, clock)
    publisher.publish([sample(0)])
    broker.up = False
    result = publisher.publish([sample(1), sample(2)])
    assert result.sent == 0 and result.spooled == 2 and not publisher.kafka_up
    # while down (and before the retry time) new samples go straight behind the backlog
    broker.up = True
    result = publisher.publish([sample(3)])
    assert result.spooled == 1 and publisher.spool.records == 3
    clock.now += 10
    result = publisher.publish([sample(4)])
    assert result.replayed == 3 and result.sent == 1
    assert broker.sample_ids() == [sample(n).event_id for n in range(5)]
    assert publisher.spool.records == 0 and publisher.kafka_up


def test_unreachable_at_start_spools_and_retries_later(broker: Broker, tmp_path: Path) -> None:
    clock = Clock()
    broker.reachable = False
    publisher = make(broker, tmp_path, clock)
    assert publisher.publish([sample(1)]).spooled == 1
    broker.reachable = True
    assert publisher.publish([sample(2)]).spooled == 1  # retry not due yet
    clock.now += 6
    result = publisher.publish([sample(3)])
    assert result.replayed == 2 and result.sent == 1
    assert broker.sample_ids() == [sample(n).event_id for n in (1, 2, 3)]


def test_blocked_send_spools_the_rest(broker: Broker, tmp_path: Path) -> None:
    publisher = make(broker, tmp_path)
    broker.block_sends = True
    result = publisher.publish([sample(1), sample(2)])
    assert result.spooled == 2
    values = [decode_message(p) for p in publisher.spool.iter_records()]
    assert [parse_sample(v).event_id for _, v in values] == [sample(1).event_id, sample(2).event_id]


def test_spool_survives_an_agent_restart(broker: Broker, tmp_path: Path) -> None:
    broker.up = False
    first = make(broker, tmp_path)
    first.publish([sample(1), sample(2)])
    first.close(timeout=0.1)
    broker.up = True
    second = make(broker, tmp_path)
    assert second.spool.records == 2
    second.publish([])
    assert broker.sample_ids() == [sample(1).event_id, sample(2).event_id]


def test_topology_is_retried_until_acknowledged(broker: Broker, tmp_path: Path) -> None:
    clock = Clock()
    publisher = make(broker, tmp_path, clock)
    topology = NodeTopology(cluster="c", node="gpu-node-1", gpus=[], links={}, at=START)
    broker.up = False
    assert not publisher.publish_topology(topology)
    broker.up = True
    clock.now += 10
    publisher.publish([])
    topics = [(t, k) for t, k, _ in broker.log]
    assert topics == [("t.gpumeter.node.topology.v1", b"gpu-node-1")]
    assert jsonio.loads(broker.log[0][2])["node"] == "gpu-node-1"


def test_samples_go_out_as_one_record_per_tenant(tmp_path: Path) -> None:
    broker = Broker()
    publisher = make(broker, tmp_path, Clock())
    batch = [sample(n, tenant="team-a" if n % 2 else "team-b") for n in range(10)]
    assert publisher.publish(batch).sent == 10
    sent = [(key, value) for topic, key, value in broker.log if topic.endswith("samples.v1")]
    assert sorted(key for key, _ in sent) == [b"team-a", b"team-b"]
    for key, value in sent:
        assert [parse_sample(line).tenant for line in split(value)] == [key.decode()] * 5


def keys_of(publisher: Publisher) -> list[bytes]:
    return [decode_message(payload)[0] for payload in publisher.spool.iter_records()]


def test_one_unwritable_partition_holds_back_only_its_tenant(broker: Broker, tmp_path: Path) -> None:
    """A partition without a leader spools its own tenant's samples; the others keep flowing."""
    clock = Clock()
    publisher = make(broker, tmp_path, clock)
    broker.down_keys = {b"team-b"}
    first = publisher.publish([sample(1), sample(2, tenant="team-b")])
    assert (first.sent, first.spooled, first.dropped) == (1, 1, 0)
    assert publisher.kafka_up  # the cluster answers; one partition does not
    # the next window: team-a goes straight out, team-b queues behind its spooled sample
    second = publisher.publish([sample(3), sample(4, tenant="team-b")])
    assert (second.sent, second.spooled) == (1, 1)
    assert keys_of(publisher) == [b"team-b", b"team-b"]
    assert broker.sample_ids() == [sample(1).event_id, sample(3).event_id]
    broker.down_keys = set()
    clock.now += 10
    third = publisher.publish([sample(5, tenant="team-b")])
    assert third.replayed == 2 and third.sent == 1 and publisher.spool.records == 0
    team_b = [parse_sample(line).event_id for key, value in broker.on("samples.v1") if key == b"team-b"
              for line in split(value)]
    assert team_b == [sample(n, tenant="team-b").event_id for n in (2, 4, 5)]  # its own order kept


def test_replay_sends_the_writable_partitions_and_keeps_the_others_in_order(
    broker: Broker, tmp_path: Path,
) -> None:
    clock = Clock()
    publisher = make(broker, tmp_path, clock)
    broker.up = False
    publisher.publish([sample(1), sample(2, tenant="team-b")])
    publisher.publish([sample(3), sample(4, tenant="team-b")])
    assert publisher.spool.records == 4
    broker.up, broker.down_keys = True, {b"team-b"}
    clock.now += 10
    result = publisher.publish([sample(5)])
    assert result.replayed == 2 and result.sent == 1
    assert broker.sample_ids() == [sample(n).event_id for n in (1, 3, 5)]
    assert keys_of(publisher) == [b"team-b", b"team-b"]
    broker.down_keys = set()
    clock.now += 10
    publisher.publish([])
    assert publisher.spool.records == 0
    assert broker.sample_ids()[3:] == [sample(n, tenant="team-b").event_id for n in (2, 4)]


def test_a_restarted_agent_still_holds_back_the_tenants_its_spool_holds(
    broker: Broker, tmp_path: Path,
) -> None:
    broker.down_keys = {b"team-b"}
    first = make(broker, tmp_path)
    first.publish([sample(1, tenant="team-b")])
    first.close(timeout=0.1)
    second = make(broker, tmp_path)
    result = second.publish([sample(2), sample(3, tenant="team-b")])
    assert (result.sent, result.spooled) == (1, 1)
    assert [parse_sample(decode_message(p)[1]).event_id for p in second.spool.iter_records()] == [
        sample(1, tenant="team-b").event_id, sample(3, tenant="team-b").event_id]
