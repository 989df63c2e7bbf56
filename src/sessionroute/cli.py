"""The ``sessionroute`` command line.

Each subcommand lives in its own module under :mod:`sessionroute.commands` with
``register(subparsers)``; heavy imports happen inside the command's handler so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from sessionroute import __version__

__all__ = ["build_parser", "main"]

_COMMANDS: tuple[str, ...] = ("compare", "serve", "emulate", "bench", "tiny_model")


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
            module = importlib.import_module(f"sessionroute.commands.{name}")
        except ModuleNotFoundError:
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sessionroute`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
