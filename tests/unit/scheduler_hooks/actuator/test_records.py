"""RecordSink's replay-guard reads, with a stand-in for clickhouse-connect (pure unit test of
our own connection handling; the reads themselves run on real ClickHouse in tests/kube)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from gpumeter.core.settings import Settings
from scheduler_hooks.actuator import records


class FakeClient:
    """What _Connection holds: closed once when the sink closes."""

    def close(self) -> None:
        pass


def test_reads_for_different_tenants_run_at_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two reads that can only finish together (each waits for the other inside ClickHouse, as
    two slow queries overlap in time): on a single shared connection the second would wait
    for the first, which never finishes alone."""
    both_inside = threading.Barrier(2, timeout=20)
    tenants_seen: list[str] = []

    def select_ids(client: Any, tenant: str, cause: str) -> set[str]:
        tenants_seen.append(tenant)
        both_inside.wait()
        return {f"{tenant}/{cause}"}

    monkeypatch.setattr(records.clickhouse, "connect", lambda dsn: FakeClient())
    monkeypatch.setattr(records, "_select_ids", select_ids)

    async def run() -> list[set[str] | None]:
        sink = records.RecordSink(Settings())
        try:
            # Bounded so that reads which cannot overlap fail the test instead of retrying for ever.
            both = asyncio.gather(sink.recorded("team-a", "e1"), sink.recorded("team-b", "e2"))
            return list(await asyncio.wait_for(both, 60))
        finally:
            await sink.close()

    assert asyncio.run(run()) == [{"team-a/e1"}, {"team-b/e2"}]
    assert sorted(tenants_seen) == ["team-a", "team-b"]
