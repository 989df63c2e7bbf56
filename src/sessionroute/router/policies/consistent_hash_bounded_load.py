"""``consistent_hash_bounded_load``: consistent hashing with bounded loads.

Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads" (SODA 2018): every
worker has capacity ``ceil(c * m / n)`` for ``m`` active sessions on ``n`` workers, and a key
that finds its ring owner full walks clockwise to the first worker with room. The ring is
:class:`~sessionroute.router.policies._ring.HashRing` with vllm-router's layout and key
(``header:<name>:<session id>``, 160 points per worker), so with a large ``c`` placements are
exactly those of ``consistent_hash``.

Session semantics (a :class:`~sessionroute.router.state.SessionTable`, as in
``sticky_least_loaded``):

* a new session (first turn, or after release/expiry) walks the ring from its hash point to the
  first healthy worker with fewer than ``ceil(c * (m + 1) / n)`` sessions (``m + 1`` counts the
  session being placed, so such a worker always exists when ``c >= 1``);
* a known session keeps its worker while that worker is healthy and holds at most
  ``ceil(c * m / n)`` sessions; above the bound (after releases, expiries or a worker joining
  lowered it) the session is moved by the same walk and counted as re-pinned;
* a session whose worker became unhealthy or was removed is re-placed by the walk on its next
  turn (re-pinned); it stays on the new worker when the old one returns;
* a request without a session id goes to the least-loaded worker and records nothing.

``m`` is the number of live sessions in the table and ``n`` the number of healthy workers.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import ConfigError
from sessionroute.router.policies._ring import HashRing, KeyHashCache, ring_key
from sessionroute.router.policies._sessions import SessionPolicy
from sessionroute.router.policies.least_loaded import LeastRecentlyChosen
from sessionroute.router.policies.options import knob
from sessionroute.router.state.cluster import ClusterView
from sessionroute.router.state.sessions import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TTL_S,
)
from sessionroute.types import RouteRequest

__all__ = ["ConsistentHashBoundedLoadConfig", "ConsistentHashBoundedLoadPolicy"]


@dataclass(frozen=True, slots=True)
class ConsistentHashBoundedLoadConfig:
    """Options of ``consistent_hash_bounded_load``.

    Attributes:
        c: load bound factor ``c = 1 + epsilon >= 1``; a worker may hold at most
            ``ceil(c * average)`` active sessions (paper's default range 1.25-2; here 1.25).
        session_ttl_s: idle seconds before a session expires (as ``sticky_least_loaded``).
        sweep_interval_s: minimum seconds between sweeps run inside ``select``.
        max_sessions: capacity of the session table; the least recently used is evicted.
        session_table_max_bytes: capacity of the session table in estimated bytes
            (``SessionTable``'s ``max_bytes``; the router's ``RouterConfig`` gives its own).

    Raises:
        ConfigError: if ``c`` is not a finite number >= 1 or ``sweep_interval_s < 0``.
    """

    c: float = knob(1.25, 1.0, 2.0)
    session_ttl_s: float = DEFAULT_TTL_S
    sweep_interval_s: float = 60.0
    max_sessions: int = DEFAULT_MAX_SESSIONS
    session_table_max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if (
            isinstance(self.c, bool)
            or not isinstance(self.c, int | float)
            or not math.isfinite(self.c)
            or self.c < 1
        ):
            raise ConfigError(f"c must be a finite number >= 1, got {self.c!r}")
        if not self.sweep_interval_s >= 0:
            raise ConfigError(f"sweep_interval_s must be >= 0, got {self.sweep_interval_s!r}")


class ConsistentHashBoundedLoadPolicy(SessionPolicy):
    """Consistent hashing whose workers hold at most ``ceil(c * average)`` sessions."""

    name: ClassVar[str] = "consistent_hash_bounded_load"
    Config: ClassVar[type[Any] | None] = ConsistentHashBoundedLoadConfig

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg: ConsistentHashBoundedLoadConfig = self.config
        c = Fraction(str(cfg.c))  # exact decimal, so ceil() never suffers float rounding
        self._c_num = c.numerator
        self._c_den = c.denominator
        self._ring = HashRing()
        self._hash = KeyHashCache()
        self._stateless = LeastRecentlyChosen()
        self.overload_moves = 0
        """Sessions moved because their healthy worker was above the bound (also re-pinned)."""

    def bound(self, sessions: int, workers: int) -> int:
        """``ceil(c * sessions / workers)``, in exact integer arithmetic.

        Raises:
            ValueError: if ``workers < 1``.
        """
        if workers < 1:
            raise ValueError(f"bound needs at least one worker, got {workers}")
        return -(-(self._c_num * sessions) // (self._c_den * workers))

    def place_stateless(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """Fewest in-flight requests, ties to the least recently chosen."""
        return self._stateless.pick(healthy, cluster)

    def keeps(self, worker: str, healthy: tuple[str, ...]) -> bool:
        """A session leaves its healthy worker when that worker holds more than the bound."""
        if self.table.count(worker) <= self.bound(len(self.table), len(healthy)):
            return True
        self.overload_moves += 1
        return False

    def place_new(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The first worker clockwise from the session's key with room under the bound."""
        if healthy is not self._ring.members:
            self._ring.rebuild(healthy)
        return self._walk(ring_key(request.session_header, str(request.session_id)), len(healthy))

    def _walk(self, key: str, workers: int) -> str:
        """First worker clockwise from ``key``'s hash with fewer sessions than the bound."""
        count = self.table.count
        cap = self.bound(len(self.table) + 1, workers)
        for w in self._ring.walk(self._hash(key)):
            if count(w) < cap:
                return w
        # Unreachable for c >= 1: the healthy workers hold at most len(table) < n * cap.
        raise RuntimeError(f"no worker under the bound {cap} (ring {self._ring.members})")
