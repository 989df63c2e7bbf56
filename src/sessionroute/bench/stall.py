"""``sessionroute bench stall``: the longest the router's event loop is blocked by bulk session
work (issue 19, item 7).

What it does, in process and without I/O (the routing core is what runs on the event loop):
a routing core with ``--policy`` (``sticky_least_loaded`` by default; any policy, e.g.
``adaptive_sticky`` or ``cache_aware_v2``), bounded as ``serve`` bounds it
(``Policy.bound_sweeps``), on a manual clock pins ``--sessions`` sessions (default
100,000) over 4 workers, the clock moves past their TTL, and the expiry runs (1) as one sweep,
as before issue 19, and (2) as the live router's background sweep runs it now, in the chunks
of :meth:`~sessionroute.router.RoutingCore.sweep_chunks` (:data:`~sessionroute.router.core.
SWEEP_CHUNK` sessions) with the event loop free between chunks. Then ``--removed`` sessions
(default 50,000) are pinned to one worker and that worker is removed (O(1): its pins go stale
and each moves on its session's next turn; ``replace_turn_ms`` is the longest such turn over
all of them). For a policy that indexes prompt content (``needs_content``: ``cache_aware``,
``cache_aware_v2``, ...) every session's prompt carries :data:`CONTENT_BLOCKS` keys of its
own, so each session adds a leaf of that many blocks to the removed worker's index; what the
removal leaves for the background sweep (those entries) is measured as that sweep runs it, in
chunks (``remove_tidy_ms``). A policy that keeps no sessions has nothing to expire: its two
expiry rows say so instead of a time. Last, ``full_gc_ms``: a full collection of Python's
cyclic garbage collector with ``--sessions`` sessions routed (the bench's own objects frozen
first, as ``serve`` freezes its start-up objects), a pause no chunking removes: what it
traverses is what the policy keeps per session. Reported: the longest single blocking call
of each, in milliseconds of the thread's CPU time (``time.thread_time``: on a shared machine,
wall time would add whatever other processes take meanwhile), with the median of
``--repeat`` runs; a concurrent request waits that long for the event loop, so it bounds what
the work adds to request latency on an idle machine (the issue's target: p99 under 10 ms).

``--live`` measures that target itself, the latency of concurrent requests through a real
router while the same work runs (:mod:`sessionroute.bench.stall_live`).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["add_arguments", "print_table", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``stall`` options."""
    a = parser.add_argument
    a("--sessions", type=int, default=100_000, help="sessions that expire at once (100000)")
    a("--removed", type=int, default=50_000, help="sessions on the removed worker (50000)")
    a("--repeat", type=int, default=3, help="runs; medians are reported (3)")
    a(
        "--live",
        action="store_true",
        help="also measure the latency of concurrent requests through a real router while "
        "the work runs (two backends and a router as processes)",
    )
    a("--concurrency", type=int, default=8, help="--live: requests in flight (8)")
    a(
        "--policy",
        default="sticky_least_loaded",
        help="the routing policy (default sticky_least_loaded; e.g. adaptive_sticky)",
    )


def _core(workers: list[str], policy_name: str) -> Any:
    from sessionroute.clock import ManualClock
    from sessionroute.router import RoutingCore, choose_policy
    from sessionroute.router.state import Cluster

    clock = ManualClock()
    policy = choose_policy(policy_name, {}, session_ttl_s=60.0).build(
        clock=clock, rng=random.Random(0)
    )
    return RoutingCore(policy, Cluster(workers), rng=random.Random(0)), clock


CONTENT_BLOCKS = 8
"""Content blocks per session's prompt, for policies that index content (``needs_content``):
each session's prompt has its own chain of keys, so a worker's index holds one leaf of
``CONTENT_BLOCKS`` blocks per session placed on it."""


def _request(core: Any, session_id: str, number: int) -> Any:
    """Session ``session_id``'s turn; with its own content keys when the policy reads them."""
    from sessionroute.types import RouteRequest

    blocks = None
    if core.policy.needs_content:
        blocks = [(number << 8) | j for j in range(CONTENT_BLOCKS)]
    return RouteRequest(session_id=session_id, prompt_tokens=100, blocks=blocks)


def _fill(core: Any, n: int, prefix: str) -> None:
    for i in range(n):
        core.complete(core.route(_request(core, f"{prefix}{i}", i)))


def _longest_chunk_ms(chunks: Iterator[int]) -> float:
    """Run a sweep's chunks; the longest one, milliseconds of thread CPU time."""
    longest = 0.0
    while True:
        t0 = time.thread_time()
        n = next(chunks, None)
        longest = max(longest, time.thread_time() - t0)
        if n is None:
            return longest * 1000.0


