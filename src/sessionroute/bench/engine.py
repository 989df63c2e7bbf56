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
import random
import time
from dataclasses import dataclass, field
from typing import Any

from sessionroute.engine import PROFILES, EngineRequest, Replica, ReplicaConfig
from sessionroute.errors import ConfigError
from sessionroute.native import build_caption, compiled_modules

__all__ = ["add_arguments", "print_table", "run", "run_closed_loop"]

_SYSTEM_TOKENS = 2048


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
    parser.add_argument("--requests", type=int, default=20_000, help="fast-path requests")
    parser.add_argument(
        "--reference-requests", type=int, default=1_000, help="reference requests (0: skip)"
    )
    parser.add_argument(
        "--max-wall", type=float, default=20.0, help="wall seconds per implementation at most"
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed")


@dataclass
class _Session:
    keys: list[int]
    context: int  # tokens of the next prompt
    turn: int = 0
    sid: int = 0
    out: list[int] = field(default_factory=list)


class _Workload:
    """Closed-loop multi-turn sessions with synthetic chained block keys."""

    def __init__(self, sessions: int, max_context: int, block_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.bs = block_size
        self.max_context = max_context
        self.next_key = 1 << 40
        self.next_sid = 0
        self.system_keys = [self._key() for _ in range(_SYSTEM_TOKENS // block_size)]
        self.sessions: dict[str, _Session] = {}
        self.initial = [self._new_session(warm=True) for _ in range(sessions)]

    def _key(self) -> int:
        self.next_key += 1
        return self.next_key

    def _new_session(self, warm: bool) -> _Session:
        self.next_sid += 1
        context = _SYSTEM_TOKENS + self.rng.randint(1000, 4000)
        if warm:
            context = self.rng.randint(context, max(context, self.max_context - 1000))
        s = _Session(keys=list(self.system_keys), context=context, sid=self.next_sid)
        self._extend_keys(s, context)
        return s

    def _extend_keys(self, s: _Session, tokens: int) -> None:
        more = tokens // self.bs - len(s.keys)
        if more > 0:
            s.keys += range(self.next_key + 1, self.next_key + 1 + more)
            self.next_key += more

    def request(self, s: _Session) -> EngineRequest:
        """The session's next turn: its context as prompt, a random output length."""
        out = self.rng.randint(100, 500)
        self._extend_keys(s, s.context + out)
        s.turn += 1
        rid = f"s{s.sid}-t{s.turn}"
        self.sessions[rid] = s
        return EngineRequest(rid, s.context, out, s.keys)

    def follow_up(self, rid: str, output_tokens: int) -> EngineRequest:
        """The next turn after ``rid`` finished (or a fresh session past ``max_context``)."""
        s = self.sessions.pop(rid)
        s.context += output_tokens + self.rng.randint(100, 500)
        if s.context + 500 > self.max_context:
            s = self._new_session(warm=False)
        return self.request(s)


def run_closed_loop(
    config: ReplicaConfig,
    *,
    fast: bool,
    sessions: int,
    max_context: int,
    requests: int,
    seed: int,
    max_wall_s: float = float("inf"),
) -> dict[str, Any]:
    """Drive one replica until ``requests`` requests finished (or ``max_wall_s`` passed).

    Returns:
        Measured numbers: requests, wall seconds, requests per wall second, simulated seconds,
        steps, preemptions, prefix-cache hit rate, mean prompt tokens.
    """
    wl = _Workload(sessions, max_context, config.block_size, seed)
    rep = Replica(config, fast=fast)
    for s in wl.initial:
        rep.add_request(wl.request(s), 0.0)
    finished = 0
    prompt_tokens = 0
    t_end = 0.0
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    deadline = wall0 + max_wall_s
    loops = 0
    while finished < requests:
        loops += 1
        if not loops & 63 and time.perf_counter() > deadline:
            break
        t = rep.next_event_time()
        if t is None:
            break
        for r in rep.advance(t):
            finished += 1
            prompt_tokens += r.prompt_tokens
            t_end = r.finish_s
            rep.add_request(wl.follow_up(r.request_id, r.output_tokens), r.finish_s)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    c = rep.counters()
    return {
        "requests": finished,
        "wall_seconds": wall,
        "requests_per_wall_second": finished / wall if wall > 0 else 0.0,
        "cpu_seconds": cpu,
        "requests_per_cpu_second": finished / cpu if cpu > 0 else 0.0,
        "simulated_seconds": t_end,
        "simulated_requests_per_second": finished / t_end if t_end > 0 else 0.0,
        "steps": c.steps,
        "steps_per_wall_second": c.steps / wall if wall > 0 else 0.0,
        "preemptions": c.num_preemptions,
        "prefix_cache_hit_rate": (
            c.prefix_cache_hits / c.prefix_cache_queries if c.prefix_cache_queries else 0.0
        ),
        "mean_prompt_tokens": prompt_tokens / finished if finished else 0.0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark (fast path, then the reference) and return the result document."""
    if args.sessions < 1 or args.requests < 1:
        raise ConfigError(
            f"--sessions and --requests must be >= 1, got {args.sessions}, {args.requests}"
        )
    if args.max_context < _SYSTEM_TOKENS + 5000:
        raise ConfigError(
            f"--max-context must be >= {_SYSTEM_TOKENS + 5000}, got {args.max_context}"
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
