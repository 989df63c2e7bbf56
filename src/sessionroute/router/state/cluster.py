"""The cluster: workers, their health and the router-side load signals.

A :class:`Cluster` is owned by the caller (the live router or the simulated router) and handed
to policies as a read-only :class:`ClusterView`. The caller reserves load on the chosen worker
in the same synchronous call that selected it (see :class:`sessionroute.router.RoutingCore`),
so a burst of first turns never sees the same free capacity twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sessionroute.errors import WorkerError
from sessionroute.types import EngineGauges

__all__ = ["Cluster", "ClusterView", "WorkerState"]


@dataclass(slots=True)
class WorkerState:
    """Mutable per-worker load, owned by :class:`Cluster`.

    Attributes:
        url: the worker id (its base URL).
        healthy: whether the worker may receive new requests.
        in_flight: requests reserved and not yet completed.
        in_flight_tokens: sum of reserved prompt-token estimates.
        gauges: last scraped engine gauges, or None.
        order: insertion index, stable across health changes.
    """

    url: str
    healthy: bool = True
    in_flight: int = 0
    in_flight_tokens: int = 0
    gauges: EngineGauges | None = None
    order: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class ClusterView(Protocol):
    """Read-only view of the cluster given to policies."""

    def healthy(self) -> tuple[str, ...]:
        """Healthy worker ids in the order they were added (a cached tuple)."""
        ...

    def workers(self) -> tuple[str, ...]:
        """All worker ids, healthy or not, in the order they were added."""
        ...

    def is_healthy(self, url: str) -> bool:
        """True when ``url`` is a known, healthy worker."""
        ...

    def in_flight(self, url: str) -> int:
        """Requests in flight on ``url`` (0 for an unknown worker)."""
        ...

    def in_flight_tokens(self, url: str) -> int:
        """Reserved prompt tokens on ``url`` (0 for an unknown worker)."""
        ...

    def gauges(self, url: str) -> EngineGauges | None:
        """Last scraped engine gauges of ``url``, or None."""
        ...


class Cluster:
    """Workers with health and load; implements :class:`ClusterView`.

    Raises:
        WorkerError: on adding a duplicate worker or removing/updating an unknown one.
    """

    __slots__ = ("_all", "_healthy", "_next_order", "_workers")

    def __init__(self, urls: tuple[str, ...] | list[str] = ()) -> None:
        self._workers: dict[str, WorkerState] = {}
        self._healthy: tuple[str, ...] = ()
        self._all: tuple[str, ...] = ()
        self._next_order = 0
        for url in urls:
            self.add(url)

    # -- view -------------------------------------------------------------------------------
    def healthy(self) -> tuple[str, ...]:
        return self._healthy

    def workers(self) -> tuple[str, ...]:
        return self._all

    def is_healthy(self, url: str) -> bool:
        w = self._workers.get(url)
        return w is not None and w.healthy

    def in_flight(self, url: str) -> int:
        w = self._workers.get(url)
        return 0 if w is None else w.in_flight

    def in_flight_tokens(self, url: str) -> int:
        w = self._workers.get(url)
        return 0 if w is None else w.in_flight_tokens

    def gauges(self, url: str) -> EngineGauges | None:
        w = self._workers.get(url)
        return None if w is None else w.gauges

    def state(self, url: str) -> WorkerState:
        """The mutable state of ``url``; raises WorkerError if unknown."""
        try:
            return self._workers[url]
        except KeyError:
            raise WorkerError(f"unknown worker: {url!r}") from None

    def __contains__(self, url: object) -> bool:
        return url in self._workers

    def __len__(self) -> int:
        return len(self._workers)

    # -- mutation ---------------------------------------------------------------------------
    def add(self, url: str, *, healthy: bool = True) -> None:
        """Add worker ``url``; WorkerError if it is already present or empty."""
        if not url:
            raise WorkerError("worker url must not be empty")
        if url in self._workers:
            raise WorkerError(f"worker already present: {url!r}")
        self._workers[url] = WorkerState(url=url, healthy=healthy, order=self._next_order)
        self._next_order += 1
        self._rebuild()

    def remove(self, url: str) -> WorkerState:
        """Remove worker ``url`` and return its last state; WorkerError if unknown."""
        state = self.state(url)
        del self._workers[url]
        self._rebuild()
        return state

    def set_healthy(self, url: str, healthy: bool) -> bool:
        """Set health of ``url``; returns True when it changed. WorkerError if unknown."""
        w = self.state(url)
        if w.healthy == healthy:
            return False
        w.healthy = healthy
        self._rebuild()
        return True

    def set_gauges(self, url: str, gauges: EngineGauges) -> None:
        """Record scraped engine gauges for ``url`` (ignored for an unknown worker)."""
        w = self._workers.get(url)
        if w is not None:
            w.gauges = gauges

    def reserve(self, url: str, tokens: int) -> int:
        """Count one more in-flight request of ``tokens`` prompt tokens on ``url``.

        Returns:
            The worker's generation (its add-order index, new on every add), to hand back to
            :meth:`release`; -1 for an unknown worker (nothing is reserved).
        """
        w = self._workers.get(url)
        if w is None:
            return -1
        w.in_flight += 1
        w.in_flight_tokens += tokens
        return w.order

    def release(self, url: str, tokens: int, generation: int | None = None) -> None:
        """Undo one :meth:`reserve` (never below zero; a removed worker is ignored).

        Args:
            url: the worker.
            tokens: the prompt tokens that were reserved.
            generation: what :meth:`reserve` returned; when given and the worker has since
                been removed and added again (a new generation), nothing is released.
        """
        w = self._workers.get(url)
        if w is not None and (generation is None or generation == w.order):
            if w.in_flight > 0:
                w.in_flight -= 1
            w.in_flight_tokens = w.in_flight_tokens - tokens if w.in_flight_tokens > tokens else 0

    def _rebuild(self) -> None:
        ordered = sorted(self._workers.values(), key=lambda w: w.order)
        self._all = tuple(w.url for w in ordered)
        self._healthy = tuple(w.url for w in ordered if w.healthy)
