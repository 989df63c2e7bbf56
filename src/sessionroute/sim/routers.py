"""Several routers in the simulator: per-router (local) state or one shared session table.

``[sim] routers = N`` runs N routers in front of the replicas, each with its own instance of
the arm's policy; every request reaches one of them (clients spread over routers: an L4
balancer picks a router per connection, so consecutive turns of a session may arrive at
different routers). The router of a request is ``fbi_hash(request id) mod N``, so
:meth:`Policy.admit` and :meth:`Policy.select` of one request ask the same router.

``router_state = "local"``: each router has its own session table and sees only its own
in-flight requests (what ``sessionroute serve`` without ``--state-url`` gives when several
run side by side): a turn that reaches a router that has not seen its session is placed again
(the session moves and re-prefills), and "fewest sessions"/"least loaded" compare 1/N of the
load. A ``/finish_session`` reaches one router; the others keep the pin until its TTL.

``router_state = "shared"``: the routers' policies read and write one session table and see
every router's in-flight requests (``serve --state-url``). The simulator runs in virtual
time without I/O, so the shared table is modelled as one object: a decision sees every
earlier decision at once, as the compare-and-set on Redis guarantees
(:mod:`sessionroute.serve.state`); what it does not model is the extra round trip on Redis
(a fraction of a millisecond on a LAN, ``docs/router.md``).

Everything is driven through one :class:`~sessionroute.router.RoutingCore` (the simulator's
one router side): :class:`RouterFleet` is the policy it holds, and it hands each call to the
router the request reached. The routers' policies are unchanged instances of the arm's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from sessionroute.clock import Clock
from sessionroute.router.policies.base import Policy
from sessionroute.router.policies.capabilities import KeepsSessionTable
from sessionroute.router.policies.hashing import fbi_hash
from sessionroute.router.state.cluster import ClusterView
from sessionroute.router.state.sessions import SessionStats, SessionTable
from sessionroute.types import Decision, EngineGauges, RouteRequest

__all__ = ["RouterFleet", "build_fleet"]


class _RouterView:
    """One router's view of the cluster: health and gauges of the whole cluster, in-flight
    counts of this router's requests only (local state)."""

    __slots__ = ("_base", "_n", "_tokens")

    def __init__(self, base: ClusterView) -> None:
        self._base = base
        self._n: dict[str, int] = {}
        self._tokens: dict[str, int] = {}

    def healthy(self) -> tuple[str, ...]:
        return self._base.healthy()

    def workers(self) -> tuple[str, ...]:
        return self._base.workers()

    def is_healthy(self, url: str) -> bool:
        return self._base.is_healthy(url)

    def in_flight(self, url: str) -> int:
        return self._n.get(url, 0)

    def in_flight_tokens(self, url: str) -> int:
        return self._tokens.get(url, 0)

    def gauges(self, url: str) -> EngineGauges | None:
        return self._base.gauges(url)

    def add(self, url: str, tokens: int, sign: int) -> None:
        self._n[url] = max(0, self._n.get(url, 0) + sign)
        self._tokens[url] = max(0, self._tokens.get(url, 0) + sign * tokens)


