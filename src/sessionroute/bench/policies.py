"""``sessionroute bench policies``: select+complete latency of every policy at scale.

For each policy a fresh :class:`~sessionroute.router.core.RoutingCore` over ``--workers`` workers is
pre-populated with ``--sessions`` active sessions (one routed and completed turn each, through
the policy itself), then timed with :func:`time.perf_counter_ns`:

* ``p50_us`` / ``p99_us``: one ``route`` + ``complete`` of a later turn of a random existing
  session (``--turns`` samples);
* ``new_session_us``: the median ``route`` + ``complete`` of a session never seen before
  (``--new`` samples; each is released again, untimed, so the population stays constant).

Requests carry a session id, a prompt-token estimate and a text (a 256-character shared system
prompt plus a per-session task line), so ``cache_aware`` routes on real prefixes.

With ``--prompt-tokens N`` requests are long prompts instead: each session's content is ``N /
16`` chained 16-token block keys (the first 64 shared by every session: a common system
prompt), its later turns append 64 blocks (1,024 tokens), and each timed sample builds the
request through the router's own :meth:`~sessionroute.router.requests.RequestBuilder.from_turn`
(the content step included) before ``route`` + ``complete``. A policy with a KV index
(``kv_aware``, ``kv_cost``) is measured as the live router runs it instead, hashing included
(:func:`bench_kv_growing`): requests carry token ids and no session id, and each timed sample
hashes the prompt into vLLM's sha256 block hashes through the router's incremental memo
(:class:`~sessionroute.router.kv.prefixmemo.PrefixMemo`, 16-token blocks) before ``route`` +
``complete``. The clock is a :class:`~sessionroute.clock.ManualClock` that does not move, so no
session expires. Garbage is collected (and the survivors frozen) before timing each policy.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

import numpy as np

from sessionroute.bench.kvgrowing import bench_kv_growing
from sessionroute.bench.options import at_least
from sessionroute.clock import ManualClock
from sessionroute.keys import mix64
from sessionroute.router.core import RoutingCore
from sessionroute.router.policies import create_policy, policy_names
from sessionroute.router.policies.capabilities import ReadsKvEvents
from sessionroute.router.requests import BYTES_PER_TOKEN, text_block_keys
from sessionroute.router.state import Cluster
from sessionroute.types import RouteRequest

__all__ = ["add_arguments", "bench_policy", "print_table", "run"]

_SYSTEM = ("You are a software engineering agent working in a sandboxed repository. " * 4)[:256]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``sessionroute bench policies``."""
    parser.add_argument("--workers", type=at_least(1), default=64, help="workers (default 64)")
    parser.add_argument(
        "--sessions", type=at_least(1), default=100_000, help="active sessions (default 100000)"
    )
    parser.add_argument(
        "--turns", type=at_least(1), default=20_000, help="timed turns of existing sessions"
    )
    parser.add_argument(
        "--new", type=at_least(1), default=1_000, help="timed new-session placements"
    )
    parser.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="policy to run (repeatable; default: every built-in)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled sessions")
    parser.add_argument(
        "--prompt-tokens",
        type=at_least(0),
        default=0,
        help="long-prompt mode: tokens per prompt (e.g. 32768; use --sessions 256 or so, "
        "every session holds N/16 block keys); default: short text prompts",
    )


def _core(name: str, workers: int, seed: int) -> RoutingCore:
    """A fresh core with policy ``name`` over ``workers`` workers."""
    urls = [f"http://10.0.{i // 250}.{i % 250 + 1}:8000" for i in range(workers)]
    return RoutingCore(
        create_policy(name, clock=ManualClock(), rng=random.Random(seed)), Cluster(urls)
    )


def _row(
    name: str, workers: int, sessions: int, turn_ns: list[int], new_ns: list[int]
) -> dict[str, Any]:
    """The JSON row of one policy from its timed samples (nanoseconds in, microseconds out,
    2 decimals)."""
    p50, p99 = np.percentile(np.asarray(turn_ns, dtype=np.float64) / 1000.0, [50, 99])
    return {
        "policy": name,
        "workers": workers,
        "sessions": sessions,
        "p50_us": round(float(p50), 2),
        "p99_us": round(float(p99), 2),
        "new_session_us": round(float(np.median(np.asarray(new_ns)) / 1000.0), 2),
    }


def _request(i: int, prefix: str = "sess") -> RouteRequest:
    sid = f"{prefix}-{i}"
    return RouteRequest(
        session_id=sid,
        prompt_tokens=1000 + i % 7000,
        blocks=text_block_keys(
            f"{_SYSTEM}\nTask {sid}: fix the failing test in module_{i % 997}.py\n",
            16 * BYTES_PER_TOKEN,
        ),
    )


_BLOCK = 16
_SHARED_BLOCKS = 64
_TURN_BLOCKS = 64


