"""``sessionroute bench sim``: simulated requests per wall second of the whole simulator.

Runs the default ``swe-rl`` workload (3 x ``glm45air-h200-tp8``, 20 RL steps; every option can
be changed) under one policy with :func:`sessionroute.sim.run_simulation` and reports finished
requests per wall-clock second. ``--json`` prints ``{"requests_per_wall_second": X,
"simulated_requests": N, "wall_seconds": T}``.

Wall time on a shared machine moves with its load (on the project's 2-core VM one run of the
default took 6.2-8.4 s within minutes), so ``--repeat N`` runs the same simulation N times and
reports the median run, with every run's figure and the 1-minute load average at the end
(keys ``runs`` and ``loadavg_1m_at_end``, added only when N > 1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from sessionroute.bench.options import at_least
from sessionroute.native import build_caption, compiled_modules

__all__ = ["add_arguments", "print_table", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sessionroute bench sim``."""
    parser.add_argument("--workload", default="swe-rl", help="workload kind (default swe-rl)")
    parser.add_argument("--steps", type=int, default=20, help="RL steps (swe-rl)")
    parser.add_argument("--replicas", type=int, default=3, help="simulated replicas")
    parser.add_argument(
        "--policy",
        default="sticky_least_loaded",
        help="routing policy",
    )
    parser.add_argument(
        "--block-size", type=int, default=None, help="simulated KV block size (tokens)"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload and policy seed")
    parser.add_argument("--reference", action="store_true", help="use the naive engine")
    parser.add_argument(
        "--repeat",
        type=at_least(1),
        default=1,
        help="run the simulation N times and report the median run, with every run (default 1)",
    )


_FLAGS: dict[tuple[Any, ...], str] = {
    ("workload", "steps"): "--steps",
    ("workload", "kind"): "--workload",
    ("replicas", "count"): "--replicas",
    ("replicas", "block_size"): "--block-size",
}
"""Simulation spec fields -> the options that set them (for error messages)."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the simulation ``--repeat`` times and measure it.

    Raises:
        ConfigError: an option value the simulation refuses (e.g. ``--steps 0``).

    Returns:
        ``requests_per_wall_second``, ``simulated_requests`` (finished requests) and
        ``wall_seconds`` of the median run (exactly these keys for one run: the ``--json``
        document of issue 4); with ``--repeat`` N > 1 also ``runs`` (each run's requests per
        wall second, in order) and ``loadavg_1m_at_end``.
    """
    runs = []
    for k in range(args.repeat):
        runs.append(_run_once(args))
        if args.repeat > 1:
            rate = runs[-1]["requests_per_wall_second"]
            print(f"run {k + 1}/{args.repeat}: {rate:,.0f} requests / wall second", file=sys.stderr)
    if len(runs) == 1:
        return runs[0]
    rates = [r["requests_per_wall_second"] for r in runs]
    median = statistics.median_low(rates)  # a run that happened, not a mean of two
    result = dict(runs[rates.index(median)])
    result["runs"] = rates
    result["loadavg_1m_at_end"] = os.getloadavg()[0]
    return result


def _run_once(args: argparse.Namespace) -> dict[str, Any]:
    replicas: dict[str, Any] = {"count": args.replicas}
    if args.block_size is not None:
        replicas["block_size"] = args.block_size
    from pydantic import ValidationError

    from sessionroute.clock import MonotonicClock
    from sessionroute.errors import ConfigError
    from sessionroute.sim import SimSpec, run_simulation  # heavy: only when the bench runs

    try:
        spec = SimSpec.model_validate(
            {
                "workload": {"kind": args.workload, "steps": args.steps},
                "replicas": replicas,
                "sim": {"fast_engine": not args.reference},
            }
        )
    except ValidationError as err:
        problems = "; ".join(
            f"{_FLAGS.get(tuple(e['loc']), '.'.join(map(str, e['loc'])))}: {e['msg']}"
            for e in err.errors()
        )
        raise ConfigError(f"invalid options: {problems}") from None
    res = run_simulation(spec, args.policy, seed=args.seed, wall_clock=MonotonicClock())
    m = res.metrics
    return {
        "requests_per_wall_second": m["requests_per_wall_second"],
        "simulated_requests": m["requests_completed"],
        "wall_seconds": m["wall_seconds"],
    }


def print_table(result: dict[str, Any]) -> None:
    """Print the measurement as a short table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sessionroute bench sim", caption=build_caption(bool(compiled_modules())))
    table.add_column("simulated requests", justify="right")
    table.add_column("wall seconds", justify="right")
    table.add_column("requests / wall second", justify="right")
    table.add_row(
        f"{result['simulated_requests']:,}",
        f"{result['wall_seconds']:.2f}",
        f"{result['requests_per_wall_second']:,.0f}",
    )
    runs = result.get("runs")
    if runs:
        table.title = f"sessionroute bench sim (median of {len(runs)} runs)"
        table.caption = (
            f"{table.caption}; runs: {', '.join(f'{r:,.0f}' for r in runs)} requests / wall "
            f"second; load average {result['loadavg_1m_at_end']:.2f} at the end"
        )
    Console().print(table)
