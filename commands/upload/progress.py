"""The progress bar of ``cdi upload``: bytes sent, rate and time left, drawn by ``rich``.

virtctl draws a bar with pb; users watch it for minutes, so ours shows the same three numbers
(and the bytes a resume skipped count as done, so the bar jumps forward instead of restarting).
``rich`` is already the bar of ``cdi import``. The transfer reports through ``update`` from the
event loop; ``rich`` redraws from its own thread ten times a second, so a slow terminal never
slows the upload. Without a terminal (a pipe, CI) nothing is drawn.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class ProgressBar:
    def __init__(self, enabled: bool, description: str = "upload") -> None:
        self.enabled = enabled
        self.description = description
        self.done = 0
        self.total = 0
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    @contextmanager
    def shown(self, total: int) -> Iterator[ProgressBar]:
        self.total = total
        if not self.enabled:
            yield self
            return
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),  # decimal units, as TransferSpeedColumn
            TransferSpeedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, transient=False) as bar:
            self._bar, self._task = bar, bar.add_task(self.description, total=total)
            try:
                yield self
            finally:
                bar.update(self._task, completed=self.done)
                self._bar = self._task = None

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` bytes are with the server (a resume may move it back)."""
        self.done, self.total = done, total or self.total
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, total=self.total)
