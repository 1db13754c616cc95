"""No command ever prints a password (issue 31, point 5): every CLI command that reaches
ClickHouse or Kafka is run with a distinctive password (ClickHouse ``password_file`` or a password
in the DSN, Kafka ``sasl_password_file``) against servers that are not there and against real
servers that refuse it; the password never appears in stdout, stderr or any file the command
wrote under its data directory.
"""

from __future__ import annotations

import subprocess
import sys
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


def start_all(settings: Settings, tmp: Path) -> dict[str, subprocess.Popen[str]]:
    """Every command at once (several wait out Kafka's bootstrap timeout)."""
    env = settings_env(settings)
    return {
        name: subprocess.Popen([sys.executable, "-m", "gpumeter.app.cli", *argv], env=env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               text=True)
        for name, argv in commands(tmp).items()
    }


def outputs_of(running: dict[str, subprocess.Popen[str]]) -> dict[str, subprocess.CompletedProcess[str]]:
    outputs = {}
    for name, process in running.items():
        try:
            stdout, stderr = process.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        outputs[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return outputs


def assert_never_printed(setup: str, tmp: Path, outputs: dict[str, subprocess.CompletedProcess[str]],
                         failure: int = 1) -> None:
    for name, result in outputs.items():
        assert PASSWORD not in result.stdout + result.stderr, (setup, name, result.stdout, result.stderr)
        # Every command failed here for want of its services (1) or of a usable DSN (2), with
        # one line saying why; status reports instead.
        if name not in ("status", "status-json"):
            assert result.returncode in (1, failure), (setup, name, result.returncode, result.stderr)
            assert result.stderr.strip(), (setup, name)
    written = [path for path in tmp.rglob("*") if path.is_file() and path.name != "password"]
    for path in written:
        assert PASSWORD.encode() not in path.read_bytes(), (setup, path)


def test_no_command_prints_a_password(settings: Settings, endpoints: Endpoints, tmp_path: Path) -> None:
    """Four setups, every command of each, all run at once (most of the time is waiting):
    - the servers are not there (password from files);
    - the password written in the DSN;
    - a DSN that does not parse, password in it (usage error, exit 2);
    - the real servers refuse it: the test ClickHouse's user has no password, and the test
      Kafka listener is plaintext, so the SASL handshake is refused."""
    def nowhere() -> str:
        return f"127.0.0.1:{closed_port()}"

    host = endpoints.clickhouse_url.split("://", 1)[1].rpartition("@")[2]
    database = settings.clickhouse.dsn.rpartition("/")[2]
    setups = {  # name: (ClickHouse DSN, Kafka bootstrap, password file, exit code of a failure)
        "servers absent": (f"http://gpumeter@{nowhere()}/gpumeter", nowhere(), True, 1),
        "password in the DSN": (f"http://gpumeter:{PASSWORD}@{nowhere()}/gpumeter", nowhere(), False, 1),
        "DSN that does not parse": (f"http://gpumeter:{PASSWORD}@127.0.0.1:port/db", nowhere(), False, 2),
        "servers refuse": (f"http://default@{host}/{database}", endpoints.kafka_bootstrap, True, 1),
    }
    running = {}
    for index, (setup, (dsn, bootstrap, password_file, _failure)) in enumerate(setups.items()):
        tmp = tmp_path / f"setup-{index}"
        tmp.mkdir()
        configured = with_secrets(settings, tmp, clickhouse_dsn=dsn, kafka_bootstrap=bootstrap,
                                  password_file=password_file)
        running[setup] = (tmp, start_all(configured, tmp))
    for setup, (tmp, processes) in running.items():
        assert_never_printed(setup, tmp, outputs_of(processes), failure=setups[setup][3])
