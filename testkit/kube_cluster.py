"""A real Kubernetes control plane, envtest-style, for tests and benchmarks.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler binaries (built from
source by ``tests/kube/build.sh``), plus the KWOK controller simulating GPU nodes and the pod
lifecycle on them. Nothing is mocked: clients talk to a real apiserver over TLS with RBAC on.
The pytest fixtures over this are tests/kube/fixtures.py.

Binaries come from ``$GPUMETER_KUBE_BIN`` or the build.sh cache; when they are missing
:func:`require_binaries` fails the test (never skips) and says to run ``make testbin``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from kubernetes import client as k8s

from gpumeter.core.kube import CAPACITY_TYPE_LABEL, GPU_RESOURCE
from gpumeter.core.models import CAPACITY_TYPES

# tests/kube holds the pinned Kubernetes release (go.mod) and build.sh.
KUBE_TESTS = Path(__file__).resolve().parent.parent / "tests" / "kube"

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
TOPOLOGY_ANNOTATION = "gpumeter.io/gpu-topology"

ADMIN_USER = "gpumeter-test-admin"
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_VERSION = "v1beta1"

# Generous bounds: first start on a cold page cache of a 2-core box is slow,
# and these only bound how long a broken start-up takes to be reported.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 0.2


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to start or become ready."""



# --------------------------------------------------------------------------
# binaries


