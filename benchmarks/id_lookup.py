"""The sink's id probe against the granule size of ``event_id_hashes``, same hashes, same run.

    .venv/bin/python -m benchmarks.id_lookup [--rows 30000000] [--ids 15000] [--granularity 256 64]
        [--rounds 5]

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
INSERTS = 30
HASH = "sipHash64(concat('id-', toString(number)))"  # the sink's sipHash64(event_id) of made-up ids


def declared(granularity: int) -> str:
    settings = (EVENT_ID_HASHES.settings or "").replace("index_granularity = 256",
                                                          f"index_granularity = {granularity}")
    return replace(EVENT_ID_HASHES, settings=settings).create_sql(f"hashes_{granularity}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--ids", type=int, default=15_000)
    parser.add_argument("--granularity", type=int, nargs="+", default=[256, 64])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rows < INSERTS or args.ids < 1 or args.rounds < 1 or min(args.granularity) < 1:
        parser.error("--rows >= 30, --ids >= 1, --rounds >= 1 and every --granularity >= 1")
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
                query(declared(granularity))
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
                began = time.perf_counter()
                found = query(f"SELECT count() FROM hashes_{granularity} WHERE id_hash IN "
                              f"(SELECT {HASH} FROM numbers({start}, {args.ids}))")
                times[granularity].append(time.perf_counter() - began)
                if found.strip() != "0":
                    raise AssertionError(f"ids never stored were found: {found.strip()}")
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
