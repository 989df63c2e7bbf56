"""The base of session-keeping policies: a session table, periodic sweeps, lifecycle queries.

Shared by ``sticky_least_loaded`` and ``consistent_hash_bounded_load``: both pin sessions in a
:class:`~sessionroute.router.state.sessions.SessionTable` with an idle TTL, sweep it at most every
``sweep_interval_s`` inside routing calls (vllm-router sweeps at most every 60 s), and unpin a
removed worker's sessions so they count as re-pinned on their next turn.

:meth:`SessionPolicy.select` is the one implementation of the session lifecycle (revisit,
expiry, re-pin after a failure or removal, new placement, counters); a subclass says only where
a new session goes (:meth:`~SessionPolicy.place_new`), where a request without a session goes
(:meth:`~SessionPolicy.place_stateless`) and, optionally, when a live session must leave its
healthy worker (:meth:`~SessionPolicy.keeps`).
"""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.router.policies._rendezvous import rendezvous_winner
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.router.state.sessions import (
    DEFAULT_MAX_BYTES,
    SessionInfo,
    SessionStats,
    SessionTable,
)
from sessionroute.router.state.shared import SharedSessionTable
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["SessionPolicy"]


class SessionPolicy(Policy):
    """A policy that pins sessions. Its ``Config`` must have ``session_ttl_s``,
    ``sweep_interval_s`` and ``max_sessions``, and may have ``session_table_max_bytes``."""

    keeps_sessions: ClassVar[bool] = True

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        super().__init__(config, clock=clock, rng=rng)
        cfg = self.config
        self.table = SessionTable(
            cfg.session_ttl_s,
            cfg.max_sessions,
            getattr(cfg, "session_table_max_bytes", DEFAULT_MAX_BYTES),
        )
        self._sweep_interval: float = self.config.sweep_interval_s
        self._last_sweep = clock.now()
        self._sweep_limit: int | None = None  # most sessions one sweep inside select expires
        self._sweep_more = False  # the last sweep inside select stopped at its limit
        self._decisions: dict[str, Decision] = {}  # worker -> its (immutable) STICKY decision

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        """Route a known, live session to its worker; place a new (or expired, or displaced)
        one with :meth:`place_new` and pin it; requests without a session go to
        :meth:`place_stateless` and record nothing.

        While a shared table is offline (:attr:`SharedSessionTable.offline`: several routers,
        their shared state unreachable), every router must place a session it has not seen
        the same way without talking: such a session goes to the rendezvous winner of its id
        over the healthy workers (not by load, which each router sees differently), and a
        known session stays on its healthy worker (:meth:`keeps` is not asked).

        Raises:
            NoWorkerAvailable: when no worker is healthy.
        """
        healthy = require_healthy(cluster)
        sid = request.session_id
        if sid is None:
            return Decision(self.place_stateless(request, healthy, cluster), DecisionKind.STATELESS)
        now = self.clock.now()
        self._maybe_sweep(now)
        table = self.table
        offline = isinstance(table, SharedSessionTable) and table.offline
        worker = table.lookup(sid, now)
        if worker is not None:
            if cluster.is_healthy(worker) and (offline or self.keeps(worker, healthy)):
                table.touch(sid, now)
                table.stats.sticky += 1
                return self._sticky(worker)
            table.unpin(sid)
            kind = DecisionKind.REPINNED
        elif table.take_displaced(sid, now):
            kind = DecisionKind.REPINNED
        else:
            kind = DecisionKind.NEW
        if offline:  # every router agrees without the shared table
            worker = rendezvous_winner(sid, healthy)
        else:
            worker = self.place_new(request, healthy, cluster)
        table.pin(sid, worker, now)
        if kind is DecisionKind.REPINNED:
            table.stats.repinned += 1
        else:
            table.stats.new += 1
        return Decision(worker, kind)

    @abstractmethod
    def place_new(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The worker for a session that has none (``request.session_id`` is set); the caller
        pins it."""

    @abstractmethod
    def place_stateless(
        self, request: RouteRequest, healthy: tuple[str, ...], cluster: ClusterView
    ) -> str:
        """The worker for a request without a session."""

    def keeps(self, worker: str, healthy: tuple[str, ...]) -> bool:
        """Whether a live session stays on its healthy ``worker`` (default: always)."""
        return True

    def _maybe_sweep(self, now: float) -> None:
        """Sweep if ``sweep_interval_s`` has passed since the last sweep, or the last one
        stopped at its limit (:meth:`bound_sweeps`)."""
        if self._sweep_more or now - self._last_sweep >= self._sweep_interval:
            limit = self._sweep_limit
            if limit is None:
                self.sweep(now)
            else:
                self._sweep_more = self.sweep(now, limit) >= limit or self.sweep_pending()

    def bound_sweeps(self, limit: int) -> None:
        """Sweeps inside :meth:`select` expire at most ``limit`` sessions; one that reached it
        goes on at the next call."""
        self._sweep_limit = limit

    def _sticky(self, worker: str) -> Decision:
        """The cached STICKY decision for ``worker`` (decisions are immutable)."""
        d = self._decisions.get(worker)
        if d is None:
            d = self._decisions[worker] = Decision(worker, DecisionKind.STICKY)
        return d

    def release_session(self, session_id: str) -> bool:
        return self.table.release(session_id)

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self.table.displace(worker)

    def sweep(self, now: float, limit: int | None = None) -> int:
        self._last_sweep = now
        return self.table.sweep(now, limit)

    def session_counts(self) -> Mapping[str, int]:
        return self.table.counts()

    def session_stats(self) -> SessionStats:
        return self.table.stats

    def session_table_bytes(self) -> int:
        return self.table.nbytes

    def worker_of(self, session_id: str) -> str | None:
        return self.table.worker_of(session_id)

    def session_info(self, session_id: str) -> SessionInfo | None:
        return self.table.info(session_id)
