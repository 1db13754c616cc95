"""The sink's split of permanent from transient failures, on a named fake client.

FakeClickHouseClient behaves like clickhouse-connect's HTTP client and the server where the
sink relies on them: ``insert`` takes the real client's arguments (rows or columns, type
names); a batch holding a value the client cannot encode into its column raises for the
whole batch (DataError for an Int32 out of range, AttributeError for a non-text value in a
String column), a server that is away raises OperationalError, and a server-side refusal is
DatabaseError carrying "Code: N". Text sent for a Decimal column is stored as the server
converts it, including its one silent failure: a value beyond the precision of a Nullable
Decimal column becomes NULL. Its
``event_ids`` behaves like the MergeTree table: every claim is kept, and read back in the order
the inserts committed (``ORDER BY _block_number``: here, insertion order); its
``event_id_hashes`` is a plain MergeTree whose inserts are numbered as they commit, one part
each, never merged, and a read filtered by the highest block of a part (``indexHint`` of a
condition on ``_part``) reads the parts numbered above; a lightweight DELETE
removes the claims it names; and an insert into rated_usage carrying an
insert_deduplication_token it has seen is dropped, as the engine does for a table with
non_replicated_deduplication_window.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, Context, Decimal
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError
from clickhouse_connect.driver.external import ExternalData

from gpumeter.infra.rows import Row
from gpumeter.infra.schema import DEAD_LETTERS, EVENT_IDS, FINGERPRINT_COLUMNS, RATED_USAGE
from gpumeter.infra.tables import Table
from streams.sink import IDS_TABLE, ClickHouseSink, insert_token, is_permanent

PRIORITY = RATED_USAGE.insert_columns.index("priority")


TABLES = {table.name: table for table in (RATED_USAGE, EVENT_IDS, DEAD_LETTERS)}
_WINDOW_START, _PERIOD, _TENANT = (RATED_USAGE.insert_columns.index(name)
                                   for name in ("window_start", "period", "tenant"))
_CLAIM_PARTITION, _CLAIM_OFFSET = (EVENT_IDS.insert_columns.index(name)
                                   for name in ("source_partition", "source_offset"))
_TEXT = re.compile(r"(LowCardinality\()?(Nullable\()?String\)*")
_DECIMAL = re.compile(r"^(Nullable\()?Decimal\((\d+), *(\d+)\)\)?$")


def encode_like_the_client(type_name: str, value: Any, column: str) -> None:
    """The client's own refusals while encoding (it sends nothing then)."""
    if value is None:
        if "Nullable" not in type_name:
            raise DataError(f"Invalid None value in non-Nullable column, column name: `{column}`")
    elif type_name == "Int32" and not -(2**31) <= value < 2**31:
        raise DataError(f"Unable to create native array for column `{column}`: error")
    elif _TEXT.fullmatch(type_name) and not isinstance(value, str):
        raise AttributeError(f"'{type(value).__name__}' object has no attribute 'encode'")
    elif "Decimal" in type_name:
        Decimal(str(value))  # InvalidOperation for a value that is not a number


def stored_like_the_server(declared: Table, types: list[str], values: Row) -> Row:
    """Text sent for a Decimal column converted as the server converts it: digits beyond the
    scale truncated; beyond the precision, NULL in a Nullable column (silently), else code 69."""
    stored = list(values)
    for index, column in enumerate(c for c in declared.columns if c.inserted):
        match = _DECIMAL.match(column.type)
        if match is None or not isinstance(values[index], str):
            continue
        assert "String" in types[index]
        precision, scale = int(match.group(2)), int(match.group(3))
        number = Decimal(values[index]).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_DOWN,
                                                 context=Context(prec=100))
        if abs(number) >= Decimal(10) ** (precision - scale):
            if match.group(1):
                stored[index] = None
                continue
            raise DatabaseError(f"Code: 69. DB::Exception: Decimal value is too big: {values[index]}")
        stored[index] = number
    return tuple(stored)


class FakeResult:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.result_rows = rows


