"""The `gpumeter` command. Components are imported inside the command that needs them.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or bad input. Errors are one line
on stderr; a traceback is printed only with GPUMETER_DEBUG=1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from gpumeter.app.cli.arguments import Parser
from gpumeter.app.cli.errors import UsageError
from gpumeter.core.config_files import ConfigError
from gpumeter.core.settings import Settings, load_settings


class Command(NamedTuple):
    module: str  # under gpumeter.app.cli: declares the command's arguments and runs it
    function: str
    help: str
    # The module's function that declares the command's arguments (None: it takes none).
    arguments: str | None = "add_arguments"


# In the order `gpumeter --help` lists them. A command's module, and whatever it needs, is
# imported only when that command is parsed, so `gpumeter --help` stays fast.
COMMANDS: dict[str, Command] = {
    "demo": Command("demo", "run", "run the whole pipeline on a simulated fleet"),
    "up": Command("local", "up", "start the local Kafka broker(s) and ClickHouse server",
                  arguments="up_arguments"),
    "down": Command("local", "down", "stop them", arguments=None),
    "status": Command("local", "status", "show what runs where", arguments="status_arguments"),
    "migrate": Command("migrate", "run", "apply the ClickHouse schema migrations (under a lock)"),
    "collect": Command("collect", "run", "node agent"),
    "worker": Command("worker", "run", "stream processors (rating, quotas, sink)"),
    "ingest": Command("ingest", "run", "publish UsageSample lines from a file ('-' = stdin)"),
    "invoice": Command("invoice", "run", "invoices from ClickHouse; `invoice close` issues a month"),
    "drain": Command("drain", "run", "wait until everything published is rated and stored"),
    "insights": Command("insights", "run", "idle GPUs, month-end and quota forecasts (advice only)"),
    "report": Command("report", "run", "the offline finance report of one month (HTML and CSVs)"),
    "reconcile": Command("reconcile", "run", "prove invoices = rated usage = stored samples"),
    "rerate": Command("rerate", "run", "re-rate a stored month with the rate cards now loaded; "
                                       "a month with a final invoice gets an adjustment"),
    "api": Command("api", "run", "the tenant invoice API (HTTP)"),
    "hooks": Command("hooks", "run", "scheduler extender HTTP service and quota actuator"),
    "quota": Command("quota", "run", "tenant quotas: usage against limits"),
    "budget": Command("budget", "run", "budget grants and top-ups; a tenant's limit, used, remaining"),
    "explain": Command("explain", "run", "why a GPU pod waits (quota, capacity, topology) and what would "
                                         "change it"),
}


class _CommandParser(Parser):
    """One command's parser: its module declares the arguments when the command is parsed."""

    def __init__(self, *args: Any, command: Command, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._declare: Command | None = command if command.arguments is not None else None

    def parse_known_args(  # type: ignore[override]  # the stubs overload it by namespace type
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._declare is not None:
            module = importlib.import_module(f"gpumeter.app.cli.{self._declare.module}")
            declare = getattr(module, str(self._declare.arguments))
            self._declare = None
            declare(self)
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="gpumeter", description="GPU metering, quotas and billing")
    parser.add_argument("--config", type=Path, help="settings YAML (default: $GPUMETER_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, command=command)
    return parser


def _command(name: str) -> Callable[[Settings, argparse.Namespace], int]:
    module, function = COMMANDS[name].module, COMMANDS[name].function
    command: Callable[[Settings, argparse.Namespace], int] = getattr(
        importlib.import_module(f"gpumeter.app.cli.{module}"), function)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_quiet_client_libraries)
    settings: Settings | None = None
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
        return _fail(1, _refused(exc, settings) or exc)


# kafka-python logs every refused connection while a broker starts, and the HTTP stack under
# clickhouse-connect every retry; our own code turns a service that stays away into one clear
# error, so their chatter would only bury that line. (A handler filter, because
# clickhouse-connect resets the urllib3 logger's level when it is imported.)
_CHATTY = ("kafka", "urllib3", "clickhouse_connect")


def _quiet_client_libraries(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.CRITICAL or not record.name.startswith(_CHATTY)


def _refused(exc: Exception, settings: Settings | None) -> str | None:
    """An operation Kafka's ACLs refused, said as who was refused what (None: not that)."""
    errors = sys.modules.get("kafka.errors")  # loaded by whichever command reached Kafka
    if settings is None or errors is None or not isinstance(exc, errors.AuthorizationError):
        return None
    from gpumeter.infra.kafka import refusal

    return refusal(settings.kafka, exc)


def _fail(code: int, exc: BaseException | str) -> int:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"gpumeter: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
