"""A real gRPC server implementing the kubelet's v1.PodResourcesLister on a unix socket.

Used by the tests and benchmarks/agent.py: our client talks to it exactly as it
talks to the kubelet (same proto, same wire method paths, unix socket transport).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from collectors.agent.proto.generate import load

pb2, pb2_grpc = load()


@dataclass
class ClaimSpec:
    """A ResourceClaim a container uses (DRA), with the devices allocated to it."""

    name: str
    namespace: str
    devices: list[tuple[str, str, str]]  # (driver, pool, device name), e.g. ("gpu.nvidia.com", node, "gpu-0")


@dataclass
class ContainerSpec:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device ids
    numa: int | None = None
    claims: list[ClaimSpec] = field(default_factory=list)


@dataclass
class PodSpec:
    namespace: str
    name: str
    containers: list[ContainerSpec]


class Lister(pb2_grpc.PodResourcesListerServicer):  # type: ignore[name-defined]
    def __init__(self, pods: list[PodSpec], allocatable: dict[str, list[str]] | None = None) -> None:
        self.pods = pods
        self.allocatable = allocatable or {}
        self.list_calls = 0
        self.allocatable_calls = 0
        self.fail_list: grpc.StatusCode | None = None
        self.allocatable_unimplemented = False

    def _pod(self, pod: PodSpec) -> Any:
        containers = []
        for container in pod.containers:
            devices = []
            for resource, ids in container.devices.items():
                topology = None
                if container.numa is not None:
                    topology = pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=container.numa)])
                devices.append(
                    pb2.ContainerDevices(resource_name=resource, device_ids=ids, topology=topology)
                )
            dynamic = [
                pb2.DynamicResource(
                    claim_name=claim.name,
                    claim_namespace=claim.namespace,
                    claim_resources=[
                        pb2.ClaimResource(
                            # The NVIDIA driver's CDI device for a claim's device (one per device).
                            cdi_devices=[pb2.CDIDevice(name=f"k8s.{driver}/claim={claim.name}-{device}")],
                            driver_name=driver,
                            pool_name=pool,
                            device_name=device,
                        )
                        for driver, pool, device in claim.devices
                    ],
                )
                for claim in container.claims
            ]
            containers.append(
                pb2.ContainerResources(
                    name=container.name, devices=devices, cpu_ids=[0, 1], dynamic_resources=dynamic
                )
            )
        return pb2.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 (gRPC method name)
        self.list_calls += 1
        if self.fail_list is not None:
            context.abort(self.fail_list, "stand-in failure")
        return pb2.ListPodResourcesResponse(pod_resources=[self._pod(pod) for pod in self.pods])

    def GetAllocatableResources(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.allocatable_calls += 1
        if self.allocatable_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this kubelet")
        devices = [
            pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in self.allocatable.items()
        ]
        return pb2.AllocatableResourcesResponse(devices=devices, cpu_ids=list(range(8)))

    def Get(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        for pod in self.pods:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return pb2.GetPodResourcesResponse(pod_resources=self._pod(pod))
        context.abort(grpc.StatusCode.NOT_FOUND, "no such pod")


@contextmanager
def serve(socket_path: Path, lister: Lister) -> Iterator[Lister]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield lister
    finally:
        server.stop(grace=None).wait()
