"""Attribution: which pod and container holds which GPU, from the kubelet PodResources v1 API.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``). ``List`` returns, per pod and
container, the device IDs the device plugin handed out: GPU UUIDs for
``nvidia.com/gpu``, MIG device UUIDs for ``nvidia.com/mig-<profile>`` (mixed
strategy), and ``<uuid>::<n>`` replicas when the plugin time-slices GPUs.
``GetAllocatableResources`` lists every device the kubelet can assign, which is
how a replica's share of its GPU (1 / replicas) is known; older kubelets lack it,
and the count is then derived (``PodResourcesClient._derived_replicas``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import grpc

from collectors.agent.mig import parse_profile
from collectors.agent.proto.generate import load as load_stubs
from gpumeter.core.kube import MIG_RESOURCE_PREFIX, SHARED_SUFFIX, is_gpu_resource

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DRA_GPU_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver: whole GPUs and MIG devices
REPLICA_SEPARATOR = "::"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def mig_profile_of(resource_name: str) -> str | None:
    """``nvidia.com/mig-1g.5gb`` -> ``1g.5gb``, ``nvidia.com/mig-1g.10gb.me`` -> ``1g.10gb+me``
    (NVML's spelling: resource names cannot hold a ``+``); None for whole GPUs."""
    base = resource_name.removesuffix(SHARED_SUFFIX)
    if not base.startswith(MIG_RESOURCE_PREFIX):
        return None
    text = base[len(MIG_RESOURCE_PREFIX) :]
    profile = parse_profile(text)
    return profile.name if profile is not None else (text or None)


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
    # Dynamic Resource Allocation: the claim ("<namespace>/<name>") and the DRA device (the
    # driver's device name, e.g. "gpu-0"); device_uuid stays "" until collectors.agent.dra
    # resolves the name against NVML.
    claim: str | None = None
    dra_device: str | None = None


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources socket did not answer."""


ReplicaHints = Callable[[], Mapping[str, int]]


class PodResourcesClient:
    """A client of the kubelet's PodResources v1 API over its unix socket.

    Replica counts (a time-sliced device's share is 1/replicas) come from
    ``GetAllocatableResources``. A kubelet without it (before 1.23, or the feature
    gate off) answers UNIMPLEMENTED: that is asked once, remembered and logged once,
    and the counts are derived instead (:meth:`_derived_replicas`) so a replica never
    bills as a whole device. Other failures are transient: asked again next cycle,
    logged once per kind until an answer comes.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout: float = 5.0,
        replica_hints: ReplicaHints | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        # resource name -> replicas per device, from the node (see replicas_from_node); used
        # only when the kubelet cannot list its allocatable devices.
        self.replica_hints = replica_hints
        self._pb2, pb2_grpc = load_stubs()
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._stub: Any = pb2_grpc.PodResourcesListerStub(self._channel)
        self._replicas: dict[str, int] = {}
        self.allocatable_supported: bool | None = None  # None: not known yet
        self.allocatable_errors = 0
        self._warned: set[str] = set()

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

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)

    def refresh_allocatable(self) -> None:
        """Count replicas per device from GetAllocatableResources (never again once UNIMPLEMENTED)."""
        if self.allocatable_supported is False:
            return
        try:
            response = self._stub.GetAllocatableResources(
                self._pb2.AllocatableResourcesRequest(), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            self.allocatable_errors += 1
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self.allocatable_supported = False
                self._warn_once(
                    "unimplemented",
                    "the kubelet has no PodResources GetAllocatableResources (%s); time-sliced "
                    "replica counts are derived from the device IDs and the node's capacity",
                    _describe(exc),
                )
            else:
                self._warn_once(
                    f"error:{getattr(code, 'name', code)}",
                    "PodResources GetAllocatableResources failed (%s); asking again next cycle",
                    _describe(exc),
                )
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
        self.allocatable_supported = True
        self._warned = {key for key in self._warned if key == "unimplemented"}

    def device_replicas(self) -> dict[str, int] | None:
        """Replicas per time-sliced device (GPU or MIG UUID) from the kubelet's allocatable list;
        a device not listed is not shared. None while the kubelet has not told (or cannot)."""
        return dict(self._replicas) if self.allocatable_supported else None

    def gpu_allocations(self) -> list[DeviceAllocation]:
        """Every GPU / MIG device held by a container on this node."""
        response = self.list_raw()
        replica_ids = {
            split_replica(device_id)[0]
            for _pod, _container, devices in _gpu_devices(response)
            for device_id in devices.device_ids
            if split_replica(device_id)[1] is not None
        }
        if self.allocatable_supported is None or (
            self.allocatable_supported and not replica_ids <= set(self._replicas)
        ):
            self.refresh_allocatable()  # first cycle, or a device shared since the last count
        replicas = self._derived_replicas(response) if replica_ids - set(self._replicas) else {}
        replicas.update(self._replicas)
        return allocations_from_response(response, replicas)

    def _derived_replicas(self, response: Any) -> dict[str, int]:
        """Replica counts without GetAllocatableResources.

        The device plugin numbers a device's replicas ``<id>::0`` .. ``<id>::<replicas-1>``, so
        the highest number listed bounds the count from below; the node's hint for the resource
        (GPU feature discovery's ``<resource>.replicas`` label, or the capacity the kubelet
        reports divided by the devices behind it) gives the configured count. The larger wins:
        a replica held is never billed above its share.
        """
        hints: Mapping[str, int] = {}
        if self.replica_hints is not None:
            try:
                hints = self.replica_hints()
            except Exception as exc:  # a hint is an aid; its failure must not cost the window
                self._warn_once("hints", "replica hints from the node failed: %s", exc)
        counts: dict[str, int] = {}
        for _pod, _container, devices in _gpu_devices(response):
            hint = hints.get(devices.resource_name.removesuffix(SHARED_SUFFIX)) or hints.get(
                devices.resource_name
            )
            for device_id in devices.device_ids:
                base, replica = split_replica(device_id)
                if replica is None:
                    continue
                counts[base] = max(counts.get(base, 1), replica + 1, hint or 1)
        return counts


def replicas_from_node(
    labels: Mapping[str, str],
    capacity: Mapping[str, Any],
    devices_behind: Callable[[str], int],
) -> dict[str, int]:
    """Replicas per device for each GPU resource of the node, without the kubelet's allocatable list.

    GPU feature discovery labels the node ``nvidia.com/gpu.replicas`` (``nvidia.com/mig-<profile>.replicas``
    for MIG resources); without it the kubelet's capacity for a resource (the device plugin advertises
    every replica) divided by the physical devices behind it (``devices_behind(resource)``, from NVML)
    gives it when it divides evenly.
    """
    hints: dict[str, int] = {}
    for resource, value in capacity.items():
        if not is_gpu_resource(resource):
            continue
        base = resource.removesuffix(SHARED_SUFFIX)
        label = labels.get(f"{base}.replicas")
        if label is not None and label.isdigit() and int(label) > 0:
            hints[base] = int(label)
            continue
        try:
            advertised = int(str(value))
        except ValueError:
            continue
        devices = devices_behind(base)
        if devices > 0 and advertised >= devices and advertised % devices == 0:
            hints[base] = max(hints.get(base, 0), advertised // devices)
    return hints


def _gpu_devices(response: Any) -> Iterator[tuple[Any, Any, Any]]:
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if is_gpu_resource(devices.resource_name):
                    yield pod, container, devices


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
            out.extend(_dra_allocations(pod, container))
    return out


def _dra_allocations(pod: Any, container: Any) -> Iterator[DeviceAllocation]:
    """GPUs a container holds through ResourceClaims (``dynamic_resources``; kubelet feature gate
    KubeletPodResourcesDynamicResources, beta and on by default since 1.34)."""
    for claim in container.dynamic_resources:
        claim_key = f"{claim.claim_namespace or pod.namespace}/{claim.claim_name}"
        for resource in claim.claim_resources:
            if resource.driver_name != DRA_GPU_DRIVER or not resource.device_name:
                continue
            yield DeviceAllocation(
                namespace=pod.namespace,
                pod=pod.name,
                container=container.name,
                resource_name=f"dra:{resource.driver_name}",
                # Stable per device across windows and claims: the driver/pool/device triplet.
                device_id=f"dra:{resource.driver_name}/{resource.pool_name}/{resource.device_name}",
                device_uuid="",
                mig_profile=None,
                share=Decimal(1),
                claim=claim_key,
                dra_device=resource.device_name,
            )


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
