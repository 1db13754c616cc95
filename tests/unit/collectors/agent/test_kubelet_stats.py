"""Kubelet stats summary: parsing a recorded document of the documented shape, and fetching it over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from collectors.agent.kubelet_stats import KubeletStatsClient, KubeletStatsError, parse_summary

pytestmark = pytest.mark.agent

DATA = Path(__file__).parent / "data"
SUMMARY = json.loads((DATA / "stats_summary.json").read_text())
TRAINER = "6f1c1f0a-1111-4a0e-9c1e-000000000001"


def test_parse_recorded_summary() -> None:
    stats = parse_summary(SUMMARY)
    assert stats.node == "gpu-node-1"
    assert set(stats.pods) == {
        TRAINER,
        "6f1c1f0a-2222-4a0e-9c1e-000000000002",
        "6f1c1f0a-3333-4a0e-9c1e-000000000003",
    }
    trainer = stats.pods[TRAINER]
    assert (trainer.namespace, trainer.name) == ("team-a", "trainer-0")
    assert trainer.cpu_cores == Decimal("11.5")
    assert trainer.memory_working_set_bytes == 128 * 1024**3
    assert trainer.ephemeral_used_bytes == 5 * 1024**3
    pvc = [v for v in trainer.volumes if v.pvc_name]
    assert [(v.name, v.pvc_namespace, v.capacity_bytes) for v in pvc] == [
        ("checkpoints", "team-a", 500 * 1024**3)
    ]
    fresh = stats.pods["6f1c1f0a-3333-4a0e-9c1e-000000000003"]
    assert fresh.cpu_cores is None and fresh.memory_working_set_bytes is None and fresh.volumes == ()


def test_parse_rejects_non_objects() -> None:
    with pytest.raises(KubeletStatsError):
        parse_summary([1, 2])


class _Handler(BaseHTTPRequestHandler):
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        _Handler.seen_auth.append(self.headers.get("Authorization"))
        if self.path != "/stats/summary":
            self.send_error(404)
            return
        body = json.dumps(SUMMARY).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def kubelet() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_fetch_over_http_with_bearer_token(kubelet: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    _Handler.seen_auth.clear()
    stats = KubeletStatsClient(kubelet, token_path=token).fetch()
    assert TRAINER in stats.pods
    assert _Handler.seen_auth == ["Bearer s3cret"]


def test_fetch_failure_is_a_stats_error(tmp_path: Path) -> None:
    client = KubeletStatsClient("http://127.0.0.1:9", token_path=None, timeout=0.5)
    with pytest.raises(KubeletStatsError, match="kubelet stats"):
        client.fetch()
