"""Types of the native rating path (src/lib.rs; used by streams/native_rating.py)."""

from collections.abc import Callable
from decimal import Decimal
from typing import Any

class NativeRater:
    def __init__(
        self,
        window: Callable[[str, str], tuple[bytes, list[Any], int, str] | None],
        rating: Callable[..., tuple[bytes, bytes, list[Any]] | None],
        decimal: type[Decimal],
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
