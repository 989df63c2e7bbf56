"""A rich progress display: one bar per arm run."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["OverallReporter", "RichReporter"]


class _Display:
    """A started-and-stopped ``rich`` progress display (a context manager)."""

    _progress: Progress

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()


class RichReporter(_Display):
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

    def start_run(self, label: str) -> _Updater:
        # the bar's clock starts with the run's first progress, not while it waits for a slot
        task = self._progress.add_task(label, total=1.0, start=False)
        self._tasks[label] = task
        return _Updater(self._progress, task)

    def end_run(self, label: str) -> None:
        task = self._tasks.get(label)
        if task is not None:
            self._progress.start_task(task)  # (no-op when already started)
            self._progress.update(task, completed=1.0)


class _Updater:
    __slots__ = ("_last", "_progress", "_task")

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task
        self._last = -1.0

    def __call__(self, fraction: float) -> None:
        f = min(1.0, max(0.0, fraction))
        if self._last < 0.0:
            self._progress.start_task(self._task)
        if f - self._last >= 0.005 or f >= 1.0:
            self._last = f
            self._progress.update(self._task, completed=f)


class OverallReporter(_Display):
    """Implements the runner's ProgressReporter with one bar for all runs (a sweep's many
    runs): the mean fraction done, and how many runs have finished."""

    def __init__(self, console: Console, description: str, runs: int) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>5.1f}%"),
            TextColumn("{task.fields[done]}/{task.fields[runs]} runs"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(description, total=1.0, done=0, runs=runs)
        self._runs = runs
        self._fractions: dict[str, float] = {}
        self._done = 0

    def _update(self) -> None:
        total = sum(self._fractions.values()) / max(1, self._runs)
        self._progress.update(self._task, completed=min(1.0, total), done=self._done)

    def start_run(self, label: str) -> _Fraction:
        self._fractions[label] = 0.0
        return _Fraction(self, label)

    def end_run(self, label: str) -> None:
        self._fractions[label] = 1.0
        self._done = sum(1 for f in self._fractions.values() if f >= 1.0)
        self._update()

    def set_fraction(self, label: str, fraction: float) -> None:
        """Record ``label``'s fraction done and redraw."""
        self._fractions[label] = min(1.0, max(0.0, fraction))
        self._update()


class _Fraction:
    __slots__ = ("_label", "_last", "_owner")

    def __init__(self, owner: OverallReporter, label: str) -> None:
        self._owner = owner
        self._label = label
        self._last = -1.0

    def __call__(self, fraction: float) -> None:
        if fraction - self._last >= 0.01 or fraction >= 1.0:
            self._last = fraction
            self._owner.set_fraction(self._label, fraction)
