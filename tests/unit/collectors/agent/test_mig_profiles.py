"""MIG profile names: NVML's spellings and the device plugin's resource-name spellings."""

from __future__ import annotations

from decimal import Decimal

import pytest

from collectors.agent.mig import parse_profile, profile_in_name

pytestmark = pytest.mark.agent


@pytest.mark.parametrize(
    ("text", "nvml_name", "share_of_7"),
    [
        pytest.param("1g.5gb", "1g.5gb", Decimal(1) / 7, id="1g.5gb"),
        pytest.param("3g.40gb", "3g.40gb", Decimal(3) / 7, id="3g.40gb"),
        pytest.param("1c.3g.20gb", "1c.3g.20gb", Decimal(1) / 7, id="1c.3g.20gb"),
        pytest.param("2c.3g.20gb", "2c.3g.20gb", Decimal(2) / 7, id="2c.3g.20gb"),
        pytest.param("1g.10gb+me", "1g.10gb+me", Decimal(1) / 7, id="1g.10gb+me"),
        pytest.param("1g.10gb.me", "1g.10gb+me", Decimal(1) / 7, id="1g.10gb.me"),
        pytest.param("1g.23gb+me.all", "1g.23gb+me.all", Decimal(1) / 7, id="1g.23gb+me.all"),
        pytest.param("1g.23gb.me.all", "1g.23gb+me.all", Decimal(1) / 7, id="1g.23gb.me.all"),
        pytest.param("1g.23gb-me", "1g.23gb-me", Decimal(1) / 7, id="1g.23gb-me"),
        pytest.param("1g.23gb.gfx", "1g.23gb+gfx", Decimal(1) / 7, id="1g.23gb.gfx"),
    ],
)
def test_profile_spellings(text: str, nvml_name: str, share_of_7: Decimal) -> None:
    profile = parse_profile(text)
    assert profile is not None and profile.name == nvml_name and profile.share(7) == share_of_7


def test_malformed_profiles_are_not_profiles() -> None:
    assert parse_profile("7g.80gb.bogus") is None and parse_profile("gpu") is None
    assert parse_profile("") is None


def test_the_profile_of_an_nvml_mig_device_name() -> None:
    named = profile_in_name("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb")
    assert named is not None and named.name == "1c.3g.20gb" and named.compute_slices == 1
    assert profile_in_name("NVIDIA H100 80GB HBM3") is None