class FakeClickHouseClient:
    def __init__(self, down_for: int = 0, server_error: str | None = None,
                 event_ids_down_for: int = 0, rated_usage_down_for: int = 0,
                 rival_claims: Sequence[Row] = (), rival_first: bool = True,
                 rival_hashes_early: bool = False, hashes_engine: str = "MergeTree") -> None:
        self.tables: dict[str, list[Row]] = {"rated_usage": [], "dead_letters": []}
        self.event_ids: list[Row] = []
        # event_id_hashes, a hash per claim written (the fake keys a hash by its id: a named
        # stand-in for sipHash64, without its collisions), in the order the inserts committed,
        # and the block number of the insert (the part) that wrote each.
        self.hashes: list[str] = []
        self.hash_blocks: list[int] = []
        self.hashes_engine = hashes_engine
        self.horizons: list[int] = []  # the horizons a contest read parts above
        self.requests: list[str] = []  # the tables written, in order
        self.tokens: set[str] = set()
        self.down_for = down_for
        self.event_ids_down_for = event_ids_down_for
        self.rated_usage_down_for = rated_usage_down_for
        # Claims another sink commits around our first claim insert (before it, or after it).
        self.rival_claims = list(rival_claims)
        self.rival_first = rival_first
        if rival_hashes_early:  # the rival stored its hashes before our lookup, its claims later
            self.add_hashes([rival[0] for rival in self.rival_claims])
        self.rival_hashes_early = rival_hashes_early
        self.server_error = server_error
        self.inserts = 0

    def add_hashes(self, ids: Sequence[str]) -> None:
        """One insert into event_id_hashes: one part, numbered as it commits."""
        if not ids:
            return
        block = max(self.hash_blocks, default=0) + 1
        self.hashes.extend(ids)
        self.hash_blocks.extend(block for _ in ids)

    def query(self, sql: str, parameters: dict[str, Any] | None = None,
              settings: dict[str, Any] | None = None, *,
              external_data: ExternalData | None = None) -> FakeResult:
        if sql.startswith("SELECT engine FROM system.tables"):
            assert "name = 'event_id_hashes'" in sql, sql
            return FakeResult([(self.hashes_engine,)])
        if sql.startswith("SELECT max(max_block_number) FROM system.parts"):
            assert "table = 'event_id_hashes' AND active" in sql, sql
            return FakeResult([(max(self.hash_blocks, default=0),)])
        # The ids come as the real client sends them: an external TabSeparated table.
        assert external_data is not None and external_data.files[0].name == IDS_TABLE
        wanted = {line.encode().decode("unicode_escape")
                  for line in external_data.files[0].data.decode().splitlines()}
        if sql.startswith("SELECT event_id FROM batch_ids WHERE sipHash64(event_id) IN (SELECT id_hash FROM "
                          "event_id_hashes WHERE id_hash IN (SELECT sipHash64(event_id) FROM batch_ids))"):
            return FakeResult([(event_id,) for event_id in wanted if event_id in self.hashes])
        if "FROM event_ids" in sql:
            # The server's answer to ``argMin((claim...), _block_number), count() AS claims FROM
            # event_ids PREWHERE id_hash GLOBAL IN (the batch's hashes [those event_id_hashes
            # holds more than once, in the parts numbered above a horizon]) ... GROUP BY event_id
            # [HAVING claims > 1]``: self.event_ids is in commit order, so an id's first claim is
            # its first row here; the claim comes back as one tuple.
            assert "argMin((" in sql and "_block_number)" in sql and "GROUP BY event_id" in sql, sql
            if "GROUP BY id_hash HAVING count() > 1" in sql:
                assert "GLOBAL IN (SELECT id_hash FROM event_id_hashes WHERE id_hash IN" in sql, sql
                horizon = re.search(r"indexHint\(.*_part.* > (\d+)\) GROUP BY", sql)
                above = int(horizon.group(1)) if horizon else -1
                if horizon:
                    self.horizons.append(above)
                hashes = Counter(event_id for event_id, block
                                 in zip(self.hashes, self.hash_blocks, strict=True)
                                 if event_id in wanted and block > above)
                wanted = {event_id for event_id, count in hashes.items() if count > 1}
            else:
                assert "GLOBAL IN (SELECT sipHash64(event_id) FROM batch_ids)" in sql, sql
            width = 1 + len(FINGERPRINT_COLUMNS)
            counts = Counter(stored[0] for stored in self.event_ids if stored[0] in wanted)
            first: dict[str, tuple[Any, ...]] = {}
            for stored in self.event_ids:
                if stored[0] in wanted:
                    first.setdefault(stored[0], (*stored[1:width], stored[_CLAIM_PARTITION],
                                                 stored[_CLAIM_OFFSET]))
            minimum = 2 if "HAVING claims > 1" in sql else 1
            return FakeResult([(event_id, claim, counts[event_id]) for event_id, claim in first.items()
                               if counts[event_id] >= minimum])
        return FakeResult([(row[0],) for row in self.tables["rated_usage"] if row[0] in wanted])

    def insert(self, table: str | None = None, data: Sequence[Sequence[Any]] | None = None,
               column_names: str | Sequence[str] | None = "*", database: str | None = None,
               column_types: Sequence[Any] | None = None, column_type_names: Sequence[str] | None = None,
               column_oriented: bool = False, settings: dict[str, Any] | None = None,
               context: Any = None, transport_settings: dict[str, str] | None = None) -> None:
        """clickhouse-connect's ``Client.insert`` signature; rows as the server would store them."""
        assert table is not None and data is not None and database is None and context is None
        declared = TABLES[table]
        assert list(column_names or []) == list(declared.insert_columns)
        rows = [tuple(r) for r in (zip(*data, strict=True) if column_oriented else data)]
        types = list(column_type_names) if column_type_names is not None else [
            column.type for column in declared.columns if column.inserted]
        self.inserts += 1
        if self.down_for > 0:
            self.down_for -= 1
            raise OperationalError("HTTPConnectionPool(host='127.0.0.1', port=8123): connection refused")
        if self.server_error is not None:
            raise DatabaseError(self.server_error)
        if table == EVENT_IDS.name and self.event_ids_down_for > 0:
            self.event_ids_down_for -= 1
            raise OperationalError("connection reset by peer")
        # The client encodes the values as it streams the request: a failure stores nothing.
        for index, type_name in enumerate(types):
            for value in (r[index] for r in rows):
                encode_like_the_client(type_name, value, declared.insert_columns[index])
        rows = [stored_like_the_server(declared, types, r) for r in rows]
        if table == EVENT_IDS.name:
            self.requests.append(table)
            # A rival sink writes its hash, then its claim, just before or just after ours.
            rivals, self.rival_claims = self.rival_claims, []
            rival_hashes = [] if self.rival_hashes_early else [rival[0] for rival in rivals]
            if self.rival_first:
                self.add_hashes(rival_hashes)
                self.event_ids.extend(rivals)
            self.event_ids.extend(rows)
            if not self.rival_first:
                self.add_hashes(rival_hashes)
                self.event_ids.extend(rivals)
            return
        if table == RATED_USAGE.name and self.rated_usage_down_for > 0:
            self.rated_usage_down_for -= 1
            raise OperationalError("connection reset by peer")
        token = (settings or {}).get("insert_deduplication_token")
        if token in self.tokens:
            return
        if token is not None:
            self.tokens.add(token)
        self.tables[table].extend(rows)

    def command(self, cmd: str, parameters: dict[str, Any] | None = None, data: Any = None,
                settings: dict[str, Any] | None = None, use_database: bool = True,
                external_data: ExternalData | None = None, transport_settings: Any = None) -> None:
        """The sink's two commands: the batch's hashes into event_id_hashes (INSERT ... SELECT
        from the external table of ids), and a lightweight DELETE of one refused row's claim."""
        self.inserts += 1
        if self.down_for > 0:
            self.down_for -= 1
            raise OperationalError("HTTPConnectionPool(host='127.0.0.1', port=8123): connection refused")
        if cmd.startswith("INSERT INTO event_id_hashes (id_hash) SELECT"):
            assert external_data is not None and external_data.files[0].name == IDS_TABLE
            assert "sipHash64(event_id) FROM batch_ids" in cmd, cmd
            self.requests.append("event_id_hashes")
            self.add_hashes([line.encode().decode("unicode_escape")
                             for line in external_data.files[0].data.decode().splitlines()])
            return
        assert cmd.startswith(f"DELETE FROM {EVENT_IDS.name} WHERE") and parameters is not None, cmd
        named = (parameters["id"], parameters["partition"], parameters["offset"])
        self.event_ids = [claim for claim in self.event_ids
                          if (claim[0], claim[_CLAIM_PARTITION], claim[_CLAIM_OFFSET]) != named]

    def close(self) -> None:
        pass


