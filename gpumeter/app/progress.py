"""Progress display (rich) for long commands; quiet when stderr is not a terminal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

stderr_console = Console(stderr=True)


@contextmanager
def byte_progress(total: int, label: str) -> Iterator[Callable[[int], None]]:
    """A bar over ``total`` bytes; yields a function to advance it."""
    progress = Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=stderr_console, disable=not stderr_console.is_terminal, transient=True,
    )
    with progress:
        task = progress.add_task(label, total=total)

        def advance(size: int) -> None:
            progress.advance(task, size)

        yield advance
