"""The closed-loop multi-turn load of ``sessionroute bench engine`` and its driver loop.

``sessions`` concurrent sessions; each sends its next turn the moment the previous one finishes,
with prompt = previous context + previous output + an observation (100-500 tokens). Contexts
start at a shared :data:`SYSTEM_TOKENS`-token system prompt plus a task (1000-4000 tokens) and
grow until they would pass ``max_context``, when the session is replaced by a fresh one.
Initial sessions start at random points of their growth so the load is stationary from the
start. Block keys are synthetic (unique per session and block, shared for the system prompt),
so prefix reuse is real.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Final

from sessionroute.replica import EngineRequest, Replica, ReplicaConfig

__all__ = ["SYSTEM_TOKENS", "run_closed_loop"]

SYSTEM_TOKENS: Final = 2048
"""Tokens of the system prompt every session shares."""


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
        self.system_keys = [self._key() for _ in range(SYSTEM_TOKENS // block_size)]
        self.sessions: dict[str, _Session] = {}
        self.initial = [self._new_session(warm=True) for _ in range(sessions)]

    def _key(self) -> int:
        self.next_key += 1
        return self.next_key

    def _new_session(self, warm: bool) -> _Session:
        self.next_sid += 1
        context = SYSTEM_TOKENS + self.rng.randint(1000, 4000)
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
