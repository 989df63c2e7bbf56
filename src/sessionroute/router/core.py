"""The routing core: a policy plus a cluster, with select-and-reserve and exactly-once release.

Both the live router and the simulated router drive policies through this class, so the two
make the same decisions for the same event sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from sessionroute.router.policies.base import Policy
from sessionroute.router.state.cluster import Cluster
from sessionroute.types import Decision, DecisionKind, RouteRequest

__all__ = ["Reservation", "RoutingCore"]

_KINDS: Final = (
    DecisionKind.STICKY,
    DecisionKind.NEW,
    DecisionKind.REPINNED,
    DecisionKind.STATELESS,
)
"""Every decision kind, the most frequent first."""


@dataclass(init=False, slots=True, eq=False)
class Reservation:
    """One routed request; pass it back to :meth:`RoutingCore.complete` exactly once.

    Attributes:
        request: what was routed.
        worker: the chosen worker.
        kind: how it was chosen.
        done: True once completed (a second complete is ignored).
        generation: the worker's add-order index when reserved (-1 if it was unknown, None to
            release by URL alone); a worker removed and added again is a new generation, so
            completing an old reservation never takes load off the new one.
    """

    request: Final[RouteRequest]
    worker: Final[str]
    kind: Final[DecisionKind]
    done: bool
    generation: Final[int | None]

    def __init__(
        self,
        request: RouteRequest,
        worker: str,
        kind: DecisionKind,
        done: bool = False,
        generation: int | None = None,
    ) -> None:
        # its own __init__: a compiled class builds in ~1/6 of a dataclass __init__'s time
        self.request = request
        self.worker = worker
        self.kind = kind
        self.done = done
        self.generation = generation


@dataclass(slots=True)
class RoutingCore:
    """Select + reserve in one synchronous step; release exactly once.

    Attributes:
        policy: the routing policy.
        cluster: workers, health and in-flight load.
        log: when not None, every decision is appended as ``(session_id, worker, kind)``
            (used by parity tests).
    """

    policy: Policy
    cluster: Cluster
    log: list[tuple[str | None, str, str]] | None = None
    _counts: list[int] = field(default_factory=lambda: [0] * len(_KINDS), init=False, repr=False)
    """Decisions by kind, in :data:`_KINDS` order (found by identity: hashing or reading an
    ``Enum`` member's value runs Python code)."""

    @property
    def decisions(self) -> dict[DecisionKind, int]:
        """Count of decisions by kind (a fresh dict)."""
        return {k: self._counts[_KINDS.index(k)] for k in DecisionKind}

    def route(self, request: RouteRequest) -> Reservation:
        """Choose a worker and reserve load on it.

        Raises:
            NoWorkerAvailable: when no worker is healthy.
        """
        d: Decision = self.policy.select(request, self.cluster)
        generation = self.cluster.reserve(d.worker, request.prompt_tokens)
        kind = d.kind
        i = 0
        while _KINDS[i] is not kind:
            i += 1
        counts = self._counts
        counts[i] = counts[i] + 1  # (``+=`` on a list item is a generic call when compiled)
        if self.log is not None:
            self.log.append((request.session_id, d.worker, d.kind.value))
        return Reservation(request, d.worker, d.kind, False, generation)

    def complete(self, reservation: Reservation) -> bool:
        """Release what :meth:`route` reserved; returns False if already completed."""
        if reservation.done:
            return False
        reservation.done = True
        self.cluster.release(
            reservation.worker, reservation.request.prompt_tokens, reservation.generation
        )
        self.policy.on_complete(reservation.request, reservation.worker)
        return True

    def finish_session(self, session_id: str) -> bool:
        """Release a session (idempotent); True if the policy knew it."""
        return self.policy.release_session(session_id)

    def add_worker(self, url: str) -> None:
        """Add a healthy worker (WorkerError if present)."""
        self.cluster.add(url)
        self.policy.on_worker_added(url, self.cluster)

    def remove_worker(self, url: str) -> None:
        """Remove a worker (WorkerError if unknown); its sessions re-place on their next turn."""
        self.cluster.remove(url)
        self.policy.on_worker_removed(url, self.cluster)

    def set_health(self, url: str, healthy: bool) -> bool:
        """Mark a worker healthy/unhealthy; True if it changed (WorkerError if unknown)."""
        changed = self.cluster.set_healthy(url, healthy)
        if changed:
            self.policy.on_health_change(url, healthy, self.cluster)
        return changed

    def sweep(self, now: float) -> int:
        """Expire idle sessions; returns how many."""
        return self.policy.sweep(now)
