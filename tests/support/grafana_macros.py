"""What Grafana and the ClickHouse plugin do to a panel's SQL before ClickHouse sees it.

A reimplementation for tests, rule for rule, of two stages (sources read: the plugin's
``src/data/CHDatasource.ts`` and ``pkg/macros/macros.go`` as of plugin 4.3.x, and
``data/sqlutil/macros.go`` of grafana-plugin-sdk-go, which the plugin's backend uses):

1. In the browser (``CHDatasource.applyTemplateVariables``):
   a. ``$__conditionalAll(phrase, $var)``, innermost-last (``lastIndexOf``): replaced by ``1=1``
      when the variable's current value, as a string, is empty or ``$__all``, else by
      ``phrase`` untrimmed. Arguments split at commas at bracket depth 1.
   b. Grafana's template variables (``$var``, ``${var}``, ``${var:format}``, ``[[var]]``),
      with the plugin's default format (a list becomes ``'a','b'``, a single value stays
      bare) and Grafana's named formats. "All" without a custom all-value means every
      option. Unknown names stay as written (``$__timeFilter`` is one: the backend's).
      Built-ins: ``$__from``/``$__to`` (epoch ms; ``:date:seconds``, ``:date:iso``),
      ``$__interval``, ``$__interval_ms``, ``$__range_s``, ``$__range_ms``.
2. In the plugin's backend (``sqlutil.Interpolate`` with the plugin's macros on top of the
   SDK's defaults): macro names longest first; each ``$__name\\b`` occurrence takes the
   bracketed argument list that starts right after it (balanced brackets; arguments split
   at depth-1 commas and trimmed; a missing ``)`` is an error); the expansion replaces every
   occurrence of that exact text. Times are Unix seconds (``toDateTime(N)``) or
   milliseconds (``fromUnixTimestamp64Milli(N)``); ``$__timeFilter`` is inclusive at both
   ends; ``$__timeInterval``/``$__interval_s`` use the request interval in whole seconds,
   at least 1.

Anything left that still looks like a macro or variable after both stages raises: a query
the real plugin would send to ClickHouse broken must fail the test here, not pass quietly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

ALL = "$__all"


class MacroError(ValueError):
    """The plugin would refuse this query (bad argument count, unbalanced brackets, ...)."""


@dataclass(frozen=True)
class Variable:
    """A dashboard variable's state: its options and what is selected (``["$__all"]`` for All)."""

    current: Sequence[str]
    options: Sequence[str] = ()
    multi: bool = False
    all_value: str | None = None

    def value(self) -> str | list[str]:
        if list(self.current) == [ALL]:
            if self.all_value is not None:
                return self.all_value
            return list(self.options)
        if self.multi:
            return list(self.current)
        return self.current[0] if self.current else ""


@dataclass(frozen=True)
class Request:
    time_from: datetime
    time_to: datetime
    interval: timedelta
    variables: Mapping[str, Variable] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.time_from.tzinfo is None or self.time_to.tzinfo is None:
            raise ValueError("request times must be timezone-aware")


def expand(sql: str, request: Request) -> str:
    """The SQL the plugin sends to ClickHouse for ``sql`` under ``request``."""
    text = apply_conditional_all(sql, request.variables)
    text = replace_variables(text, request)
    text = interpolate(text, request)
    leftover = re.search(r"\$__\w+|\$\{[^}]*\}|\[\[\w+\]\]|\$[A-Za-z_]\w*", text)
    if leftover:
        raise MacroError(f"unexpanded {leftover.group(0)!r} would reach ClickHouse")
    return text


# ---------------------------------------------------------------- stage 1a: $__conditionalAll


def _macro_args(text: str, open_index: int) -> list[str]:
    """CHDatasource.getMacroArgs: from the '(' at ``open_index``, depth-1 comma-split, untrimmed."""
    args: list[str] = []
    depth = 0
    last = open_index + 1
    for match in re.finditer(r"\(|\)|,", text[open_index:]):
        token, end = match.group(0), open_index + match.end()
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        if token == "," and depth == 1:
            args.append(text[last:end - 1])
            last = end
        if depth == 0:
            args.append(text[last:end - 1])
            return args
    return []


