"""``least_loaded``: fewest in-flight requests; ties go to the least recently chosen worker."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["LeastLoadedConfig", "LeastLoadedPolicy", "LeastRecentlyChosen"]


class LeastRecentlyChosen:
    """Picks the worker with the fewest in-flight requests, ties to the least recently chosen.

    A never-chosen worker counts as least recent; among never-chosen ones the earlier-added
    wins. Each pick records its choice (a logical counter, not the clock).
    """

    __slots__ = ("_last", "_tick")

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._tick = 0

    def pick(self, candidates: Sequence[str], cluster: ClusterView) -> str:
        in_flight = cluster.in_flight
        loads = [in_flight(w) for w in candidates]
        fewest = min(loads)
        if loads.count(fewest) == 1:
            best = candidates[loads.index(fewest)]
        else:
            last = self._last
            best = min(
                (w for w, n in zip(candidates, loads, strict=True) if n == fewest),
                key=lambda w: last.get(w, -1),
            )
        self._tick += 1
        self._last[best] = self._tick
        return best


@dataclass(frozen=True, slots=True)
class LeastLoadedConfig:
    """``least_loaded`` has no options."""


class LeastLoadedPolicy(Policy):
    """Route every request to the healthy worker with the fewest in-flight requests."""

    name: ClassVar[str] = "least_loaded"
    Config: ClassVar[type[Any] | None] = LeastLoadedConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self._picker = LeastRecentlyChosen()

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        return Decision(
            self._picker.pick(require_healthy(cluster), cluster), DecisionKind.STATELESS
        )
