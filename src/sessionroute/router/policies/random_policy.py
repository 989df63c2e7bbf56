"""``random``: a uniformly random healthy worker from the injected generator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["RandomConfig", "RandomPolicy"]


@dataclass(frozen=True, slots=True)
class RandomConfig:
    """``random`` has no options."""


class RandomPolicy(Policy):
    """Pick ``healthy[rng.randrange(len(healthy))]`` (vllm-router ``random``).

    The generator is the injected ``random.Random``, so a seed replays the same choices.
    Sessions are ignored; nothing is recorded.
    """

    name: ClassVar[str] = "random"
    Config: ClassVar[type[Any] | None] = RandomConfig

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        return Decision(healthy[self.rng.randrange(len(healthy))], DecisionKind.STATELESS)