START = datetime(2026, 11, 1, tzinfo=UTC)


def row(event_id: str, priority: int = 0, **changes: Any) -> Row:
    values: dict[str, Any] = dict(
        event_id=event_id, tenant="team-a", period="2026-11", kind="gpu", cluster="c1", node="n1",
        namespace="ns", pod="p", pod_uid="uid-1", window_start=START, window_end=START + timedelta(hours=1),
        quantity=Decimal(1), unit_seconds=Decimal(3600), gpu_model="H100-SXM-80GB", mig_profile=None,
        capacity_type="on-demand", priority=priority, rate_card="2026-11", currency="USD",
        unit_price=Decimal("2.5"), capacity_multiplier=Decimal(1), list_cost=Decimal("2.5"),
        utilization=Decimal("0.5"), energy_joules=None, labels={}, source_partition=0, source_offset=0)
    assert set(values) == set(RATED_USAGE.insert_columns)
    values.update(changes)
    return tuple(values[column] for column in RATED_USAGE.insert_columns)


@pytest.mark.parametrize(
    ("error", "permanent"),
    [
        pytest.param(DataError("Unable to create native array for column `priority`"), True,
                     id="client-encoding"),
        pytest.param(OverflowError("int too big to convert"), True, id="decimal-overflow-in-client"),
        pytest.param(OperationalError("connection refused"), False, id="server-away"),
        pytest.param(DatabaseError("Code: 407. DB::Exception: Decimal math overflow"), True, id="server-407"),
        pytest.param(DatabaseError("Code: 60. DB::Exception: Table rated_usage does not exist"), False,
                     id="missing-table-is-for-an-operator"),
        pytest.param(DatabaseError("Code: 241. DB::Exception: Memory limit exceeded"), False, id="overload"),
        pytest.param(TimeoutError("timed out"), False, id="timeout"),
    ],
)
def test_errors_are_classified(error: BaseException, permanent: bool) -> None:
    assert is_permanent(error) is permanent


