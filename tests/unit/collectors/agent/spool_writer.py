"""Subprocess for the kill -9 test: appends numbered records in batches, printing each acknowledged batch.

``python -m tests.unit.collectors.agent.spool_writer DIR`` prints ``acked <last record number>``
after every ``Spool.append`` returned (i.e. after its fsync), forever, until killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from collectors.agent.spool import Spool


def main() -> None:
    spool = Spool(Path(sys.argv[1]), max_bytes=512 * 1024 * 1024, segment_bytes=64 * 1024)
    number = 0
    while True:
        batch = []
        for _ in range(50):
            number += 1
            batch.append(f"record-{number:09d}-".encode() + b"x" * (number % 200))
        spool.append(batch)
        sys.stdout.write(f"acked {number}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
