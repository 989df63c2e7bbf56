"""``sessionroute serve``: run the live router (a drop-in for vllm-router's session features)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``serve`` subcommand to ``sub`` (an argparse subparsers object)."""
    from sessionroute.serve.flags import add_arguments

    parser = sub.add_parser(
        "serve",
        help="run the session-aware router in front of vLLM replicas",
        description=(
            "An OpenAI-compatible reverse proxy in front of N replicas. Flags shared with "
            "vllm-router keep its names and defaults; see docs/router.md."
        ),
        allow_abbrev=False,
    )
    add_arguments(parser)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from sessionroute.errors import ConfigError
    from sessionroute.serve.config import settings_from_args
    from sessionroute.serve.probes import StartupTimeout
    from sessionroute.serve.router import Router
    from sessionroute.serve.runner import run

    try:
        settings = settings_from_args(args)
        Router(settings)  # fail fast on a bad policy or options, before binding ports
    except ConfigError as exc:
        print(f"sessionroute serve: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        run(settings)
    except (OSError, StartupTimeout) as exc:
        print(f"sessionroute serve: error: {exc}", file=sys.stderr)
        return 1
    return 0
