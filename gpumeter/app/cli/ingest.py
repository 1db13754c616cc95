"""`gpumeter ingest FILE`: publish UsageSample lines; report accepted and rejected counts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpumeter.app.cli.errors import UsageError
from gpumeter.core.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file")


def run(settings: Settings, args: argparse.Namespace) -> int:
    from gpumeter.app.ingest import ingest_lines
    from gpumeter.app.progress import byte_progress

    if args.file == "-":
        result = ingest_lines(sys.stdin.buffer, settings, source="ingest:stdin")
    else:
        path = Path(args.file)
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        with path.open("rb") as handle, byte_progress(path.stat().st_size, "ingest") as advance:
            result = ingest_lines(handle, settings, source=f"ingest:{path.name}", on_line=advance)
    for reason in result.reasons:
        print(reason, file=sys.stderr)
    if result.rejected > len(result.reasons):
        print(f"... and {result.rejected - len(result.reasons)} more rejected lines", file=sys.stderr)
    print(f"accepted {result.accepted}, rejected {result.rejected}")
    return 0 if result.rejected == 0 else 2
