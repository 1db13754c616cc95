"""Types of the native paths (src/rate.rs: streams/native_rating.py; src/rated_reader.rs:
streams/quota_decode.py; src/extender.rs: scheduler_hooks/extender/wire_kube.py and
scheduler_hooks/cluster/placement.py)."""

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

# The contract-1 limits the native checks implement (src/validate.rs), held equal to
# gpumeter.core's by tests/unit/streams/test_native_limits.py.
MAX_SAMPLE_BYTES: int
EVENT_ID_MAX_CHARS: int
NAME_MAX_CHARS: int
NAME_PATTERN: str
TENANT_PATTERN: str
PRIORITY_MIN: int
PRIORITY_MAX: int
UTILIZATION_DIGITS: int
TELEMETRY_DIGITS: int
KINDS: list[str]
CAPACITY_TYPES: list[str]

class NativeRater:
    def __init__(
        self,
        window: Callable[[str, str], tuple[bytes, dict[str, Any], int, str] | None],
        rating: Callable[..., tuple[bytes, bytes, dict[str, Any]] | None],
        decimal: type[Decimal],
        columns: Sequence[str],
    ) -> None: ...
    def rate_lines(self, lines: list[bytes], partition: int, offset: int) -> list[tuple[Any, ...] | None]: ...
    def clear(self) -> None: ...

class RatedReader:
    def __init__(
        self,
        moment: Callable[[str], Any],
        number: Callable[[str], Decimal | None],
        usage: Callable[..., Any],
    ) -> None: ...
    def read(self, record: bytes) -> list[tuple[int, int, Any]] | None: ...

class NodeNames:
    """A NodeNames request's names, undecoded (src/extender.rs)."""

    def __len__(self) -> int: ...
    def decode(self) -> list[str]: ...

def read_node_names(body: bytes) -> tuple[bytes, NodeNames] | None: ...
def priorities(names: NodeNames, score: int) -> bytes: ...

class FitPieces:
    """One fit table's host and FailedNodes pieces by node (scheduler_hooks/cluster/placement.py)."""

    def __init__(self, neutral: int) -> None: ...
    def __len__(self) -> int: ...
    def set(self, name: str, host: bytes, failed: bytes | None) -> bool: ...
    def forget(self, name: str) -> None: ...
    def filter(self, names: NodeNames) -> bytes: ...
    def prioritize(self, names: NodeNames) -> bytes: ...
