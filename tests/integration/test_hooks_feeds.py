"""The extender's Kafka feed against a real broker: quota events, topology and allocation.

Records are published as the worker and the agent publish them (JSON values, tenant or node
keys, tombstones on the compacted topics); the feed runs in the production server harness
(testkit.live_hooks), and the state is read back on its loop thread.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpumeter.core import topics
from gpumeter.core.models import GpuAssignment, GpuDevice, NodeAllocation, NodeTopology, QuotaEvent
from gpumeter.core.settings import KafkaSettings
from gpumeter.core.tenants import TenantPolicy, TenantsFile
from gpumeter.infra import kafka as gkafka
from quota.periods import period_key, period_start
from scheduler_hooks.cluster.feeds import KafkaFeed
from testkit.live_hooks import LiveHooks
from tests.services import Endpoints, delete_topics
from tests.support import polling

pytestmark = pytest.mark.integration

AT = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
TENANTS = TenantsFile(tenants=[
    TenantPolicy(tenant="team-a", gpu_hours=100, spend="50.00", on_exceed="block"),
    TenantPolicy(tenant="team-b", gpu_hours=100, on_exceed="preempt"),
    TenantPolicy(tenant="team-n", gpu_hours=100, on_exceed="notify"),
])


eventually = functools.partial(polling.eventually, interval=0.1)


# Quota events the hooks trust (contract 4, amendment "trust"): the policy's limit, this month.
THIS_MONTH = period_key(datetime.now(UTC), "month")
LAST_MONTH = period_key(period_start(THIS_MONTH) - timedelta(days=1), "month")


def event(tenant: str, metric: str, level: str, period: str = THIS_MONTH, n: int = 0) -> QuotaEvent:
    policy = TENANTS.policy(tenant)
    limit = getattr(policy, metric) if policy is not None else None
    return QuotaEvent(event_id=f"{tenant}|{metric}|{period}|{level}|{n}", tenant=tenant, metric=metric,
                      level=level, threshold="1" if level != "warning" else "0.8", used="1",
                      limit=str(limit if limit is not None else 1), period=period, at=AT)


def topology(node: str) -> NodeTopology:
    gpus = [GpuDevice(index=i, uuid=f"GPU-{node}-{i}", model="H100-SXM-80GB") for i in range(8)]
    links = {f"{a}-{b}": "NV18" for a in range(8) for b in range(a + 1, 8)}
    return NodeTopology(cluster="c", node=node, gpus=gpus, links=links, at=AT)


def allocation(node: str, *indices: int) -> NodeAllocation:
    held = GpuAssignment(namespace="ns", pod="p", pod_uid=f"uid-{node}", gpu_indices=list(indices))
    return NodeAllocation(cluster="c", node=node, assignments=[held], at=AT)


@pytest.fixture
def kafka_settings(endpoints: Endpoints) -> Iterator[KafkaSettings]:
    settings = KafkaSettings(bootstrap=endpoints.kafka_bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}.")
    gkafka.ensure_topics(settings)
    yield settings
    delete_topics(settings)


class Publisher:
    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.producer = gkafka.make_producer(settings)

    def send(self, base: str, key: str, value: Any) -> None:
        payload = value if value is None or isinstance(value, bytes) else value.model_dump_json().encode()
        self.producer.send(self.settings.topic(base), key=key.encode(), value=payload)

    def flush(self) -> None:
        self.producer.flush(30)


@pytest.fixture
def publisher(kafka_settings: KafkaSettings) -> Iterator[Publisher]:
    publisher = Publisher(kafka_settings)
    yield publisher
    publisher.producer.close(5)


def test_state_is_the_fold_of_the_topics_and_ready_once_read_to_their_end(
    kafka_settings: KafkaSettings, publisher: Publisher,
) -> None:
    quota = topics.QUOTA_EVENTS
    # team-a: gpu_hours exceeded then recovered, spend exceeded: blocked on spend.
    publisher.send(quota, "team-a", event("team-a", "gpu_hours", "exceeded"))
    publisher.send(quota, "team-a", event("team-a", "gpu_hours", "recovered"))
    publisher.send(quota, "team-a", event("team-a", "spend", "exceeded"))
    # team-b: exceeded in October, recovered by the new period; a replay republishes the old
    # exceeded (same event_id): it must not block again.
    publisher.send(quota, "team-b", event("team-b", "gpu_hours", "exceeded", LAST_MONTH))
    publisher.send(quota, "team-b", event("team-b", "gpu_hours", "recovered", LAST_MONTH))
    publisher.send(quota, "team-b", event("team-b", "gpu_hours", "exceeded", LAST_MONTH))
    publisher.send(quota, "team-b", event("team-b", "gpu_hours", "warning", THIS_MONTH))
    # team-n is over, but only notified.
    publisher.send(quota, "team-n", event("team-n", "gpu_hours", "exceeded"))
    publisher.send(quota, "team-z", b"{not json")  # rejected, counted, skipped
    publisher.send(topics.TOPOLOGY, "n1", topology("n1"))
    publisher.send(topics.TOPOLOGY, "n2", topology("n2"))
    publisher.send(topics.TOPOLOGY, "n2", None)  # n2 gone: tombstone
    publisher.send(topics.ALLOCATION, "n1", allocation("n1", 0, 1))
    publisher.send(topics.ALLOCATION, "n1", allocation("n1", 0, 1, 2, 3, 4))  # the latest wins
    publisher.flush()

    live = LiveHooks(TENANTS).start()
    feed = live.call(lambda: KafkaFeed(kafka_settings, live.state, live.post, poll_ms=200))
    try:
        assert live.request("GET", "/readyz")[0] == 503
        live.add_feeds([feed])
        eventually(lambda: live.request("GET", "/readyz")[0] == 200, "ready")
        state = live.state
        assert live.call(lambda: dict(state.blocked)) == {"team-a": "spend"}
        assert live.call(lambda: (state.placement.free("n1"), "n2" in state.placement)) == (3, False)
        assert feed.rejected == 1

        # Live updates after the replay.
        publisher.send(quota, "team-b", event("team-b", "gpu_hours", "exceeded", THIS_MONTH))
        publisher.send(quota, "team-a", event("team-a", "spend", "recovered"))
        publisher.send(topics.ALLOCATION, "n1", None)
        publisher.flush()
        blocked = {"team-b": "gpu_hours"}
        eventually(lambda: live.call(lambda: dict(state.blocked)) == blocked, "team-b blocked")
        eventually(lambda: live.call(lambda: state.placement.free("n1")) == 8, "n1 allocation forgotten")
    finally:
        live.stop()
