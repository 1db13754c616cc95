"""The pipeline end to end over SASL_SSL only, with Kafka ACLs on (issue 28 point 2, issue 31).

A simulated agent publishes a fleet's windows, the worker (a process of its own) rates them into
ClickHouse and accounts quotas, and the quota actuator acts on the real kube-apiserver: each
as its own SCRAM principal, granted gpumeter/core/kafka_acls.py's list for its role and
nothing else, given only the SASL_SSL listeners. The tenant over its gpu_hours quota loses its
pods, as tests/kube/test_actuator.py shows over plaintext; the other tenant keeps its pod. While
the worker and the actuator run, neither holds a connection to a plaintext listener.
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from collectors.sim.config import FleetConfig, TenantSpec
from collectors.sim.fleet import SimulatedFleet
from collectors.sim.runner import FleetPublisher
from gpumeter.app import schema
from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.kafka_acls import Role, role_acls
from gpumeter.infra import clickhouse, kafka
from scheduler_hooks.actuator.kube_gateway import KubeGateway
from scheduler_hooks.actuator.service import Actuator
from scheduler_hooks.actuator.tenants_source import TenantsSource
from scheduler_hooks.cluster.kube_objects import parse_notice
from testkit.secure_kafka import ADMIN, SecureKafka, remote_ports, secure_kafka
from tests.kube.fixtures import CreateGpuNodes
from tests.kube.test_actuator import (
    ActuatorThread,
    Cluster,
    PodWatch,
    cluster,  # noqa: F401  (the fixture, used by name)
    eventually,
    handled_everything,
    stored_records,
    write_tenants,
)
from tests.services import Endpoints, Namespaces, isolated_settings

pytestmark = [pytest.mark.kube, pytest.mark.integration, pytest.mark.security]

ROLES_USED: tuple[Role, ...] = ("agent", "worker", "hooks")
WINDOWS = 3  # of 60 s, 3 GPUs each tenant: 0.05 GPU-hours a window


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    home = tmp_path_factory.mktemp("kafka-secure")
    with secure_kafka(home, ROLES_USED, nodes=1, authorize=True) as started:
        yield started


def gpu_hours(samples: list[dict[str, object]], tenant: str) -> Decimal:
    return sum((Decimal(str(s["quantity"])) * (Decimal(60) / Decimal(3600))
                for s in samples if s["tenant"] == tenant and s["kind"] == "gpu"), Decimal(0))


def test_a_quota_crossing_over_sasl_ssl_with_acls_evicts_the_tenant_over_its_quota(
    secure: SecureKafka,
    endpoints: Endpoints,
    namespaces: Namespaces,
    cluster: Cluster,  # noqa: F811
    gpu_nodes: CreateGpuNodes,
    worker_factory: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    tag = secrets.token_hex(3)
    over, under = f"so-{tag}", f"su-{tag}"
    cluster.forget_queues(over, under)
    prefix = f"e2e{tag}."

    base = isolated_settings(endpoints, tmp_path / "data")
    namespaces.add(base, topics=False)  # the topics live on this module's cluster
    base.tenants = write_tenants(tmp_path / "tenants.yaml", [
        {"tenant": over, "gpu_hours": "0.1", "on_exceed": "preempt", "grace_seconds": 0},
        {"tenant": under, "gpu_hours": "100", "on_exceed": "preempt", "grace_seconds": 0},
    ])
    client = clickhouse.connect(base.clickhouse.dsn)
    try:
        schema.migrate(client)
    finally:
        client.close()
    # The platform's administrator creates the topics and grants each role its list.
    kafka.ensure_topics(secure.settings(ADMIN, topic_prefix=prefix))
    as_role = {role: base.model_copy(update={"kafka": secure.settings(role, topic_prefix=prefix)})
               for role in ROLES_USED}
    granted = role_acls(as_role["worker"])
    for role in ROLES_USED:
        secure.grant(role, granted[role])
    for settings in as_role.values():
        assert settings.kafka.security_protocol == "SASL_SSL"
        assert {int(address.rsplit(":", 1)[1]) for address in settings.kafka.bootstrap.split(",")} \
            == secure.client_ports

    [node] = gpu_nodes(1, gpus_per_node=8)
    ns_over, ns_under = cluster.namespace(over), cluster.namespace(under)
    for namespace, name in [(ns_over, "o-1"), (ns_over, "o-2"), (ns_under, "u-1")]:
        cluster.pod(namespace, name, node=node)
        eventually(functools.partial(cluster.running, namespace, name), f"{name} Running")
    watch = PodWatch(cluster.core, [ns_over, ns_under])
    actuator = ActuatorThread(Actuator(
        as_role["hooks"], dry_run=False, kube=KubeGateway(cluster.hooks_api),
        tenants=TenantsSource(base.tenants), reclaim_seconds=3600.0, queue_sync_seconds=0.5))
    try:
        worker = worker_factory(as_role["worker"], "secure-worker")
        # Windows of the current month: the actuator acts only on crossings of the current
        # period (contract 4, amended: trust).
        this_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        fleet = SimulatedFleet(FleetConfig(
            seed=3, start=this_month, nodes={"H100-SXM-80GB": 1}, mig_gpus_per_node={}, time_sliced_nodes={},
            tenants=[TenantSpec(over, mig_share=0.0), TenantSpec(under, mig_share=0.0)],
            capacity_mix={"on-demand": 1.0}, spot_reclaims_per_day=0, agent_outages_per_day=0, diurnal=False))
        publisher = FleetPublisher(as_role["agent"], fleet)
        published: list[dict[str, object]] = []
        try:
            for _ in range(WINDOWS):
                published += publisher.publish_window()
        finally:
            publisher.close()
        # What the crossing rests on, from what was published (not from the pipeline).
        assert gpu_hours(published, over) > Decimal("0.1")
        assert Decimal(0) < gpu_hours(published, under) < Decimal(100)

        for name in ("o-1", "o-2"):
            eventually(functools.partial(cluster.gone, ns_over, name),
                       f"{name} evicted; worker: {worker.log_tail()}", timeout=240)
        assert worker.alive(), worker.log_tail()
        # Both still connected (the worker's consumer, the actuator's): to the SASL_SSL
        # listeners, to no plaintext one.
        assert worker.process is not None
        for pid in (worker.process.pid, os.getpid()):
            ports = remote_ports(pid)
            assert ports & secure.client_ports, f"process {pid} holds no connection to the cluster"
            assert not ports & secure.plaintext_ports, f"process {pid} connected to a plaintext listener"
        eventually(lambda: handled_everything(as_role["hooks"]), "quota events handled")
        assert watch.noticed(ns_under, "u-1") == [] and cluster.alive(ns_under, "u-1")
        for name in ("o-1", "o-2"):
            [text] = watch.noticed(ns_over, name)
            notice = parse_notice(text)
            assert notice is not None and notice.metric == "gpu_hours"
            assert notice.reason.startswith(f"gpumeter: tenant {over} over gpu_hours quota")
    finally:
        watch.close()
        actuator.stop()
    assert {(pod, action) for _id, pod, action, _cause, _n in stored_records(base)} == {
        ("o-1", "noticed"), ("o-1", "evicted"), ("o-2", "noticed"), ("o-2", "evicted"),
        (f"gpumeter-{over}", "queue_closed"),
    }
