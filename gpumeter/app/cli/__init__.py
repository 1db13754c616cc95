"""The `gpumeter` command. Components are imported inside the command that needs them.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input. Errors are one line
on stderr; a traceback is printed only with GPUMETER_DEBUG=1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import NoReturn

from gpumeter.app.cli.errors import UsageError
from gpumeter.core.config_files import ConfigError
from gpumeter.core.settings import Settings, load_settings

PERIOD = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")




def _period(value: str) -> str:
    if not PERIOD.match(value):
        raise argparse.ArgumentTypeError(f"period must be YYYY-MM, got {value!r}")
    return value


def _rfc3339(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an RFC 3339 time, got {value!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"the time needs an offset (e.g. Z), got {value!r}")
    return moment


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpumeter: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpumeter", description="GPU metering, quotas and billing")
    parser.add_argument("--config", type=Path, help="settings YAML (default: $GPUMETER_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    commands.add_parser("demo", help="run the whole pipeline on a simulated fleet").add_argument(
        "--seconds", type=_positive_float, default=60.0, help="wall time of the simulated run")
    commands.add_parser("up", help="start the local Kafka broker and ClickHouse server")
    commands.add_parser("down", help="stop them")
    commands.add_parser("status", help="show what runs where")

    collect = commands.add_parser("collect", help="node agent")
    collect.add_argument("--source", choices=["nvml", "simulated"], required=True)
    collect.add_argument("--seed", type=int, default=7)
    collect.add_argument("--windows", type=int, default=0, help="simulated: stop after N windows (0: never)")
    collect.add_argument("--speed", type=_positive_float, default=None,
                         help="simulated: windows per second (default: as fast as possible)")

    worker = commands.add_parser("worker", help="stream processors (rating, quotas, sink)")
    worker.add_argument("--loglevel", default="warn", choices=["debug", "info", "warn", "error"])

    ingest = commands.add_parser("ingest", help="publish UsageSample lines from a file ('-' = stdin)")
    ingest.add_argument("file")

    invoice = commands.add_parser("invoice", help="invoices from ClickHouse; `invoice close` issues a month")
    # An optional verb, so every `gpumeter invoice --tenant ...` form parses as before.
    invoice.add_argument("action", nargs="?", choices=["close"],
                         help="close: issue every tenant's invoice of an ended month (numbered, stored, "
                              "never changed; later usage becomes numbered adjustments)")
    who = invoice.add_mutually_exclusive_group()  # required unless `close`: checked by the command
    who.add_argument("--tenant")
    who.add_argument("--all-tenants", action="store_true")
    invoice.add_argument("--period", type=_period, required=True, help="YYYY-MM (UTC)")
    invoice.add_argument("--format", choices=["csv", "json", "pdf"], default="json")
    invoice.add_argument("--paper", choices=["A4", "Letter"], default="A4", help="PDF page size")
    invoice.add_argument("--out", type=Path, default=Path("gpumeter-out"))
    invoice.add_argument("--finalize", action="store_true",
                         help="issue the invoice: it is stored and never changes; later usage "
                              "of the month goes on an adjustment invoice")

    drain = commands.add_parser("drain", help="wait until everything published is rated and stored")
    drain.add_argument("--timeout", type=_positive_float, default=300.0)

    insights = commands.add_parser("insights", help="idle GPUs, month-end and quota forecasts (advice only)")
    insights.add_argument("--at", type=_rfc3339, default=None,
                          help="evaluate as of this RFC 3339 time (default: the latest gpu window)")
    insights.add_argument("--threshold", type=_positive_float, default=0.05,
                          help="idle below this GPU utilization (0-1, default 0.05)")
    insights.add_argument("--sustain-minutes", type=_positive_float, default=60.0,
                          help="for at least this long (default 60)")
    insights.add_argument("--no-forecasts", action="store_true", help="idle GPUs only")
    insights.add_argument("--no-publish", action="store_true",
                          help="print only: no advice events, nothing written to ClickHouse")

    report = commands.add_parser("report", help="the offline finance report of one month (HTML and CSVs)")
    report.add_argument("--period", type=_period, required=True, help="YYYY-MM (UTC)")
    report.add_argument("--out", type=Path, default=Path("gpumeter-out"))

    reconcile = commands.add_parser("reconcile", help="prove invoices = rated usage = stored samples")
    reconcile.add_argument("--period", type=_period, required=True, help="YYYY-MM (UTC)")

    rerate = commands.add_parser("rerate", help="re-rate a stored month with the rate cards now loaded; "
                                                "a month with a final invoice gets an adjustment")
    rerate.add_argument("--period", type=_period, required=True, help="YYYY-MM (UTC)")
    rerate.add_argument("--tenant", help="one tenant (default: every tenant of the month)")
    rerate.add_argument("--dry-run", action="store_true", help="print the differences, write nothing")

    commands.add_parser("api", help="the tenant invoice API (HTTP)").add_argument(
        "--listen", help="HOST:PORT (default: api.listen, 127.0.0.1:8791)")

    hooks = commands.add_parser("hooks", help="scheduler extender HTTP service and quota actuator")
    hooks.add_argument("--dry-run", action="store_true",
                       help="actuator records every decision and acts on none (default: hooks.dry_run)")

    quota = commands.add_parser("quota", help="tenant quotas: usage against limits")
    quota_commands = quota.add_subparsers(dest="quota_command", required=True, parser_class=_Parser)
    quota_status = quota_commands.add_parser("status", help="each tenant's usage, limits and state")
    quota_status.add_argument("--tenant", help="one tenant (default: every tenant with a policy or usage)")
    quota_status.add_argument("--at", help="evaluate at this RFC 3339 time (default: the quota clock)")
    quota_status.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


# Command -> (module under gpumeter.app.cli, function). A command's module, and whatever it
# needs, is imported only when that command runs, so `gpumeter --help` stays fast.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("local", "up"), "down": ("local", "down"), "status": ("local", "status"),
    "worker": ("worker", "run"), "ingest": ("ingest", "run"), "drain": ("drain", "run"),
    "invoice": ("invoice", "run"), "collect": ("collect", "run"), "demo": ("demo", "run"),
    "insights": ("insights", "run"),
    "quota": ("quota", "run"),
    "reconcile": ("reconcile", "run"),
    "rerate": ("rerate", "run"),
    "report": ("report", "run"),
    "api": ("api", "run"),
    "hooks": ("hooks", "run"),
}


def _command(name: str) -> Callable[[Settings, argparse.Namespace], int]:
    module, function = COMMANDS[name]
    command: Callable[[Settings, argparse.Namespace], int] = getattr(
        importlib.import_module(f"gpumeter.app.cli.{module}"), function)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_quiet_client_libraries)
    try:
        settings = load_settings(args.config)
        return _command(args.command)(settings, args)
    except (UsageError, ConfigError) as exc:
        return _fail(2, exc)
    except KeyboardInterrupt:
        print("gpumeter: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the one place that turns failures into exit codes
        if os.environ.get("GPUMETER_DEBUG"):
            raise
        return _fail(1, exc)


# kafka-python logs every refused connection while a broker starts, and the HTTP stack under
# clickhouse-connect every retry; our own code turns a service that stays away into one clear
# error, so their chatter would only bury that line. (A handler filter, because
# clickhouse-connect resets the urllib3 logger's level when it is imported.)
_CHATTY = ("kafka", "urllib3", "clickhouse_connect")


def _quiet_client_libraries(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.CRITICAL or not record.name.startswith(_CHATTY)


def _fail(code: int, exc: BaseException) -> int:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"gpumeter: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
