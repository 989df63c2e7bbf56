"""A rich progress display: one bar per arm run."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["RichReporter"]


class RichReporter:
    """Implements the runner's ProgressReporter with a bar per arm (on ``console``)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description:<32}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichReporter:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def start_run(self, label: str) -> _Updater:
        task = self._progress.add_task(label, total=1.0)
        self._tasks[label] = task
        return _Updater(self._progress, task)

    def end_run(self, label: str) -> None:
        task = self._tasks.get(label)
        if task is not None:
            self._progress.update(task, completed=1.0)


class _Updater:
    __slots__ = ("_last", "_progress", "_task")

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task
        self._last = -1.0

    def __call__(self, fraction: float) -> None:
        f = min(1.0, max(0.0, fraction))
        if f - self._last >= 0.005 or f >= 1.0:
            self._last = f
            self._progress.update(self._task, completed=f)
