"""``round_robin``: healthy workers in turn (vllm-router ``round_robin``)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["RoundRobinConfig", "RoundRobinPolicy"]


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    """``round_robin`` has no options."""


class RoundRobinPolicy(Policy):
    """The ``k``-th request goes to ``healthy[k mod len(healthy)]``.

    As in vllm-router / sglang ``round_robin``, one counter advances per request and
    indexes the current healthy list (in the order workers were added), so a health change
    shifts the rotation but never skips a turn. Sessions are ignored; nothing is recorded.
    """

    name: ClassVar[str] = "round_robin"
    Config: ClassVar[type[Any] | None] = RoundRobinConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self._counter = 0

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        worker = healthy[self._counter % len(healthy)]
        self._counter += 1
        return Decision(worker, DecisionKind.STATELESS)