def apply_conditional_all(sql: str, variables: Mapping[str, Variable]) -> str:
    macro = "$__conditionalAll("
    index = sql.rfind(macro)
    while index != -1:
        params = _macro_args(sql, index + len(macro) - 1)
        if len(params) != 2:
            return sql  # the plugin gives up and leaves the text as it is
        name = params[1].strip()[1:]
        variable = variables.get(name)
        value = ",".join(variable.current) if variable is not None else None
        phrase = "1=1" if value in ("", ALL) else params[0]
        sql = sql.replace(f"{macro}{params[0]},{params[1]})", phrase, 1)
        index = sql.rfind(macro)
    return sql


# ---------------------------------------------------------------- stage 1b: template variables

# Grafana's variable syntax (public/app/features/variables/utils.ts, variableRegex).
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}")


def _plugin_format(value: str | list[str]) -> str:
    """CHDatasource.format: a list becomes 'a','b' (no escaping); a single value stays bare."""
    if isinstance(value, list):
        return "'" + "','".join(value) + "'"
    return value


def _named_format(value: str | list[str], fmt: str) -> str:
    values = value if isinstance(value, list) else [value]
    if fmt == "singlequote":
        return ",".join("'" + v.replace("'", "\\'") + "'" for v in values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "raw":
        return ",".join(values) if isinstance(value, list) else value
    if fmt == "pipe":
        return "|".join(values)
    raise MacroError(f"variable format {fmt!r} is not modelled by this test expander")


def seconds_to_hms(seconds: float) -> str:
    """Grafana's rangeutil.secondsToHms: the largest whole unit only (5400 s is "1h")."""
    years = math.floor(seconds / 31536000)
    if years:
        return f"{years}y"
    rest = seconds % 31536000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count = math.floor(rest / size)
        if count:
            return f"{count}{unit}"
        rest %= size
    milliseconds = math.floor(seconds * 1000)
    return f"{milliseconds}ms" if milliseconds else "less than a millisecond"


def _builtin(name: str, fmt: str | None, request: Request) -> str | None:
    def epoch_ms(moment: datetime) -> int:
        return int(moment.timestamp() * 1000)

    interval_ms = int(request.interval.total_seconds() * 1000)
    if name in ("__from", "__to"):
        moment = request.time_from if name == "__from" else request.time_to
        if fmt is None:
            return str(epoch_ms(moment))
        if fmt == "date:seconds":
            return str(epoch_ms(moment) // 1000)
        if fmt in ("date", "date:iso"):
            return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        raise MacroError(f"${{{name}:{fmt}}} is not modelled by this test expander")
    span = request.time_to - request.time_from
    values: dict[str, str] = {
        "__interval": seconds_to_hms(interval_ms / 1000),
        "__interval_ms": str(interval_ms),
        "__range_s": str(int(span.total_seconds())),
        "__range_ms": str(int(span.total_seconds() * 1000)),
    }
    return values.get(name)


def replace_variables(sql: str, request: Request) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(4)
        fmt = match.group(3) or match.group(6)
        if match.group(5):
            raise MacroError(f"variable field paths ({match.group(0)}) are not modelled")
        builtin = _builtin(name, fmt, request)
        if builtin is not None:
            return builtin
        variable = request.variables.get(name)
        if variable is None:
            return match.group(0)  # Grafana leaves unknown names alone
        value = variable.value()
        return _named_format(value, fmt) if fmt else _plugin_format(value)

    return _VARIABLE.sub(substitute, sql)


# ---------------------------------------------------------------- stage 2: backend macros

Macro = Callable[[Request, list[str] | None], str]


def _one_arg(name: str, args: list[str] | None) -> str:
    if args is None or len(args) != 1:
        raise MacroError(f"$__{name}: unexpected number of arguments: expected 1, received "
                         f"{0 if args is None else len(args)}")
    return args[0]


def _seconds(moment: datetime) -> int:
    return math.floor(moment.timestamp())  # Go's time.Unix(): whole seconds, toward -inf


def _date_time(moment: datetime) -> str:
    return f"toDateTime({_seconds(moment)})"


def _date_time64(moment: datetime) -> str:
    return f"fromUnixTimestamp64Milli({math.floor(moment.timestamp() * 1000)})"


def _date(moment: datetime) -> str:
    return f"toDate('{moment.astimezone(UTC):%Y-%m-%d}')"


def _interval_seconds(request: Request) -> int:
    return int(max(request.interval.total_seconds(), 1))


def _time_filter(request: Request, args: list[str] | None) -> str:
    column = _one_arg("timeFilter", args)
    return (f"{column} >= {_date_time(request.time_from)} AND "
            f"{column} <= {_date_time(request.time_to)}")


def _time_filter_ms(request: Request, args: list[str] | None) -> str:
    column = _one_arg("timeFilter_ms", args)
    return (f"{column} >= {_date_time64(request.time_from)} AND "
            f"{column} <= {_date_time64(request.time_to)}")


def _date_filter(request: Request, args: list[str] | None) -> str:
    column = _one_arg("dateFilter", args)
    return f"{column} >= {_date(request.time_from)} AND {column} <= {_date(request.time_to)}"


def _date_time_filter(request: Request, args: list[str] | None) -> str:
    if args is None or len(args) != 2:
        raise MacroError("$__dateTimeFilter: expected 2 arguments")
    date_column, time_column = args
    return (f"({date_column} >= {_date(request.time_from)} AND {date_column} <= {_date(request.time_to)})"
            f" AND ({time_column} >= {_date_time(request.time_from)} AND "
            f"{time_column} <= {_date_time(request.time_to)})")


def _time_interval(request: Request, args: list[str] | None) -> str:
    column = _one_arg("timeInterval", args)
    return f"toStartOfInterval(toDateTime({column}), INTERVAL {_interval_seconds(request)} second)"


def _time_interval_ms(request: Request, args: list[str] | None) -> str:
    column = _one_arg("timeInterval_ms", args)
    milliseconds = int(max(request.interval.total_seconds() * 1000, 1))
    return f"toStartOfInterval(toDateTime64({column}, 3), INTERVAL {milliseconds} millisecond)"


def _sdk_time_from(request: Request, args: list[str] | None) -> str:
    column = _one_arg("timeFrom", args)
    return f"{column} >= '{request.time_from.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}'"


def _sdk_time_to(request: Request, args: list[str] | None) -> str:
    column = _one_arg("timeTo", args)
    return f"{column} <= '{request.time_to.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}'"


def _unsupported(name: str) -> Macro:
    def refuse(request: Request, args: list[str] | None) -> str:
        raise MacroError(f"$__{name} has no meaning for the ClickHouse plugin (SQL Server syntax / no table)")

    return refuse


MACROS: dict[str, Macro] = {
    # grafana-plugin-sdk-go sqlutil.DefaultMacros ...
    "interval": lambda request, _: seconds_to_hms(request.interval.total_seconds()),
    "interval_ms": lambda request, _: str(int(request.interval.total_seconds() * 1000)),
    "timeFrom": _sdk_time_from,
    "timeTo": _sdk_time_to,
    "timeGroup": _unsupported("timeGroup"),
    "table": _unsupported("table"),
    "column": _unsupported("column"),
    # ... overridden and extended by the plugin's pkg/macros.Macros.
    "fromTime": lambda request, _: _date_time(request.time_from),
    "toTime": lambda request, _: _date_time(request.time_to),
    "fromTime_ms": lambda request, _: _date_time64(request.time_from),
    "toTime_ms": lambda request, _: _date_time64(request.time_to),
    "timeFilter": _time_filter,
    "timeFilter_ms": _time_filter_ms,
    "dateFilter": _date_filter,
    "dateTimeFilter": _date_time_filter,
    "dt": _date_time_filter,
    "timeInterval": _time_interval,
    "timeInterval_ms": _time_interval_ms,
    "interval_s": lambda request, _: str(_interval_seconds(request)),
}


def parse_args(text: str) -> tuple[list[str] | None, int]:
    """sqlutil.parseArgs: a bracketed list right at the start of ``text`` -> (args, length)."""
    if not text.startswith("("):
        return None, 0
    args: list[str] = []
    depth = 0
    current: list[str] = []
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
            if depth == 1:
                continue
        elif char == ")":
            depth -= 1
            if depth == 0:
                args.append("".join(current).strip())
                return args, index + 1
        elif char == "," and depth == 1:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    return None, -1


def interpolate(sql: str, request: Request) -> str:
    for name in sorted(MACROS, key=len, reverse=True):
        pattern = re.compile(r"\$__" + re.escape(name) + r"\b", re.ASCII)
        matches = []
        for found in pattern.finditer(sql):
            args, length = parse_args(sql[found.end():])
            if length < 0:
                raise MacroError("failed to parse macro arguments (missing close bracket?)")
            matches.append((sql[found.start():found.end() + length], args))
        for full, args in matches:
            sql = sql.replace(full, MACROS[name](request, args))
    return sql
