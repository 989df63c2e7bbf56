"""``sessionroute bench engine``: simulated requests per wall second of one replica model.

One ``glm45air-h200-tp8`` replica under a saturating closed-loop multi-turn load: ``sessions``
concurrent sessions; each sends its next turn the moment the previous one finishes, with prompt
= previous context + previous output + an observation (~300 tokens). Contexts start at a
shared 2048-token system prompt plus a task and grow until they would pass ``max_context``,
when the session is replaced by a fresh one. Initial sessions start at random points of their
growth so the load is stationary from the start. Block keys are synthetic (unique per session
and block, shared for the system prompt), so prefix reuse is real.

The fast path runs ``--requests`` requests; the reference runs ``--reference-requests`` (fewer,
it is slower) on the same workload. Both report simulated requests per wall second.
"""

from __future__ import annotations

import argparse
from typing import Any

from sessionroute.bench.closed_loop import SYSTEM_TOKENS, run_closed_loop
from sessionroute.errors import ConfigError
from sessionroute.native import build_caption, compiled_modules
from sessionroute.replica import PROFILES, ReplicaConfig

__all__ = ["add_arguments", "print_table", "run", "run_closed_loop"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sessionroute bench engine``."""
    parser.add_argument(
        "--profile",
        default="glm45air-h200-tp8",
        choices=sorted(PROFILES),
        help="replica step-time profile",
    )
    parser.add_argument("--sessions", type=int, default=256, help="concurrent sessions")
    parser.add_argument("--max-context", type=int, default=60_000, help="tokens")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument(
        "--requests",
        type=int,
        default=20_000,
        help="requests to finish on the fast path (the engine the simulator uses)",
    )
    parser.add_argument(
        "--reference-requests",
        type=int,
        default=1_000,
        help="requests to finish on the naive one-step-per-iteration reference engine (0: skip)",
    )
    parser.add_argument(
        "--max-wall", type=float, default=20.0, help="wall seconds per implementation at most"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark (fast path, then the reference) and return the result document."""
    for flag, value in (("--sessions", args.sessions), ("--requests", args.requests)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.max_context < SYSTEM_TOKENS + 5000:
        raise ConfigError(
            f"--max-context must be >= {SYSTEM_TOKENS + 5000}, got {args.max_context}"
        )
    config = ReplicaConfig(PROFILES[args.profile], block_size=args.block_size)
    common: dict[str, Any] = {
        "sessions": args.sessions,
        "max_context": args.max_context,
        "seed": args.seed,
        "max_wall_s": args.max_wall,
    }
    out: dict[str, Any] = {
        "profile": args.profile,
        "block_size": args.block_size,
        "compiled": bool(compiled_modules()),
        **common,
        "fast": run_closed_loop(config, fast=True, requests=args.requests, **common),
    }
    if args.reference_requests > 0:
        out["reference"] = run_closed_loop(
            config, fast=False, requests=args.reference_requests, **common
        )
    else:
        out["reference"] = {"requests_per_wall_second": 0.0, "skipped": True}
    return out


def print_table(result: dict[str, Any]) -> None:
    """Print the result as a table: one row per measurement, one column per implementation
    (narrow enough for an 80-column terminal)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=(
            f"sessionroute bench engine: {result['profile']}, {result['sessions']} sessions, "
            f"contexts to {result['max_context']:,} tokens, block size {result['block_size']}"
        )
    )
    table.add_column("measurement")
    impls = [i for i in ("fast", "reference") if not result[i].get("skipped")]
    for impl in impls:
        table.add_column(impl, justify="right")
    if len(impls) == 2:
        table.add_column("fast / reference", justify="right")
    rows = [
        ("requests", "requests", "{:,d}", False),
        ("wall_seconds", "wall seconds", "{:.2f}", False),
        ("requests_per_wall_second", "requests / wall second", "{:,.0f}", True),
        ("requests_per_cpu_second", "requests / CPU second", "{:,.0f}", True),
        ("simulated_seconds", "simulated seconds", "{:,.1f}", False),
        ("steps_per_wall_second", "engine steps / wall second", "{:,.0f}", True),
        ("preemptions", "preemptions", "{:,d}", False),
        ("prefix_cache_hit_rate", "prefix-cache hit rate", "{:.3f}", False),
        ("mean_prompt_tokens", "mean prompt tokens", "{:,.0f}", False),
    ]
    for key, label, fmt, ratio in rows:
        cells = [fmt.format(result[i][key]) for i in impls]
        if len(impls) == 2:
            ref = result["reference"][key]
            cells.append(f"{result['fast'][key] / ref:,.1f}x" if ratio and ref else "")
        table.add_row(label, *cells)
    table.caption = build_caption(result["compiled"])
    console = Console()
    console.print(table)
    if result["reference"].get("skipped"):
        console.print("reference: skipped (--reference-requests 0)")
