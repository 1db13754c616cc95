"""The agent verifies the kubelet's serving certificate (issue 31, point 4).

A real HTTPS server on loopback stands in for the kubelet: its certificate is signed by a CA made
in the test (testkit.certs), for 127.0.0.1 as a kubelet's serving certificate names the node's IP.
The agent's client reads the stats with that CA; with another CA, or the system trust store, it
refuses with a reason naming the setting, sends no token and does not crash; it skips
verification only when told to, and says so once.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from collectors.agent import kubelet_stats
from collectors.agent.collector import AgentConfig
from collectors.agent.kubelet_stats import (
    KubeletCAError,
    KubeletStatsClient,
    KubeletStatsError,
    default_kubelet_ca,
)
from testkit.certs import CertificateAuthority

pytestmark = [pytest.mark.agent, pytest.mark.security]

SUMMARY = json.loads((Path(__file__).parent / "data" / "stats_summary.json").read_text())
TRAINER = "6f1c1f0a-1111-4a0e-9c1e-000000000001"


class _Kubelet(BaseHTTPRequestHandler):
    tokens: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        _Kubelet.tokens.append(self.headers.get("Authorization"))
        body = json.dumps(SUMMARY).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def cluster_ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path / "cluster", "cluster CA")


@pytest.fixture
def kubelet(cluster_ca: CertificateAuthority) -> Iterator[str]:
    serving = cluster_ca.issue("gpu-node-1", hosts=("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(serving.certificate, serving.key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Kubelet)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Kubelet.tokens.clear()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("agent-sa-token\n")
    return path


def test_the_cluster_ca_verifies_the_kubelet(kubelet: str, cluster_ca: CertificateAuthority,
                                             token: Path) -> None:
    stats = KubeletStatsClient(kubelet, token_path=token, ca_path=cluster_ca.certificate).fetch()
    assert TRAINER in stats.pods
    assert _Kubelet.tokens == ["Bearer agent-sa-token"]


def test_a_kubelet_signed_by_another_ca_is_refused_with_the_setting_named_and_no_token_sent(
    kubelet: str, token: Path, tmp_path: Path
) -> None:
    other = CertificateAuthority(tmp_path / "other", "other CA")
    client = KubeletStatsClient(kubelet, token_path=token, ca_path=other.certificate)
    for _ in range(2):  # every window fails the same way; the client stays usable (no crash loop)
        with pytest.raises(KubeletStatsError) as refused:
            client.fetch()
        reason = str(refused.value)
        assert "not trusted" in reason and str(other.certificate) in reason
        assert "GPUMETER_AGENT_KUBELET_CA" in reason and "GPUMETER_AGENT_KUBELET_INSECURE_TLS" in reason
    assert _Kubelet.tokens == []  # the handshake failed before any request carried the token


def test_without_a_ca_the_system_trust_store_refuses_a_cluster_signed_kubelet(
    kubelet: str, token: Path
) -> None:
    with pytest.raises(KubeletStatsError, match="the system trust store"):
        KubeletStatsClient(kubelet, token_path=token).fetch()
    assert _Kubelet.tokens == []


def test_insecure_reads_only_when_asked_and_says_so_once(
    kubelet: str, token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=kubelet_stats.__name__):
        client = KubeletStatsClient(kubelet, token_path=token, insecure=True)
        for _ in range(3):
            assert TRAINER in client.fetch().pods
    warnings = [r.getMessage() for r in caplog.records if "verification is off" in r.getMessage()]
    assert len(warnings) == 1 and kubelet in warnings[0]


def test_a_ca_file_that_cannot_be_read_is_a_configuration_error(kubelet: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.crt"
    with pytest.raises(KubeletCAError, match="GPUMETER_AGENT_KUBELET_CA"):
        KubeletStatsClient(kubelet, ca_path=missing)


def test_the_default_ca_is_the_service_accounts_when_the_pod_has_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service_account_ca = tmp_path / "ca.crt"
    monkeypatch.setattr(kubelet_stats, "CA_PATH", service_account_ca)
    assert default_kubelet_ca(None) is None  # not in a pod: the system trust store
    service_account_ca.write_text("PEM")
    assert default_kubelet_ca(None) == service_account_ca
    named = tmp_path / "kubelet-ca.crt"
    assert default_kubelet_ca(named) == named


@pytest.mark.parametrize(
    ("env", "ca", "insecure"),
    [
        ({}, None, False),
        ({"GPUMETER_AGENT_KUBELET_CA": "/etc/kubelet-ca/ca.crt"}, Path("/etc/kubelet-ca/ca.crt"), False),
        ({"GPUMETER_AGENT_KUBELET_INSECURE_TLS": "true"}, None, True),
        ({"GPUMETER_AGENT_KUBELET_INSECURE_TLS": "false"}, None, False),
        ({"GPUMETER_AGENT_KUBELET_INSECURE_TLS": ""}, None, False),
    ],
)
def test_agent_settings_verify_unless_told_otherwise(
    env: dict[str, str], ca: Path | None, insecure: bool
) -> None:
    config = AgentConfig.from_env({"NODE_IP": "10.0.0.7", **env})
    assert config.kubelet_url == "https://10.0.0.7:10250"
    assert (config.kubelet_ca, config.kubelet_insecure_tls) == (ca, insecure)
