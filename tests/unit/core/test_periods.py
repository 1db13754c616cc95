"""A month is four ASCII digits, a dash and two: everywhere a period is read (issue 31, point 7)."""

from __future__ import annotations

import argparse

import pytest
from pydantic import BaseModel, ValidationError

from gpumeter.app.cli.arguments import yyyy_mm
from gpumeter.core.tenants import Month

NON_ASCII = [
    pytest.param("\u0662\u0660\u0662\u0666-11", id="arabic-indic-year"),
    pytest.param("2026-\u0661\u0661", id="arabic-indic-month"),
    pytest.param("\uff12\uff10\uff12\uff16-11", id="fullwidth-year"),
    pytest.param("\u09e8\u09e6\u09e8\u09ec-11", id="bengali-year"),
]


class _Period(BaseModel):
    period: Month


@pytest.mark.parametrize("text", NON_ASCII)
def test_the_model_refuses_a_month_in_non_ascii_digits(text: str) -> None:
    with pytest.raises(ValidationError):
        _Period(period=text)


@pytest.mark.parametrize("text", NON_ASCII)
def test_the_cli_refuses_a_month_in_non_ascii_digits(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        yyyy_mm(text)


def test_ascii_months_still_pass() -> None:
    assert _Period(period="2026-11").period == yyyy_mm("2026-11") == "2026-11"