def _long_keys(i: int, prompt_tokens: int) -> list[int]:
    """Chained block keys of session ``i``'s first prompt (a shared prefix, then its own),
    mixed like real block hashes (:func:`~sessionroute.keys.mix64` of a (session, position)
    id: unstructured ids would share their low bits and collide in every hash table)."""
    n = prompt_tokens // _BLOCK
    shared = min(_SHARED_BLOCKS, n)
    return [mix64((7 << 40) | j) for j in range(shared)] + [
        mix64((i + 1) << 40 | j) for j in range(shared, n)
    ]


def _turn_keys(i: int) -> list[int]:
    """Keys of the blocks session ``i``'s later turns append (mixed as :func:`_long_keys`)."""
    return [mix64((i + 1) << 40 | (1 << 39) | j) for j in range(_TURN_BLOCKS)]


def _timed_turn(core: RoutingCore, sid: str, prompt_tokens: int, keys: list[int], rid: str) -> int:
    t0 = time.perf_counter_ns()
    req = core.requests.from_turn(sid, prompt_tokens, keys, _BLOCK, rid)
    core.complete(core.route(req))
    return time.perf_counter_ns() - t0


def bench_long_prompts(
    name: str, workers: int, sessions: int, turns: int, prompt_tokens: int, seed: int = 0
) -> dict[str, Any]:
    """Long-prompt mode of :func:`bench_policy` (module docstring); same row, plus
    ``prompt_tokens``; policies with a KV index are measured by :func:`bench_kv_growing`."""
    core = _core(name, workers, seed)
    if isinstance(core.policy, ReadsKvEvents):
        return bench_kv_growing(core, core.policy.index, sessions, turns, prompt_tokens, seed)
    total = prompt_tokens + _TURN_BLOCKS * _BLOCK
    later: list[list[int]] = []
    for i in range(sessions):
        keys = _long_keys(i, prompt_tokens)
        req = core.requests.from_turn(f"sess-{i}", prompt_tokens, keys, _BLOCK, f"p{i}")
        core.complete(core.route(req))
        later.append(keys + _turn_keys(i))
    rng = random.Random(seed)
    sample = [rng.randrange(sessions) for _ in range(turns)]
    gc.collect()
    gc.freeze()
    try:
        turn_ns = [
            _timed_turn(core, f"sess-{i}", total, later[i], f"t{k}") for k, i in enumerate(sample)
        ]
        fresh = [
            _timed_turn(
                core, f"new-{i}", prompt_tokens, _long_keys(sessions + i, prompt_tokens), f"n{i}"
            )
            for i in range(min(turns, 200))
        ]
    finally:
        gc.unfreeze()
    row = _row(name, workers, sessions, turn_ns, fresh)
    row["prompt_tokens"] = prompt_tokens
    return row


def _timed(core: RoutingCore, req: RouteRequest) -> int:
    t0 = time.perf_counter_ns()
    core.complete(core.route(req))
    return time.perf_counter_ns() - t0


def bench_policy(
    name: str, workers: int, sessions: int, turns: int, new: int, seed: int = 0
) -> dict[str, Any]:
    """Measure one policy; returns the JSON row ``{"policy", "workers", "sessions", "p50_us",
    "p99_us", "new_session_us"}`` (latencies in microseconds, 2 decimals).

    Raises:
        ValueError: if ``workers``, ``sessions``, ``turns`` or ``new`` is below 1.
    """
    for key, value in (("workers", workers), ("sessions", sessions), ("turns", turns)):
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    if new < 1:
        raise ValueError(f"new must be >= 1, got {new}")
    core = _core(name, workers, seed)
    population = [_request(i) for i in range(sessions)]
    for req in population:
        core.complete(core.route(req))
    rng = random.Random(seed)
    sample = [population[rng.randrange(sessions)] for _ in range(turns)]
    fresh = [_request(i, "new") for i in range(new)]
    gc.collect()
    gc.freeze()
    try:
        turn_ns = [_timed(core, req) for req in sample]
        new_ns = []
        for req in fresh:
            new_ns.append(_timed(core, req))
            if req.session_id is not None:
                core.finish_session(req.session_id)
    finally:
        gc.unfreeze()
    return _row(name, workers, sessions, turn_ns, new_ns)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark for ``args.policies`` (all built-ins by default).

    Returns:
        ``{"results": [row, ...]}``, one row per policy (see :func:`bench_policy`).
    """
    names = args.policies or policy_names()
    if getattr(args, "prompt_tokens", 0) > 0:
        return {
            "results": [
                bench_long_prompts(
                    name, args.workers, args.sessions, args.turns, args.prompt_tokens, args.seed
                )
                for name in names
            ]
        }
    return {
        "results": [
            bench_policy(name, args.workers, args.sessions, args.turns, args.new, args.seed)
            for name in names
        ]
    }


def print_table(result: dict[str, Any]) -> None:
    """Print the rows of :func:`run` as a table (microseconds)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="select+complete latency (us)")
    for col in ("policy", "workers", "sessions", "p50_us", "p99_us", "new_session_us"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for row in result["results"]:
        table.add_row(
            row["policy"],
            str(row["workers"]),
            str(row["sessions"]),
            f"{row['p50_us']:.2f}",
            f"{row['p99_us']:.2f}",
            f"{row['new_session_us']:.2f}",
        )
    Console().print(table)
