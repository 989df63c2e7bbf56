"""The policy contract: a routing policy is a pure, synchronous state machine.

The simulator, the live router and the tests drive every policy through the same calls
(``shared/DESIGN.md``, "The policy contract"):

* :meth:`Policy.admit` may hold a request back in the router's admission queue;
* :meth:`Policy.select` picks a worker for a request and reserves whatever the policy tracks
  (a session pin, a count) in the same call;
* :meth:`Policy.on_complete` undoes per-request reservations, exactly once per select;
* :meth:`Policy.release_session` drops a session (idempotent);
* :meth:`Policy.on_worker_added`, :meth:`Policy.on_worker_removed`,
  :meth:`Policy.on_health_change` follow the worker set;
* :meth:`Policy.sweep` expires idle sessions.

Router-side load (in-flight requests and tokens) is kept by the caller's
:class:`~sessionroute.router.state.Cluster`; policies read it through a
:class:`~sessionroute.router.state.ClusterView`. Policies never read the wall clock or global
random: time comes from the injected :class:`~sessionroute.clock.Clock`, randomness from the
injected :class:`random.Random`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sessionroute.clock import Clock
from sessionroute.errors import NoWorkerAvailable
from sessionroute.router.state.cluster import ClusterView
from sessionroute.router.state.sessions import SessionInfo, SessionStats
from sessionroute.types import Decision, RouteRequest

__all__ = ["Policy", "least_loaded_of", "require_healthy"]


class Policy(ABC):
    """Base class of routing policies.

    Subclasses set ``name`` (the registry name) and may set ``Config`` (a frozen dataclass of
    options; its instance is passed as ``config``).

    Args:
        config: the policy's options (its ``Config`` dataclass), or None for defaults.
        clock: injected time source (seconds).
        rng: injected random generator, seeded by the caller.
    """

    name: ClassVar[str] = "base"
    Config: ClassVar[type[Any] | None] = None
    keeps_sessions: ClassVar[bool] = False
    """True when the policy pins sessions (so clients should call ``/finish_session``)."""
    needs_content: bool = False
    """True when ``select`` reads ``request.blocks`` (the live router then parses the body).
    May be set per instance from the policy's options (``adaptive_hold``'s ``short_place``)."""
    content_tail: ClassVar[bool] = False
    """True: a live request's ``blocks`` end with a key of the prompt's last partial content
    block (the whole text), so prompts shorter than a block, or repeated exactly, match
    (``cache_aware``; the simulator's blocks are full blocks only)."""
    reads_kv_events: ClassVar[bool] = False
    """True when the policy routes on the replicas' KV cache events (``kv_aware``): drivers then
    feed its ``index`` (``serve --kv-events``, the simulator's replica events)."""
    objective_options: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    """Options the policy runs with by default under an objective of a kind (``"rl"``,
    ``"serving"``: :attr:`sessionroute.experiments.objective.Objective.kind`), below the
    options written for it: ``compare`` and ``sweep`` apply them for the experiment's
    objective, ``serve --objective KIND`` for the traffic it serves. Empty: one setting for
    every objective."""
    places_at_max_wait: ClassVar[bool] = False
    """True: a request held longer than ``RouterConfig.admission_max_wait_s`` is placed anyway
    (the router core routes it at its deadline); False: it is refused (HTTP 503 live)."""

    admission_recheck_s: float | None = None
    """Seconds between re-evaluations of waiting tickets by time alone (the drivers call
    :meth:`sessionroute.router.RoutingCore.recheck`, in virtual time in the simulator and in
    real time in ``serve``); None when :meth:`admit` depends on no clock. May be set per
    instance from the policy's options."""

    def __init__(self, config: Any = None, *, clock: Clock, rng: random.Random) -> None:
        if config is None and self.Config is not None:
            config = self.Config()
        self.config = config
        self.clock = clock
        self.rng = rng

    @abstractmethod
    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        """Choose a healthy worker for ``request`` and reserve policy state for it.

        Raises:
            NoWorkerAvailable: when ``cluster`` has no healthy worker.
        """

    def admit(self, request: RouteRequest, cluster: ClusterView) -> bool:
        """Whether ``request`` may be placed now; False holds it in the router's admission
        queue (:mod:`sessionroute.router.admission`) until the policy admits it. Must not
        change policy state. Called for every waiting ticket whenever the queue is pumped, so
        it must be cheap. The default admits everything."""
        return True

    def first_admitted(self, requests: Sequence[RouteRequest], cluster: ClusterView) -> int | None:
        """The index of the first of ``requests`` that :meth:`admit` admits now, or None when
        it holds them all. The router core's pump asks this once per placement instead of
        :meth:`admit` once per waiting ticket. The default asks :meth:`admit` for each, in
        order; a policy whose verdict has a cheap closed form may answer faster, and must give
        the same answer. Must not change policy state."""
        for i, request in enumerate(requests):
            if self.admit(request, cluster):
                return i
        return None

    def admission_max_wait_s(self) -> float | None:
        """The longest a held request waits (seconds), or None for the router's
        ``RouterConfig.admission_max_wait_s``. Default None."""
        return None

    def admission_applies(self, request: RouteRequest) -> bool:
        """Whether ``request`` is subject to admission at all; False routes it at once, ahead
        of any held requests, without asking :meth:`admit` (e.g. the next turn of a running
        session, which a policy must never hold). Must not change policy state. Default:
        every request is."""
        return True

    def on_complete(self, request: RouteRequest, worker: str) -> None:
        """Undo what :meth:`select` reserved for this request; called exactly once."""
        return None

    def release_session(self, session_id: str) -> bool:
        """Forget ``session_id``; True if it was known. Idempotent; unknown ids are a no-op."""
        return False

    def on_worker_added(self, worker: str, cluster: ClusterView) -> None:
        """``worker`` joined the cluster (it is already in ``cluster``)."""
        return None

    def on_worker_removed(self, worker: str, cluster: ClusterView) -> None:
        """``worker`` left the cluster; its sessions are re-placed on their next turn."""
        return None

    def on_health_change(self, worker: str, healthy: bool, cluster: ClusterView) -> None:
        """``worker`` became healthy or unhealthy."""
        return None

    def sweep(self, now: float, limit: int | None = None) -> int:
        """Expire sessions idle for at least the TTL at time ``now`` (at most ``limit`` of
        them, the oldest first, when given); returns how many."""
        return 0

    def sweep_pending(self) -> bool:
        """Whether the last :meth:`sweep` with a ``limit`` left bookkeeping of the policy's
        own for another call, though it expired fewer than ``limit`` sessions (a chunked
        sweep goes on while either holds). Default: False."""
        return False

    def bound_sweeps(self, limit: int) -> None:
        """Sweeps that run inside :meth:`select` expire at most ``limit`` sessions each, the
        rest on the following calls (``serve``: one routing call never expires a whole table
        at once; its background sweep expires in chunks too,
        :meth:`sessionroute.router.RoutingCore.sweep_chunks`). A policy with bulk
        bookkeeping of its own (a removed worker's index entries) leaves it to that sweep from
        now on too (:meth:`sweep`, :meth:`sweep_pending`). The simulator calls none of this:
        its policies do all of it at once. Default: nothing to bound."""
        return None

    def session_counts(self) -> Mapping[str, int]:
        """Active sessions per worker (empty for policies without sessions)."""
        return {}

    def session_stats(self) -> SessionStats:
        """Lifecycle counters (all zero for policies without sessions)."""
        return SessionStats()

    def session_table_bytes(self) -> int:
        """Estimated bytes of the policy's session table
        (:attr:`~sessionroute.router.state.SessionTable.nbytes`; 0 without one)."""
        return 0

    def worker_of(self, session_id: str) -> str | None:
        """The worker ``session_id`` is pinned to, or None (no side effects)."""
        return None

    def session_info(self, session_id: str) -> SessionInfo | None:
        """What the policy keeps of ``session_id`` (None if unknown or no sessions kept)."""
        return None

    def counters(self) -> dict[str, Any]:
        """The policy's own counters (JSON values: numbers, strings, lists and dicts of
        them), reported as ``policy_counters`` in a simulation's results. Default: none."""
        return {}


def require_healthy(cluster: ClusterView) -> tuple[str, ...]:
    """The healthy workers of ``cluster``; raises NoWorkerAvailable when there are none."""
    healthy = cluster.healthy()
    if not healthy:
        raise NoWorkerAvailable("no healthy worker available")
    return healthy


def least_loaded_of(candidates: Sequence[str], cluster: ClusterView, tiebreak: str) -> str:
    """The candidate with the fewest in-flight requests; ties by rendezvous on ``tiebreak``.

    Rendezvous hashing (``fbi_hash("<tiebreak>:<worker>")``, highest wins) makes ties
    deterministic without favouring the first worker in the list.
    """
    from sessionroute.router.policies.hashing import rendezvous_score

    best_load = min(cluster.in_flight(w) for w in candidates)
    tied = [w for w in candidates if cluster.in_flight(w) == best_load]
    if len(tied) == 1:
        return tied[0]
    return max(tied, key=lambda w: rendezvous_score(tiebreak, w))
