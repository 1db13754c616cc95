"""Victim selection (contract 4): order, protection, stopping within the limit, spot reclaim."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest

from gpumeter.core.models import CapacityType
from quota.victims import Candidate, eviction_order, select_victims, spot_reclaim
from tests.unit.quota.builders import TENANT, ts


def pod(
    name: str,
    gpus: str = "1",
    capacity: CapacityType = "on-demand",
    priority: int = 0,
    started: str | None = "2026-11-10T00:00:00Z",
    protected: bool = False,
    namespace: str = "ml",
    tenant: str = TENANT,
) -> Candidate:
    return Candidate(
        namespace=namespace, name=name, uid=f"uid-{name}", tenant=tenant, gpus=Decimal(gpus),
        capacity_type=capacity, priority=priority, started_at=None if started is None else ts(started),
        protected=protected,
    )


def names(victims: list[Candidate]) -> list[str]:
    return [victim.name for victim in victims]


ORDER_CASES = [
    pytest.param(
        [pod("od", capacity="on-demand", priority=-10), pod("spot", capacity="spot", priority=100)],
        ["spot", "od"],
        id="spot-before-any-priority",
    ),
    pytest.param(
        [pod("reserved", capacity="reserved"), pod("od", capacity="on-demand"), pod("spot", capacity="spot")],
        ["spot", "od", "reserved"],  # reserved and on-demand tie on capacity: name decides
        id="only-spot-is-special",
    ),
    pytest.param(
        [pod("high", priority=1000), pod("low", priority=-5), pod("mid", priority=0)],
        ["low", "mid", "high"],
        id="lowest-priority-first",
    ),
    pytest.param(
        [pod("old", started="2026-11-01T00:00:00Z"), pod("new", started="2026-11-10T00:00:00Z"),
         pod("mid", started="2026-11-05T00:00:00Z")],
        ["new", "mid", "old"],
        id="most-recently-started-first",
    ),
    pytest.param(
        [pod("a", started="2026-11-10T00:00:00.000001Z"), pod("b", started="2026-11-10T00:00:00Z")],
        ["a", "b"],
        id="start-times-one-microsecond-apart",
    ),
    pytest.param(
        # 01:00+02:00 is 23:00 UTC the day before: older than 2026-11-10T00:00Z.
        [pod("east", started="2026-11-10T01:00:00+02:00"), pod("utc", started="2026-11-10T00:00:00Z")],
        ["utc", "east"],
        id="start-times-compared-in-utc",
    ),
    pytest.param(
        [pod("running", started="2026-11-10T00:00:00Z"), pod("pending", started=None)],
        ["pending", "running"],
        id="not-started-counts-as-most-recent",
    ),
    pytest.param(
        [pod("b"), pod("a", namespace="zz"), pod("a")],
        ["a", "b", "a"],  # ml/a, ml/b, zz/a
        id="ties-by-namespace-then-name",
    ),
    pytest.param(
        [pod("guarded", capacity="spot", priority=-100, protected=True), pod("free")],
        ["free"],
        id="protected-never",
    ),
    pytest.param(
        [pod("cpu-only", gpus="0", capacity="spot"), pod("gpu")],
        ["gpu"],
        id="pods-without-gpus-never",
    ),
    pytest.param(
        [
            pod("od-low-new", priority=-1, started="2026-11-10T00:00:00Z"),
            pod("spot-high-old", capacity="spot", priority=10, started="2026-11-01T00:00:00Z"),
            pod("spot-high-new", capacity="spot", priority=10, started="2026-11-09T00:00:00Z"),
            pod("spot-low-old", capacity="spot", priority=1, started="2026-11-01T00:00:00Z"),
            pod("od-low-old", priority=-1, started="2026-11-02T00:00:00Z"),
            pod("od-high-new", priority=50, started=None),
        ],
        ["spot-low-old", "spot-high-new", "spot-high-old", "od-low-new", "od-low-old", "od-high-new"],
        id="all-keys-together",
    ),
]


@pytest.mark.parametrize(("candidates", "expected"), ORDER_CASES)
def test_eviction_order(candidates: list[Candidate], expected: list[str]) -> None:
    assert names(eviction_order(candidates)) == expected


@pytest.mark.parametrize(("candidates", "expected"), ORDER_CASES)
def test_order_does_not_depend_on_input_order(candidates: list[Candidate], expected: list[str]) -> None:
    for permutation in itertools.permutations(candidates):
        assert names(eviction_order(permutation)) == expected


TENANT_PODS = [
    pod("spot-1", gpus="2", capacity="spot", priority=5),
    pod("low-1", gpus="1", priority=-1),
    pod("mid-4", gpus="4", priority=0),
    pod("high-8", gpus="8", priority=100),
    pod("vip-2", gpus="2", priority=-100, protected=True),
]
# Eviction order of TENANT_PODS: spot-1 (2), low-1 (1), mid-4 (4), high-8 (8); vip-2 never.
# Held in total: 17.


@pytest.mark.parametrize(
    ("held", "limit", "expected"),
    [
        pytest.param("17", None, ["spot-1", "low-1", "mid-4", "high-8"],
                     id="no-limit-evicts-every-unprotected"),
        pytest.param("17", "17", [], id="at-limit-nothing"),
        pytest.param("12", "17", [], id="under-limit-nothing"),
        pytest.param("17", "16", ["spot-1"], id="one-over"),
        pytest.param("17", "15", ["spot-1"], id="exactly-within-after-first"),
        pytest.param("17", "14.5", ["spot-1", "low-1"], id="fraction-limit"),
        pytest.param("17", "14", ["spot-1", "low-1"], id="stops-as-soon-as-within"),
        pytest.param("17", "10", ["spot-1", "low-1", "mid-4"], id="three"),
        pytest.param("17", "2", ["spot-1", "low-1", "mid-4", "high-8"], id="down-to-protected"),
        pytest.param("17", "0", ["spot-1", "low-1", "mid-4", "high-8"],
                     id="unreachable-evicts-all-evictable"),
        # The ledger's held count (e.g. 20: pods not yet listed) is what is brought within the limit.
        pytest.param("20", "17", ["spot-1", "low-1"], id="held-from-ledger-not-from-pods"),
    ],
)
def test_select_victims(held: str, limit: str | None, expected: list[str]) -> None:
    victims = select_victims(TENANT_PODS, Decimal(held), None if limit is None else Decimal(limit))
    assert names(victims) == expected


@pytest.mark.parametrize(
    ("pods", "held", "limit", "expected"),
    [
        pytest.param(
            [pod(f"p{i}", gpus="0.142857142857", started=f"2026-11-10T00:00:0{i}Z") for i in range(7)],
            "0.999999999999", "0.714285714285", ["p6", "p5"], id="mig-fractions-exact",
        ),
        pytest.param([], "4", "2", [], id="no-candidates"),
        pytest.param([pod("only", protected=True)], "4", "2", [], id="only-protected"),
    ],
)
def test_select_victims_edges(pods: list[Candidate], held: str, limit: str, expected: list[str]) -> None:
    assert names(select_victims(pods, Decimal(held), Decimal(limit))) == expected


def test_select_victims_refuses_mixed_tenants() -> None:
    with pytest.raises(ValueError, match="one tenant"):
        select_victims([pod("a"), pod("b", tenant="team-b")], Decimal(2), None)


NODE_PODS = [
    pod("s-low-old", gpus="2", capacity="spot", priority=0, started="2026-11-01T00:00:00Z", tenant="t1"),
    pod("s-low-new", gpus="1", capacity="spot", priority=0, started="2026-11-09T00:00:00Z", tenant="t2"),
    pod("s-high", gpus="4", capacity="spot", priority=10, tenant="t1"),
    pod("s-guarded", gpus="8", capacity="spot", priority=-10, protected=True),
    pod("on-demand", gpus="8", capacity="on-demand", priority=-10),
]
# Reclaim order: s-low-new (1), s-low-old (2), s-high (4): 7 reclaimable GPUs.


@pytest.mark.parametrize(
    ("needed", "expected"),
    [
        pytest.param("1", ["s-low-new"], id="one"),
        pytest.param("2", ["s-low-new", "s-low-old"], id="prefix-not-best-fit"),
        pytest.param("3", ["s-low-new", "s-low-old"], id="exact"),
        pytest.param("3.5", ["s-low-new", "s-low-old", "s-high"], id="fraction"),
        pytest.param("7", ["s-low-new", "s-low-old", "s-high"], id="all-reclaimable"),
        pytest.param("7.000000000001", [], id="impossible-returns-nothing"),
        pytest.param("0", [], id="nothing-needed"),
    ],
)
def test_spot_reclaim(needed: str, expected: list[str]) -> None:
    assert names(spot_reclaim(NODE_PODS, Decimal(needed))) == expected


def test_candidate_needs_decimal_gpus_and_aware_start() -> None:
    with pytest.raises(TypeError):
        Candidate("ml", "p", "u", TENANT, 1.0, "spot", 0, None, False)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        naive = ts("2026-11-10T00:00:00Z").replace(tzinfo=None)
        Candidate("ml", "p", "u", TENANT, Decimal(1), "spot", 0, naive, False)