@pytest.mark.parametrize("position", [0, 5, 9], ids=["first", "middle", "last"])
def test_one_refused_row_is_returned_and_the_rest_stored(position: int) -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    rows = [row(f"e{i}", priority=3_000_000_000 if i == position else 0) for i in range(10)]
    result = sink.store_rated(rows)
    assert result.stored == 9
    assert [r[0] for r, _ in result.rejected] == [f"e{position}"]
    assert "priority" in result.rejected[0][1]
    stored = sorted(r[0] for r in client.tables["rated_usage"])
    assert stored == sorted(f"e{i}" for i in range(10) if i != position)


def test_every_row_refused_stores_nothing_and_returns_all() -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    result = sink.store_rated([row(f"e{i}", priority=-(2**40)) for i in range(4)])
    assert result.stored == 0
    assert len(result.rejected) == 4
    assert client.tables["rated_usage"] == []


@pytest.mark.parametrize(
    "client",
    [
        pytest.param(FakeClickHouseClient(down_for=1), id="server-away"),
        pytest.param(FakeClickHouseClient(server_error="Code: 60. Table does not exist"), id="missing-table"),
    ],
)
def test_transient_failures_raise_so_the_batch_is_retried_whole(client: FakeClickHouseClient) -> None:
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    with pytest.raises(Exception) as caught:
        sink.store_rated([row("e1", priority=3_000_000_000), row("e2")])
    assert not is_permanent(caught.value)
    assert client.tables["rated_usage"] == []
    assert sink.counters.failures == 1


def test_a_retry_after_a_partial_split_does_not_store_twice() -> None:
    """Halves stored before a transient failure are skipped by the duplicate check on retry."""
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    rows = [row(f"e{i}", priority=3_000_000_000 if i == 7 else 0) for i in range(8)]
    first = sink.store_rated(rows)
    second = sink.store_rated(rows)
    assert first.stored == 7
    assert second.stored == 0
    assert len(client.tables["rated_usage"]) == 7


