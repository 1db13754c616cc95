"""The node's GPU topology through NVML: NVLink peers and the PCIe link class of every GPU pair."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any

from collectors.agent.nvml_calls import DeviceLost, NvmlCalls, normalize_bus_id, nvml_text, reraise
from collectors.agent.nvml_inventory import GpuInfo
from gpumeter.core.models import GpuDevice, NodeTopology

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi topo -m names (the extender's link classes).
TOPOLOGY_CLASSES = {
    0: "X",  # NVML_TOPOLOGY_INTERNAL: same board
    10: "PIX",  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    20: "PXB",  # NVML_TOPOLOGY_MULTIPLE: several PCIe switches
    30: "PHB",  # NVML_TOPOLOGY_HOSTBRIDGE: the CPU's host bridge
    40: "NODE",  # NVML_TOPOLOGY_NODE: host bridges within one NUMA node
    50: "SYS",  # NVML_TOPOLOGY_SYSTEM: across the socket interconnect
}



class TopologyReader:
    """NVLink links and PCIe common ancestors of the GPUs of an inventory snapshot."""

    def __init__(self, calls: NvmlCalls) -> None:
        self._calls = calls
        self._call = calls.call
        self._nvml = calls.nvml

    def topology(
        self, inventory: list[GpuInfo], handles: dict[str, Any], cluster: str, node: str,
        at: datetime | None = None,
    ) -> NodeTopology:
        """GPU layout for the scheduler extender: NVLink peers and pairwise link class.

        A pair joined by NVLink is ``NV<links>`` as ``nvidia-smi topo -m`` prints it:
        direct links counted per peer (NVLink bridges, hybrid cube mesh), or, on
        NVSwitch systems where every link ends at a switch, the smaller of the
        two GPUs' switch-link counts when NVML confirms NVLink P2P between them.
        Other pairs get the PCIe common-ancestor class (PIX, PXB, PHB, NODE, SYS).
        """
        by_bus = {gpu.pci_bus_id: gpu.index for gpu in inventory if gpu.pci_bus_id}
        direct: dict[int, Counter[int]] = {}
        switched: dict[int, int] = {}
        for gpu in inventory:
            try:
                direct[gpu.index], switched[gpu.index] = self._nvlinks(gpu, handles.get(gpu.uuid), by_bus)
            except DeviceLost:
                direct[gpu.index], switched[gpu.index] = Counter(), 0
        links: dict[str, str] = {}
        peers: dict[int, set[int]] = {gpu.index: set() for gpu in inventory}
        for position, first in enumerate(inventory):
            for second in inventory[position + 1 :]:
                key = f"{first.index}-{second.index}"
                h1, h2 = handles.get(first.uuid), handles.get(second.uuid)
                count = max(direct[first.index][second.index], direct[second.index][first.index])
                fabric = bool(switched[first.index] and switched[second.index])
                if not count and fabric and self._p2p_nvlink(first.index, h1, h2):
                    count = min(switched[first.index], switched[second.index])
                if count:
                    links[key] = f"NV{count}"
                    peers[first.index].add(second.index)
                    peers[second.index].add(first.index)
                    continue
                if h1 is None or h2 is None:
                    continue
                try:
                    level = self._call(
                        "nvmlDeviceGetTopologyCommonAncestor",
                        f"gpu{first.index}",
                        self._nvml.nvmlDeviceGetTopologyCommonAncestor,
                        h1,
                        h2,
                    )
                except DeviceLost:
                    continue
                if level is not None:
                    links[key] = TOPOLOGY_CLASSES.get(int(level), "SYS")
        devices = [
            GpuDevice(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                nvlink_peers=sorted(peers[gpu.index]),
                numa_node=gpu.numa_node,
                memory_bytes=gpu.memory_total_bytes,
                pci_bus_id=gpu.pci_bus_id,
                mig_enabled=gpu.mig_enabled,
            )
            for gpu in inventory
        ]
        return NodeTopology(cluster=cluster, node=node, gpus=devices, links=links, at=at or datetime.now(UTC))

    def _p2p_nvlink(self, index: int, h1: Any, h2: Any) -> bool:
        nvml = self._nvml
        if h1 is None or h2 is None:
            return False
        if not hasattr(nvml, "nvmlDeviceGetP2PStatus"):
            return True  # both GPUs have active switch links: on an NVSwitch fabric they reach each other
        try:
            status = self._call(
                "nvmlDeviceGetP2PStatus",
                f"gpu{index}",
                nvml.nvmlDeviceGetP2PStatus,
                h1,
                h2,
                getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2),
            )
        except DeviceLost:
            return False
        return status is not None and int(status) == int(getattr(nvml, "NVML_P2P_STATUS_OK", 0))

    def _nvlinks(self, gpu: GpuInfo, handle: Any, by_bus: dict[str, int]) -> tuple[Counter[int], int]:
        """Active NVLink links of one GPU: (links per peer GPU index, links ending at a switch)."""
        nvml = self._nvml
        peers: Counter[int] = Counter()
        switch_links = 0
        if handle is None or not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
            return peers, 0
        label = f"gpu{gpu.index}"
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        end_of_scan = (
            getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2),
            getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3),
        )
        for link in range(max_links):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in end_of_scan:
                    break  # past the last link, or no NVLink on this board: the normal end of the scan
                self._call("nvmlDeviceGetNvLinkState", label, reraise, exc)
                continue
            if int(state) != int(getattr(nvml, "NVML_FEATURE_ENABLED", 1)):
                continue
            remote_type = self._remote_type(handle, label, link)
            if remote_type == int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)):
                switch_links += 1
                continue
            remote = self._call(
                "nvmlDeviceGetNvLinkRemotePciInfo", label, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link
            )
            if remote is None:
                continue
            peer = by_bus.get(normalize_bus_id(nvml_text(remote.busId)))
            if peer is not None and peer != gpu.index:
                peers[peer] += 1
            elif peer is None and remote_type is None:
                # No remote-type call (older driver): a far end that is no GPU of this node is
                # taken for an NVSwitch. With the call, a GPU missing from the inventory (lost, or
                # failing to enumerate) is known to be a GPU and joins no fabric.
                switch_links += 1
        return peers, switch_links

    def _remote_type(self, handle: Any, label: str, link: int) -> int | None:
        """nvmlNvLinkDeviceType_t of a link's far end (GPU, IBMNPU, SWITCH); None when not supported."""
        nvml = self._nvml
        call = "nvmlDeviceGetNvLinkRemoteDeviceType"
        if not hasattr(nvml, call) or (call, label) in self._calls.unsupported:
            return None
        value = self._call(
            call, label, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link,
            quiet=(self._calls.not_supported,),
        )
        if value is None or int(value) == int(getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_UNKNOWN", 0xFF)):
            return None
        return int(value)

