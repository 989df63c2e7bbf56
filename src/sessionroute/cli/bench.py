"""``sessionroute bench``: benchmarks that print machine-readable results.

The argument layer only: each target is a module of :mod:`sessionroute.bench` with
``add_arguments(parser)``, ``run(args) -> dict`` and ``print_table(result)``, and optionally
``exit_status(result) -> int`` (0 when absent).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from typing import Any

__all__ = ["register"]

_BUILD_NOTE = (
    "Measures the installed build: the hot modules compiled with mypyc, or pure Python when "
    "SESSIONROUTE_PURE_PYTHON=1; the table's caption says which ran and how fast pure Python "
    "is, and with --json a pure-Python run says so on stderr."
)
_MEASURES_BUILD = frozenset({"engine", "sim", "instructions"})
"""Targets whose result depends on the compiled build."""

# target name -> (module with run(args) -> dict and add_arguments(parser), help)
_TARGETS: dict[str, tuple[str, str]] = {
    "policies": (
        "sessionroute.bench.policies",
        "select+complete latency per policy at many workers and sessions",
    ),
    "engine": ("sessionroute.bench.engine", "simulated requests per wall second, one replica"),
    "sim": ("sessionroute.bench.sim", "simulated requests per wall second, default swe-rl"),
    "proxy": ("sessionroute.bench.proxy", "router overhead against a zero-delay backend"),
    "shared-state": (
        "sessionroute.bench.shared",
        "sessions over several routers sharing one Redis: mismatches, restarts",
    ),
    "stall": (
        "sessionroute.bench.stall",
        "longest event-loop block while many sessions expire or a worker is removed",
    ),
    "soak": (
        "sessionroute.bench.soak",
        "router memory under never-released sessions (10 minutes by default)",
    ),
    "chaos": (
        "sessionroute.bench.chaos",
        "faults while loaded: two routers on one Redis, emulated replicas, crashes and restarts",
    ),
    "scale": (
        "sessionroute.bench.scale",
        "one router, 64 workers, 10,000 live sessions: CPU, latency, memory, Redis trips",
    ),
    "instructions": (
        "sessionroute.bench.instructions",
        "instructions per request of engine, sim or proxy (valgrind)",
    ),
    "digest": (
        "sessionroute.bench.digest",
        "hash the results of 16 simulations and 4 engine runs; save or check",
    ),
}


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already names a default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or re.search(r"\([0-9.]+\)$", text)  # "seconds per row (10)" already says it
            or not action.option_strings
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
        ):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help=f"run a benchmark ({', '.join(_TARGETS)})",
        description="Benchmarks. Each prints a table, or one JSON document with --json.",
    )
    targets = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, (module_name, help_text) in _TARGETS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        p = targets.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_BUILD_NOTE if name in _MEASURES_BUILD else None,
            formatter_class=_DefaultsFormatter,
        )
        p.add_argument("--json", action="store_true", help="print one JSON document")
        module.add_arguments(p)
        for action in p._actions:  # options a bench module left without help still show it
            if action.help is None and action.option_strings and action.default is not None:
                action.help = "(default: %(default)s)"
        p.set_defaults(handler=_make_handler(module))


def _make_handler(module: Any) -> Any:
    def handler(args: argparse.Namespace) -> int:
        from sessionroute.errors import ConfigError
        from sessionroute.native import build_caption, pure_requested

        try:
            result: dict[str, Any] = module.run(args)
        except ConfigError as exc:  # a bad option value: one line, like argparse's errors
            print(f"sessionroute bench {args.target}: error: {exc}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(result))
            if args.target in _MEASURES_BUILD and pure_requested():
                note = build_caption(False)
                print(f"sessionroute bench {args.target}: note: {note}", file=sys.stderr)
        else:
            module.print_table(result)
        status = getattr(module, "exit_status", None)
        return int(status(result)) if status is not None else 0

    return handler
