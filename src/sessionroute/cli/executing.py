"""The command-line options and messages shared by the commands that run experiments
(``compare``, ``sweep``, ``tune``): where the runs execute, and what to say when some fail."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["add_ray_argument", "executor_from_args", "failed_runs_text"]


def add_ray_argument(parser: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]``: run each simulation as a Ray task."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run the simulations as Ray tasks: on the cluster at ADDRESS (e.g. "
        "ray://head:10001), or without ADDRESS on a local Ray instance; same results as the "
        "local process pool for the same seeds (needs pip install 'sessionroute[ray]')",
    )


def executor_from_args(args: argparse.Namespace, jobs: int) -> Any:
    """The executor ``--ray``/``--jobs`` ask for (:mod:`sessionroute.experiments.executor`).

    Raises:
        ConfigError: ``--ray`` without Ray installed (the message says what to install).
    """
    from sessionroute.experiments.executor import make_executor

    ray = getattr(args, "ray", None)
    return make_executor(jobs, False if ray is None else ray)


def failed_runs_text(failed: Sequence[Any]) -> str:
    """One line per failed run (:class:`~sessionroute.experiments.executor.RunFailed`)."""
    lines = [f"{len(failed)} run(s) failed; the results hold the runs that finished:"]
    lines += [f"  {f.label}: {f.error}" for f in failed]
    return "\n".join(lines)