def kube_version() -> str:
    """The k8s.io/kubernetes release pinned in tests/kube/go.mod (e.g. 1.37.2)."""
    match = re.search(r"^\s*k8s\.io/kubernetes\s+v(\S+)", (KUBE_TESTS / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise ControlPlaneError(f"k8s.io/kubernetes not pinned in {KUBE_TESTS / 'go.mod'}")
    return match.group(1)


def bin_dir() -> Path:
    """Where build.sh puts the binaries (same rule as build.sh), or $GPUMETER_KUBE_BIN."""
    override = os.environ.get("GPUMETER_KUBE_BIN")
    if override:
        return Path(override)
    cache = os.environ.get("GPUMETER_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpumeter"
    )
    return Path(cache) / f"kube-{kube_version()}" / "bin"


def require_binaries(*names: str) -> dict[str, Path]:
    """Paths of the named files in bin_dir(); fails the test (not skip) if absent."""
    directory = bin_dir()
    paths = {name: directory / name for name in names}
    missing = [name for name, path in paths.items() if not path.is_file()]
    if missing:
        pytest.fail(
            f"Kubernetes test binaries missing from {directory}: {', '.join(missing)}. "
            "Run `make testbin` (bash tests/kube/build.sh) first.",
            pytrace=False,
        )
    return paths


# --------------------------------------------------------------------------
# processes


def free_port() -> int:
    """A currently free loopback TCP port (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """A child process in its own process group, logging to a file."""

    def __init__(self, name: str, argv: Sequence[str | Path], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        self._log.write(("$ " + " ".join(str(a) for a in argv) + "\n").encode())
        self._log.flush()
        # Own session: stop() signals the whole group, so nothing outlives the test run.
        self.popen = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(cannot read {self.log_path}: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the group, wait, then SIGKILL; safe to call twice."""
        if self.alive():
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait(timeout=STOP_TIMEOUT_S)
        self._log.close()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(self.popen.pid, sig)


def _failure(what: str, processes: Sequence[Process], reason: str) -> ControlPlaneError:
    parts = [f"{what}: {reason}"]
    for proc in processes:
        parts.append(f"--- {proc.name} (log {proc.log_path}), last lines ---\n{proc.log_tail()}")
    return ControlPlaneError("\n".join(parts))


def wait_until(
    check: Callable[[], bool],
    *,
    what: str,
    processes: Sequence[Process] = (),
    timeout: float = START_TIMEOUT_S,
) -> None:
    """Poll check() until true; fail early if a watched process dies."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in processes:
            if not proc.alive():
                raise _failure(
                    what,
                    processes,
                    f"{proc.name} exited with code {proc.popen.returncode}",
                )
        if check():
            return
        if time.monotonic() > deadline:
            raise _failure(what, processes, f"not ready after {timeout:.0f}s")
        time.sleep(POLL_INTERVAL_S)


# Health probes only ever hit loopback endpoints of processes we just started,
# whose certificates are self-signed at start-up; clients proper verify TLS.
_PROBE_TLS = ssl.create_default_context()
_PROBE_TLS.check_hostname = False
_PROBE_TLS.verify_mode = ssl.CERT_NONE


def http_ok(url: str, token: str | None = None) -> bool:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=2, context=_PROBE_TLS) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


# --------------------------------------------------------------------------
# credentials


def write_service_account_keys(directory: Path) -> tuple[Path, Path]:
    """RSA key pair the apiserver signs/verifies ServiceAccount tokens with.

    `cryptography` when installed (it is not a project dependency, hence the
    dynamic import that keeps mypy quiet either way), else the openssl CLI.
    """
    key, pub = directory / "sa.key", directory / "sa.pub"
    try:
        serialization = importlib.import_module("cryptography.hazmat.primitives.serialization")
        rsa = importlib.import_module("cryptography.hazmat.primitives.asymmetric.rsa")
    except ImportError:
        for argv in (
            ["openssl", "genrsa", "-out", str(key), "2048"],
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise ControlPlaneError(f"{' '.join(argv)} failed: {done.stderr.strip()}") from None
        return key, pub
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    pub.write_bytes(
        private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key, pub


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpumeter-test",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [
            {
                "name": "gpumeter-test",
                "context": {"cluster": "gpumeter-test", "user": ADMIN_USER},
            }
        ],
        "current-context": "gpumeter-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)


# --------------------------------------------------------------------------
# the control plane


@dataclass
class Kube:
    """A running control plane; ``api_client()`` gives an admin client."""

    server: str
    token: str
    kubeconfig: Path
    ca_file: Path
    workdir: Path
    bin_dir: Path
    processes: list[Process] = field(default_factory=list)

    def api_client(self) -> k8s.ApiClient:
        """An admin client verifying the apiserver's TLS cert (same settings as .kubeconfig)."""
        configuration = k8s.Configuration(
            host=self.server,
            api_key={"BearerToken": self.token},
            api_key_prefix={"BearerToken": "Bearer"},
            ssl_ca_cert=str(self.ca_file),
        )
        return k8s.ApiClient(configuration)

    def stop(self) -> None:
        # Reverse start order: controllers before the apiserver before etcd.
        for proc in reversed(self.processes):
            proc.stop()


def start_etcd(binary: Path, workdir: Path, processes: list[Process]) -> str:
    client_port, peer_port = free_port(), free_port()
    client_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    proc = Process(
        "etcd",
        [
            binary,
            "--name=gpumeter-test",
            f"--data-dir={workdir / 'etcd-data'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpumeter-test={peer_url}",
            # Throwaway data: skipping fsync makes every apiserver write much cheaper.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        workdir / "etcd.log",
    )
    processes.append(proc)
    wait_until(lambda: http_ok(f"{client_url}/health"), what="etcd /health", processes=[proc])
    return client_url


def start_apiserver(binary: Path, workdir: Path, etcd_url: str, processes: list[Process]) -> Kube:
    token = secrets.token_urlsafe(32)
    tokens = workdir / "tokens.csv"
    # Static token file: token,user,uid,"groups"; system:masters bypasses RBAC.
    tokens.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    tokens.chmod(0o600)
    sa_key, sa_pub = write_service_account_keys(workdir)
    cert_dir = workdir / "apiserver-certs"
    port = free_port()
    server = f"https://127.0.0.1:{port}"
    proc = Process(
        "kube-apiserver",
        [
            binary,
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The "kubernetes" Service endpoints may not point at loopback, and
            # nothing in-cluster needs them (as envtest does).
            "--endpoint-reconciler-type=none",
            f"--secure-port={port}",
            f"--cert-dir={cert_dir}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--allow-privileged=true",
            "--profiling=false",
        ],
        workdir / "kube-apiserver.log",
    )
    processes.append(proc)
    wait_until(
        lambda: http_ok(f"{server}/readyz", token),
        what="kube-apiserver /readyz",
        processes=[proc],
    )
    # --cert-dir holds the generated serving cert followed by its self-signed CA;
    # the CA in that bundle is what clients verify against.
    ca_file = cert_dir / "apiserver.crt"
    kubeconfig = workdir / "admin.kubeconfig"
    write_kubeconfig(kubeconfig, server, ca_file, token)
    return Kube(server, token, kubeconfig, ca_file, workdir, binary.parent, processes)


def start_controller_manager(binary: Path, kube: Kube) -> None:
    port = free_port()
    proc = Process(
        "kube-controller-manager",
        [
            binary,
            f"--kubeconfig={kube.kubeconfig}",
            f"--authentication-kubeconfig={kube.kubeconfig}",
            f"--authorization-kubeconfig={kube.kubeconfig}",
            # No client CA is configured (token auth only), so there is no
            # extension-apiserver-authentication ConfigMap to look up.
            "--authentication-skip-lookup",
            # Only what tests rely on: default ServiceAccounts (pod admission),
            # namespace clean-up, ownerReference GC, PDB status (evictions), and
            # node lifecycle, which lifts the not-ready taint the apiserver's
            # TaintNodesByCondition admission puts on every new node.
            "--controllers=serviceaccount-controller,namespace-controller,garbage-collector-controller,"
            "disruption-controller,node-lifecycle-controller",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--use-service-account-credentials=false",
        ],
        kube.workdir / "kube-controller-manager.log",
    )
    kube.processes.append(proc)
    wait_until(
        lambda: http_ok(f"https://127.0.0.1:{port}/healthz"),
        what="kube-controller-manager /healthz",
        processes=[proc],
    )


def volcano_crds() -> list[dict[str, Any]]:
    """Volcano's Queue (cluster) and PodGroup (namespaced) CRDs, schema left open."""

    def crd(kind: str, plural: str, scope: str, short_names: list[str]) -> dict[str, Any]:
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{VOLCANO_GROUP}"},
            "spec": {
                "group": VOLCANO_GROUP,
                "scope": scope,
                "names": {
                    "kind": kind,
                    "listKind": f"{kind}List",
                    "plural": plural,
                    "singular": kind.lower(),
                    "shortNames": short_names,
                },
                "versions": [
                    {
                        "name": VOLCANO_VERSION,
                        "served": True,
                        "storage": True,
                        # Real Volcano serves status as a subresource; mirror that so
                        # spec/status write paths behave as in a real cluster.
                        "subresources": {"status": {}},
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }

    return [
        crd("Queue", "queues", "Cluster", ["q", "queue-v1beta1"]),
        crd("PodGroup", "podgroups", "Namespaced", ["pg", "podgroup-v1beta1"]),
    ]


def install_crds(api: k8s.ApiClient, crds: Sequence[Mapping[str, Any]], processes: Sequence[Process]) -> None:
    ext = k8s.ApiextensionsV1Api(api)
    for crd in crds:
        ext.create_custom_resource_definition(body=k8s.V1CustomResourceDefinition.model_validate(crd))

    def established(name: str) -> bool:
        status = ext.read_custom_resource_definition(name).status
        return has_condition(status.conditions if status else None, "Established")

    for crd in crds:
        name = crd["metadata"]["name"]
        wait_until(
            functools.partial(established, name),
            what=f"CRD {name} Established",
            processes=processes,
        )


def start_kube(workdir: Path) -> Kube:
    bins = require_binaries("etcd", "kube-apiserver", "kube-controller-manager")
    processes: list[Process] = []
    try:
        etcd_url = start_etcd(bins["etcd"], workdir, processes)
        kube = start_apiserver(bins["kube-apiserver"], workdir, etcd_url, processes)
        start_controller_manager(bins["kube-controller-manager"], kube)
        with kube.api_client() as api:
            install_crds(api, volcano_crds(), processes)
            # The serviceaccount controller creating "default" proves the
            # controller manager is really reconciling, not just healthy.
            wait_for_default_service_account(api, "default", processes)
    except BaseException:
        for proc in reversed(processes):
            proc.stop()
        raise
    return kube


def wait_for_default_service_account(
    api: k8s.ApiClient, namespace: str, processes: Sequence[Process] = ()
) -> None:
    core = k8s.CoreV1Api(api)

    def exists() -> bool:
        try:
            core.read_namespaced_service_account("default", namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    wait_until(exists, what=f"ServiceAccount {namespace}/default", processes=processes)


# --------------------------------------------------------------------------
# KWOK


@dataclass
class Kwok:
    process: Process
    server: str


def start_kwok(kube: Kube) -> Kwok:
    """The KWOK controller: makes annotated nodes Ready and bound pods Running."""
    bins = require_binaries("kwok", "kwok-stages.yaml")
    port = free_port()
    proc = Process(
        "kwok",
        [
            bins["kwok"],
            f"--kubeconfig={kube.kubeconfig}",
            f"--config={bins['kwok-stages.yaml']}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
            "--manage-nodes-with-label-selector=",
            "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
            "--disregard-status-with-label-selector=",
            "--cidr=10.244.0.1/16",
            "--node-ip=10.240.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{port}",
        ],
        kube.workdir / "kwok.log",
    )
    try:
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{port}/healthz"),
            what="kwok /healthz",
            processes=[proc],
        )
    except BaseException:
        proc.stop()
        raise
    return Kwok(proc, f"http://127.0.0.1:{port}")


# --------------------------------------------------------------------------
# kube-scheduler


@dataclass
class Scheduler:
    process: Process
    config_path: Path
    port: int

    def stop(self) -> None:
        self.process.stop()


DEFAULT_SCHEDULER_CONFIG: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [{"schedulerName": "default-scheduler"}],
}


def scheduler_config(config: str | Mapping[str, Any] | None, kubeconfig: Path) -> dict[str, Any]:
    """The given KubeSchedulerConfiguration with kubeconfig filled in and leader election off."""
    if config is None:
        parsed: Any = json.loads(json.dumps(DEFAULT_SCHEDULER_CONFIG))
    elif isinstance(config, str):
        parsed = yaml.safe_load(config)
    else:
        parsed = json.loads(json.dumps(config))  # deep copy; callers keep theirs
    if not isinstance(parsed, dict):
        raise TypeError("scheduler config must be a YAML/JSON mapping (KubeSchedulerConfiguration)")
    parsed.setdefault("apiVersion", DEFAULT_SCHEDULER_CONFIG["apiVersion"])
    parsed.setdefault("kind", "KubeSchedulerConfiguration")
    parsed.setdefault("clientConnection", {}).setdefault("kubeconfig", str(kubeconfig))
    # One scheduler per test and no second replica: leader election only delays start.
    parsed["leaderElection"] = {"leaderElect": False}
    return parsed


def start_scheduler(
    binary: Path, kube: Kube, workdir: Path, index: int, config: str | Mapping[str, Any] | None = None
) -> Scheduler:
    """kube-scheduler number ``index`` with a KubeSchedulerConfiguration, once /readyz answers."""
    config_path = workdir / f"kube-scheduler-{index}.yaml"
    config_path.write_text(yaml.safe_dump(scheduler_config(config, kube.kubeconfig)))
    port = free_port()
    proc = Process(
        f"kube-scheduler-{index}",
        [
            binary,
            f"--config={config_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authentication-kubeconfig={kube.kubeconfig}",
            f"--authorization-kubeconfig={kube.kubeconfig}",
            "--authentication-skip-lookup",  # as for the controller manager
        ],
        workdir / f"kube-scheduler-{index}.log",
    )
    # /readyz includes informer sync, so pods created next are seen.
    try:
        wait_until(
            lambda: http_ok(f"https://127.0.0.1:{port}/readyz"),
            what="kube-scheduler /readyz",
            processes=[proc],
        )
    except BaseException:
        proc.stop()
        raise
    return Scheduler(proc, config_path, port)


# --------------------------------------------------------------------------
# simulated GPU nodes


def nvlink_domains(gpus: int, topology: Sequence[Sequence[int]] | None) -> list[list[int]]:
    """NVLink domains as GPU-index groups; default: one NVSwitch domain of all GPUs."""
    if topology is None:
        return [list(range(gpus))] if gpus else []
    domains = [list(domain) for domain in topology]
    indices = sorted(i for domain in domains for i in domain)
    if indices != list(range(gpus)):
        raise ValueError(f"topology {domains} must partition GPU indices 0..{gpus - 1}")
    return domains


def gpu_node_manifest(
    name: str,
    *,
    gpus: int,
    gpu_model: str,
    capacity_type: str,
    topology: Sequence[Sequence[int]] | None,
    cpu: str,
    memory: str,
    pods: int,
    labels: Mapping[str, str],
    taints: Sequence[Mapping[str, str]],
) -> dict[str, Any]:
    if capacity_type not in CAPACITY_TYPES:
        raise ValueError(f"capacity_type must be one of {CAPACITY_TYPES}, got {capacity_type!r}")
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": str(pods),
        GPU_RESOURCE: str(gpus),
    }
    topology_doc = {
        "gpu_model": gpu_model,
        "gpu_count": gpus,
        "nvlink_domains": nvlink_domains(gpus, topology),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
                TOPOLOGY_ANNOTATION: json.dumps(topology_doc, separators=(",", ":")),
            },
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                GPU_PRODUCT_LABEL: gpu_model,
                GPU_COUNT_LABEL: str(gpus),
                CAPACITY_TYPE_LABEL: capacity_type,
                **labels,
            },
        },
        "spec": {"taints": [dict(t) for t in taints]},
        # Node status is kept on create (kubelets register this way); KWOK's
        # node-initialize stage keeps capacity/allocatable and adds conditions.
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def has_condition(conditions: Sequence[Any] | None, type_: str, status: str = "True") -> bool:
    """Whether a Kubernetes condition list holds condition `type_` with `status`."""
    return any(c.type == type_ and c.status == status for c in conditions or [])


# Put on new nodes by the apiserver (TaintNodesByCondition) and lifted by the
# node lifecycle controller once the node reports Ready.
CONDITION_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def node_schedulable(core: k8s.CoreV1Api, name: str) -> bool:
    """Ready (KWOK heartbeats) and free of condition taints (so the scheduler may use it)."""
    node = core.read_node(name)
    ready = node.status is not None and has_condition(node.status.conditions, "Ready")
    taints = (node.spec.taints if node.spec else None) or []
    return ready and not any(t.key in CONDITION_TAINTS for t in taints)
