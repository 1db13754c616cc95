"""Shared fixtures: one real Kafka broker and one ClickHouse server per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from gpumeter.infra import kafka
from tests.services import (
    Endpoints,
    Namespaces,
    isolated_settings,
    prepared,
    session_endpoints,
    start_local_broker,
)

pytest_plugins = ["tests.kube.fixtures"]


@pytest.fixture(scope="session")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    with session_endpoints(tmp_path_factory.mktemp("services")) as found:
        yield found


@pytest.fixture(autouse=True)
def _single_node_only(request: pytest.FixtureRequest) -> None:
    """Tests of the one-node migrations (an older version's tables, replayed steps) do not apply
    to a cluster, where a fresh database gets the current schema (gpumeter/infra/migrations.py)."""
    if request.node.get_closest_marker("single_node") is None:
        return
    topology = request.getfixturevalue("endpoints").topology
    if topology.cluster is not None:
        pytest.skip(f"one-node migrations; the tests' ClickHouse is {topology.name} on {topology.cluster}")


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    registry = Namespaces()
    yield registry
    registry.remove()


@pytest.fixture
def settings(endpoints: Endpoints, tmp_path: Path, namespaces: Namespaces) -> Settings:
    """Isolated topics (prefix) and database on the session's services, schema migrated; both
    removed after the test (``namespaces``)."""
    configured = isolated_settings(endpoints, tmp_path / "data")
    namespaces.add(configured)
    return prepared(configured)


@pytest.fixture
def worker_factory(tmp_path: Path, namespaces: Namespaces) -> Iterator[object]:
    started: list[WorkerProcess] = []

    def start(settings: Settings, name: str = "worker") -> WorkerProcess:
        worker = WorkerProcess(settings, tmp_path / f"{name}-{len(started)}.log").start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


class StoppableBroker:
    """A dedicated local broker a test may stop and restart; its data survives the restart."""

    def __init__(self, home: Path) -> None:
        self._broker = start_local_broker(home)

    @property
    def bootstrap(self) -> str:
        return self._broker.bootstrap

    def stop(self) -> None:
        self._broker.stop()

    def start(self) -> None:
        self._broker.start()
        kafka.wait_for_broker(self.bootstrap, timeout=90)


@pytest.fixture
def kafka_service(tmp_path: Path) -> Iterator[StoppableBroker]:
    broker = StoppableBroker(tmp_path / "own-kafka")
    yield broker
    broker.stop()
