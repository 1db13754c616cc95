"""Kubernetes JSON read the way Go's encoding/json reads it, and a pod's GPU request from it.

Both the extender wires (kube-scheduler's and Volcano's requests) and the state's watches
(API objects, camelCase) read the same shapes: field names matched case-insensitively as Go
does, values checked for type with a ``WireError`` naming where a shape is wrong, and
GPU quantities counted in whole devices (``nvidia.com/gpu``, and apart from it MIG devices and
renamed time-sliced replicas). A pod's GPU request is checked here and
computed by ``gpumeter.core.kube.effective_requests``, the kubelet's rule the agent bills by.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from gpumeter.core import kube


class WireError(ValueError):
    """A request whose JSON shape does not match the upstream types; ``reason`` says where."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- decoding helpers ------------------------------------------------------------------------


def get(obj: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` the way Go's encoding/json finds it: exact key, else case-insensitive."""
    if name in obj:
        return obj[name]
    folded = name.casefold()
    for key, value in obj.items():
        if isinstance(key, str) and key.casefold() == folded:
            return value
    return None


def as_object(value: Any, where: str, *, optional: bool = False) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise WireError(f"{where} must be a JSON object, got {_kind(value)}")
    return value


def as_list(value: Any, where: str, *, optional: bool = False) -> list[Any]:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise WireError(f"{where} must be a JSON array, got {_kind(value)}")
    return value


def as_str(value: Any, where: str, *, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise WireError(f"{where} must be a string, got {_kind(value)}")
    return value


def as_int(value: Any, where: str, *, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise WireError(f"{where} must be an integer, got {_kind(value)}")
    if isinstance(value, int):
        return value
    if not math.isfinite(value) or value != int(value):
        raise WireError(f"{where} must be an integer, got {value}")
    return int(value)


def as_number(value: Any, where: str, *, default: Decimal | None = None) -> Decimal:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise WireError(f"{where} must be a number, got {_kind(value)}")
    number = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise WireError(f"{where} must be a finite number")
    return number


def string_map(value: Any, where: str) -> dict[str, str]:
    mapping = as_object(value, where, optional=True)
    for key, item in mapping.items():
        if not isinstance(item, str):
            raise WireError(f"{where}[{key!r}] must be a string, got {_kind(item)}")
    return mapping


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | Decimal):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


# -- quantities and a pod's GPU request ------------------------------------------------------

MAX_QUANTITY_CHARS = 64
MAX_INT64 = 2**63 - 1
_QUANTITY = re.compile(r"^\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m|k|M|G|Ki|Mi|Gi)?$")
_SUFFIX = {
    None: Decimal(1), "m": Decimal("0.001"), "k": Decimal(1000), "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9, "Ki": Decimal(1024), "Mi": Decimal(1024) ** 2, "Gi": Decimal(1024) ** 3,
}


def gpu_amount(value: Any, where: str) -> Decimal:
    """A ``nvidia.com/gpu`` quantity ("2", 2, "2000m") as sent, checked: exact, never negative,
    at most what a Go int64 holds (what the scheduler's resource.Quantity counts in).

    A quantity string longer than 64 characters is refused before any arithmetic: rounding a
    number of a million digits up to whole GPUs takes minutes in one C call holding the GIL,
    which no worker thread could keep from freezing the event loop.
    """
    if isinstance(value, str):
        if len(value) > MAX_QUANTITY_CHARS:
            raise WireError(f"{where} is not a resource quantity: {len(value):,} characters, "
                            f"at most {MAX_QUANTITY_CHARS}")
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise WireError(f"{where} is not a resource quantity: {value!r}")
        try:
            amount = Decimal(match.group(1)) * _SUFFIX[match.group(2)]
        except (InvalidOperation, ArithmeticError):
            raise WireError(f"{where} is not a resource quantity: {value!r}") from None
    else:
        amount = as_number(value, where)
        if amount < 0:
            raise WireError(f"{where} must not be negative")
    if amount > MAX_INT64:
        raise WireError(f"{where} is beyond 64 bits: no node has that many GPUs")
    return amount


def gpu_count(value: Any, where: str) -> int:
    """A ``nvidia.com/gpu`` quantity as whole GPUs (a fraction rounds up)."""
    return math.ceil(gpu_amount(value, where))


def _gpu_resources(container: Any, where: str) -> dict[str, Any]:
    """A container's GPU limits and requests, checked, in the API's own shape."""
    spec = as_object(container, where)
    resources = as_object(get(spec, "resources"), f"{where}.resources", optional=True)
    checked: dict[str, dict[str, Decimal]] = {}
    for kind in ("limits", "requests"):
        amounts = as_object(get(resources, kind), f"{where}.resources.{kind}", optional=True)
        gpus = {name: gpu_amount(amount, f"{where}.resources.{kind}[{name!r}]")
                for name, amount in amounts.items() if kube.is_gpu_resource(name)}
        if gpus:
            checked[kind] = gpus
    return {"resources": checked, "restartPolicy": get(spec, "restartPolicy")}


def pod_gpus(spec: Mapping[str, Any], where: str = "Pod.spec") -> int:
    """Effective ``nvidia.com/gpu`` request, whole GPUs (``pod_gpu_requests``)."""
    return pod_gpu_requests(spec, where)[0]


def pod_gpu_requests(spec: Mapping[str, Any], where: str = "Pod.spec") -> tuple[int, int]:
    """(``nvidia.com/gpu``, other GPU devices) the pod asks, each in whole units (a fraction
    rounds up); the others are MIG devices and renamed time-sliced replicas
    (``gpumeter.core.kube.other_gpu_device_request``). Shapes and quantities are checked here (a
    ``WireError`` names the field), the rule is ``gpumeter.core.kube.effective_requests``."""
    containers = as_list(get(spec, "containers"), f"{where}.containers", optional=True)
    inits = as_list(get(spec, "initContainers"), f"{where}.initContainers", optional=True)
    overhead = as_object(get(spec, "overhead"), f"{where}.overhead", optional=True)
    checked: dict[str, Any] = {
        "containers": [_gpu_resources(c, f"{where}.containers[{i}]") for i, c in enumerate(containers)],
        "initContainers": [_gpu_resources(c, f"{where}.initContainers[{i}]") for i, c in enumerate(inits)],
    }
    checked["overhead"] = {name: gpu_amount(amount, f"{where}.overhead[{name!r}]")
                           for name, amount in overhead.items() if kube.is_gpu_resource(name)}
    return math.ceil(kube.gpu_request(checked)), math.ceil(kube.other_gpu_device_request(checked))
