"""Contract-1 samples of the simulated fleet, in the node agent's shape (collectors/agent/samples.py).

The simulated fleet must not import the agent, so the agent's rules are restated here; a test
compares the two on the same inputs (tests/unit/collectors/sim/test_agent_shape.py):

* ``event_id`` = the first 40 hex digits of sha256 over (cluster, node, pod UID, kind, device,
  window start as ISO 8601 UTC), joined by U+001F. The device is the kubelet's device ID for a
  gpu sample (GPU UUID, MIG device UUID, or ``<GPU UUID>::<replica>`` for a time-sliced
  replica), ``cpu``, ``memory``, ``ephemeral`` for the pod's ephemeral storage; a PVC sample
  uses ``pvc:<claim uid>`` with node and pod UID left empty, so a claim bills once per window.
* one gpu sample per device the pod holds; quantity = the device's share of a GPU (1, a MIG
  device's compute slices / the GPU's slices, 1 / replicas) x the part of the window the pod
  held it, at 12 places half-even (:func:`gpumeter.core.models.quantize_quantity`).
* the held part of a window is 1, or ``round(held seconds / window seconds, 6)`` for a pod that
  ended inside it (the agent's ``held_fraction``). A PVC is billed whole whatever that part.
* telemetry is quantized to 6 places and present only where NVML has it: a whole GPU held by
  one pod has utilization, memory, power and energy; a MIG device memory only (NVML has no
  utilization nor power for MIG devices); a time-sliced GPU held by several pods memory only
  (each pod's own processes); backfilled windows none.
* labels: ``gpu_uuid``, ``gpu_index`` and ``container`` on gpu samples, ``pvc`` on PVC samples,
  ``backfilled: "true"`` on backfilled ones, and on every sample ``gpumeter.io/source:
  simulated`` (the one difference from the agent's samples, on purpose: a simulated reading is
  never presented as an NVML one).

Every value is built JSON-ready (Decimals as strings, ISO 8601 timestamps with ``+00:00``),
exactly as ``UsageSample.model_dump()`` goes through :mod:`gpumeter.core.jsonio`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from gpumeter.core.models import quantize_quantity

EVENT_ID_HEX = 40
SOURCE_LABEL = "gpumeter.io/source"
BACKFILL_LABEL = "backfilled"
CONTAINER = "main"  # a simulated pod has one container; allocation records and labels name it
GIB = Decimal(2) ** 30
SIX_PLACES = Decimal("0.000001")
ONE = Decimal(1)

DeviceKind = Literal["whole", "mig", "shared"]


def event_id(cluster: str, node: str, pod_uid: str, kind: str, device: str, window_start_iso: str) -> str:
    """The agent's idempotency key (module docstring); ``window_start_iso`` as ``datetime.isoformat()``."""
    material = "\x1f".join((cluster, node, pod_uid, kind, device, window_start_iso)).encode()
    return hashlib.sha256(material).hexdigest()[:EVENT_ID_HEX]


def held_fraction(started: int, finished: int | None, window_start: int, window_end: int) -> Decimal:
    """Part of the window [window_start, window_end) (seconds) a pod living [started, finished) held."""
    begin = max(started, window_start)
    end = window_end if finished is None else min(window_end, finished)
    if end <= begin:
        return Decimal(0)
    if begin == window_start and end == window_end:
        return ONE
    # The agent's arithmetic: a float ratio rounded to 6 places, then Decimal.
    return Decimal(str(round((end - begin) / (window_end - window_start), 6)))


def quantity_text(value: Decimal) -> str:
    return str(quantize_quantity(value)) if value else "0"


def six(value: Decimal) -> str:
    """Telemetry as the agent quantizes it (6 places)."""
    return str(value.quantize(SIX_PLACES))


@dataclass(frozen=True, slots=True)
class Device:
    """One device a pod holds, as the kubelet lists it and NVML knows it."""

    index: int  # the GPU's index (a MIG device's parent)
    device_id: str  # the kubelet's device ID (goes into event_id)
    uuid: str  # the GPU or MIG device UUID (the ``gpu_uuid`` label)
    kind: DeviceKind
    share: Decimal  # fraction of one GPU
    memory_bytes: int  # the device's memory (a MIG device's own, a replica's part of its GPU)
    mig_profile: str | None = None


@dataclass(frozen=True, slots=True)
class Reading:
    """What NVML would report for one device during one window (None: not available)."""

    utilization: str | None = None
    memory_used_bytes: str | None = None
    power_watts: str | None = None
    energy_joules: str | None = None


@dataclass(frozen=True, slots=True)
class PodIdentity:
    tenant: str
    namespace: str
    pod: str
    pod_uid: str
    capacity_type: str
    priority: int


def _template(cluster: str, node: str, pod: PodIdentity, kind: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "event_id": "",
        "kind": kind,
        "cluster": cluster,
        "node": node,
        "tenant": pod.tenant,
        "namespace": pod.namespace,
        "pod": pod.pod,
        "pod_uid": pod.pod_uid,
        "window_start": "",
        "window_end": "",
        "quantity": "",
        "gpu_model": None,
        "mig_profile": None,
        "capacity_type": pod.capacity_type,
        "priority": pod.priority,
        "utilization": None,
        "memory_used_bytes": None,
        "power_watts": None,
        "energy_joules": None,
        "labels": labels,
    }


def _id_prefix(*parts: str) -> bytes:
    return ("\x1f".join(parts) + "\x1f").encode()


@dataclass(frozen=True, slots=True)
class HostUsage:
    """A pod's measured CPU cores and memory working set in one window (None: not measured)."""

    cpu_cores: Decimal | None = None
    memory_bytes: int | None = None


