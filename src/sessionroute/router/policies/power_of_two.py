"""``power_of_two``: the less loaded of two distinct random healthy workers.

Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing" (IEEE TPDS 2001); the
router form follows vllm-router / sglang ``power_of_two``, with load = router-side in-flight
requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["PowerOfTwoConfig", "PowerOfTwoPolicy"]


@dataclass(frozen=True, slots=True)
class PowerOfTwoConfig:
    """``power_of_two`` has no options."""


class PowerOfTwoPolicy(Policy):
    """Sample two distinct healthy workers; the one with fewer in-flight requests wins.

    Ties go to the less recently chosen of the two (a logical counter, not the clock); when
    neither was ever chosen, the first sampled wins, which is itself a random pick. With one
    healthy worker that worker is chosen without drawing. Sessions are ignored.
    """

    name: ClassVar[str] = "power_of_two"
    Config: ClassVar[type[Any] | None] = PowerOfTwoConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self._last: dict[str, int] = {}
        self._tick = 0

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        n = len(healthy)
        if n == 1:
            worker = healthy[0]
        else:
            i = self.rng.randrange(n)
            j = self.rng.randrange(n - 1)
            if j >= i:
                j += 1
            a, b = healthy[i], healthy[j]
            la, lb = cluster.in_flight(a), cluster.in_flight(b)
            if la != lb:
                worker = a if la < lb else b
            else:
                worker = b if self._last.get(b, -1) < self._last.get(a, -1) else a
        self._tick += 1
        self._last[worker] = self._tick
        return Decision(worker, DecisionKind.STATELESS)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self._last.pop(worker, None)
