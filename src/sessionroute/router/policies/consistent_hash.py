"""``consistent_hash``: pin a session to a worker by hashing its id onto a ring.

Placement is identical to vllm-router 0.1.x ``consistent_hash`` for the same worker URL strings:
the key is ``header:<lower-case header name>:<session id>`` (``request:<id>`` for a body
``session_params.session_id``, :func:`~sessionroute.router.session_keys.ring_key`), 160 points
per worker (``shared/ROUTER.md``). Unhealthy or removed workers leave the ring, so only their
keys move (to the ring successor) and come back when they return. Deviation (documented): a
request without a session id is placed on the least-loaded healthy worker and records nothing,
where vllm-router hashes its text (sending every header-less chat request to one worker).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies._ring import HashRing, KeyHashCache, ring_key
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.policies.least_loaded import LeastRecentlyChosen
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["PLACED_CAPACITY", "ConsistentHashConfig", "ConsistentHashPolicy"]

PLACED_CAPACITY = 1 << 14
"""Sessions whose decision on the current ring is remembered (the oldest is forgotten past
it; all are when the ring changes, a clear of about half a millisecond when full)."""


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
        self._placed: OrderedDict[tuple[str, str], Decision] = OrderedDict()
        """(session header, session id) -> its decision on the current ring (a session's
        turns all hash the same key: looked up once per ring)."""

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        session_id = request.session_id
        if session_id is None:
            return Decision(self._stateless.pick(healthy, cluster), DecisionKind.STATELESS)
        if healthy is not self._ring.members:
            self._ring.rebuild(healthy)
            self._placed.clear()
        key = (request.session_header, session_id)
        d = self._placed.get(key)
        if d is None:
            d = self._place(key)
        return d

    def _place(self, key: tuple[str, str]) -> Decision:
        """The ring's decision for ``(header, session id)``, remembered."""
        header, session_id = key
        worker = self._ring.owner(self._hash(ring_key(header, session_id)))
        d = self._decisions.get(worker)
        if d is None:
            d = self._decisions[worker] = Decision(worker, DecisionKind.STICKY)
        placed = self._placed
        if len(placed) >= PLACED_CAPACITY:
            placed.popitem(last=False)
        placed[key] = d
        return d
