"""Our PodResources client against a real gRPC v1.PodResourcesLister server on a unix socket."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import grpc
import pytest

from collectors.agent.podresources import (
    PodResourcesClient,
    PodResourcesError,
    by_device,
    mig_profile_of,
    split_replica,
)
from testkit.podresources_server import ContainerSpec, Lister, PodSpec, serve

pytestmark = pytest.mark.agent

MIG_A = "MIG-5c5f2a0e-6a4f-5f2b-9c55-0a1b2c3d4e01"
MIG_B = "MIG-5c5f2a0e-6a4f-5f2b-9c55-0a1b2c3d4e02"
MIG_C = "MIG-5c5f2a0e-6a4f-5f2b-9c55-0a1b2c3d4e03"


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    # Unix socket paths are limited to ~107 bytes; pytest tmp paths can be long.
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    return directory / "kubelet.sock"


def cluster_pods() -> list[PodSpec]:
    return [
        PodSpec(
            "team-a",
            "trainer-0",
            [
                ContainerSpec("main", {"nvidia.com/gpu": ["GPU-aaaa", "GPU-bbbb"]}, numa=0),
                ContainerSpec("sidecar", {}),
            ],
        ),
        PodSpec(
            "team-b",
            "notebook",
            [
                ContainerSpec("jupyter", {"nvidia.com/mig-1g.5gb": [MIG_A]}),
            ],
        ),
        PodSpec(
            "team-b",
            "inference",
            [
                ContainerSpec("server", {"nvidia.com/mig-3g.20gb": [MIG_B], "example.com/fpga": ["fpga-0"]}),
                ContainerSpec("warmup", {"nvidia.com/mig-1g.5gb": [MIG_C]}),
            ],
        ),
        PodSpec("kube-system", "cpu-only", [ContainerSpec("c", {})]),
    ]


def test_devices_map_to_pods_and_containers_including_mig(socket_path: Path) -> None:
    with serve(socket_path, Lister(cluster_pods())), PodResourcesClient(str(socket_path)) as client:
        allocations = client.gpu_allocations()
    table = {(a.namespace, a.pod, a.container, a.device_uuid): a for a in allocations}
    assert set(table) == {
        ("team-a", "trainer-0", "main", "GPU-aaaa"),
        ("team-a", "trainer-0", "main", "GPU-bbbb"),
        ("team-b", "notebook", "jupyter", MIG_A),
        ("team-b", "inference", "server", MIG_B),
        ("team-b", "inference", "warmup", MIG_C),
    }
    assert table[("team-b", "notebook", "jupyter", MIG_A)].mig_profile == "1g.5gb"
    assert table[("team-b", "inference", "server", MIG_B)].mig_profile == "3g.20gb"
    assert table[("team-a", "trainer-0", "main", "GPU-aaaa")].mig_profile is None
    assert table[("team-a", "trainer-0", "main", "GPU-aaaa")].numa_nodes == (0,)
    assert all(a.share == 1 for a in allocations)
    owners = by_device(allocations)
    assert [a.pod for a in owners["GPU-bbbb"]] == ["trainer-0"]


def test_time_sliced_replicas_hold_a_share_of_the_gpu(socket_path: Path) -> None:
    pods = [
        PodSpec("team-a", "a", [ContainerSpec("c", {"nvidia.com/gpu": ["GPU-aaaa::0"]})]),
        PodSpec("team-b", "b", [ContainerSpec("c", {"nvidia.com/gpu": ["GPU-aaaa::3"]})]),
    ]
    allocatable = {"nvidia.com/gpu": [f"GPU-aaaa::{i}" for i in range(4)] + ["GPU-cccc"]}
    with (
        serve(socket_path, Lister(pods, allocatable)) as lister,
        PodResourcesClient(str(socket_path)) as client,
    ):
        allocations = client.gpu_allocations()
        client.gpu_allocations()
        assert lister.allocatable_calls == 1  # replica counts are cached
    assert {a.pod: a.share for a in allocations} == {"a": Decimal("0.25"), "b": Decimal("0.25")}
    assert {a.device_uuid for a in allocations} == {"GPU-aaaa"}
    assert len(by_device(allocations)["GPU-aaaa"]) == 2


def test_old_kubelet_without_allocatable_never_bills_a_replica_as_a_whole_gpu(socket_path: Path) -> None:
    # Replica ::1 exists, so the device has at least two: the share is at most 1/2, asked once.
    lister = Lister([PodSpec("t", "p", [ContainerSpec("c", {"nvidia.com/gpu": ["GPU-aaaa::1"]})])])
    lister.allocatable_unimplemented = True
    with serve(socket_path, lister), PodResourcesClient(str(socket_path)) as client:
        allocations = client.gpu_allocations()
        client.gpu_allocations()
    assert [a.share for a in allocations] == [Decimal("0.5")]
    assert lister.allocatable_calls == 1


def test_wire_method_path_is_the_kubelets(socket_path: Path) -> None:
    """A raw call on /v1.PodResourcesLister/List: what the kubelet serves is what we call."""
    from collectors.agent.proto.generate import load

    pb2, _ = load()
    with serve(socket_path, Lister(cluster_pods())):
        channel = grpc.insecure_channel(f"unix://{socket_path}")
        call = channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=pb2.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb2.ListPodResourcesResponse.FromString,
        )
        response = call(pb2.ListPodResourcesRequest(), timeout=5)
        channel.close()
    assert len(response.pod_resources) == 4


def test_unreachable_socket_raises_a_clear_error(tmp_path: Path) -> None:
    with (
        PodResourcesClient(str(tmp_path / "absent.sock"), timeout=0.5) as client,
        pytest.raises(PodResourcesError, match=r"absent\.sock"),
    ):
        client.gpu_allocations()


def test_resource_name_helpers() -> None:
    assert mig_profile_of("nvidia.com/mig-2g.10gb") == "2g.10gb"
    assert mig_profile_of("nvidia.com/gpu") is None
    assert mig_profile_of("nvidia.com/gpu.shared") is None
    assert split_replica("GPU-x::12") == ("GPU-x", 12)
    assert split_replica("MIG-GPU-x/1/0") == ("MIG-GPU-x/1/0", None)