CONFLICTING = {
    "another-month": {"period": "2026-12", "window_start": START + timedelta(days=30),
                      "window_end": START + timedelta(days=30, hours=1)},
    "another-tenant": {"tenant": "team-b"},
    "another-quantity": {"quantity": Decimal(3), "unit_seconds": Decimal(10800)},
    "another-capacity-type": {"capacity_type": "spot"},
}


@pytest.mark.parametrize("changes", CONFLICTING.values(), ids=CONFLICTING.keys())
def test_a_later_copy_that_differs_is_a_conflict_and_the_first_stays(changes: dict[str, Any]) -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    first = row("e1")
    sink.store_rated([first])
    later = sink.store_rated([row("e1", **changes), row("e2")])
    assert later.stored == 1
    assert [(r[0], r) for r, _ in later.conflicts] == [("e1", row("e1", **changes))]
    assert [r for r in client.tables["rated_usage"] if r[0] == "e1"] == [first]
    assert sink.counters.conflicts == 1


def test_an_identical_later_copy_is_a_silent_duplicate() -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    sink.store_rated([row("e1")])
    later = sink.store_rated([row("e1")])
    assert (later.stored, later.conflicts, later.rejected) == (0, [], [])
    assert len(client.tables["rated_usage"]) == 1
    assert sink.counters.skipped_duplicates == 1


def test_a_differing_copy_in_the_same_batch_loses_to_the_first() -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    result = sink.store_rated([row("e1"), row("e1", tenant="team-b"), row("e1")])
    assert result.stored == 1
    assert [r[1] for r, _ in result.conflicts] == ["team-b"]
    assert "tenant" in result.conflicts[0][1]
    assert [r[1] for r in client.tables["rated_usage"]] == ["team-a"]


def claim_of(stored: Row) -> Row:
    """The event_ids claim of a rated row, as the sink writes it."""
    return tuple(stored[RATED_USAGE.insert_columns.index(c)] for c in EVENT_IDS.insert_columns)


def test_a_failure_while_claiming_stores_nothing_and_the_retry_stores_each_row_once() -> None:
    client = FakeClickHouseClient(event_ids_down_for=1)
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    rows = [row(f"e{i}") for i in range(3)]
    with pytest.raises(OperationalError):
        sink.store_rated(rows)
    assert client.tables["rated_usage"] == [] and client.event_ids == []
    assert sink.store_rated(rows).stored == 3
    assert sorted(r[0] for r in client.event_ids) == ["e0", "e1", "e2"]


def test_rows_claimed_but_not_stored_before_a_crash_are_stored_by_the_replay() -> None:
    """Claimed, then the rated_usage insert failed: the claims are the batch's own (same source
    positions), so the replay stores the rows; a copy from elsewhere meanwhile is a duplicate."""
    client = FakeClickHouseClient(rated_usage_down_for=1)
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    rows = [row(f"e{i}", source_partition=2, source_offset=40) for i in range(3)]
    with pytest.raises(OperationalError):
        sink.store_rated(rows)
    assert client.tables["rated_usage"] == [] and len(client.event_ids) == 3
    elsewhere = sink.store_rated([row("e1", source_partition=5, source_offset=9)])
    assert (elsewhere.stored, elsewhere.conflicts) == (0, [])
    assert sink.store_rated(rows).stored == 3
    assert sink.store_rated(rows).stored == 0  # and once stored, a replay stores nothing
    assert sorted(r[0] for r in client.tables["rated_usage"]) == ["e0", "e1", "e2"]


def test_refused_rows_are_not_recorded_as_billed() -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    sink.store_rated([row("e1", priority=3_000_000_000), row("e2")])
    assert [r[0] for r in client.event_ids] == ["e2"]
    # A storable copy of the refused id later is billed, not taken for its duplicate.
    assert sink.store_rated([row("e1", source_offset=7)]).stored == 1


