"""Options of ``adaptive_sticky`` (:mod:`sessionroute.router.policies.adaptive_sticky`), each
with the measurement that chose its default."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from sessionroute.errors import ConfigError
from sessionroute.router.state.sessions import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TTL_S,
)

__all__ = ["AdaptiveStickyConfig"]


@dataclass(frozen=True, slots=True)
class AdaptiveStickyConfig:
    """Options of ``adaptive_sticky`` (fractions of KV capacity, request counts, seconds).

    Measured on the simulated regimes of ``examples/regimes/`` (3 x glm45air-h200-tp8 swe-rl at
    448 / 544 / 640 rollouts in flight, 2 replicas at 544, the Weka replay), seed 0, output
    tok/s; ``docs/policies.md`` ("adaptive_sticky: measurements") has the commands. Values
    marked "not swept" were set once from the reason given and not varied.

    Attributes:
        count_weight: in [0, 1]; a worker's load counts its sessions at their present
            context (weight ``1 - count_weight``) and at the mean context of all pinned
            sessions (``count_weight``): a new session is small now but grows. Pure token
            balance (0) stacked new sessions on one worker before the projected knee existed
            (640 in flight: 334 sessions against 124); with it, Weka: 0 -> 13,017 s, 0.5 ->
            13,663 s, 1 (count balance) -> 17,327 s. 0.5 kept (swe-rl measured with it).
        inflight_weight: weight of the router's in-flight prompt tokens in a worker's load,
            next to its pinned sessions' context tokens (1: a running turn counts twice, once
            as context and once as work in flight). Not swept.
        escape_kv: ``kv_usage`` at or above which (with ``escape_waiting``) a worker turns
            hot. 0.9: the issue-18 prototype's gate (6,368 tok/s, 0 timeouts, 68 moves).
            With admission the escape rarely fires (0 moves at 448 and 544, 11 at 640).
        escape_waiting: waiting requests at or above which (with ``escape_kv``) a worker turns
            hot (prototype: 8).
        cool_kv: a hot worker cools when ``kv_usage`` falls below this (hysteresis; not
            swept).
        cool_waiting: a hot worker cools when fewer requests than this wait (not swept).
        target_kv: a move's target must have ``kv_usage`` below this (prototype: 0.75).
        target_waiting: a move's target must have at most this many waiting (prototype: 0).
        move_context_factor: only sessions whose context is at most this times the mean
            context on their worker move (the cheapest first; not swept).
        move_interval_s: minimum seconds between two moves off the same worker: about half a
            gauge scrape (1 s), so a burst of turns cannot empty a worker on stale gauges.
        session_cooldown_s: a moved session stays at least this long before it may move
            again (about half a median swe-rl rollout; no ping-pong).
        knee_pressure: a worker is past its knee when its projected working set reaches this
            multiple of its estimated KV capacity. Swept at 448 / 640 in flight: 1.0 -> 6,071 /
            6,141 tok/s; 1.07 -> 6,105 / 6,206; 1.15 -> 6,134 / 5,734; 1.3 -> 6,159 / 4,625
            (sticky_least_loaded 6,248 / 4,628). Past ~1.1 the 640 regime thrashes again, so
            1.0 keeps a margin; it costs 448 about 3 % (held sessions wait ~54 s on average).
        overflow_pressure: a worker whose pinned sessions' present context tokens reach this
            multiple of its estimated KV capacity, with ``overflow_waiting`` requests waiting,
            *overflows*: its cache cannot hold its sessions between turns, so their turns
            re-prefill anyway and moving one costs little. A turn on an overflowing worker may
            move as on a hot one (same conditions (a)-(d)). Weka seed 0, simulated s (no
            overflow rule: 15,742; CHWBL 1.25: 12,635): 0.8 -> 13,339 (380 moves), 0.9 ->
            14,313, 1.0 -> 18,160 without the waiting condition; with ``overflow_waiting`` 4:
            0.8 -> 13,110, 0.9 -> 12,543 (60 moves). Without the waiting condition 0.8 moved
            2,540 sessions at 544 in flight and cost 3 % (6,344 tok/s). The Weka makespan is
            one long session's latency, so single values are noisy (docs/policies.md).
        overflow_waiting: requests waiting (scraped gauge) at or above which an overflowing
            worker's turns may move: re-prefills queue up on a worker whose cache thrashes,
            not on one that merely holds much context. 4 (2 at 0.8: Weka 13,689 s).
        capacity_alpha: weight of a new sample in the moving average of a worker's KV
            capacity estimate (running in-flight tokens over ``kv_usage``); 0.2 averages over
            about five scrapes. The estimate reads 5-6 M tokens for a 4.4 M-token replica
            (shared prefixes count once in the cache, per request at the router);
            ``knee_pressure`` was swept with this bias in place.
        final_alpha: weight of a finished session's last context in the moving average of
            final contexts (the size a new session is projected to grow to); 0.02 averages
            over about 50 sessions (a few GRPO groups). Not swept.
        capacity_min_kv: capacity samples are taken only at this ``kv_usage`` or above
            (below it the ratio is noise). Not swept.
        admission: hold new sessions while every worker is past its knee (rule 3).
        pack_past_knee: when every healthy worker is past its knee, place a new session on
            the most token-loaded one instead of the least (rule 1): LRU keeps nearly nothing
            of a working set that outgrows the cache, so spreading the excess makes every
            worker thrash where packing it leaves the others' working sets in their caches.
            Off by default; on under a serving objective through ``adaptive_hold`` (Weka
            replay, 160 sessions, seeds 0-4: SLO goodput 0.577 without, 0.644 with, beside
            ``ceiling_floor``; docs/policies.md).
        thrash_gate_s: a worker past its knee still admits new sessions (the router does not
            hold them) while none of its scrapes in the last ``thrash_gate_s`` seconds showed
            thrash (``waiting >= overflow_waiting`` or ``kv_usage >= escape_kv``): the
            projected knee (count times mean final context) is a forecast, and a fleet whose
            caches have not overflowed for about half a median rollout has room it does not
            see (544 in flight: kv_usage 0.5-0.7, nothing waiting, while the projection stood
            at 1.0). 0 turns the gate off (hold on the projection alone). Default workload,
            RL step time max, seeds 0-2 (mean): off 628.3 s; 200 -> 623.0; 300 -> 620.5;
            450 -> 630.4; 600 -> 630.0 s; 640 in flight, output tok/s mean: off 6,180, 300 ->
            5,942, 600 -> 6,090 (docs/policies.md).
        max_wait_s: the longest a held new session waits before it is placed anyway. At 640
            in flight held sessions wait ~250 s on average and a few reach 600 s; the
            router's 60 s default would let them through into the thrash.
        working_set_idle_s: a session idle this long stops counting in its worker's load
            (until its next turn): it is likely finished without ``/finish_session``, and its
            cache is likely evicted (swe-rl tool calls are capped at 180 s).
        session_ttl_s: idle seconds before a session expires (vllm-router default 7200).
        sweep_interval_s: minimum seconds between sweeps run inside ``select`` (60).
        max_sessions: capacity of the session table; the least recently used is evicted.
        session_table_max_bytes: capacity of the session table in estimated bytes
            (``SessionTable``'s ``max_bytes``; the router's ``RouterConfig`` gives its own).

    Raises:
        ConfigError: on a value out of range (the message names it).
    """

    count_weight: float = 0.5
    inflight_weight: float = 1.0
    escape_kv: float = 0.9
    escape_waiting: int = 8
    cool_kv: float = 0.85
    cool_waiting: int = 2
    target_kv: float = 0.75
    target_waiting: int = 0
    move_context_factor: float = 1.0
    move_interval_s: float = 0.5
    session_cooldown_s: float = 300.0
    knee_pressure: float = 1.0
    overflow_pressure: float = 0.9
    overflow_waiting: int = 4
    capacity_alpha: float = 0.2
    final_alpha: float = 0.02
    capacity_min_kv: float = 0.2
    admission: bool = True
    pack_past_knee: bool = False
    thrash_gate_s: float = 300.0
    max_wait_s: float = 600.0
    working_set_idle_s: float = 300.0
    session_ttl_s: float = DEFAULT_TTL_S
    sweep_interval_s: float = 60.0
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_table_max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        for f in fields(AdaptiveStickyConfig):  # a subclass checks its own fields
            v = getattr(self, f.name)
            if f.name in ("admission", "pack_past_knee"):
                if not isinstance(v, bool):
                    raise ConfigError(f"{f.name} must be true or false, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{f.name} must be a finite number, got {v!r}")
            if v < 0:
                raise ConfigError(f"{f.name} must be >= 0, got {v!r}")
        for name in (
            "escape_kv", "cool_kv", "target_kv", "capacity_alpha", "capacity_min_kv",
            "final_alpha",
            "count_weight",
        ):  # fmt: skip
            if getattr(self, name) > 1:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.cool_kv > self.escape_kv:
            raise ConfigError(
                f"cool_kv ({self.cool_kv}) must be <= escape_kv ({self.escape_kv}): "
                "a hot worker must be able to cool"
            )
        if self.cool_waiting > self.escape_waiting:
            raise ConfigError(
                f"cool_waiting ({self.cool_waiting}) must be <= escape_waiting "
                f"({self.escape_waiting})"
            )
        for name in ("escape_waiting", "cool_waiting", "target_waiting", "overflow_waiting"):
            if not isinstance(getattr(self, name), int):
                raise ConfigError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if not self.knee_pressure > 0:
            raise ConfigError(f"knee_pressure must be > 0, got {self.knee_pressure!r}")
        if not self.overflow_pressure > 0:
            raise ConfigError(f"overflow_pressure must be > 0, got {self.overflow_pressure!r}")
        if not self.capacity_alpha > 0:
            raise ConfigError(f"capacity_alpha must be > 0, got {self.capacity_alpha!r}")
        if not isinstance(self.max_sessions, int) or self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be an integer >= 1, got {self.max_sessions!r}")
        if not self.session_ttl_s > 0:
            raise ConfigError(f"session_ttl_s must be > 0, got {self.session_ttl_s!r}")
