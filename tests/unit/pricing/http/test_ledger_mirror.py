"""The API's ledger index (pricing/http/ledger_mirror.py) and rendered-bytes cache (rendered.py)
over a fake ClickHouse client (a pure unit test: the real ledger is exercised by
tests/integration/test_invoice_api_sources.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from pricing.http.ledger_mirror import LedgerMirror
from pricing.http.rendered import Rendered, RenderedCache


class FakeLedgerClient:
    """Answers the index query (rows after a position) from a list of visible rows."""

    def __init__(self) -> None:
        self.visible: list[tuple[int, str, str, str]] = []
        self.queries: list[dict[str, Any]] = []
        self.fail = False

    def query(self, sql: str, parameters: dict[str, Any]) -> Any:
        if self.fail:
            raise ConnectionError("ClickHouse is away")
        self.queries.append(parameters)
        rows = sorted(r for r in self.visible if r[0] > parameters["after"])

        class Result:
            result_rows = rows

        return Result()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def mirror() -> tuple[LedgerMirror, FakeLedgerClient, Clock]:
    client, clock = FakeLedgerClient(), Clock()
    return LedgerMirror(client, max_age=1.0, clock=clock), client, clock  # type: ignore[arg-type]


def test_the_index_is_read_at_most_once_per_max_age_and_only_past_its_last_position() -> None:
    index, client, clock = mirror()
    client.visible = [(1, "team-a", "2026-11", "{}"), (2, "team-b", "2026-11", "{}")]
    index.refresh()
    assert index.positions("team-a", "2026-11") == (1,) and not index.due()
    client.visible.append((3, "team-a", "2026-11", "{}"))  # an adjustment
    index.refresh()
    assert index.positions("team-a", "2026-11") == (1,) and len(client.queries) == 1  # within a second
    clock.now += 1.0
    assert index.due()
    index.refresh()
    assert index.positions("team-a", "2026-11") == (1, 3)
    assert [q["after"] for q in client.queries] == [0, 2]
    assert index.issued_in("2026-11") == {"team-a", "team-b"} and index.issued_in("2026-10") == set()


def test_a_position_not_visible_yet_stops_the_index_until_it_is() -> None:
    index, client, clock = mirror()
    client.visible = [(1, "team-a", "2026-11", "{}"), (3, "team-b", "2026-11", "{}")]  # 2 not visible yet
    index.refresh()
    assert index.positions("team-b", "2026-11") == ()
    client.visible.append((2, "team-c", "2026-11", "{}"))
    clock.now += 1.0
    index.refresh()
    assert index.positions("team-c", "2026-11") == (2,) and index.positions("team-b", "2026-11") == (3,)


def test_credit_drawn_is_summed_per_tenant_for_drafts() -> None:
    index, client, _ = mirror()
    client.visible = [(1, "team-a", "2026-10", '{"monthly": "100.00"}'),
                      (2, "team-a", "2026-11", '{"grant-1": "25.50", "monthly": "100.00"}'),
                      (3, "team-b", "2026-11", "{}")]
    index.refresh()
    view = index.view_for_draft("team-a")
    assert view.drawn["team-a"] == {"monthly": Decimal("200.00"), "grant-1": Decimal("25.50")}
    assert view.readonly and view.issued == {}


def test_a_failed_refresh_keeps_what_was_read_but_a_failed_first_load_is_an_error() -> None:
    index, client, clock = mirror()
    client.fail = True
    with pytest.raises(ConnectionError):
        index.refresh()
    client.fail = False
    client.visible = [(1, "team-a", "2026-11", "{}")]
    index.refresh()
    client.fail = True
    clock.now += 5
    index.refresh()  # logged, not raised
    assert index.positions("team-a", "2026-11") == (1,)


def test_rendered_bytes_stay_within_their_budget_least_recently_used_first() -> None:
    cache = RenderedCache(max_bytes=10)
    for name in "abc":
        cache.put(("t", "2026-11", 1, name, ""), Rendered(b"1234", "text/csv"))
    assert cache.size == 8 and cache.get(("t", "2026-11", 1, "a", "")) is None  # a went first
    assert cache.get(("t", "2026-11", 1, "b", "")) is not None  # b is now the most recent
    cache.put(("t", "2026-11", 1, "d", ""), Rendered(b"1234", "text/csv"))
    assert cache.get(("t", "2026-11", 1, "c", "")) is None
    assert cache.get(("t", "2026-11", 1, "b", "")) is not None
    cache.put(("t", "2026-11", 2, "big", ""), Rendered(b"x" * 11, "application/pdf"))  # never kept
    assert cache.get(("t", "2026-11", 2, "big", "")) is None and cache.size == 8
