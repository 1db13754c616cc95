"""The sink's id probe against the layout of ``event_id_hashes``, same hashes, same run.

    .venv/bin/python -m benchmarks.id_lookup [--rows 30000000] [--ids 15000] [--granularity 256 64]
        [--rounds 5]
    .venv/bin/python -m benchmarks.id_lookup --merges [--rows 300000000] [--ids 15000]
        [--bases 5 1.5] [--rounds 7]

``--merges``: the parts the engine's own merges leave, and the probe over them, for each
``merge_selector_base`` in ``--bases`` (5 is ClickHouse's default; the shipped declaration says
1.5, pipeline migration 12). Each table is grown by inserts of ``--ids`` hashes, as the sink
inserts a batch's claims, with merges running, then left until no merge runs; reported: the
parts (and their rows), the probe's median (new ids, as below), and the rows the merges wrote
(system.events MergedRows: the write amplification paid for fewer parts). The ratio is each
base's probe median against the first base's. Last, the last base's table is merged into one part
(``OPTIMIZE ... FINAL``) and probed again: the floor that no merge policy goes below.

docs/capacity.md named smaller granules for ``event_id_hashes`` as a way to cheapen the sink's
probe at fleet scale (a probe reads one granule per id and part: 256 hashes at the shipped
``index_granularity``, 64 at the proposed one). This measures it before anyone migrates for it:
for each granularity, a table declared as ``EVENT_ID_HASHES`` is (only ``index_granularity``
differs) filled with ``--rows`` hashes in 30 inserts, merged into one part (``OPTIMIZE ...
FINAL``: the same number of parts on each side, since the probe costs per part), and probed
with ``--ids`` ids it does not hold, as a batch of new samples is (the probe's query shape of
streams/sink.py ``_first_claims``: ``id_hash IN`` the batch's hashes). Rounds alternate
between the tables; the ratio is each granularity's median against the first one's.

The engine is chdb's (ClickHouse's own) in this process, in a temporary directory: no server,
nothing else reads the tables. Results: benchmarks/results/id-lookup-latest.json.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from benchmarks.result_file import write_results
from gpumeter.infra.schema import EVENT_ID_HASHES

console = Console()
RESULTS = Path(__file__).parent / "results" / "id-lookup-latest.json"
MERGES_RESULTS = Path(__file__).parent / "results" / "id-lookup-merges-latest.json"
INSERTS = 30
HASH = "sipHash64(concat('id-', toString(number)))"  # the sink's sipHash64(event_id) of made-up ids


def declared(name: str, setting: str, value: object) -> str:
    """``EVENT_ID_HASHES`` as ``name``, with only ``setting`` changed to ``value``."""
    settings = re.sub(rf"{setting} = [0-9.]+", f"{setting} = {value}", EVENT_ID_HASHES.settings or "")
    return replace(EVENT_ID_HASHES, settings=settings).create_sql(name)


def probe(query: Any, table: str, start: int, ids: int) -> float:
    """One probe of the ids ``start`` .. ``start + ids`` (never stored), as the sink's
    ``_first_claims`` asks; its seconds."""
    began = time.perf_counter()
    found = query(f"SELECT count() FROM {table} WHERE id_hash IN "
                  f"(SELECT {HASH} FROM numbers({start}, {ids}))")
    seconds = time.perf_counter() - began
    if found.strip() != "0":
        raise AssertionError(f"ids never stored were found: {found.strip()}")
    return seconds


def probes(query: Any, table: str, rows: int, ids: int, rounds: int, seed: int = 7) -> list[float]:
    """``rounds`` probes of ``ids`` new ids."""
    rng = random.Random(seed)
    return [probe(query, table, rows + rng.randrange(10 * rows), ids) for _ in range(rounds)]


def merges(args: argparse.Namespace) -> int:
    """The parts that merges leave at each merge_selector_base, and the probe over them."""
    from chdb import session  # the engine, imported only when the benchmark runs

    results: dict[str, Any] = {"mode": "merges", "rows": args.rows, "ids": args.ids, "rounds": args.rounds,
                               "by_merge_selector_base": {}}
    inserts = args.rows // args.ids
    table = Table("merge_selector_base", "parts", "rows of the 3 largest", "rows written by merges",
                  "probe median", "ratio",
                  title=f"{args.rows:,} hashes inserted {args.ids:,} at a time; "
                        f"probe of {args.ids:,} new ids")
    base_median = None
    home = tempfile.mkdtemp(prefix="gpumeter-id-merges-")
    db = session.Session(home)  # one engine per process: the bases take turns, one table each

    def query(sql: str) -> str:
        return str(db.query(sql, "TSV").bytes().decode())

    def merged_rows() -> int:
        return int(query("SELECT value FROM system.events WHERE event = 'MergedRows'").strip() or 0)

    try:
        query("CREATE DATABASE IF NOT EXISTS bench ENGINE = Atomic")
        query("USE bench")
        for base in args.bases:
            name = "hashes_" + base.replace(".", "_")
            query(declared(name, "merge_selector_base", base))
            before = merged_rows()
            began = time.perf_counter()
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task(f"merge_selector_base = {base}: inserting", total=inserts)
                for index in range(inserts):
                    query(f"INSERT INTO {name} SELECT {HASH} FROM numbers({index * args.ids}, {args.ids})")
                    progress.advance(task)
            fill_s = time.perf_counter() - began
            quiet = 0
            while quiet < 3:  # merges are assigned every few seconds: three empty looks in a row
                time.sleep(1)
                quiet = quiet + 1 if query("SELECT count() FROM system.merges").strip() == "0" else 0
            sizes = [int(v) for v in query(f"SELECT rows FROM system.parts WHERE table = '{name}' AND active "
                                           "ORDER BY rows DESC").split()]
            written = merged_rows() - before
            times = probes(query, name, args.rows, args.ids, args.rounds)
            median = statistics.median(times)
            base_median = base_median or median
            results["by_merge_selector_base"][base] = {
                "parts": len(sizes), "part_rows": sizes, "merged_rows": written,
                "write_amplification": (args.rows + written) / args.rows, "fill_s": fill_s,
                "probe_s": times, "probe_median_s": median, "ratio": median / base_median}
            table.add_row(base, str(len(sizes)), ", ".join(f"{n / 1e6:.1f} M" for n in sizes[:3]),
                          f"{written:,} ({(args.rows + written) / args.rows:.1f} x the ids)",
                          f"{median * 1000:.1f} ms", f"{median / base_median:.2f}")
            if base == args.bases[-1]:
                # The floor of every merge policy: the same hashes in one part.
                query(f"OPTIMIZE TABLE {name} FINAL")
                times = probes(query, name, args.rows, args.ids, args.rounds)
                median = statistics.median(times)
                results["one_part"] = {"probe_s": times, "probe_median_s": median,
                                       "per_id_us": median / args.ids * 1e6, "ratio": median / base_median}
                table.add_row("one part (OPTIMIZE FINAL)", "1", f"{args.rows / 1e6:.1f} M", "",
                              f"{median * 1000:.1f} ms ({median / args.ids * 1e6:.1f} µs an id)",
                              f"{median / base_median:.2f}")
            query(f"DROP TABLE {name} SYNC")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    console.print(table)
    write_results(MERGES_RESULTS, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="30,000,000 (300,000,000 with --merges)")
    parser.add_argument("--ids", type=int, default=15_000)
    parser.add_argument("--granularity", type=int, nargs="+", default=[256, 64])
    parser.add_argument("--merges", action="store_true", help="parts and probe per merge_selector_base")
    parser.add_argument("--bases", nargs="+", default=["5", "1.5"],
                        help="merge_selector_base values (--merges)")
    parser.add_argument("--rounds", type=int, default=None, help="5 (7 with --merges)")
    args = parser.parse_args(argv)
    args.rows = args.rows if args.rows is not None else (300_000_000 if args.merges else 30_000_000)
    args.rounds = args.rounds if args.rounds is not None else (7 if args.merges else 5)
    if args.rows < INSERTS or args.ids < 1 or args.rounds < 1 or min(args.granularity) < 1:
        parser.error("--rows >= 30, --ids >= 1, --rounds >= 1 and every --granularity >= 1")
    if args.merges:
        if args.rows < args.ids or any(not re.fullmatch(r"[0-9]+(\.[0-9]+)?", b) or float(b) <= 1
                                       for b in args.bases):
            parser.error("--merges needs --rows >= --ids and every --bases a number > 1")
        return merges(args)
    from chdb import session  # the engine, imported only when the benchmark runs

    home = tempfile.mkdtemp(prefix="gpumeter-id-lookup-")
    db = session.Session(home)

    def query(sql: str) -> str:
        return str(db.query(sql, "TSV").bytes().decode())

    results: dict[str, Any] = {"rows": args.rows, "ids": args.ids, "rounds": args.rounds,
                               "by_granularity": {}}
    try:
        query("CREATE DATABASE IF NOT EXISTS bench ENGINE = Atomic")
        query("USE bench")
        chunk = args.rows // INSERTS
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("filling", total=len(args.granularity) * INSERTS)
            for granularity in args.granularity:
                query(declared(f"hashes_{granularity}", "index_granularity", granularity))
                for index in range(INSERTS):
                    query(f"INSERT INTO hashes_{granularity} SELECT {HASH} "
                          f"FROM numbers({index * chunk}, {chunk})")
                    progress.advance(task)
                query(f"OPTIMIZE TABLE hashes_{granularity} FINAL")
        times: dict[int, list[float]] = {g: [] for g in args.granularity}
        rng = random.Random(7)
        for number in range(args.rounds):
            order = args.granularity if number % 2 == 0 else list(reversed(args.granularity))
            start = args.rows + rng.randrange(10 * args.rows)  # ids never stored
            for granularity in order:
                times[granularity].append(probe(query, f"hashes_{granularity}", start, args.ids))
        base = statistics.median(times[args.granularity[0]])
        table = Table("index_granularity", "parts", "primary index in memory", "probe median", "ratio",
                      title=f"probe of {args.ids:,} new ids in {args.rows:,} hashes, {args.rounds} rounds")
        for granularity in args.granularity:
            parts, index_bytes = query(
                "SELECT count(), sum(primary_key_bytes_in_memory) FROM system.parts "
                f"WHERE database = 'bench' AND table = 'hashes_{granularity}' AND active").split()
            median = statistics.median(times[granularity])
            results["by_granularity"][str(granularity)] = {
                "parts": int(parts), "primary_index_bytes": int(index_bytes),
                "probe_s": times[granularity], "probe_median_s": median, "ratio": median / base}
            table.add_row(str(granularity), parts, f"{int(index_bytes) / 1e6:.1f} MB",
                          f"{median * 1000:.1f} ms", f"{median / base:.2f}")
        console.print(table)
        write_results(RESULTS, results)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