def test_the_first_claim_decides_for_every_later_copy() -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    first = row("e1", source_partition=0, source_offset=1)
    raced = row("e1", tenant="team-b", source_partition=3, source_offset=8)
    for claimed in (first, raced):  # two claims, first first, each after its hash (as _claim writes them)
        client.add_hashes([claimed[0]])
        client.event_ids.append(claim_of(claimed))
    same_as_raced = sink.store_rated([row("e1", tenant="team-b", source_partition=4, source_offset=2)])
    assert same_as_raced.stored == 0
    assert [reason for _, reason in same_as_raced.conflicts] == [
        "event_id e1 was already billed with different tenant"]
    same_as_first = sink.store_rated([row("e1", source_partition=4, source_offset=3)])
    assert (same_as_first.stored, same_as_first.conflicts) == (0, [])
    other = sink.store_rated([row("e1", quantity=Decimal(2), unit_seconds=Decimal(7200), source_offset=4)])
    assert other.stored == 0
    assert [reason for _, reason in other.conflicts] == [
        "event_id e1 was already billed with different quantity, unit_seconds"]
    assert client.tables["rated_usage"] == []  # no copy here was the first claim's own


@pytest.mark.parametrize("hashes_early", [
    pytest.param(False, id="its-hash-after-our-lookup"),
    # Its hash before our lookup and its claim after: the lookup finds the hash but no claim, so
    # e1 is ours to claim too; the rival's hash sits in a part at or below the horizon, so the
    # contest must read every part to find the two claims.
    pytest.param(True, id="its-hash-seen-by-our-lookup-without-its-claim"),
])
@pytest.mark.parametrize(
    ("rival_first", "stored", "conflicts"),
    [
        pytest.param(True, 0, ["team-a"], id="a-rival-claim-committed-just-before-ours-wins"),
        pytest.param(False, 1, [], id="our-claim-committed-first-wins"),
    ],
)
def test_two_sinks_claiming_one_id_at_once_agree_on_the_first(
    rival_first: bool, stored: int, conflicts: list[str], hashes_early: bool
) -> None:
    """Another worker claims e1 under team-b between our lookup and our read-back: whichever
    claim committed first is billed; the other sink's copy is a conflict."""
    rival = claim_of(row("e1", tenant="team-b", source_partition=3, source_offset=8))
    client = FakeClickHouseClient(rival_claims=[rival], rival_first=rival_first,
                                  rival_hashes_early=hashes_early)
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    result = sink.store_rated([row("e1", source_partition=0, source_offset=1), row("e2")])
    assert result.stored == stored + 1  # e2 is nobody else's
    assert [r[1] for r, _ in result.conflicts] == conflicts
    assert sorted(r[0] for r in client.tables["rated_usage"]) == (["e1", "e2"] if stored else ["e2"])
    # Parts above the horizon only when no hash was seen without its claim (an empty table: 0).
    assert client.horizons == ([] if hashes_early else [0])


def test_without_an_unclaimed_hash_the_contest_reads_only_parts_committed_after_the_lookup_began() -> None:
    """Two batches: the second's contest reads the parts numbered above the table's highest
    block before its lookup (the first batch's hashes are block 1, its own block 2)."""
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    assert sink.store_rated([row("e1")]).stored == 1
    assert sink.store_rated([row("e2", source_offset=1)]).stored == 1
    assert (client.hash_blocks, client.horizons) == ([1, 2], [0, 1])


@pytest.mark.parametrize("engine", ["Distributed", "ReplicatedMergeTree", "SharedMergeTree"])
def test_where_block_numbers_are_not_in_commit_order_the_contest_reads_every_part(engine: str) -> None:
    """A Distributed table numbers blocks per shard, Replicated* allocates them before the
    commit, the Cloud's SharedMergeTree is not ours to reason about: a rival's claim committed
    just before ours is still found, through every part."""
    rival = claim_of(row("e1", tenant="team-b", source_partition=3, source_offset=8))
    client = FakeClickHouseClient(rival_claims=[rival], hashes_engine=engine)
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    result = sink.store_rated([row("e1", source_partition=0, source_offset=1)])
    assert (result.stored, [r[1] for r, _ in result.conflicts]) == (0, ["team-a"])
    assert client.horizons == []