def _full_gc_ms(sessions: int, policy: str) -> float:
    """The longest of three full garbage collections with ``sessions`` sessions routed, the
    process's own objects frozen first (``serve`` freezes its start-up objects)."""
    gc.collect()
    gc.freeze()
    try:
        core, _ = _core([f"http://w{i}:8000" for i in range(4)], policy)
        _fill(core, sessions, "g")
        gc.collect()
        longest = 0.0
        for _ in range(3):
            t0 = time.thread_time()
            gc.collect()
            longest = max(longest, time.thread_time() - t0)
        return longest * 1000.0
    finally:
        gc.unfreeze()


def _once(sessions: int, removed: int, policy: str) -> dict[str, float]:
    from sessionroute.router.core import SWEEP_CHUNK

    workers = [f"http://w{i}:8000" for i in range(4)]
    out: dict[str, float] = {"full_gc_ms": _full_gc_ms(sessions, policy)}
    for mode in ("one_pass", "chunked"):
        core, clock = _core(workers, policy)
        _fill(core, sessions, "s")
        clock.advance(120.0)
        chunk = None if mode == "one_pass" else SWEEP_CHUNK
        out[f"expire_{mode}_ms"] = _longest_chunk_ms(core.sweep_chunks(clock.now(), chunk))
    core, clock = _core(workers[:1], policy)
    _fill(core, removed, "r")
    core.add_worker(workers[1])
    t0 = time.thread_time()
    core.remove_worker(workers[0])
    out["remove_worker_ms"] = (time.thread_time() - t0) * 1000.0
    # what the removal left for the background sweep (a policy's index entries)
    out["remove_tidy_ms"] = _longest_chunk_ms(core.sweep_chunks(clock.now(), SWEEP_CHUNK))
    longest = 0.0
    for i in range(removed):  # every displaced session's next turn re-places it
        req = _request(core, f"r{i}", i)
        t0 = time.thread_time()
        core.complete(core.route(req))
        longest = max(longest, time.thread_time() - t0)
    out["replace_turn_ms"] = longest * 1000.0
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the measurement (module docstring); returns the result document."""
    from sessionroute.router import choose_policy

    keeps_sessions = choose_policy(args.policy, {}).cls.keeps_sessions
    runs = [_once(args.sessions, args.removed, args.policy) for _ in range(args.repeat)]
    keys = runs[0].keys()
    result: dict[str, Any] = {
        "benchmark": "stall",
        "policy": args.policy,
        "keeps_sessions": keeps_sessions,
        "sessions": args.sessions,
        "removed": args.removed,
        "repeat": args.repeat,
        "median_ms": {k: round(statistics.median(r[k] for r in runs), 2) for k in keys},
        "range_ms": {
            k: [round(min(r[k] for r in runs), 2), round(max(r[k] for r in runs), 2)] for k in keys
        },
    }
    if args.live:
        from sessionroute.bench.stall_live import run_live

        result["live"] = run_live(args)
        result["live"]["concurrency"] = args.concurrency
    return result


def print_table(result: dict[str, Any]) -> None:
    """Print the longest blocking call of each kind of bulk work."""
    from rich.console import Console
    from rich.table import Table

    runs = "1 run" if result["repeat"] == 1 else f"median of {result['repeat']} runs"
    table = Table(title=f"longest event-loop block ({result['policy']}), {runs}")
    table.add_column("bulk work")
    table.add_column("ms", justify="right")
    table.add_column("min-max", justify="right")
    names = {
        "expire_one_pass_ms": f"{result['sessions']:,} sessions expire, one sweep",
        "expire_chunked_ms": f"{result['sessions']:,} sessions expire, chunked (serve)",
        "remove_worker_ms": f"remove a worker with {result['removed']:,} sessions",
        "remove_tidy_ms": "the next sweep after it, chunked (serve)",
        "replace_turn_ms": "the next turn of one of its sessions (re-placed)",
        "full_gc_ms": f"a full garbage collection with {result['sessions']:,} sessions",
    }
    for key, label in names.items():
        if key.startswith("expire_") and not result.get("keeps_sessions", True):
            table.add_row(label, "-", "-")
            continue
        lo, hi = result["range_ms"][key]
        table.add_row(label, f"{result['median_ms'][key]:.2f}", f"{lo:.2f}-{hi:.2f}")
    if not result.get("keeps_sessions", True):
        table.caption = f"{result['policy']} keeps no sessions: nothing expires"
    console = Console()
    console.print(table)
    live = result.get("live")
    if live is None:
        return
    t = Table(
        title=f"latency of concurrent requests through a router ({live['concurrency']} in "
        f"flight): during the work / the 2 s before / the 1 s after"
    )
    for col in ("event", "work ms", "requests", "p50 ms", "p99 ms", "max ms"):
        t.add_column(col, justify="right")
    for name, row in live["events"].items():
        windows = (row["during"], row["baseline"], row["after"])
        t.add_row(
            name,
            f"{row['work_ms']:.1f}",
            *(" / ".join(f"{w[k]:.2f}" if k != "requests" else str(w[k]) for w in windows)
              for k in ("requests", "p50_ms", "p99_ms", "max_ms")),
        )  # fmt: skip
    console.print(t)
    console.print(f"requests {live['requests']}, errors {live['errors']}")
