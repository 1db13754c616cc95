"""No command ever prints a password (issue 31, point 5): every CLI command that reaches
ClickHouse or Kafka is run with a distinctive password (ClickHouse ``password_file`` or a password
in the DSN, Kafka ``sasl_password_file``) against servers that are not there and against real
servers that refuse it; the password never appears in stdout, stderr or any file the command
wrote under its data directory.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumeter.core.settings import KafkaSettings, Settings, settings_env
from tests.services import REPO, Endpoints, free_port

pytestmark = [pytest.mark.integration, pytest.mark.security]

PASSWORD = "Pw-9d2e-NEVER-PRINTED-41c7"


def commands(tmp: Path) -> dict[str, list[str]]:
    samples = tmp / "samples.jsonl"
    samples.write_text("{}\n")
    return {
        "status": ["status"],
        "status-json": ["status", "--json"],
        "migrate": ["migrate"],
        "invoice": ["invoice", "--tenant", "team-a", "--period", "2026-11", "--format", "json",
                    "--out", str(tmp / "invoices")],
        "invoice-all": ["invoice", "--all-tenants", "--period", "2026-11", "--format", "csv",
                        "--out", str(tmp / "invoices-all")],
        "reconcile": ["reconcile", "--period", "2026-11"],
        "report": ["report", "--period", "2026-11", "--out", str(tmp / "report")],
        "rerate": ["rerate", "--period", "2026-11"],
        "insights": ["insights"],
        "api": ["api", "--listen", f"127.0.0.1:{free_port()}"],
        "worker": ["worker"],
        "ingest": ["ingest", str(samples)],
        "drain": ["drain"],
        "collect": ["collect", "--source", "simulated"],
    }


def closed_port() -> int:
    return free_port()  # nothing listens on it once the probe socket is closed


def with_secrets(settings: Settings, tmp: Path, *, clickhouse_dsn: str, kafka_bootstrap: str,
                 password_file: bool) -> Settings:
    secret = tmp / "password"
    secret.write_text(PASSWORD + "\n")
    configured = settings.model_copy(deep=True)
    configured.data_dir = tmp / "data"
    configured.clickhouse.dsn = clickhouse_dsn
    configured.clickhouse.password_file = secret if password_file else None
    configured.kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=settings.kafka.topic_prefix,
                                     security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                     sasl_username="gpumeter", sasl_password_file=secret)
    return configured


def run_all(settings: Settings, tmp: Path) -> Iterator[tuple[str, subprocess.CompletedProcess[str]]]:
    """Every command at once (several wait out Kafka's bootstrap timeout): their outputs."""
    env = settings_env(settings)
    running = {
        name: subprocess.Popen([sys.executable, "-m", "gpumeter.app.cli", *argv], env=env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True)
        for name, argv in commands(tmp).items()
    }
    for name, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        yield name, subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def assert_never_printed(settings: Settings, tmp: Path, failure: int = 1) -> None:
    outputs = dict(run_all(settings, tmp))
    for name, result in outputs.items():
        assert PASSWORD not in result.stdout + result.stderr, (name, result.stdout, result.stderr)
        # Every command failed here for want of its services (1) or of a usable DSN (2), with
        # one line saying why; status reports instead.
        if name not in ("status", "status-json"):
            assert result.returncode in (1, failure), (name, result.returncode, result.stderr)
            assert result.stderr.strip(), name
    written = [path for path in tmp.rglob("*") if path.is_file() and path.name != "password"]
    for path in written:
        assert PASSWORD.encode() not in path.read_bytes(), path


def test_no_command_prints_a_password_when_the_servers_are_not_there(settings: Settings,
                                                                      tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{closed_port()}"
    configured = with_secrets(settings, tmp_path, clickhouse_dsn=f"http://gpumeter@{nowhere}/gpumeter",
                              kafka_bootstrap=f"127.0.0.1:{closed_port()}", password_file=True)
    assert_never_printed(configured, tmp_path)


def test_no_command_prints_a_password_written_in_the_dsn(settings: Settings, tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{closed_port()}"
    configured = with_secrets(settings, tmp_path, clickhouse_dsn=f"http://gpumeter:{PASSWORD}@{nowhere}/gpumeter",
                              kafka_bootstrap=f"127.0.0.1:{closed_port()}", password_file=False)
    assert_never_printed(configured, tmp_path)


def test_no_command_prints_the_password_of_a_dsn_it_cannot_parse(settings: Settings, tmp_path: Path) -> None:
    configured = with_secrets(settings, tmp_path, clickhouse_dsn=f"http://gpumeter:{PASSWORD}@127.0.0.1:port/db",
                              kafka_bootstrap=f"127.0.0.1:{closed_port()}", password_file=False)
    assert_never_printed(configured, tmp_path, failure=2)


def test_no_command_prints_a_password_the_real_servers_refuse(settings: Settings, endpoints: Endpoints,
                                                              tmp_path: Path) -> None:
    # The test ClickHouse's user has no password, so this one is refused; the test Kafka
    # listener is plaintext, so the SASL handshake is refused.
    host = endpoints.clickhouse_url.split("://", 1)[1].rpartition("@")[2]
    database = settings.clickhouse.dsn.rpartition("/")[2]
    configured = with_secrets(settings, tmp_path, clickhouse_dsn=f"http://default@{host}/{database}",
                              kafka_bootstrap=endpoints.kafka_bootstrap, password_file=True)
    assert_never_printed(configured, tmp_path)