class RouterFleet(Policy):
    """N routers, each with its own instance of a policy (module docstring).

    Args:
        policies: one policy instance per router.
        state: ``"local"`` (each router its own session table and in-flight counts) or
            ``"shared"`` (one session table for all, every router's in-flight counts).
        clock: the simulator's clock.
    """

    name: ClassVar[str] = "router_fleet"

    def __init__(
        self, policies: list[Policy], state: Literal["local", "shared"], *, clock: Clock
    ) -> None:
        super().__init__(None, clock=clock, rng=policies[0].rng)
        self.policies = policies
        self.admission_recheck_s = policies[0].admission_recheck_s  # (set per instance)
        self.state = state
        self._views: list[_RouterView] | None = None
        self._placed: dict[int, tuple[int, str, int]] = {}  # id(request) -> router, worker, tokens
        first = policies[0]
        if state == "shared" and isinstance(first, KeepsSessionTable):
            for p in policies[1:]:  # one session table: the first router's, given to the others
                if isinstance(p, KeepsSessionTable):
                    p.table = first.table
        self._tables: list[SessionTable] = []
        for p in policies:
            if isinstance(p, KeepsSessionTable) and all(p.table is not u for u in self._tables):
                self._tables.append(p.table)

    def _router(self, request: RouteRequest) -> int:
        return fbi_hash(request.request_id or request.session_id or "") % len(self.policies)

    def _view(self, k: int, cluster: ClusterView) -> ClusterView:
        if self.state == "shared":
            return cluster
        if self._views is None:
            self._views = [_RouterView(cluster) for _ in self.policies]
        return self._views[k]

    def admission_max_wait_s(self) -> float | None:
        """The routers' policies' own maximum wait (they are instances of one arm's)."""
        return self.policies[0].admission_max_wait_s()

    def admission_applies(self, request: RouteRequest) -> bool:
        return self.policies[self._router(request)].admission_applies(request)

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        k = self._router(request)
        return self.policies[k].admit(request, self._view(k, cluster))

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        k = self._router(request)
        view = self._view(k, cluster)
        d = self.policies[k].select(request, view)
        if isinstance(view, _RouterView):
            view.add(d.worker, request.prompt_tokens, 1)
        self._placed[id(request)] = (k, d.worker, request.prompt_tokens)
        return d

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        k, placed_on, tokens = self._placed.pop(id(request), (self._router(request), worker, 0))
        if self._views is not None:
            self._views[k].add(placed_on, tokens, -1)
        self.policies[k].on_complete(request, worker)

    def release_session(self, session_id: str) -> bool:
        """``/finish_session`` reaches one router (local state) or the shared table."""
        k = fbi_hash("finish:" + session_id) % len(self.policies)
        return self.policies[k].release_session(session_id)

    def _each(self, fn: Callable[[Policy], Any]) -> None:
        for p in self.policies:
            fn(p)

    def on_worker_added(self, worker: str, cluster: ClusterView) -> None:
        self._each(lambda p: p.on_worker_added(worker, cluster))

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        self._each(lambda p: p.on_worker_removed(worker, cluster))

    def on_health_change(self, worker: str, healthy: bool, cluster: ClusterView) -> None:
        self._each(lambda p: p.on_health_change(worker, healthy, cluster))

    def sweep(self, now: float, limit: int | None = None) -> int:
        return sum(p.sweep(now, limit) for p in self.policies)

    def sweep_pending(self) -> bool:
        return any(p.sweep_pending() for p in self.policies)

    def session_counts(self) -> Mapping[str, int]:
        """Pins held per worker, summed over the routers' tables (a session pinned by two
        routers with local state counts twice: both hold it)."""
        out: dict[str, int] = {}
        for t in self._tables:
            for w, c in t.counts().items():
                out[w] = out.get(w, 0) + c
        return out

    def session_table_bytes(self) -> int:
        return sum(t.nbytes for t in self._tables)

    def session_stats(self) -> SessionStats:
        total = SessionStats()
        for t in self._tables:
            for key, value in t.stats.as_dict().items():
                setattr(total, key, getattr(total, key) + value)
        return total

    def worker_of(self, session_id: str) -> str | None:
        for t in self._tables:
            w = t.worker_of(session_id)
            if w is not None:
                return w
        return None


def build_fleet(
    make: Callable[[int], Policy], n: int, state: Literal["local", "shared"], clock: Clock
) -> RouterFleet:
    """A :class:`RouterFleet` of ``n`` policies ``make(0) .. make(n - 1)``, reporting the
    policies' ``name``, ``keeps_sessions``, ``places_at_max_wait`` and ``needs_content`` (the
    first instance's: a policy may set it from its options, as ``adaptive_hold``'s
    ``short_place``)."""
    policies = [make(k) for k in range(n)]
    first = type(policies[0])
    cls = type(
        f"RouterFleet_{first.__name__}",
        (RouterFleet,),
        {
            "name": first.name,
            "keeps_sessions": first.keeps_sessions,
            "places_at_max_wait": first.places_at_max_wait,
            "needs_content": policies[0].needs_content,
        },
    )
    fleet: RouterFleet = cls(policies, state, clock=clock)
    return fleet
