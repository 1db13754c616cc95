"""The PodResources stubs are generated from our .proto at build/run time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from collectors.agent.proto import generate

pytestmark = pytest.mark.agent


def test_generate_writes_both_stubs(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == ["podresources_v1_pb2.py", "podresources_v1_pb2_grpc.py"]
    grpc_stub = (tmp_path / "podresources_v1_pb2_grpc.py").read_text()
    ast.parse(grpc_stub)
    assert "/v1.PodResourcesLister/List" in grpc_stub
    assert "/v1.PodResourcesLister/GetAllocatableResources" in grpc_stub
    assert "/v1.PodResourcesLister/Get'" in grpc_stub or '/v1.PodResourcesLister/Get"' in grpc_stub
    assert "from collectors.agent.proto import podresources_v1_pb2" in grpc_stub


def test_load_returns_the_messages_and_the_service() -> None:
    pb2, pb2_grpc = generate.load()
    response = pb2.ListPodResourcesResponse(
        pod_resources=[
            pb2.PodResources(
                name="p",
                namespace="n",
                containers=[
                    pb2.ContainerResources(
                        name="c",
                        devices=[pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["GPU-1"])],
                    )
                ],
            )
        ]
    )
    again = pb2.ListPodResourcesResponse.FromString(response.SerializeToString())
    assert again.pod_resources[0].containers[0].devices[0].device_ids == ["GPU-1"]
    assert pb2.DESCRIPTOR.package == "v1"
    assert hasattr(pb2_grpc, "PodResourcesListerStub") and hasattr(
        pb2_grpc, "add_PodResourcesListerServicer_to_server"
    )
