"""CPU, memory and ephemeral storage per pod from the kubelet's stats summary (``/stats/summary``).

The document (kubelet ``stats/v1alpha1`` Summary) has ``node`` and ``pods[]``;
each pod carries ``podRef{name,namespace,uid}``, ``cpu.usageNanoCores``,
``memory.workingSetBytes``, ``ephemeral-storage.usedBytes`` and ``volume[]``
(``name``, ``usedBytes``, ``capacityBytes``, ``pvcRef``).

Reached directly on the kubelet (``https://$NODE_IP:10250/stats/summary``, the
ServiceAccount token as bearer, RBAC ``nodes/stats``) or through the API server's
node proxy (``/api/v1/nodes/<node>/proxy/stats/summary``, RBAC ``nodes/proxy``).

The kubelet's serving certificate is verified, host name (the node's IP) included, against the
CA the agent is given (``GPUMETER_AGENT_KUBELET_CA``), by default the cluster CA of the pod's
ServiceAccount: the kubelet's certificate is signed by it where the cluster issues kubelet
serving certificates (``serverTLSBootstrap``, EKS, GKE, AKS). The bearer token goes only to a
kubelet that proved itself so: sent to whoever answers on the node's port 10250 it would let
them read every pod's stats as the agent. Verification is off only when asked for
(``GPUMETER_AGENT_KUBELET_INSECURE_TLS=true``, for self-signed kubelet certificates), and the
agent says so once in its log.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TOKEN_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
CA_PATH = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


class KubeletStatsError(RuntimeError):
    pass


class KubeletCAError(KubeletStatsError):
    """The CA named to verify the kubelet cannot be loaded: a configuration error, found at start."""


@dataclass(frozen=True)
class VolumeUsage:
    name: str
    used_bytes: int | None
    capacity_bytes: int | None
    pvc_namespace: str | None = None
    pvc_name: str | None = None


@dataclass(frozen=True)
class PodUsage:
    uid: str
    namespace: str
    name: str
    cpu_cores: Decimal | None
    memory_working_set_bytes: int | None
    ephemeral_used_bytes: int | None
    volumes: tuple[VolumeUsage, ...] = ()


@dataclass(frozen=True)
class NodeStats:
    node: str
    pods: dict[str, PodUsage] = field(default_factory=dict)  # by pod UID


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    try:
        number = int(Decimal(str(value)))
    except ArithmeticError:
        return None
    return number if number >= 0 else None


def parse_summary(document: Any) -> NodeStats:
    """The pods of a stats summary document. Pods without a podRef uid are skipped."""
    if not isinstance(document, dict):
        raise KubeletStatsError("stats summary is not a JSON object")
    node = document.get("node") or {}
    pods: dict[str, PodUsage] = {}
    for entry in document.get("pods") or []:
        if not isinstance(entry, dict):
            continue
        ref = entry.get("podRef") or {}
        uid = ref.get("uid")
        if not uid:
            continue
        cpu = entry.get("cpu") or {}
        nano = _int(cpu.get("usageNanoCores"))
        memory = entry.get("memory") or {}
        ephemeral = entry.get("ephemeral-storage") or {}
        volumes = []
        for volume in entry.get("volume") or []:
            if not isinstance(volume, dict):
                continue
            pvc = volume.get("pvcRef") or {}
            volumes.append(
                VolumeUsage(
                    name=str(volume.get("name", "")),
                    used_bytes=_int(volume.get("usedBytes")),
                    capacity_bytes=_int(volume.get("capacityBytes")),
                    pvc_namespace=pvc.get("namespace"),
                    pvc_name=pvc.get("name"),
                )
            )
        pods[uid] = PodUsage(
            uid=uid,
            namespace=str(ref.get("namespace", "")),
            name=str(ref.get("name", "")),
            cpu_cores=Decimal(nano).scaleb(-9) if nano is not None else None,
            memory_working_set_bytes=_int(memory.get("workingSetBytes")),
            ephemeral_used_bytes=_int(ephemeral.get("usedBytes")),
            volumes=tuple(volumes),
        )
    return NodeStats(node=str(node.get("nodeName", "")), pods=pods)


def default_kubelet_ca(explicit: Path | None) -> Path | None:
    """The CA that verifies the kubelet: ``explicit`` when set, else the ServiceAccount's cluster
    CA when the pod has one, else None (the system's trust store)."""
    if explicit is not None:
        return explicit
    return CA_PATH if CA_PATH.is_file() else None


class KubeletStatsClient:
    """Fetch the summary from the kubelet's HTTPS endpoint with the pod's ServiceAccount token."""

    def __init__(
        self,
        url: str,
        *,
        token_path: Path | None = TOKEN_PATH,
        ca_path: Path | None = None,
        insecure: bool = False,
        timeout: float = 5.0,
    ) -> None:
        self.url = url.rstrip("/")
        if not self.url.endswith("/stats/summary"):
            self.url += "/stats/summary"
        self.token_path = token_path
        self.timeout = timeout
        self.ca_path = ca_path
        self._context: ssl.SSLContext | None = None
        if self.url.startswith("https://"):
            if insecure:
                log.warning("kubelet TLS verification is off (GPUMETER_AGENT_KUBELET_INSECURE_TLS): "
                            "the ServiceAccount token goes to whatever answers at %s", self.url)
                self._context = ssl.create_default_context()
                self._context.check_hostname = False
                self._context.verify_mode = ssl.CERT_NONE
            else:
                try:
                    self._context = ssl.create_default_context(cafile=str(ca_path) if ca_path else None)
                except (OSError, ssl.SSLError) as exc:
                    raise KubeletCAError(f"kubelet CA {ca_path} (GPUMETER_AGENT_KUBELET_CA) "
                                            f"cannot be loaded: {exc}") from None

    def fetch(self) -> NodeStats:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        if self.token_path is not None and self.token_path.is_file():
            # Re-read every time: projected ServiceAccount tokens rotate.
            request.add_header("Authorization", "Bearer " + self.token_path.read_text().strip())
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                body = response.read()
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise KubeletStatsError(self._unverified(exc.reason)) from exc
            raise KubeletStatsError(f"kubelet stats {self.url}: {exc}") from exc
        except ssl.SSLCertVerificationError as exc:
            raise KubeletStatsError(self._unverified(exc)) from exc
        except (OSError, ValueError) as exc:
            raise KubeletStatsError(f"kubelet stats {self.url}: {exc}") from exc
        try:
            return parse_summary(json.loads(body))
        except json.JSONDecodeError as exc:
            raise KubeletStatsError(f"kubelet stats {self.url}: not JSON: {exc}") from exc

    def _unverified(self, exc: ssl.SSLCertVerificationError) -> str:
        trusted = self.ca_path or "the system trust store"
        return (f"kubelet stats {self.url}: the kubelet's certificate is not trusted "
                f"({exc.verify_message or exc}) by {trusted}; set GPUMETER_AGENT_KUBELET_CA to the CA "
                "that signs kubelet serving certificates, or GPUMETER_AGENT_KUBELET_INSECURE_TLS=true "
                "to skip verification")


class ApiServerStatsClient:
    """Fetch the summary through the API server's node proxy (kubernetes client)."""

    def __init__(self, core_api: Any, node: str) -> None:
        self.core = core_api
        self.node = node

    def fetch(self) -> NodeStats:
        try:
            body = self.core.connect_get_node_proxy_with_path(
                self.node, "stats/summary", _preload_content=False
            )
            data = body.data if hasattr(body, "data") else body
        except Exception as exc:  # ApiException, urllib3 errors
            raise KubeletStatsError(f"stats summary via API server for node {self.node}: {exc}") from exc
        try:
            return parse_summary(json.loads(data))
        except json.JSONDecodeError as exc:
            raise KubeletStatsError(f"stats summary via API server: not JSON: {exc}") from exc
