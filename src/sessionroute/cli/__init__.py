"""The ``sessionroute`` command line.

Each subcommand lives in its own module under :mod:`sessionroute.cli` with
``register(subparsers)``; heavy imports happen inside the command's handler so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sessionroute import __version__

__all__ = ["build_parser", "main"]

_COMMANDS: tuple[str, ...] = (
    "compare",
    "sweep",
    "serve",
    "emulate",
    "bench",
    "tiny_model",
    "calibrate",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="sessionroute",
        description=(
            "Session-aware load balancing for multi-turn LLM inference: a router in front of "
            "vLLM replicas, a replica model and simulator, and an experiment runner that "
            "compares routing policies."
        ),
        epilog="Run 'sessionroute COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"sessionroute {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"sessionroute.cli.{name}")
        except ModuleNotFoundError:
            continue
        module.register(sub)
    return parser


def _chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The innermost subcommand parser that ``args`` went through (``bench engine``'s, say)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _chosen_parser(chosen, args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sessionroute`` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's own parser, with that subcommand's usage line
        _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
