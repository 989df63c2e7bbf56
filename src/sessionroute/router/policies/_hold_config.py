"""Options of ``adaptive_hold`` (:mod:`sessionroute.router.policies.adaptive_hold`): every
option of ``adaptive_sticky`` plus the hold and resume of running sessions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sessionroute.errors import ConfigError
from sessionroute.router.policies._adaptive_config import AdaptiveStickyConfig

__all__ = ["HOLD_PICKS", "SHORT_PLACES", "AdaptiveHoldConfig"]

HOLD_PICKS: tuple[str, ...] = ("newest", "largest")
"""Which sessions a worker over its ceiling holds first: the most recently started on it, or
the largest context (frees the most)."""
SHORT_PLACES: tuple[str, ...] = ("load", "cache_aware_v2")
"""Where rule 7 places a new session while sessions are short: by rule 1's token load, or
where ``cache_aware_v2`` would send its first turn."""


@dataclass(frozen=True, slots=True)
class AdaptiveHoldConfig(AdaptiveStickyConfig):
    """Options of ``adaptive_hold``: :class:`AdaptiveStickyConfig`'s, and these (fractions of
    KV usage, request counts, seconds; measurements in ``docs/policies.md``, "adaptive_hold").

    Attributes:
        hold: hold and resume sessions that are already running (False: ``adaptive_sticky``).
        hold_waiting: a scrape of a worker with at least this many requests waiting shows
            thrash (the queue watermark).
        hold_kv: a scrape with ``kv_usage`` at or above this shows thrash (the KV watermark;
            ThunderAgent pauses at 0.95).
        hold_queue_kv: the queue watermark counts only at this ``kv_usage`` or above (0:
            always). A burst of first turns queues with the caches half empty; 0.8 would not
            read it as thrash (measurements in docs/policies.md; not the default yet).
        resume_kv: a scrape shows a calm worker when ``kv_usage`` is below this and fewer than
            ``resume_waiting`` requests wait (ThunderAgent resumes at 0.85).
        resume_waiting: see ``resume_kv``.
        hold_cut: a scrape showing thrash sets the worker's working-set ceiling to this
            fraction of its present working set (of the ceiling, when lower), at most once per
            ``hold_interval_s``.
        hold_raise: each ``hold_interval_s`` of calm scrapes raises the ceiling by this
            fraction; a ceiling at ``lift_pressure`` times the capacity estimate with nothing
            held goes away.
        lift_pressure: see ``hold_raise``.
        resume_fraction: a held session resumes, in hold order, when the worker's working
            set with it is at most this fraction of the ceiling (hysteresis; 0.85 / 0.95, as
            ThunderAgent's bands).
        hold_interval_s: minimum seconds between two changes of one worker's ceiling (a
            hold shows in the gauges only once the held sessions' cache is evicted and the
            queue drains).
        hold_pick: ``"newest"`` (the sessions most recently placed on the worker first) or
            ``"largest"`` (the largest context first: frees the most per session held).
        hold_max_s: the longest one hold lasts (its held turn is then admitted).
        hold_total_max_s: the most seconds one session is held over its life, all holds
            together: a rollout that finishes within its timeout minus this when never held
            finishes within its timeout (the hold never times it out by itself).
        hold_age_max_s: a session is never held once this many seconds have passed since its
            first turn was placed, and a hold in progress ends then.
        hold_check_s: seconds between the drivers' re-checks of held turns by time alone
            (:attr:`~sessionroute.router.policies.Policy.admission_recheck_s`): a hold ends
            at most this long after its bound.
        wait_bound: bound the time a held session's turn (rule 4) waits at the router by its
            worker's own queueing delay (rule 6): waiting longer at the router than the
            engine's queue would make it wait buys the turn nothing, and makes the latency
            tail the router's alone. Off by default: on the Weka replay it brings the TTFT
            p99 to the engines' own with more SLO goodput, but past the knee of an RL run the
            long holds are what keeps the working set in the caches (3 replicas, 680 and 816
            rollouts in flight: mean step time +22 % and +19 %, 3.7 % and 9.3 % of rollouts
            timed out; docs/policies.md). On under a serving objective
            (``AdaptiveHoldPolicy.objective_options``: ``compare``/``sweep`` on a trace
            replay, ``serve --objective serving``).
        wait_bound_new: bound a new session's first turn (rule 3) the same way, by the
            fleet's queueing delay. Off by default: rule 3 decides how many sessions share
            the caches, and a new session admitted stays for its whole life; bounded by the
            queueing delay it admitted sessions the fleet could not hold (Weka replay, 128
            sessions: SLO goodput 0.51-0.64 against 0.64-0.84, at factors 1 to 10; measured in
            docs/policies.md). It is ``max_wait_s`` that bounds rule 3.
        wait_queue_factor: a turn leaves the router once it has waited this many times the
            queueing delay (Little's law: waiting requests over the rate at which requests
            finish, :mod:`~sessionroute.router.policies._queue_delay`).
        wait_rate_window_s: the time constant (seconds) of that completion rate (an
            exponentially weighted average).
        short_turns: while the sessions that ended had fewer turns than this on average (an
            exponentially weighted mean over them, weight 0.05 each), rule 4 holds no session
            and its holds and ceilings keep no new session off a worker (rule 3 is then
            ``adaptive_sticky``'s). Holding a session costs its next turn and pays off over its
            later ones; a session of one or two turns has none, and under open-loop arrivals
            holding new sessions sheds no load (the Mooncake replay, 1.5 turns a session, at
            3x its arrival rate: measured in docs/policies.md). 0 (the default): always
            hold; 3 under a serving objective.
        short_place: how rule 7 places a new session while sessions are short: ``"load"``
            (``adaptive_sticky``'s rule 1, the default) or ``"cache_aware_v2"`` (where that
            policy would send its first turn: the worker holding the longest shared prefix,
            by expected prefill wait; the router then hashes every prompt's content, as for
            the cache-aware policies). A short session builds no context of its own, so its
            prefix shared with other sessions and the prefill backlog decide its latency
            (Mooncake replay at 3x its arrival rate: SLO goodput 0.405 with ``"load"``,
            0.511 with ``"cache_aware_v2"``, against that policy's 0.516). Later turns stay on
            the session's worker either way. ``"cache_aware_v2"`` under a serving objective.
            Without ``hold`` (``adaptive_sticky``) rule 7 learns no session lengths and this
            places nothing.
        ceiling_floor: rule 4 never cuts a worker's ceiling below this times its capacity
            estimate. 0 (the default): no floor. Thrash that holding cannot end (the sessions
            past ``hold_age_max_s`` alone overflow the cache) cuts the ceiling every
            ``hold_interval_s``: at 128 and 160 Weka sessions it reached 0-4 % of the capacity,
            holding every session it could and keeping new ones off, while the held ones came
            back at their bounds and re-prefilled. 0.5 under a serving objective (Weka
            replay, seeds 0-4, SLO goodput at 96/128/160 sessions: 0.876/0.781/0.470 without,
            0.872/0.817/0.644 with 0.5 and ``pack_past_knee``; docs/policies.md). Below
            ``lift_pressure``: a floor at or above it lifts every ceiling at the next calm scrape.
        overload_window_s: rule 8 (:mod:`~sessionroute.router.policies._overload`): the
            time constant, seconds, of the exponential average of the fleet's smallest engine
            queue (the scraped waiting requests of the worker with the fewest), which tells a
            fleet past its capacity for good (no queue drains: the average keeps up) from a
            burst (some queue drains within the window: it falls). 0 (the default): rule 8
            off; 120 under a serving objective; refused without ``short_turns``. Once the
            average reaches ``overload_waiting``, while sessions are short (rule 7), the worker
            with the longest queue becomes a *sacrifice*: a new session bound for another
            worker whose queueing delay (rule 6's estimate) is at least ``spill_delay_s`` goes
            to it instead, so the excess of an open-loop load queues there and the other workers
            stay inside the TTFT SLO. Placed evenly, every queue grows and every turn misses
            the SLO together (Mooncake replay, seed 0: SLO goodput 0.339 at 3.125x its arrival
            rate, 0.077 at 3.2x; with rule 8 0.345 and 0.303, against consistent_hash's 0.156;
            docs/policies.md, "adaptive_hold: measurements"). Under closed-loop or RL load the
            sessions are long and rule 8 never acts. A 120 s window is longer than the
            bursts that drain (at 3.125x the average peaks at 14 requests).
        overload_waiting: the average smallest queue (requests waiting, > 0) at which the
            fleet is past its capacity for good; 16 by default (Mooncake replay, before the
            serving knee: it peaks at 9, 12 and 14 at 3.03x, 3.08x and 3.125x its arrival
            rate, where the queues drain, and reaches 22 and 35 at 3.17x and 3.2x, where they
            do not).
        spill_delay_s: during an episode a new session bound for a worker (not a sacrifice)
            whose queueing delay is at least this many seconds goes to a sacrifice; 2 by
            default (the TTFT SLO's default: a worker queueing that long serves its new
            turns late anyway, and one queueing less keeps taking them).
        sacrifice_max_delay_s: a sacrifice whose queueing delay is at least this many seconds
            takes no more new sessions; the next to divert gives up another worker (the
            longest queue of the rest, never the last one). It bounds the TTFT tail that
            concentrating the excess builds: without it, at 4x the Mooncake arrival rate the
            TTFT p99 was 2.2x consistent_hash's; at 60 / 90 / 120 / 150 / 180 / 240 s SLO
            goodput at 3.45x was 0.003 / 0.021 / 0.056 / 0.083 / 0.103 / 0.175 (consistent_hash
            0.075) and TTFT p99 at 4x 0.70 / 0.93 / 0.90 / 0.94 / 1.14 / 1.09x consistent_hash's:
            180 by default. A sacrifice whose queue stays empty for ``overload_window_s`` is
            let go of; the episode ends with the last.

    Raises:
        ConfigError: on a value out of range, or ``overload_window_s`` without
            ``short_turns`` (the message names it).
    """

    hold: bool = True
    hold_waiting: int = 8
    hold_kv: float = 0.95
    hold_queue_kv: float = 0.0
    resume_kv: float = 0.85
    resume_waiting: int = 1
    hold_cut: float = 0.95
    hold_raise: float = 0.01
    lift_pressure: float = 1.2
    resume_fraction: float = 0.95
    hold_interval_s: float = 30.0
    hold_pick: str = "newest"
    hold_max_s: float = 300.0
    hold_total_max_s: float = 600.0
    hold_age_max_s: float = 1800.0
    hold_check_s: float = 1.0
    wait_bound: bool = False
    wait_bound_new: bool = False
    wait_queue_factor: float = 1.0
    wait_rate_window_s: float = 60.0
    short_turns: float = 0.0
    short_place: str = "load"
    ceiling_floor: float = 0.0
    overload_window_s: float = 0.0
    overload_waiting: float = 16.0
    sacrifice_max_delay_s: float = 180.0
    spill_delay_s: float = 2.0

    def __post_init__(self) -> None:
        AdaptiveStickyConfig.__post_init__(self)
        for flag in ("hold", "wait_bound", "wait_bound_new"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.short_place not in SHORT_PLACES:
            raise ConfigError(
                f"short_place must be one of {', '.join(SHORT_PLACES)}, got {self.short_place!r}"
            )
        if self.hold_pick not in HOLD_PICKS:
            raise ConfigError(
                f"hold_pick must be one of {', '.join(HOLD_PICKS)}, got {self.hold_pick!r}"
            )
        for name in ("hold_waiting", "resume_waiting"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {v!r}")
        for name in (
            "hold_kv", "hold_queue_kv", "resume_kv", "hold_cut", "hold_raise", "lift_pressure",
            "resume_fraction", "hold_interval_s", "hold_max_s", "hold_total_max_s",
            "hold_age_max_s", "hold_check_s", "wait_queue_factor", "wait_rate_window_s",
            "short_turns", "ceiling_floor", "overload_window_s", "overload_waiting",
            "spill_delay_s", "sacrifice_max_delay_s",
        ):  # fmt: skip
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"{name} must be a finite number, got {v!r}")
            if v < 0:
                raise ConfigError(f"{name} must be >= 0, got {v!r}")
        for name in ("hold_kv", "hold_queue_kv", "resume_kv", "resume_fraction"):
            if getattr(self, name) > 1:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if self.resume_kv > self.hold_kv:
            raise ConfigError(f"resume_kv ({self.resume_kv}) must be <= hold_kv ({self.hold_kv})")
        if self.resume_waiting > self.hold_waiting:
            raise ConfigError(
                f"resume_waiting ({self.resume_waiting}) must be <= hold_waiting "
                f"({self.hold_waiting}): a scrape cannot show thrash and calm at once"
            )
        if self.ceiling_floor >= self.lift_pressure:
            raise ConfigError(
                f"ceiling_floor ({self.ceiling_floor}) must be < lift_pressure "
                f"({self.lift_pressure}): a ceiling at the floor would be lifted at once"
            )
        if not 0 < self.hold_cut < 1:
            raise ConfigError(f"hold_cut must be in (0, 1), got {self.hold_cut!r}")
        for name in (
            "hold_check_s",
            "wait_rate_window_s",
            "overload_waiting",
            "sacrifice_max_delay_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.hold and self.overload_window_s > 0 and not self.short_turns:
            raise ConfigError(
                f"overload_window_s ({self.overload_window_s}) acts only while sessions are "
                "short (rule 8 needs rule 7): set short_turns > 0, or overload_window_s = 0"
            )
        if self.hold_max_s > self.hold_total_max_s:
            raise ConfigError(
                f"hold_max_s ({self.hold_max_s}) must be <= hold_total_max_s "
                f"({self.hold_total_max_s})"
            )
