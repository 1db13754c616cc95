"""The DDL rendered for a cluster, on chdb's served engine configured as a cluster member.

chdb's LocalServer runs no DDL worker, so ``ON CLUSTER`` is refused there ("Replicated DDL
queries are disabled"): each statement is run as the DDL worker would run it on one node,
with its ON CLUSTER clause taken out, and that is the only change made to it. Replicated*
tables are accepted with a test Keeper and macros; nothing is inserted into them (a replica
that cannot become active makes an insert wait for minutes). A real cluster is a real
clickhouse-server: GPUMETER_TEST_CLICKHOUSE_DSN.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from gpumeter.app.runtime.chserver import LocalClickHouse
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, migrations
from gpumeter.infra.tables import Topology
from testkit.clickhouse_cluster import KEEPER, macros, remote_servers
from tests.services import free_port, run_cli
from tests.unit.infra.golden_ddl import CLUSTER, TOPOLOGIES, statements

MACROS = macros(1)


def own_two_shards(tcp_port: int) -> str:
    """Two shards, both this server's own TCP port, each with a database of its own."""
    return remote_servers([tcp_port, tcp_port], ["shard1", "shard2"])


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalClickHouse]]:
    """A cluster member, and two that lack a macro or a Keeper."""
    started: dict[str, LocalClickHouse] = {}
    try:
        configs = {"member": (KEEPER, MACROS), "no-macros": (KEEPER,), "no-keeper": (MACROS,)}
        for name, parts in configs.items():
            tcp = free_port()
            server = LocalClickHouse(Path(tmp_path_factory.mktemp(name)), "127.0.0.1", free_port(), tcp,
                                     config_fragment="".join(parts) + own_two_shards(tcp))
            server.start(timeout=90)
            started[name] = server
        yield started
    finally:
        for server in started.values():
            server.stop()


def connect(server: LocalClickHouse) -> Client:
    return clickhouse.connect(f"{server.url}/c_{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in TOPOLOGIES if name != "plain"])
def test_the_rendered_cluster_ddl_is_accepted_by_a_cluster_member(
    servers: dict[str, LocalClickHouse], name: str
) -> None:
    topology = TOPOLOGIES[name]
    client = connect(servers["member"])
    try:
        migrations.check_topology(client, topology)
        rendered = statements(topology)
        for statement in rendered:
            assert statement.count(topology.on_cluster) == 1
            client.command(statement.replace(topology.on_cluster, "", 1))
        rows = client.query("SELECT name, engine FROM system.tables WHERE database = currentDatabase()"
                            ).result_rows
        engines = {str(name): str(engine) for name, engine in rows}
        assert len(engines) == len(rendered)
        assert engines["invoice_ledger"] == "ReplicatedMergeTree"
        expected = "Distributed" if topology.sharded else "ReplicatedReplacingMergeTree"
        assert engines["rated_usage"] == expected
        if topology.sharded:
            assert engines["rated_usage_local"] == (
                "ReplicatedReplacingMergeTree" if topology.replicated else "ReplacingMergeTree")
    finally:
        client.close()


@pytest.mark.parametrize(("server", "topology", "says"), [
    pytest.param("member", Topology("elsewhere", replicated=True),
                 "clickhouse.cluster 'elsewhere': the server has no such cluster", id="unknown-cluster"),
    pytest.param("no-macros", Topology(CLUSTER, replicated=True),
                 "clickhouse.replicated: the server's config has no {shard} macro", id="missing-macro"),
    pytest.param("no-keeper", Topology(CLUSTER, sharded=True),
                 # chdb refuses ON CLUSTER itself (no DDL worker): the first cluster DDL's failure
                 # is the one line; a real server without Keeper fails the same statement.
                 f"clickhouse.cluster '{CLUSTER}': creating database c_", id="no-keeper"),
])
def test_a_server_that_cannot_hold_the_topology_is_refused_before_anything_is_created(
    servers: dict[str, LocalClickHouse], server: str, topology: Topology, says: str
) -> None:
    client = connect(servers[server])
    try:
        with pytest.raises(migrations.SchemaError) as caught:
            migrations.migrate(client, [], topology)
        assert str(caught.value).startswith(says)
        assert "\n" not in str(caught.value)
        assert client.query("SELECT count() FROM system.tables WHERE database = currentDatabase()"
                            ).result_rows[0][0] == 0
    finally:
        client.close()


def test_migrate_on_a_server_without_the_macros_is_one_line_exit_1_and_creates_nothing(
    servers: dict[str, LocalClickHouse], tmp_path: Path
) -> None:
    """`gpumeter migrate` itself, as an operator runs it against a member lacking <macros>."""
    settings = Settings(data_dir=tmp_path)
    database = f"c_{uuid.uuid4().hex[:8]}"
    settings.clickhouse.dsn = f"{servers['no-macros'].url}/{database}"
    settings.clickhouse.cluster, settings.clickhouse.replicated = CLUSTER, True
    run = run_cli(settings, "migrate")
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert lines == ["gpumeter: error: clickhouse.replicated: the server's config has no {shard} macro "
                     "(<macros>), which the Replicated tables' Keeper paths need"], run.stderr
    client = clickhouse.connect(f"{servers['no-macros'].url}/{database}", create_database=False)
    try:
        assert client.query("SELECT count() FROM system.tables WHERE database = %(db)s",
                            parameters={"db": database}).result_rows[0][0] == 0
    finally:
        client.close()
