"""gpumeter/core/jsonio.py: every malformed input is a JSONInputError with a reason, nothing else."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpumeter.core import jsonio

pytestmark = pytest.mark.security

# Python refuses to convert an integer literal longer than sys.get_int_max_str_digits() (4,300
# by default) with a plain ValueError: the attack of contract 1's poison (issue 31, point 1).
HUGE_INTEGER = "9" * 5_000


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(HUGE_INTEGER, id="bare-huge-integer"),
        pytest.param('{"priority": ' + HUGE_INTEGER + "}", id="huge-integer-in-object"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="deep-nesting"),
        pytest.param(b"\xff\xfe", id="not-utf8"),
        pytest.param("NaN", id="nan"),
        pytest.param('{"a": 1', id="truncated"),
    ],
)
def test_bad_json_is_a_json_input_error_with_a_reason(text: str | bytes) -> None:
    with pytest.raises(jsonio.JSONInputError) as raised:
        jsonio.loads(text)
    assert str(raised.value)


def test_a_long_but_convertible_integer_and_a_long_fraction_still_parse() -> None:
    assert jsonio.loads("9" * 4_000) == int("9" * 4_000)
    assert jsonio.loads("0." + "1" * 5_000) == Decimal("0." + "1" * 5_000)
