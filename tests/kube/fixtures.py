"""Pytest plugin: a real Kubernetes control plane for the test suite.

The control plane itself (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK) is started by testkit/kube_cluster.py, which benchmarks use
too; these are the fixtures over it.

Fixtures
--------
``kube`` (session)
    etcd + kube-apiserver + kube-controller-manager (only the controllers tests
    need: serviceaccount, namespace, garbage collector, disruption, node
    lifecycle) with the Volcano Queue/PodGroup CRDs installed. Yields :class:`Kube`.
``kwok`` (session)
    The KWOK controller, managing nodes annotated ``kwok.x-k8s.io/node=fake``.
``kube_scheduler`` (function)
    Factory starting kube-scheduler with a KubeSchedulerConfiguration.
``gpu_nodes`` (function)
    Factory creating KWOK-managed GPU nodes; deleted at teardown.
``kube_namespace`` (function)
    A fresh namespace whose ``default`` ServiceAccount exists (pods are
    admitted); deleted at teardown.

Binaries come from ``$GPUMETER_KUBE_BIN`` or the build.sh cache; when they are
missing the fixtures fail (never skip) and say to run ``make testbin``.
"""


from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from testkit.kube_cluster import (
    Kube,
    Kwok,
    Scheduler,
    gpu_node_manifest,
    node_schedulable,
    require_binaries,
    start_kube,
    start_kwok,
    start_scheduler,
    wait_for_default_service_account,
    wait_until,
)


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so the marker exists wherever this plugin is loaded.
    config.addinivalue_line("markers", "kube: needs the real Kubernetes control plane (make testbin)")


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """etcd + kube-apiserver + kube-controller-manager, Volcano CRDs installed."""
    cluster = start_kube(tmp_path_factory.mktemp("kube"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kwok(kube: Kube) -> Iterator[Kwok]:
    """The KWOK controller: makes annotated nodes Ready and bound pods Running."""
    started = start_kwok(kube)
    try:
        yield started
    finally:
        started.process.stop()


StartScheduler = Callable[..., Scheduler]


@pytest.fixture
def kube_scheduler(kube: Kube, tmp_path: Path) -> Iterator[StartScheduler]:
    """Factory: ``kube_scheduler(config=None)`` starts kube-scheduler, stopped at teardown."""
    binary = require_binaries("kube-scheduler")["kube-scheduler"]
    started: list[Scheduler] = []

    def start(config: str | Mapping[str, Any] | None = None) -> Scheduler:
        scheduler = start_scheduler(binary, kube, tmp_path, len(started), config)
        started.append(scheduler)
        return scheduler

    try:
        yield start
    finally:
        for scheduler in reversed(started):
            scheduler.stop()


CreateGpuNodes = Callable[..., list[str]]


@pytest.fixture
def gpu_nodes(kube: Kube, kwok: Kwok) -> Iterator[CreateGpuNodes]:
    """Factory: ``gpu_nodes(n, gpus_per_node=8, ...)`` -> names of Ready, schedulable
    nodes; deleted at teardown.

    No taint by default (the test cluster has no real nodes for workloads to
    avoid); pass ``taints=[{"key": "kwok.x-k8s.io/node", "value": "fake",
    "effect": "NoSchedule"}]`` for KWOK's usual fencing.
    """
    created: list[str] = []
    with kube.api_client() as api:
        core = k8s.CoreV1Api(api)

        def create(
            n: int,
            gpus_per_node: int = 8,
            gpu_model: str = "H100-SXM-80GB",
            capacity_type: str = "on-demand",
            topology: Sequence[Sequence[int]] | None = None,
            *,
            cpu: str | None = None,
            memory: str | None = None,
            pods: int = 110,
            labels: Mapping[str, str] | None = None,
            taints: Sequence[Mapping[str, str]] = (),
            name_prefix: str = "gpu-node",
        ) -> list[str]:
            batch = secrets.token_hex(3)
            names = [f"{name_prefix}-{batch}-{i}" for i in range(n)]
            for name in names:
                manifest = gpu_node_manifest(
                    name,
                    gpus=gpus_per_node,
                    gpu_model=gpu_model,
                    capacity_type=capacity_type,
                    topology=topology,
                    # Roughly an HGX box per 8 GPUs, scaled: 12 cores / 128Gi per GPU.
                    cpu=cpu or str(max(8, 12 * gpus_per_node)),
                    memory=memory or f"{max(64, 128 * gpus_per_node)}Gi",
                    pods=pods,
                    labels=labels or {},
                    taints=taints,
                )
                core.create_node(body=k8s.V1Node.model_validate(manifest))
                created.append(name)
            for name in names:
                wait_until(
                    functools.partial(node_schedulable, core, name),
                    what=f"node {name} Ready and untainted",
                    processes=[kwok.process],
                )
            return names

        try:
            yield create
        finally:
            for name in created:
                try:
                    core.delete_node(name)
                except k8s.ApiException as exc:
                    if exc.status != 404:
                        raise


# --------------------------------------------------------------------------
# namespaces


@pytest.fixture
def kube_namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists)."""
    name = f"t-{secrets.token_hex(4)}"
    with kube.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace(body=k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        try:
            # ServiceAccount admission rejects pods until the controller made "default".
            wait_for_default_service_account(api, name, kube.processes)
            yield name
        finally:
            core.delete_namespace(name)

