"""The rating stage alone, beside a raw decode of the same bytes measured in the same run.

    .venv/bin/python -m benchmarks.stage [--samples 60000] [--repeat 5]

Records a simulated fleet's samples framed as the pipeline sends them (one record per
tenant, up to 500 lines: gpumeter/core/records.py), then times on one core, in CPU seconds
of this process (steadier than wall time on a shared machine), best of ``--repeat``:
- raw: split each record into lines and decode each line (stdlib json, and orjson);
- stage: what the worker's rating agent does per record, RatingStage.rate_record (rows with
  their rated lines, and the rated record joined from them: streams/rating_agent.py), with the native
  path (native/, streams/native_rating.py) as the worker runs it;
- python: the same with the Python path alone (``RatingStage(..., native=False)``).
Prints samples/s and the ratios to raw; ratios travel better than absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from benchmarks.result_file import write_results
from collectors.sim.fleet import FleetConfig, SimulatedFleet
from gpumeter.core import jsonio
from gpumeter.core.ratecard import load_rate_cards
from gpumeter.core.records import RecordBatcher, join, split
from gpumeter.core.settings import load_settings
from streams.stage import RatingStage

console = Console()
RESULTS = Path(__file__).resolve().parent / "results" / "stage-latest.json"


def fleet_lines(count: int) -> list[bytes]:
    """``count`` sample lines of the pipeline benchmark's simulated fleet."""
    fleet = SimulatedFleet(FleetConfig(seed=3, window_seconds=60,
                                       nodes={"H100-SXM-80GB": 40, "A100-SXM-40GB": 12, "L40S-48GB": 12}))
    samples: list[dict[str, object]] = []
    while len(samples) < count:
        samples.extend(fleet.step_dicts())
    return [jsonio.dumpb(sample) for sample in samples[:count]]


def recorded_records(count: int, path: Path | None) -> list[bytes]:
    """``count`` samples framed into Kafka record values as a node agent sends them (one
    record per tenant and window). With ``path``: the sample lines stored there (an ingest
    file), recorded from the fleet first if the file does not exist, so that two versions
    of the code can be timed on the very same bytes."""
    if path is not None and path.exists():
        lines = [line for line in path.read_bytes().split(b"\n") if line.strip()][:count]
    else:
        lines = fleet_lines(count)
        if path is not None:
            path.write_bytes(b"\n".join(lines) + b"\n")
    batcher = RecordBatcher()
    framed = [ready for line in lines if (ready := batcher.add(orjson.loads(line)["tenant"].encode(), line))]
    framed.extend(batcher.drain())
    return [record for _key, record, _lines in framed]


def cpu_seconds(run: Callable[[], int], repeat: int) -> tuple[float, int]:
    """Best CPU time of ``repeat`` runs, and the samples the run reported."""
    best, handled = float("inf"), 0
    for _ in range(repeat):
        started = time.process_time()
        handled = run()
        best = min(best, time.process_time() - started)
    return best, handled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--record-file", type=Path,
                        help="sample lines to time (recorded there first if absent)")
    args = parser.parse_args(argv)

    record_values = recorded_records(args.samples, args.record_file)
    args.samples = sum(len(split(record)) for record in record_values)
    cards = load_rate_cards(load_settings().rate_cards)

    def raw_json() -> int:
        return sum(1 for record in record_values for line in split(record) if json.loads(line))

    def raw_orjson() -> int:
        return sum(1 for record in record_values for line in split(record) if orjson.loads(line))

    def rating(native: bool) -> Callable[[], int]:
        def run() -> int:
            # A fresh stage per run: its dedup window would otherwise see every id as a replay.
            stage = RatingStage(cards, "bench", native=native)
            rated_count = 0
            for offset, record in enumerate(record_values):
                rows, _dead = stage.rate_record(record, 0, offset)
                join([row[-1] for row in rows])
                rated_count += len(rows)
            return rated_count
        return run

    results: dict[str, float] = {"samples": args.samples, "records": len(record_values)}
    timings = {}
    for name, run in (("raw_json", raw_json), ("raw_orjson", raw_orjson), ("stage", rating(True)),
                      ("python", rating(False))):
        with console.status(f"{name}..."):
            seconds, handled = cpu_seconds(run, args.repeat)
        if handled != args.samples:
            console.print(f"[red]{name} handled {handled} of {args.samples} samples[/red]")
            return 1
        timings[name] = seconds
        results[f"{name}_per_s"] = args.samples / seconds
    results["ratio_vs_raw_json"] = results["stage_per_s"] / results["raw_json_per_s"]
    results["ratio_vs_raw_orjson"] = results["stage_per_s"] / results["raw_orjson_per_s"]
    results["python_ratio_vs_raw_orjson"] = results["python_per_s"] / results["raw_orjson_per_s"]
    results["native_vs_python"] = results["stage_per_s"] / results["python_per_s"]
    table = Table("measure", "value", title=f"rating stage, one core ({len(record_values)} records, "
                  f"{args.samples:,} samples, best of {args.repeat})", title_justify="left")
    table.add_row("raw split + json.loads", f"{results['raw_json_per_s']:,.0f} samples/s")
    table.add_row("raw split + orjson.loads", f"{results['raw_orjson_per_s']:,.0f} samples/s")
    table.add_row("stage (native): rate, JSON, row", f"{results['stage_per_s']:,.0f} samples/s "
                  f"({timings['stage'] / args.samples * 1e6:.1f} µs/sample)")
    table.add_row("  ratio vs raw json.loads", f"{results['ratio_vs_raw_json']:.3f}")
    table.add_row("  ratio vs raw orjson.loads", f"{results['ratio_vs_raw_orjson']:.3f}")
    table.add_row("the same, Python path alone", f"{results['python_per_s']:,.0f} samples/s "
                  f"({timings['python'] / args.samples * 1e6:.1f} µs/sample)")
    table.add_row("  ratio vs raw orjson.loads", f"{results['python_ratio_vs_raw_orjson']:.3f}")
    table.add_row("native / Python", f"{results['native_vs_python']:.2f}")
    console.print(table)
    write_results(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
