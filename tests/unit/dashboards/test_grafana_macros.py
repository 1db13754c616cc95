"""The test expander does what Grafana and the ClickHouse plugin do (expected strings written by
hand from the plugin's Go and TypeScript sources, see tests/support/grafana_macros.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.grafana_macros import (
    ALL,
    MacroError,
    Request,
    Variable,
    apply_conditional_all,
    expand,
    interpolate,
    parse_args,
    replace_variables,
    seconds_to_hms,
)

# 2026-11-01T00:00:00Z = 1793491200 s; 2026-11-03T12:30:15.250Z = 1793709015250 ms.
FROM = datetime(2026, 11, 1, tzinfo=UTC)
TO = datetime(2026, 11, 3, 12, 30, 15, 250000, tzinfo=UTC)
TENANTS = Variable(current=["team-a", "team-b"], options=["research", "team-a", "team-b"], multi=True)


def request(interval: float = 3600, **variables: Variable) -> Request:
    return Request(FROM, TO, timedelta(seconds=interval), variables)


def test_time_filter_is_inclusive_whole_seconds_and_time_macros_keep_their_own_precision() -> None:
    sql = "SELECT 1 WHERE $__timeFilter(hour) AND x < $__toTime_ms AND y > $__fromTime AND z < $__toTime"
    assert expand(sql, request()) == (
        "SELECT 1 WHERE hour >= toDateTime(1793491200) AND hour <= toDateTime(1793709015)"
        " AND x < fromUnixTimestamp64Milli(1793709015250) AND y > toDateTime(1793491200)"
        " AND z < toDateTime(1793709015)"
    )


def test_macro_arguments_keep_nested_calls_and_every_identical_occurrence_is_replaced() -> None:
    sql = "$__timeFilter(toDateTime(ts, 'UTC')) OR $__timeFilter(toDateTime(ts, 'UTC'))"
    expected = ("toDateTime(ts, 'UTC') >= toDateTime(1793491200) AND "
                "toDateTime(ts, 'UTC') <= toDateTime(1793709015)")
    assert interpolate(sql, request()) == f"{expected} OR {expected}"


def test_time_interval_and_interval_seconds_use_whole_seconds_of_at_least_one() -> None:
    assert interpolate("$__timeInterval(hour) / $__interval_s", request(3600)) == (
        "toStartOfInterval(toDateTime(hour), INTERVAL 3600 second) / 3600")
    assert interpolate("$__interval_s", request(0.25)) == "1"
    assert interpolate("$__interval_s", request(90.9)) == "90"


def test_date_filters() -> None:
    assert interpolate("$__dateFilter(day)", request()) == (
        "day >= toDate('2026-11-01') AND day <= toDate('2026-11-03')")
    assert interpolate("$__dt(d, t)", request()) == (
        "(d >= toDate('2026-11-01') AND d <= toDate('2026-11-03')) AND "
        "(t >= toDateTime(1793491200) AND t <= toDateTime(1793709015))")


def test_bad_macro_calls_are_errors_as_in_the_plugin() -> None:
    with pytest.raises(MacroError, match="missing close bracket"):
        interpolate("WHERE $__timeFilter(hour", request())
    with pytest.raises(MacroError, match="expected 1"):
        interpolate("WHERE $__timeFilter", request())
    with pytest.raises(MacroError, match="expected 1"):
        interpolate("WHERE $__timeFilter(a, b)", request())
    with pytest.raises(MacroError):
        expand("SELECT $__timeGroup(t, hour)", request())


def test_argument_list_must_start_right_after_the_name() -> None:
    assert parse_args("(a, f(b, c)) rest") == (["a", "f(b, c)"], 12)
    assert parse_args(" (a)") == (None, 0)
    assert parse_args("(a") == (None, -1)
    # A macro without brackets does not swallow a later bracket (sqlds issue 82).
    assert interpolate("$__fromTime > f(1)", request()) == "toDateTime(1793491200) > f(1)"


def test_plugin_default_format_quotes_lists_and_leaves_single_values_bare() -> None:
    single = Variable(current=["team-a"])
    assert replace_variables("IN ($tenants) AND t = '$one' AND u = '${one}'",
                             request(tenants=TENANTS, one=single)) == (
        "IN ('team-a','team-b') AND t = 'team-a' AND u = 'team-a'")


def test_named_formats_and_all_expands_to_every_option() -> None:
    everyone = Variable(current=[ALL], options=["o'neil", "team-a"], multi=True)
    assert replace_variables("IN (${t:singlequote})", request(t=everyone)) == "IN ('o\\'neil','team-a')"
    assert replace_variables("${t:csv}", request(t=TENANTS)) == "team-a,team-b"
    custom_all = Variable(current=[ALL], options=["a"], multi=True, all_value="%")
    assert replace_variables("LIKE '${t:raw}'", request(t=custom_all)) == "LIKE '%'"
    with pytest.raises(MacroError):
        replace_variables("${t:json}", request(t=TENANTS))


def test_conditional_all_drops_the_condition_for_all_or_empty_and_keeps_it_otherwise() -> None:
    sql = "WHERE $__conditionalAll(tenant IN (${tenant:singlequote}), $tenant) AND x"
    assert apply_conditional_all(sql, {"tenant": Variable(current=[ALL], multi=True)}) == "WHERE 1=1 AND x"
    assert apply_conditional_all(sql, {"tenant": Variable(current=[], multi=True)}) == "WHERE 1=1 AND x"
    assert expand(sql, request(tenant=TENANTS)) == "WHERE tenant IN ('team-a','team-b') AND x"


def test_conditional_all_with_a_wrong_argument_count_is_left_alone_and_then_fails() -> None:
    sql = "WHERE $__conditionalAll(a = 1) AND x"
    assert apply_conditional_all(sql, {}) == sql
    with pytest.raises(MacroError, match="conditionalAll"):
        expand(sql, request())


def test_builtins_and_unknown_variables() -> None:
    assert replace_variables("$__from $__to ${__from:date:seconds} $__interval $__interval_ms $__range_s",
                             request(5400)) == (
        "1793491200000 1793709015250 1793491200 1h 5400000 217815")
    with pytest.raises(MacroError, match=r"\$nobody"):
        expand("SELECT $nobody", request())


def test_seconds_to_hms_keeps_the_largest_unit() -> None:
    assert [seconds_to_hms(s) for s in (90000, 3600, 5400, 600, 59, 0.5, 0)] == [
        "1d", "1h", "1h", "10m", "59s", "500ms", "less than a millisecond"]
