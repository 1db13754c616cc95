"""MIG profile names as NVML and NVIDIA's device plugin spell them.

NVML names a MIG device ``<board> MIG <profile>``; the profile is
``<g>g.<mem>gb`` for a GPU instance with one compute instance using all of it,
``<c>c.<g>g.<mem>gb`` for a compute instance using ``c`` of the GPU instance's
``g`` compute slices (several share one GPU instance), and may carry a media
extension: ``+me`` (Ampere/Hopper: the instance gets the media engines),
``+me.all``, ``+gfx`` and ``-me`` (Blackwell). Kubernetes resource names allow no
``+``, so the device plugin advertises ``1g.10gb+me`` as
``nvidia.com/mig-1g.10gb.me`` (``.me.all``, ``.gfx``); this module turns either
spelling into NVML's, which is what samples carry in ``mig_profile``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

_PROFILE = re.compile(
    r"^(?:(?P<ci>\d+)c\.)?(?P<gi>\d+)g\.(?P<memory>\d+)gb"
    r"(?P<extension>\+me\.all|\+me|\+gfx|-me|\.me\.all|\.me|\.gfx)?$",
    re.IGNORECASE,
)
_IN_NAME = re.compile(r"\bMIG\s+(\S+)", re.IGNORECASE)


@dataclass(frozen=True)
class MigProfile:
    gpu_slices: int  # compute slices of the GPU instance (the "g")
    memory_gb: int
    compute_slices: int | None = None  # the "c" of a compute-instance sub-profile
    extension: str = ""  # "+me", "+me.all", "+gfx", "-me" or ""

    @property
    def name(self) -> str:
        """NVML's spelling, e.g. ``1c.2g.20gb`` or ``1g.10gb+me``."""
        prefix = f"{self.compute_slices}c." if self.compute_slices is not None else ""
        return f"{prefix}{self.gpu_slices}g.{self.memory_gb}gb{self.extension}"

    def share(self, gpu_slices_total: int) -> Decimal:
        """Fraction of the physical GPU held: the GPU instance's slices of the GPU's, times the
        compute instance's part of its GPU instance (``1c.2g``: half of a 2-slice instance)."""
        compute = self.compute_slices if self.compute_slices is not None else self.gpu_slices
        return Decimal(compute) / Decimal(gpu_slices_total)


def parse_profile(text: str) -> MigProfile | None:
    """``1g.10gb``, ``1c.2g.20gb``, ``1g.10gb+me`` or the device plugin's ``1g.10gb.me``; None otherwise."""
    match = _PROFILE.match(text.strip())
    if match is None:
        return None
    extension = (match.group("extension") or "").lower()
    if extension.startswith("."):
        extension = "+" + extension[1:]  # the resource-name spelling of "+"
    ci = match.group("ci")
    return MigProfile(
        gpu_slices=int(match.group("gi")),
        memory_gb=int(match.group("memory")),
        compute_slices=int(ci) if ci is not None else None,
        extension=extension,
    )


def profile_in_name(device_name: str) -> MigProfile | None:
    """The profile of an NVML MIG device name (``NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb``)."""
    match = _IN_NAME.search(device_name)
    return parse_profile(match.group(1)) if match else None
