"""``consistent_hash``: pin a session to a worker by hashing its id onto a ring.

Placement is identical to vllm-router 0.1.x ``consistent_hash`` for the same worker URL strings:
the key is ``header:<lower-case header name>:<session id>``, 160 points per worker
(``shared/ROUTER.md``). Unhealthy or removed workers leave the ring, so only their keys move (to
the ring successor) and come back when they return. Deviation (documented): a request without a
session id is placed on the least-loaded healthy worker and records nothing, where vllm-router
hashes its text (sending every header-less chat request to one worker).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies._ring import HashRing, KeyHashCache
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.policies.least_loaded import LeastRecentlyChosen
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["ConsistentHashConfig", "ConsistentHashPolicy"]


@dataclass(frozen=True, slots=True)
class ConsistentHashConfig:
    """``consistent_hash`` has no options."""


class ConsistentHashPolicy(Policy):
    """Hash ring keyed by session id (Karger et al. 1997; vllm-router's layout)."""

    name: ClassVar[str] = "consistent_hash"
    Config: ClassVar[type[Any] | None] = ConsistentHashConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        self._ring = HashRing()
        self._hash = KeyHashCache()
        self._stateless = LeastRecentlyChosen()
        self._decisions: dict[str, Decision] = {}  # worker -> its (immutable) STICKY decision

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        if request.session_id is None:
            return Decision(self._stateless.pick(healthy, cluster), DecisionKind.STATELESS)
        if healthy is not self._ring.members:
            self._ring.rebuild(healthy)
        key = f"header:{request.session_header}:{request.session_id}"
        worker = self._ring.owner(self._hash(key))
        d = self._decisions.get(worker)
        if d is None:
            d = self._decisions[worker] = Decision(worker, DecisionKind.STICKY)
        return d
