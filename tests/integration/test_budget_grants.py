"""Budget grants on the real ClickHouse engine and the real broker (contract 4, amendment "grants").

- ``gpumeter budget grant`` numbers grants by claims: writers racing for one number get one
  each; bad input exits 2 naming the field and writes nothing.
- A grant that lifts a tenant above its use makes the worker publish ``recovered`` with the
  raised limit; after kill -9 and a replay of everything, the grant is still counted once
  (every crossing once, the same ids) and ``budget show`` adds it up.

Expected values by hand: 1 GPU x 1 h = 1 GPU-hour per sample.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from gpumeter.app.runtime.worker_process import WorkerProcess
from gpumeter.core import topics
from gpumeter.core.grants import GrantRecord
from gpumeter.core.settings import Settings
from gpumeter.infra import clickhouse, kafka
from gpumeter.infra import grants as store
from tests.integration.test_quota_stream import (
    committed_past,
    rewind_group,
    sample,
    stored_events,
    summary,
    topic_events,
)
from tests.services import run_cli, wait_until

pytestmark = pytest.mark.integration

TENANTS = """\
tenants:
  - tenant: alpha
    gpu_hours: 10
    on_exceed: block
  - tenant: beta
    spend: "100.00"
"""


def rows(settings: Settings) -> list[GrantRecord]:
    client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
    try:
        return store.read(client)
    finally:
        client.close()


def grant(settings: Settings, *args: str) -> tuple[int, str, str]:
    result = run_cli(settings, "budget", "grant", *args)
    return result.returncode, result.stdout, result.stderr


@pytest.fixture
def with_tenants(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    settings.tenants = path
    return settings


def test_bad_grants_exit_2_naming_the_field_and_write_nothing(with_tenants: Settings) -> None:
    settings = with_tenants
    code, out, _ = grant(settings, "--tenant", "alpha", "--gpu-hours", "5")
    assert code == 0 and out.startswith("grant #1: alpha gpu_hours 5.000000"), out
    bad = {
        ("--tenant", "nobody", "--gpu-hours", "1"): "--tenant: nobody is not in the tenants file",
        ("--tenant", "alpha", "--spend", "10.00"): "metric: tenant alpha has no spend limit",
        ("--tenant", "beta", "--spend", "1.234"): "--spend: '1.234' is not a number with at most 2 decimal",
        ("--tenant", "alpha", "--gpu-hours", "lots"): "--gpu-hours: not a number: 'lots'",
        ("--tenant", "alpha", "--gpu-hours", "2", "--effective", "2026-11-10T00:00:00Z",
         "--expires", "2026-11-09T00:00:00Z"):
            "expires_at: 2026-11-09T00:00:00+00:00 is not after effective_at",
        ("--tenant", "alpha", "--gpu-hours", "2", "--expires", "2020-01-01T00:00:00Z"): "expires_at: ",
        ("--tenant", "alpha", "--gpu-hours", "-1"): "amount: a grant adds a positive amount",
        ("--tenant", "alpha", "--gpu-hours", "-6", "--corrects", "1"): "amount: grant #1 has 5.000000 left",
        ("--tenant", "alpha", "--gpu-hours", "-1", "--corrects", "7"): "--corrects: #7 is not a grant",
        ("--tenant", "beta", "--spend", "-1.00", "--corrects", "1"):
            "--corrects: #1 is not a grant of tenant beta",
        ("--tenant", "alpha", "--gpu-hours", "-1", "--corrects", "1", "--rollover"):
            "--corrects: a correction",
    }
    for args, message in bad.items():
        code, out, err = grant(settings, *args)
        assert code == 2, (args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, err)
    assert [record.number for record in rows(settings)] == [1]
    # A correction within the balance is stored, numbered next.
    code, out, err = grant(settings, "--tenant", "alpha", "--gpu-hours", "-2", "--corrects", "1")
    assert code == 0 and out.startswith("correction #2: alpha gpu_hours -2.000000"), err
    assert [(r.number, r.amount, r.corrects) for r in rows(settings)] == [
        (1, Decimal(5), None), (2, Decimal(-2), 1)]


def test_writers_racing_for_a_number_get_one_each(with_tenants: Settings) -> None:
    settings = with_tenants
    now = datetime.now(UTC)
    draft = GrantRecord(number=1, tenant="alpha", metric="gpu_hours", amount=Decimal(1), effective_at=now,
                        granted_at=now)
    numbers: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        client = clickhouse.connect(settings.clickhouse.dsn, create_database=False)
        try:
            numbers.append(store.append(client, draft, lambda candidate, before: None).number)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=write) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(numbers) == [1, 2, 3, 4, 5, 6]
    assert sorted(record.number for record in rows(settings)) == [1, 2, 3, 4, 5, 6]


def ingest(settings: Settings, tmp_path: Path, name: str, pods: list[str], start: str) -> None:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(sample("alpha", pod, start)) + "\n" for pod in pods))
    result = run_cli(settings, "ingest", str(path))
    assert result.returncode == 0, result.stderr


def test_a_grant_recovers_a_tenant_once_through_a_worker_kill(
    with_tenants: Settings, worker_factory: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    settings = with_tenants
    settings.quota.reload_seconds = 0.5
    settings.quota.grants_poll_seconds = 0.5
    first = worker_factory(settings, "first")
    # 6 + 5 = 11 GPU-hours of 10: exceeded.
    ingest(settings, tmp_path, "one", [f"a{i}" for i in range(6)], "2026-11-10T00:00:00Z")
    ingest(settings, tmp_path, "two", [f"a{i}" for i in range(5)], "2026-11-10T01:00:00Z")
    exceeded = ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "11.000000", "10.000000")
    wait_until(lambda: exceeded in {summary(e) for e in topic_events(settings)}, 180,
               f"exceeded published; worker log: {first.log_tail()}")

    code, _, err = grant(settings, "--tenant", "alpha", "--gpu-hours", "5", "--effective",
                           "2026-11-01T00:00:00Z", "--note", "end-of-quarter top-up")
    assert code == 0, err
    # 11 < 10 + 5: recovered, showing the raised limit.
    recovered = ("alpha", "gpu_hours", "recovered", "1", "2026-11", "11.000000", "15.000000")
    wait_until(lambda: recovered in {summary(e) for e in topic_events(settings)}, 60,
               f"recovered published; worker log: {first.log_tail()}")
    first.kill9()
    rewind_group(settings)
    second = worker_factory(settings, "second")
    rated_end = kafka.end_offsets(settings.kafka, [settings.kafka.topic(topics.RATED)])
    wait_until(lambda: committed_past(settings, rated_end), 240,
               f"the second worker re-read every rated record; its log: {second.log_tail()}")
    # 4 more hours: 15 of 15, exceeded again under the raised limit (a new crossing).
    ingest(settings, tmp_path, "three", [f"a{i}" for i in range(4)], "2026-11-10T02:00:00Z")
    again = ("alpha", "gpu_hours", "exceeded", "1", "2026-11", "15.000000", "15.000000")
    wait_until(lambda: again in {summary(e) for e in topic_events(settings)}, 180,
               f"the second exceeded published; its log: {second.log_tail()}")

    published = topic_events(settings)
    by_id = {e["event_id"]: summary(e) for e in published}
    # Every crossing once (the replay republished the same ids, never a second recovered).
    assert sorted(by_id.values()) == sorted([exceeded, recovered, again])
    wait_until(lambda: len(stored_events(settings)) == 3, 60, "three crossings stored")

    shown = run_cli(settings, "budget", "show", "--tenant", "alpha", "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    [hours] = document["metrics"]
    assert hours["limit"] == "15.000000" and hours["base_limit"] == "10.000000"
    assert hours["used"] == "15.000000" and hours["remaining"] == "0.000000"
    assert [g["grant"] for g in hours["grants"]] == ["#1"]
    assert hours["runway"] == "exhausted"
    text = run_cli(settings, "budget", "show", "--tenant", "alpha")
    assert text.returncode == 0 and "limit 15.000000 = base 10.000000 + #1 5.000000" in text.stdout
