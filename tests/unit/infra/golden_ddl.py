"""The rendered DDL of every topology, as kept in tests/unit/infra/golden/<topology>.sql.

Regenerate after a deliberate schema change, then read the diff before committing it:
    PYTHONPATH=. python -m tests.unit.infra.golden_ddl
"""

from __future__ import annotations

from pathlib import Path

from gpumeter.app.schema import OWNERS
from gpumeter.infra.migrations import SCHEMA_LOCK, SCHEMA_MIGRATIONS
from gpumeter.infra.tables import SINGLE_NODE, Topology

GOLDEN = Path(__file__).parent / "golden"
CLUSTER = "gpumeter_cluster"
TOPOLOGIES = {
    topology.name: topology
    for topology in (SINGLE_NODE, Topology(CLUSTER, replicated=True), Topology(CLUSTER, sharded=True),
                     Topology(CLUSTER, replicated=True, sharded=True))
}


def statements(topology: Topology) -> list[str]:
    """What `gpumeter migrate` runs on a fresh database of this topology, in order."""
    rendered = [*SCHEMA_MIGRATIONS.create_statements(topology), *SCHEMA_LOCK.create_statements(topology)]
    for owner in OWNERS:
        rendered.extend(owner.create_statements(topology))
    return rendered


def text(topology: Topology) -> str:
    return "".join(statement.strip() + ";\n\n" for statement in statements(topology))


def main() -> None:
    for name, topology in TOPOLOGIES.items():
        (GOLDEN / f"{name}.sql").write_text(text(topology))
        print(f"wrote {GOLDEN / name}.sql")


if __name__ == "__main__":
    main()
