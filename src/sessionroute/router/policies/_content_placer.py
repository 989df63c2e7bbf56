"""Place a session's first turn where ``cache_aware_v2`` would send it, inside another policy.

``adaptive_hold`` places new sessions this way while sessions are short (its rule 7 with
``short_place = "cache_aware_v2"``): a session of one or two turns builds up no context of its
own, so what decides its first turn's latency is the prefix it shares with other sessions
(system prompts, documents) and the prefill backlog of the worker it lands on, which is what
``cache_aware_v2`` (SGLang model gateway's cache-aware routing,
:mod:`~sessionroute.router.policies.cache_aware_v2`) weighs. The owning policy keeps the
session (pins it, routes its later turns) and forwards the hooks below (``adaptive_hold``
through :class:`~sessionroute.router.policies._short_sessions.ShortSessions`), so the embedded
policy's prefix index and in-flight prefill stay those of the requests it placed.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from sessionroute.clock import Clock
from sessionroute.router.policies._prefix import prompt_blocks
from sessionroute.router.policies.cache_aware_v2 import CacheAwareV2Policy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.types import RouteRequest

__all__ = ["ContentPlacer"]


class ContentPlacer:
    """A ``cache_aware_v2`` with its default options, used for placement only.

    Args:
        clock: the owning policy's clock. rng: its random generator.

    Attributes:
        placed: requests placed.
    """

    __slots__ = ("_policy", "placed")

    def __init__(self, *, clock: Clock, rng: random.Random) -> None:
        self._policy = CacheAwareV2Policy(clock=clock, rng=rng)
        self.placed = 0

    def place(
        self,
        request: RouteRequest,
        cluster: ClusterView,
        redirect: Callable[[str], str] | None = None,
    ) -> str:
        """The worker ``cache_aware_v2`` picks for ``request``, or where ``redirect`` sends a
        turn bound for it; the prompt is recorded where the turn goes.

        Raises:
            NoWorkerAvailable: when no worker is healthy.
        """
        self.placed += 1
        policy = self._policy
        blocks = prompt_blocks(request)
        worker = policy.choose(request, cluster, blocks)
        if redirect is not None:
            worker = redirect(worker)
        policy.record(request, worker, blocks)
        return worker

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        """``request`` finished (its prefill no longer counts; one not placed here is ignored)."""
        self._policy.on_complete(request, worker)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self._policy.on_worker_removed(worker, cluster)

    def sweep(self, now: float, limit: int | None = None) -> None:
        """Drop up to ``limit`` prefix-index entries of removed workers."""
        self._policy.sweep(now, limit)

    def sweep_pending(self) -> bool:
        return self._policy.sweep_pending()

    def bound_sweeps(self, limit: int) -> None:
        self._policy.bound_sweeps(limit)
