"""Fixtures of the agent's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.collectors.agent import node_rig


@pytest.fixture
def socket_path() -> Path:
    """A fresh path for a PodResources server's Unix socket."""
    return node_rig.socket_path()
