"""What the demo's end-to-end tests share: a demo run on services of its own."""

from __future__ import annotations

import os
from pathlib import Path

from tests.services import free_port


def demo_environment(tmp_path: Path) -> tuple[dict[str, str], str, int]:
    """The environment of a demo on services of its own (free ports, data under ``tmp_path``),
    none of the caller's GPUMETER_ settings; with its Kafka bootstrap and ClickHouse HTTP port."""
    bootstrap = f"127.0.0.1:{free_port()}"
    http_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMETER_")}
    env.update({
        "GPUMETER_DATA_DIR": str(tmp_path / "data"),
        "GPUMETER_KAFKA_BOOTSTRAP": bootstrap,
        "GPUMETER_KAFKA_CONTROLLER_PORT": str(free_port()),
        "GPUMETER_KAFKA_HEAP": "512m",
        "GPUMETER_CLICKHOUSE_DSN": f"http://127.0.0.1:{http_port}/gpumeter",
        "GPUMETER_WORKER_METRICS_PORT": "0",
    })
    return env, bootstrap, http_port
