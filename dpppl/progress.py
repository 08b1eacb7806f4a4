"""Progress bars for long loops, drawn with rich like PyMC's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import (
    Progress as RichProgress,
)


class Task:
    """A handle on one bar; a no-op when progress bars are off."""

    def __init__(self, progress: RichProgress | None, task_id: int | None):
        self._progress = progress
        self._task_id = task_id

    def advance(self, steps: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task_id, steps)

    def update(self, *, description: str | None = None, completed: float | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task_id, description=description, completed=completed)


class Progress:
    """Progress reporting handed to mechanisms: ``with progress.task("DP-SGD", total=T) as bar``."""

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)

    @contextmanager
    def task(self, description: str, total: float) -> Iterator[Task]:
        if not self.enabled:
            yield Task(None, None)
            return
        progress = RichProgress(
            SpinnerColumn(),
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        with progress:
            task_id = progress.add_task(description, total=total)
            yield Task(progress, task_id)
            progress.update(task_id, completed=total)
