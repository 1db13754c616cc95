"""Attribution: which pod and container holds which GPU, from the kubelet PodResources v1 API.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``). ``List`` returns, per pod and
container, the device IDs the device plugin handed out: GPU UUIDs for
``nvidia.com/gpu``, MIG device UUIDs for ``nvidia.com/mig-<profile>`` (mixed
strategy), and ``<uuid>::<n>`` replicas when the plugin time-slices GPUs.
``GetAllocatableResources`` lists every device the kubelet can assign, which is
how a replica's share of its GPU (1 / replicas) is known.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import grpc

from collectors.agent.proto.generate import load as load_stubs

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"  # device plugin's renameByDefault for time-sliced GPUs
REPLICA_SEPARATOR = "::"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def is_gpu_resource(resource_name: str) -> bool:
    base = resource_name.removesuffix(SHARED_SUFFIX)
    return base == GPU_RESOURCE or base.startswith(MIG_RESOURCE_PREFIX)


def mig_profile_of(resource_name: str) -> str | None:
    """``nvidia.com/mig-1g.5gb`` -> ``1g.5gb``; None for whole GPUs."""
    base = resource_name.removesuffix(SHARED_SUFFIX)
    if base.startswith(MIG_RESOURCE_PREFIX):
        return base[len(MIG_RESOURCE_PREFIX) :] or None
    return None


def split_replica(device_id: str) -> tuple[str, int | None]:
    """``GPU-abc::3`` -> (``GPU-abc``, 3); a plain ID -> (ID, None)."""
    base, sep, replica = device_id.partition(REPLICA_SEPARATOR)
    if sep and replica.isdigit():
        return base, int(replica)
    return device_id, None


@dataclass(frozen=True)
class DeviceAllocation:
    """One device (or one replica of a shared device) held by one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str  # as the kubelet reports it
    device_uuid: str  # the GPU or MIG UUID, replica suffix removed
    mig_profile: str | None
    share: Decimal  # fraction of the device held: 1, or 1/replicas when time-sliced
    numa_nodes: tuple[int, ...] = ()


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources socket did not answer."""


class PodResourcesClient:
    """A client of the kubelet's PodResources v1 API over its unix socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._pb2, pb2_grpc = load_stubs()
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._stub: Any = pb2_grpc.PodResourcesListerStub(self._channel)
        self._replicas: dict[str, int] = {}
        self._allocatable_known = False

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_raw(self) -> Any:
        try:
            return self._stub.List(self._pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            raise PodResourcesError(f"PodResources List on {self.socket_path}: {_describe(exc)}") from exc

    def refresh_allocatable(self) -> None:
        """Count replicas per GPU from GetAllocatableResources (best effort: older kubelets lack it)."""
        try:
            response = self._stub.GetAllocatableResources(
                self._pb2.AllocatableResourcesRequest(), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            log.warning("PodResources GetAllocatableResources unavailable: %s", _describe(exc))
            self._allocatable_known = True  # do not ask every cycle; replicas count as whole devices
            return
        replicas: dict[str, int] = {}
        for devices in response.devices:
            if not is_gpu_resource(devices.resource_name):
                continue
            for device_id in devices.device_ids:
                base, replica = split_replica(device_id)
                if replica is not None:
                    replicas[base] = replicas.get(base, 0) + 1
        self._replicas = replicas
        self._allocatable_known = True

    def gpu_allocations(self) -> list[DeviceAllocation]:
        """Every GPU / MIG device held by a container on this node."""
        response = self.list_raw()
        allocations = allocations_from_response(response, self._replicas)
        if not self._allocatable_known or any(
            a.device_id != a.device_uuid and a.device_uuid not in self._replicas for a in allocations
        ):
            self.refresh_allocatable()
            allocations = allocations_from_response(response, self._replicas)
        return allocations


def allocations_from_response(
    response: Any, replicas: dict[str, int] | None = None
) -> list[DeviceAllocation]:
    """Flatten a ListPodResourcesResponse into GPU device allocations."""
    replicas = replicas or {}
    out: list[DeviceAllocation] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                numa = tuple(int(node.ID) for node in devices.topology.nodes)
                profile = mig_profile_of(devices.resource_name)
                for device_id in devices.device_ids:
                    uuid, replica = split_replica(device_id)
                    share = Decimal(1)
                    if replica is not None and replicas.get(uuid, 0) > 1:
                        share = Decimal(1) / Decimal(replicas[uuid])
                    out.append(
                        DeviceAllocation(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource_name=devices.resource_name,
                            device_id=device_id,
                            device_uuid=uuid,
                            mig_profile=profile,
                            share=share,
                            numa_nodes=numa,
                        )
                    )
    return out


def by_device(allocations: list[DeviceAllocation]) -> dict[str, list[DeviceAllocation]]:
    """Device UUID -> the containers holding it (more than one when time-sliced)."""
    table: dict[str, list[DeviceAllocation]] = {}
    for allocation in allocations:
        table.setdefault(allocation.device_uuid, []).append(allocation)
    return table


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{getattr(code, 'name', code)}: {details}"
