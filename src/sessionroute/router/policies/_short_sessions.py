"""Rule 7 of ``adaptive_hold``: whether sessions are short, and where short ones go.

``adaptive_hold`` (:mod:`~sessionroute.router.policies.adaptive_hold`) counts the turns it
routes per live session (:meth:`ShortSessions.turn`). When a session ends (released, expired or
evicted: :meth:`ShortSessions.ended`) its count folds into an exponentially weighted mean over
the ended sessions, each weighing ``_TURNS_WEIGHT``. While that mean is below ``short_turns``
(:meth:`ShortSessions.applies`) the policy holds nothing and keeps no new session off a worker;
with ``short_place = "cache_aware_v2"`` it then places new sessions where ``cache_aware_v2``
sends their first turn (:attr:`ShortSessions.placer`, a
:class:`~sessionroute.router.policies._content_placer.ContentPlacer`), and this object forwards
the policy's hooks to that placer.
"""

from __future__ import annotations

import random
from typing import Any

from sessionroute.clock import Clock
from sessionroute.router.policies._content_placer import ContentPlacer
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import RouteRequest

__all__ = ["ShortSessions"]

_TURNS_WEIGHT = 0.05
"""Weight of each ended session in the mean turns per session (``short_turns``)."""


class ShortSessions:
    """Turns per session, their mean over ended sessions, and the short-session placer.

    Args:
        short_turns: sessions are short while the ended ones had fewer turns than this on
            average (0: never; then no turns are counted).
        place_by_content: keep a :class:`ContentPlacer` (``short_place = "cache_aware_v2"``).
        clock: the owning policy's clock. rng: its random generator.

    Attributes:
        mean_turns: mean turns of the ended sessions (None before one ended).
        placer: the placer, or None without ``place_by_content``.
    """

    __slots__ = ("_turns", "mean_turns", "placer", "short_turns")

    def __init__(
        self, short_turns: float, *, place_by_content: bool, clock: Clock, rng: random.Random
    ) -> None:
        self.short_turns = short_turns
        self._turns: dict[str, int] = {}  # live session -> turns routed
        self.mean_turns: float | None = None
        self.placer = ContentPlacer(clock=clock, rng=rng) if place_by_content else None

    def applies(self) -> bool:
        """Whether the sessions that ended had fewer than ``short_turns`` turns on average."""
        mean = self.mean_turns
        return mean is not None and mean < self.short_turns

    def turn(self, sid: str) -> None:
        """A turn of ``sid`` was routed (counted only with ``short_turns``)."""
        if self.short_turns:
            self._turns[sid] = self._turns.get(sid, 0) + 1

    def ended(self, sid: str) -> None:
        """``sid`` ended: its turns, if counted, move the mean."""
        turns = self._turns.pop(sid, None)
        if turns is not None:
            mean = self.mean_turns
            self.mean_turns = turns if mean is None else mean + _TURNS_WEIGHT * (turns - mean)

    def counters(self) -> dict[str, Any]:
        """The mean turns of ended sessions (2 decimals; None before one ended) and the new
        sessions placed by content (``short_placed``)."""
        mean = self.mean_turns
        return {
            "mean_turns": None if mean is None else round(mean, 2),
            "short_placed": 0 if self.placer is None else self.placer.placed,
        }

    # -- the owning policy's hooks, forwarded to the placer -------------------------------
    def on_complete(self, request: RouteRequest, worker: str) -> None:
        """The policy's ``on_complete``: ``request`` finished on ``worker``; the placer stops
        counting its prefill there (nothing without a placer)."""
        if self.placer is not None:
            self.placer.on_complete(request, worker)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        """The policy's ``on_worker_removed``, after it ended the worker's holds: ``worker``
        left ``cluster``; the placer drops it (its index entries go in later sweeps)."""
        if self.placer is not None:
            self.placer.on_worker_removed(worker, cluster)

    def sweep(self, now: float, limit: int | None = None) -> None:
        """The policy's ``sweep`` at router time ``now`` (seconds), before its own: the placer
        drops up to ``limit`` prefix-index entries of removed workers (all when None)."""
        if self.placer is not None:
            self.placer.sweep(now, limit)

    def sweep_pending(self) -> bool:
        """The policy's ``sweep_pending``: whether the placer's last bounded sweep left index
        entries for another (False without a placer)."""
        return self.placer is not None and self.placer.sweep_pending()

    def bound_sweeps(self, limit: int) -> None:
        """The policy's ``bound_sweeps`` (``serve``): the placer's sweeps inside routing calls
        drop at most ``limit`` entries each from now on."""
        if self.placer is not None:
            self.placer.bound_sweeps(limit)
