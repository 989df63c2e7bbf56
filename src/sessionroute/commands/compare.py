"""``sessionroute compare``: matched A/B experiments (placeholder until the runner lands)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare routing policies on a workload (simulated or live)",
        description="Run matched arms that differ only in the routing policy and report.",
    )
    parser.add_argument("file", nargs="?", help="experiment file (TOML)")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    print(
        "sessionroute compare: the experiment runner is not built yet "
        "(needs the simulator and the experiment runner).",
        file=sys.stderr,
    )
    return 1
