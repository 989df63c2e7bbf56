"""Where an experiment's runs execute: this process, a local process pool, or a Ray cluster.

Every run is independent and seeded (an arm, a seed, a progress callback ->
:class:`~sessionroute.experiments.results.RunOutput`), so where it runs never changes its
result: the three executors give identical numbers for the same seeds. They differ in reach and
in failure handling:

* :class:`LocalExecutor` (the default): runs in this process (``jobs=1``) or in ``jobs`` spawned
  worker processes on this machine.
* :class:`RayExecutor` (``--ray [ADDRESS]``, the ``sessionroute[ray]`` extra): each run is a Ray
  task (https://docs.ray.io/en/latest/ray-core/tasks.html) on a running cluster (``ADDRESS``,
  e.g. ``ray://head:10001`` or ``127.0.0.1:6379``) or on a local instance started for the
  command. A task whose worker process dies is retried by Ray (``max_retries``); progress flows
  back through a Ray queue.

Both return one entry per task: its output, or a :class:`RunFailed` naming what went wrong, so
that a partial experiment still writes what finished. A :class:`~sessionroute.errors.ConfigError`
(a setting of the experiment that every run would trip on) is raised instead.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sessionroute.errors import ConfigError
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import ResolvedArm

__all__ = [
    "Executor",
    "LocalExecutor",
    "ProgressFn",
    "RayExecutor",
    "RunFailed",
    "Task",
    "make_executor",
]

H = TypeVar("H")

ProgressFn = Callable[[float], None]
"""Called with the fraction done of the current run, in [0, 1]."""


class ArmRunner(Protocol):
    """Executes one arm once: ``(arm, seed, progress) -> RunOutput``."""

    def __call__(self, arm: ResolvedArm, seed: int, progress: ProgressFn) -> RunOutput: ...


class ProgressReporter(Protocol):
    """What an executor tells about progress (a rich progress display in the CLI)."""

    def start_run(self, label: str) -> ProgressFn: ...

    def end_run(self, label: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Task:
    """One run: ``arm`` with ``seed``, shown as ``label`` (unique within a batch)."""

    arm: ResolvedArm
    seed: int
    label: str


@dataclass(frozen=True, slots=True)
class RunFailed:
    """A run that raised or whose worker died (after the executor's retries).

    Attributes:
        label: the task's label.
        error: the exception's type and message.
        detail: the traceback text where one was captured.
    """

    label: str
    error: str
    detail: str = ""


class Executor(Protocol):
    """Runs a batch of tasks; returns, in task order, each output or :class:`RunFailed`."""

    def run(
        self,
        tasks: Sequence[Task],
        arm_runner: ArmRunner,
        reporter: ProgressReporter | None = None,
    ) -> list[RunOutput | RunFailed]: ...


def _ignore(fraction: float) -> None:
    return None


def _failure(label: str, exc: BaseException) -> RunFailed:
    """The :class:`RunFailed` of a run that raised ``exc``; a :class:`ConfigError` (the
    experiment's own settings, which every run would hit alike) is raised instead."""
    cause = getattr(exc, "cause", None)  # a Ray task's error wraps the run's
    for err in (exc, cause):
        if isinstance(err, ConfigError):
            raise err
    detail = "".join(traceback.format_exception(exc))
    return RunFailed(label, f"{type(exc).__name__}: {exc}", detail)


class LocalExecutor:
    """This process (``jobs == 1`` or a single task) or a pool of ``jobs`` spawned processes.

    Args:
        jobs: worker processes (>= 1).

    Raises:
        ValueError: for ``jobs < 1``.
    """

    def __init__(self, jobs: int = 1) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.jobs = jobs

    def run(
        self,
        tasks: Sequence[Task],
        arm_runner: ArmRunner,
        reporter: ProgressReporter | None = None,
    ) -> list[RunOutput | RunFailed]:
        if self.jobs > 1 and len(tasks) > 1:
            return self._parallel(tasks, arm_runner, reporter)
        outputs: list[RunOutput | RunFailed] = []
        for task in tasks:
            progress = reporter.start_run(task.label) if reporter else _ignore
            try:
                outputs.append(arm_runner(task.arm, task.seed, progress))
            except Exception as exc:  # reported per run; the other runs still go on
                outputs.append(_failure(task.label, exc))
            if reporter:
                reporter.end_run(task.label)
        return outputs

    def _parallel(
        self, tasks: Sequence[Task], arm_runner: ArmRunner, reporter: ProgressReporter | None
    ) -> list[RunOutput | RunFailed]:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager, ProcessPoolExecutor(self.jobs, mp_context=ctx) as pool:
            queue = manager.Queue()
            futures = [
                pool.submit(_run_with_queue, arm_runner, t.arm, t.seed, t.label, queue)
                for t in tasks
            ]

            def wait_some(pending: list[Future[RunOutput]]) -> list[Future[RunOutput]]:
                return list(wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)[1])

            def updates() -> Iterator[tuple[str, float]]:
                while not queue.empty():
                    yield queue.get()

            return _collect(tasks, reporter, futures, wait_some, updates, Future.result)


def _collect(
    tasks: Sequence[Task],
    reporter: ProgressReporter | None,
    handles: list[H],
    wait_some: Callable[[list[H]], list[H]],
    updates: Callable[[], Iterator[tuple[str, float]]],
    result: Callable[[H], RunOutput],
) -> list[RunOutput | RunFailed]:
    """Follow submitted runs to the end, for either pool: show their progress, then collect
    each one's output or :class:`RunFailed`, in task order.

    Args:
        tasks: the runs, in order.
        reporter: shows progress, or None.
        handles: one per task (a future, a Ray object ref).
        wait_some: waits a little (0.2 s at most) and returns the handles still pending.
        updates: the ``(label, fraction)`` progress reports queued since the last call.
        result: a finished handle's output (raises what the run raised).
    """
    updaters = {t.label: reporter.start_run(t.label) for t in tasks} if reporter else {}
    pending = list(handles)
    while pending:
        pending = wait_some(pending)
        for label, fraction in updates():
            if label in updaters:
                updaters[label](fraction)
    if reporter:
        for t in tasks:
            reporter.end_run(t.label)
    outputs: list[RunOutput | RunFailed] = []
    for task, handle in zip(tasks, handles, strict=True):
        try:
            outputs.append(result(handle))
        except Exception as exc:  # reported per run; the other runs' outputs are kept
            outputs.append(_failure(task.label, exc))
    return outputs


def _run_with_queue(
    arm_runner: ArmRunner, arm: ResolvedArm, seed: int, label: str, queue: Any
) -> RunOutput:
    """A worker's run, its progress put on ``queue`` as ``(label, fraction)``, at most every
    0.1 s (and always the last)."""
    last = [0.0]

    def progress(fraction: float) -> None:
        now = time.monotonic()
        if fraction >= 1.0 or now - last[0] >= 0.1:
            last[0] = now
            queue.put((label, fraction))

    return arm_runner(arm, seed, progress)


class RayExecutor:
    """Each run a Ray task on the cluster at ``address`` (None: a local instance started here,
    bound to 127.0.0.1).

    Args:
        address: a running cluster's address (``ray://host:10001``, ``host:6379``), or None.
        max_retries: times Ray re-runs a task whose worker process died.

    Raises:
        ConfigError: when Ray is not installed (``pip install 'sessionroute[ray]'``).
    """

    def __init__(self, address: str | None = None, max_retries: int = 2) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--ray needs Ray: pip install 'sessionroute[ray]' (or pip install ray)"
            ) from None
        self.address = address
        self.max_retries = max_retries

    def _init(self) -> bool:
        """Connect to (or start) Ray; True when this call started it (and so shuts it down)."""
        import ray

        if ray.is_initialized():
            return False
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:
            ray.init(
                _node_ip_address="127.0.0.1",
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        return True

    def run(
        self,
        tasks: Sequence[Task],
        arm_runner: ArmRunner,
        reporter: ProgressReporter | None = None,
    ) -> list[RunOutput | RunFailed]:
        import ray
        from ray.util.queue import Empty, Queue

        started = self._init()
        try:
            queue = Queue()
            remote = ray.remote(max_retries=self.max_retries)(_run_with_queue)
            refs = [remote.remote(arm_runner, t.arm, t.seed, t.label, queue) for t in tasks]

            def wait_some(pending: list[Any]) -> list[Any]:
                return list(ray.wait(pending, num_returns=1, timeout=0.2)[1])

            def updates() -> Iterator[tuple[str, float]]:
                while True:
                    try:
                        yield queue.get_nowait()
                    except Empty:
                        return

            # a RayTaskError (the run raised) or a dead worker is the run's RunFailed
            outputs = _collect(tasks, reporter, refs, wait_some, updates, ray.get)
            queue.shutdown()
            return outputs
        finally:
            if started:
                ray.shutdown()


def make_executor(jobs: int, ray_address: str | bool | None = False) -> Executor:
    """The executor the command line asks for: Ray when ``ray_address`` is a string (an
    address, or ``""`` for a local instance) or True, else a local pool of ``jobs``."""
    if ray_address is False or ray_address is None:
        return LocalExecutor(jobs)
    address = ray_address if isinstance(ray_address, str) and ray_address else None
    return RayExecutor(address)