class PodSampler:
    """Every sample of one pod on one node, window after window.

    What never changes while the pod runs (identity, devices, requests, event-id prefixes) is
    built once; a window fills in times, quantities and telemetry. The samples are the ones the
    agent builds from the same observations (module docstring).
    """

    __slots__ = (
        "_cpu", "_devices", "_ephemeral", "_gpu", "_host", "_memory", "_pvc", "_pvc_prefix", "_requested",
    )

    def __init__(
        self, cluster: str, node: str, gpu_model: str, pod: PodIdentity, devices: tuple[Device, ...], *,
        cpu_request: Decimal, memory_request: int, ephemeral_gib: Decimal,
        pvc: tuple[str, str, Decimal] | None,
    ) -> None:
        self._devices = devices
        self._gpu: list[tuple[dict[str, Any], bytes, str]] = []
        for device in devices:
            template = _template(cluster, node, pod, "gpu", {
                SOURCE_LABEL: "simulated", "gpu_uuid": device.uuid, "gpu_index": str(device.index),
                "container": CONTAINER,
            })
            template["gpu_model"] = gpu_model
            template["mig_profile"] = device.mig_profile
            prefix = _id_prefix(cluster, node, pod.pod_uid, "gpu", device.device_id)
            self._gpu.append((template, prefix, quantity_text(device.share)))
        self._cpu = cpu_request
        self._memory = memory_request
        self._ephemeral = ephemeral_gib
        self._host = {
            kind: (_template(cluster, node, pod, kind, {SOURCE_LABEL: "simulated"}),
                   _id_prefix(cluster, node, pod.pod_uid, kind, device))
            for kind, device in (("cpu", "cpu"), ("memory", "memory"), ("storage", "ephemeral"))
        }
        # The quantities of a window held whole at the request: most windows, so computed once.
        self._requested = {
            "cpu": quantity_text(cpu_request),
            "memory": quantity_text(Decimal(memory_request) / GIB),
            "storage": quantity_text(ephemeral_gib),
        }
        self._pvc: tuple[dict[str, Any], str] | None = None
        self._pvc_prefix = b""
        if pvc is not None and pvc[2] > 0:
            uid, name, gib = pvc
            self._pvc = (_template(cluster, node, pod, "storage", {SOURCE_LABEL: "simulated", "pvc": name}),
                         quantity_text(gib))
            # Cluster-wide: every pod (on any node) mounting the claim yields the same event_id.
            self._pvc_prefix = _id_prefix(cluster, "", "", "storage", f"pvc:{uid}")

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    def window(
        self, start_iso: str, end_iso: str, fraction: Decimal, readings: Sequence[Reading | None] | None,
        usage: HostUsage, backfilled: bool = False,
    ) -> list[dict[str, Any]]:
        """The pod's samples of one window: gpu (``readings`` per device, None: no telemetry), cpu,
        memory, ephemeral storage, PVC."""
        stamp = start_iso.encode()
        sha = hashlib.sha256
        out: list[dict[str, Any]] = []
        whole = fraction == ONE
        for i, (template, prefix, full) in enumerate(self._gpu):
            sample = template.copy()
            sample["event_id"] = sha(prefix + stamp).hexdigest()[:EVENT_ID_HEX]
            sample["window_start"] = start_iso
            sample["window_end"] = end_iso
            sample["quantity"] = full if whole else quantity_text(self._devices[i].share * fraction)
            sample["labels"] = template["labels"].copy()
            reading = readings[i] if readings is not None else None
            if reading is not None:
                sample["utilization"] = reading.utilization
                sample["memory_used_bytes"] = reading.memory_used_bytes
                sample["power_watts"] = reading.power_watts
                sample["energy_joules"] = reading.energy_joules
            out.append(sample)
        cpu = self._cpu if usage.cpu_cores is None else max(self._cpu, usage.cpu_cores)
        memory = Decimal(self._memory)
        if usage.memory_bytes is not None and usage.memory_bytes > self._memory:
            memory = Decimal(usage.memory_bytes)
        for kind, amount, requested in (
            ("cpu", cpu, cpu == self._cpu),
            ("memory", memory, memory == self._memory),
            ("storage", self._ephemeral, True),
        ):
            if amount <= 0:
                continue
            template, prefix = self._host[kind]
            sample = template.copy()
            sample["event_id"] = sha(prefix + stamp).hexdigest()[:EVENT_ID_HEX]
            sample["window_start"] = start_iso
            sample["window_end"] = end_iso
            if whole and requested:
                sample["quantity"] = self._requested[kind]
            else:
                sample["quantity"] = quantity_text((amount / GIB if kind == "memory" else amount) * fraction)
            sample["labels"] = template["labels"].copy()
            if kind == "cpu" and usage.cpu_cores is not None and self._cpu > 0:
                sample["utilization"] = six(usage.cpu_cores / self._cpu)
            elif kind == "memory" and usage.memory_bytes is not None:
                sample["memory_used_bytes"] = str(usage.memory_bytes)
            out.append(sample)
        if self._pvc is not None:
            template, gib = self._pvc
            sample = template.copy()
            sample["event_id"] = sha(self._pvc_prefix + stamp).hexdigest()[:EVENT_ID_HEX]
            sample["window_start"] = start_iso
            sample["window_end"] = end_iso
            sample["quantity"] = gib  # held whole, from the claim's creation: not scaled by the fraction
            sample["labels"] = template["labels"].copy()
            out.append(sample)
        if backfilled:
            for sample in out:
                sample["labels"][BACKFILL_LABEL] = "true"
        return out