def test_a_claims_hash_is_stored_before_the_claim_so_a_rival_never_sees_a_claim_without_it() -> None:
    """The contest after claiming finds rival claims through event_id_hashes: it can only see
    every claim committed before its own if each claim's hash was stored before the claim."""
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    assert sink.store_rated([row("e1"), row("e2", source_offset=1)]).stored == 2
    assert client.requests == ["event_id_hashes", "event_ids"]
    assert client.hashes == ["e1", "e2"]


def test_a_hash_whose_claim_failed_is_not_taken_for_a_claim() -> None:
    """The hashes went in, the claims' insert failed: the retry finds the hashes, reads no claim
    in event_ids, claims again and stores each row once."""
    client = FakeClickHouseClient(event_ids_down_for=1)
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    with pytest.raises(OperationalError):
        sink.store_rated([row("e1")])
    assert (client.hashes, client.event_ids) == (["e1"], [])
    assert sink.store_rated([row("e1")]).stored == 1
    assert [r[0] for r in client.tables["rated_usage"]] == ["e1"]


def test_each_insert_is_named_by_exactly_its_rows() -> None:
    rows = [row(f"e{i}", source_partition=i % 2, source_offset=100 + i) for i in range(6)]
    assert insert_token(rows) == insert_token([tuple(r) for r in rows])  # the same rows again: a repeat
    assert insert_token(rows[:3]) != insert_token(rows)  # a split half is other rows
    moved = [row(f"e{i}", source_partition=i % 2, source_offset=200 + i) for i in range(6)]
    assert insert_token(moved) != insert_token(rows)  # the same ids read again at other offsets
    assert len({insert_token(rows[:n]) for n in range(1, 7)}) == 6


def test_a_retry_with_other_rows_of_the_same_offsets_is_not_taken_for_a_repeat() -> None:
    """A token naming only the batch's offset range would make the engine drop this retry."""
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    rows = [row(f"e{i}", source_offset=i) for i in range(8)]
    assert sink.store_rated(rows).stored == 8
    # The first and last rows and every recorded id gone, as if those had never landed.
    client.tables["rated_usage"] = [r for r in client.tables["rated_usage"] if r[0] not in ("e0", "e7")]
    client.event_ids.clear()
    again = sink.store_rated(rows)
    assert again.stored == 2
    assert sorted(r[0] for r in client.tables["rated_usage"]) == [f"e{i}" for i in range(8)]


UTILIZATION = RATED_USAGE.insert_columns.index("utilization")
LIST_COST = RATED_USAGE.insert_columns.index("list_cost")


def test_a_value_beyond_its_nullable_decimal_column_is_refused_not_stored_as_null() -> None:
    """utilization is Nullable(Decimal(18, 6)): the server would store 10^12 as NULL."""
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    rows = [row("e0"), row("e1", utilization=Decimal(10) ** 12),
            row("e2", utilization=Decimal("999999999999.999999"))]
    result = sink.store_rated(rows)
    assert [r[0] for r, _ in result.rejected] == ["e1"]
    assert "Decimal(18, 6)" in result.rejected[0][1]
    assert {r[0]: r[UTILIZATION] for r in client.tables["rated_usage"]} == {
        "e0": Decimal("0.5"), "e2": Decimal("999999999999.999999")}
    assert sorted(r[0] for r in client.event_ids) == ["e0", "e2"]


def test_decimal_values_are_stored_exactly() -> None:
    client = FakeClickHouseClient()
    sink = ClickHouseSink(lambda: client)  # type: ignore[arg-type, return-value]
    cost = Decimal("0.045833333333333333")  # 18 places: the column's scale
    quantity = Decimal("0.142857142857")  # a 1/7 MIG share at 12 places
    sink.store_rated([row("e1", list_cost=cost, quantity=quantity, unit_seconds=quantity * 3600,
                          utilization=None)])
    (stored,) = client.tables["rated_usage"]
    assert stored[LIST_COST] == cost
    assert stored[RATED_USAGE.insert_columns.index("quantity")] == quantity
    assert stored[RATED_USAGE.insert_columns.index("unit_seconds")] == Decimal("514.2857142852")
    assert stored[UTILIZATION] is None
