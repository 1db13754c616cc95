"""A rate card deployed while the worker runs prices the samples it covers, without a restart.

On the real broker and ClickHouse through `gpumeter worker` (contract 3.2: the card in force
at window_start). Before the watcher, the worker read its cards once at start.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse
from testkit.builders import rate_card, sample
from tests.integration.invoice_checks import publish_lines
from tests.services import run_cli, wait_until

pytestmark = pytest.mark.integration


def priced(settings: Settings) -> dict[str, tuple[str, Decimal]]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        rows = client.query("SELECT event_id, rate_card, unit_price FROM rated_usage FINAL").result_rows
    finally:
        client.close()
    return {event_id: (card, Decimal(price)) for event_id, card, price in rows}


def publish_and_drain(settings: Settings, *samples: dict[str, object]) -> None:
    publish_lines(settings, [json.dumps(s).encode() for s in samples])
    drained = run_cli(settings, "drain", "--timeout", "120")
    assert drained.returncode == 0, drained.stderr


def test_a_card_deployed_while_running_prices_the_windows_it_covers(
    settings: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    cards = tmp_path / "ratecards"
    cards.mkdir()
    (cards / "v1.yaml").write_text(yaml.safe_dump(rate_card()), encoding="utf-8")
    settings.rate_cards = cards
    settings.worker.rate_card_reload_seconds = 0.5
    worker = worker_factory(settings)

    publish_and_drain(settings, sample("before", start="2026-11-20T00:00:00Z"))
    (cards / "v2.yaml").write_text(yaml.safe_dump(rate_card(
        version="v2", effective_from="2026-11-15T00:00:00Z", rates=[{"kind": "gpu", "unit_price": "3.00"}],
    )), encoding="utf-8")
    (cards / "broken.yaml").write_text("version: v3\nrates: [{kind: tpu}]\n", encoding="utf-8")
    wait_until(lambda: "rate cards refused" in worker.log_tail(200), 60, "the broken card to be refused")
    (cards / "broken.yaml").unlink()
    wait_until(lambda: "rate cards reloaded" in worker.log_tail(200), 60, "the worker to load card v2")
    publish_and_drain(settings,
                      sample("after-in-v2", start="2026-11-20T01:00:00Z"),
                      sample("after-before-v2", start="2026-11-10T00:00:00Z"))

    assert priced(settings) == {
        "before": ("v1", Decimal("1.80")),  # stored before v2 existed: unchanged (rerate is separate)
        "after-in-v2": ("v2", Decimal("3.00")),
        "after-before-v2": ("v1", Decimal("1.80")),  # 2026-11-10 is before v2's effective_from
    }
    assert worker.alive()
