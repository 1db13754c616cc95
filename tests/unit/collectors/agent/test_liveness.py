"""The agent's liveness endpoint: /healthz fails once the last completed collection cycle is older than
three windows (a stalled loop), while /metrics keeps answering."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from collectors.agent.metrics import AgentMetrics

pytestmark = pytest.mark.agent


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_healthz_fails_when_the_last_completed_cycle_is_older_than_three_windows() -> None:
    clock = Clock()
    metrics = AgentMetrics(interval=15, clock=clock)
    port = free_port()
    server, _thread = metrics.serve(port, addr="127.0.0.1")
    try:
        assert status(port, "/healthz") == 200  # starting: the first cycle is still to come
        clock.now += 45  # three windows and no cycle yet: still within the limit
        assert status(port, "/healthz") == 200
        clock.now += 1
        assert status(port, "/healthz") == 503
        metrics.cycle_completed()
        assert status(port, "/healthz") == 200
        clock.now += 46  # the loop stalled after that cycle
        assert status(port, "/healthz") == 503
        assert status(port, "/metrics") == 200  # the scrape endpoint is not the probe
        assert status(port, "/elsewhere") == 404
    finally:
        server.shutdown()
        server.server_close()


def test_the_cycle_age_is_a_metric() -> None:
    from prometheus_client import generate_latest

    clock = Clock()
    metrics = AgentMetrics(interval=15, clock=clock)
    metrics.cycle_completed()
    clock.now += 20
    text = generate_latest(metrics.registry).decode()
    assert "gpumeter_agent_last_cycle_age_seconds 20.0" in text
