"""``sessionroute bench``: benchmarks that print machine-readable results."""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

__all__ = ["register"]

# target name -> (module with run(args) -> dict and add_arguments(parser), help)
_TARGETS: dict[str, tuple[str, str]] = {
    "policies": (
        "sessionroute.bench.policies",
        "select+complete latency per policy at many workers and sessions",
    ),
    "engine": ("sessionroute.bench.engine", "simulated requests per wall second, one replica"),
    "sim": ("sessionroute.bench.sim", "simulated requests per wall second, default swe-rl"),
    "proxy": ("sessionroute.bench.proxy", "router overhead against a zero-delay backend"),
}


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark (policies, engine, sim, proxy)",
        description="Benchmarks. Each prints a table, or one JSON document with --json.",
    )
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, (module_name, help_text) in _TARGETS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        p = targets.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print one JSON document")
        module.add_arguments(p)
        p.set_defaults(handler=_make_handler(module))


def _make_handler(module: Any) -> Any:
    def handler(args: argparse.Namespace) -> int:
        result: dict[str, Any] = module.run(args)
        if args.json:
            print(json.dumps(result))
        else:
            module.print_table(result)
        return 0

    return handler
