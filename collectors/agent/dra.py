"""GPUs allocated through Dynamic Resource Allocation, resolved to the devices NVML reports.

The kubelet's PodResources ``dynamic_resources`` name a DRA device by its driver,
pool and device name, not by UUID. NVIDIA's DRA driver (``gpu.nvidia.com``,
kubernetes-sigs/dra-driver-nvidia-gpu) names devices by the GPU's *minor number*
(``/dev/nvidia<minor>``, ``nvmlDeviceGetMinorNumber``), not by NVML index:

* a whole GPU: ``gpu-<minor>``;
* a MIG device: ``gpu-<parent minor>-mig-<profile>-<profile id>-<placement start>``,
  the profile with its dots removed and other characters not allowed in a DNS
  label turned into ``-`` (``1g.10gb+me`` -> ``1g10gb-me``).

A whole GPU resolves to its UUID. A MIG device resolves to the one NVML MIG
device of that profile on that parent; when there are several (NVML does not
report the placement), it bills the profile's share of the parent GPU without
MIG telemetry, which is the same quantity. Anything else stays unresolved
(empty UUID) and is counted as an unknown device by the sample builder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from collectors.agent.mig import MigProfile
from collectors.agent.nvml_inventory import GpuInfo
from collectors.agent.podresources import DeviceAllocation

_WHOLE = re.compile(r"^gpu-(\d+)$")
_MIG = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
_DRA_PROFILE = re.compile(r"^(?:(\d+)c)?(\d+)g(\d+)gb(-[a-z0-9-]+)?$")
_NOT_IN_LABEL = re.compile(r"[^a-z0-9-]")


def dra_profile_key(profile: str) -> str:
    """How the DRA driver spells an NVML profile inside a device name: ``1g.10gb+me`` -> ``1g10gb-me``."""
    return _NOT_IN_LABEL.sub("-", profile.lower().replace(".", "")).strip("-")


def _profile_from_key(key: str) -> MigProfile | None:
    match = _DRA_PROFILE.match(key)
    if match is None:
        return None
    compute = match.group(1)
    return MigProfile(
        gpu_slices=int(match.group(2)),
        memory_gb=int(match.group(3)),
        compute_slices=int(compute) if compute is not None else None,
    )


def resolve(allocations: Iterable[DeviceAllocation], inventory: Iterable[GpuInfo]) -> list[DeviceAllocation]:
    """The allocations with each DRA device's NVML UUID filled in where the name resolves."""
    by_minor = {gpu.minor_number if gpu.minor_number is not None else gpu.index: gpu for gpu in inventory}
    return [
        _resolve(allocation, by_minor) if allocation.dra_device and not allocation.device_uuid else allocation
        for allocation in allocations
    ]


def _resolve(allocation: DeviceAllocation, by_minor: dict[int, GpuInfo]) -> DeviceAllocation:
    name = allocation.dra_device or ""
    whole = _WHOLE.match(name)
    if whole is not None:
        gpu = by_minor.get(int(whole.group(1)))
        return replace(allocation, device_uuid=gpu.uuid) if gpu is not None else allocation
    mig = _MIG.match(name)
    if mig is None:
        return allocation
    parent = by_minor.get(int(mig.group(1)))
    key = mig.group(2)
    if parent is None:
        return allocation
    candidates = [m for m in parent.mig_instances if m.profile and dra_profile_key(m.profile) == key]
    if len(candidates) == 1:
        (instance,) = candidates
        return replace(allocation, device_uuid=instance.uuid, mig_profile=instance.profile)
    profile = _profile_from_key(key)
    if profile is None or not parent.mig_slices:
        return allocation
    # Several devices of this profile on the parent and no placement from NVML: the quantity is the
    # same for each, so bill the profile's share of the parent (no per-slice telemetry).
    named = candidates[0].profile if candidates else profile.name
    return replace(
        allocation,
        device_uuid=parent.uuid,
        mig_profile=named,
        share=allocation.share * profile.share(parent.mig_slices),
    )
