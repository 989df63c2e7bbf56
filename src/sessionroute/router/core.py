"""The routing core: the one implementation of every router decision, for both drivers.

:class:`RoutingCore` holds a policy, the cluster (workers, their availability and router-side
load), and the router's decision helpers. ``serve`` drives it over HTTP in real time, the
simulator drives it in virtual time; neither makes a routing decision, keeps a timer or holds
a default of its own. Each event a driver feeds in is answered with an action
(:mod:`sessionroute.router.actions`: send, hold, retry after s, refuse with a status, probe,
sweep), and the core's timers are run by :meth:`RoutingCore.on_timer` at
:meth:`RoutingCore.next_deadline`:

* :attr:`RoutingCore.requests` builds the policy's request (session id, size estimate,
  content keys; :mod:`sessionroute.router.requests`);
* :meth:`RoutingCore.place` admits (:mod:`sessionroute.router.admitting`), selects and
  reserves in one synchronous step: a :class:`Reservation` (send) or a
  :class:`~sessionroute.router.admission.Ticket` (hold, placed or refused later by the core's
  timers); :meth:`RoutingCore.complete` releases exactly once;
* :meth:`~RoutingCore.attempt_failed`, :meth:`~RoutingCore.attempt_answered` and
  :meth:`~RoutingCore.next_attempt` decide retries and re-placement
  (:mod:`sessionroute.router.failures`, :mod:`sessionroute.router.retry`);
* :meth:`RoutingCore.record_success`, :meth:`~RoutingCore.record_failure`,
  :meth:`~RoutingCore.record_unreachable` and :meth:`~RoutingCore.observe_check` keep each
  worker's availability (:mod:`sessionroute.router.availability`,
  :mod:`sessionroute.router.health`);
* :meth:`RoutingCore.finish_session`, :meth:`RoutingCore.sweep` and
  :meth:`RoutingCore.sweep_chunks` end sessions;
* :meth:`RoutingCore.start`, :meth:`~RoutingCore.next_deadline` and
  :meth:`~RoutingCore.on_timer` run the core's timers (:mod:`sessionroute.router.timing`).

Build one with :func:`sessionroute.router.build.build_router`.

Every decision is counted by kind and, when :attr:`RoutingCore.log` is a list, appended to it
as ``(session_id, worker, kind)``: the parity test compares the logs of both drivers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sessionroute.clock import Clock
from sessionroute.router.actions import Timers
from sessionroute.router.admission import AdmissionQueue
from sessionroute.router.admitting import AdmissionControl
from sessionroute.router.availability import WorkerAvailability
from sessionroute.router.config import RouterConfig
from sessionroute.router.failures import AttemptOutcomes
from sessionroute.router.health import WorkerHealth
from sessionroute.router.kv.content import KvContent
from sessionroute.router.policies.base import Policy
from sessionroute.router.ratelimit import TokenBucket
from sessionroute.router.requests import RequestBuilder
from sessionroute.router.retry import RetryPolicy
from sessionroute.router.state.cluster import Cluster
from sessionroute.router.timing import CoreTiming, TimerAction
from sessionroute.types import DecisionKind, EngineGauges, RouteRequest

__all__ = ["SWEEP_CHUNK", "Reservation", "RoutingCore", "TimerAction"]

SWEEP_CHUNK = 500
"""Sessions expired per chunk of :meth:`RoutingCore.sweep_chunks` (about a millisecond of
work; ``sessionroute bench stall``)."""


@dataclass(eq=False, slots=True)
class Reservation:
    """One routed request; pass it back to :meth:`RoutingCore.complete` exactly once.

    Attributes:
        request: what was routed.
        worker: the chosen worker.
        kind: how it was chosen.
        generation: the worker's add-order index when reserved (-1 if it was unknown); a
            worker removed and added again is a new generation, so completing an old
            reservation never takes load off the new one.
        done: True once completed (a second complete is ignored).
        token: True while it holds a token of the rate limit (:attr:`RoutingCore.limiter`),
            given back when it completes.
        waited_s: seconds it waited in the admission queue before it was placed (0 when it
            was placed at once).
    """

    request: RouteRequest
    worker: str
    kind: DecisionKind
    generation: int
    done: bool = False
    token: bool = False
    waited_s: float = 0.0


class RoutingCore(AdmissionControl, WorkerAvailability, AttemptOutcomes, CoreTiming):
    """Select + reserve in one synchronous step, release exactly once, and the router's other
    decisions (module docstring).

    Args:
        policy: the routing policy.
        cluster: workers, availability and in-flight load (its workers get a health record).
        config: router settings (defaults: :class:`RouterConfig`'s).
        rng: random generator for retry jitter (``random.Random(0)`` when omitted).
        log: when a list, every decision is appended as ``(session_id, worker, kind)``.
        clock: time source of the circuit breakers (the policy's clock when omitted).
        kv_content: the servers' tokenizer and block-hash scheme for live requests' content
            (:class:`~sessionroute.router.requests.RequestBuilder`), or None.
        sweep_chunk: most sessions a sweep inside a routing call expires
            (:meth:`~sessionroute.router.policies.Policy.bound_sweeps`, set here for both
            drivers).
    """

    def __init__(
        self,
        policy: Policy,
        cluster: Cluster,
        config: RouterConfig | None = None,
        *,
        rng: random.Random | None = None,
        log: list[tuple[str | None, str, str]] | None = None,
        clock: Clock | None = None,
        kv_content: KvContent | None = None,
        sweep_chunk: int = SWEEP_CHUNK,
    ) -> None:
        self.policy = policy
        self.cluster = cluster
        self.config = config if config is not None else RouterConfig()
        self.clock = clock if clock is not None else policy.clock
        self.log = log
        self.on_decision: Callable[[Reservation], None] | None = None
        """Called with every new reservation (``serve``'s route receipts), or None."""
        self.on_circuit = None
        self.on_unreachable = None
        self.requests = RequestBuilder(
            self.config,
            needs_content=policy.needs_content,
            kv_content=kv_content,
            content_tail=policy.content_tail,
        )
        self.retry = RetryPolicy(self.config, rng if rng is not None else random.Random(0))
        self.admission = AdmissionQueue(self.config.admission_max_waiting)
        self.limiter: TokenBucket | None = None
        """vllm-router's rate limit (``RouterConfig.rate_limit_capacity``), or None."""
        if self.config.rate_limit_capacity is not None:
            cap = self.config.rate_limit_capacity
            rate = self.config.rate_limit_per_s or float(cap)
            self.limiter = TokenBucket(cap, rate, self.clock.now())
        self.health: dict[str, WorkerHealth] = {w: self._new_health(w) for w in cluster.workers()}
        self.decisions: dict[DecisionKind, int] = dict.fromkeys(DecisionKind, 0)
        """Count of decisions by kind."""
        self.timers = Timers()
        """The core's timers (:mod:`sessionroute.router.actions`); a driver sets
        ``timers.on_push`` to re-arm its one timer at :meth:`next_deadline`."""
        self._recheck_set = False
        self._sick_set = False
        # no routing call expires a whole table at once, in either driver (the periodic
        # sweep expires in chunks, :meth:`sweep_chunks`)
        policy.bound_sweeps(sweep_chunk)
        # the default hooks admit everything and keep nothing per request: not asked then
        kind = type(policy)
        self._admits_all = kind.admit is Policy.admit
        self._keeps_requests = kind.on_complete is not Policy.on_complete

    # -- placement ------------------------------------------------------------------------
    def route(self, request: RouteRequest) -> Reservation:
        """Choose a worker and reserve load on it (no admission check).

        Raises:
            NoWorkerAvailable: when no worker is available.
        """
        d = self.policy.select(request, self.cluster)
        generation = self.cluster.reserve(d.worker, request.prompt_tokens)
        self.decisions[d.kind] += 1
        if self.log is not None:
            self.log.append((request.session_id, d.worker, d.kind.value))
        if self.on_decision is not None:
            reservation = Reservation(request, d.worker, d.kind, generation)
            self.on_decision(reservation)
            return reservation
        return Reservation(request, d.worker, d.kind, generation)

    def observe_gauges(self, url: str, gauges: EngineGauges) -> None:
        """Record scraped engine gauges of ``url`` (ignored for an unknown worker) and pump
        the admission queue, whose verdicts may read them."""
        self.cluster.set_gauges(url, gauges)
        if self.admission.waiting:
            self.pump()

    def complete(self, reservation: Reservation) -> bool:
        """Release what :meth:`route` reserved; returns False if already completed."""
        if reservation.done:
            return False
        reservation.done = True
        if reservation.token and self.limiter is not None:
            reservation.token = False
            self.limiter.give_back()
        self.cluster.release(
            reservation.worker, reservation.request.prompt_tokens, reservation.generation
        )
        if self._keeps_requests:
            self.policy.on_complete(reservation.request, reservation.worker)
        if self.admission.waiting:
            self.pump()
        return True

    def retract(self, reservation: Reservation) -> None:
        """Take back a placement that a shared session table refused (another router changed
        the table since the decision; :mod:`sessionroute.router.state.shared`): release it and
        uncount its decision. The caller withdraws the pin and decides again."""
        if self.complete(reservation):
            self.decisions[reservation.kind] -= 1

    def retarget(self, reservation: Reservation) -> Reservation:
        """The reservation for the next attempt: the same one while its worker is available,
        otherwise it is completed and the request placed again (a session moves).

        Raises:
            NoWorkerAvailable: when it must move and no worker is available.
        """
        if self.cluster.is_healthy(reservation.worker):
            return reservation
        token, reservation.token = reservation.token, False  # the request keeps its token
        self.complete(reservation)
        try:
            moved = self.route(reservation.request)
        except BaseException:
            if token and self.limiter is not None:
                self.limiter.give_back()
            raise
        moved.token = token
        return moved

    # -- sessions -------------------------------------------------------------------------
    def finish_session(self, session_id: str) -> bool:
        """Release a session (idempotent), and forget where its id came from; True if the
        policy knew it."""
        self.requests.origins.pop(session_id, None)
        known = self.policy.release_session(session_id)
        if known and self.admission.waiting:
            self.pump()
        return known

    def sweep(self, now: float) -> int:
        """Expire every idle session in one call (the simulator's sweep); returns how many.
        The same work as :meth:`sweep_chunks` with no chunk limit."""
        return sum(self.sweep_chunks(now, None))

    def sweep_chunks(self, now: float, chunk: int | None = SWEEP_CHUNK) -> Iterator[int]:
        """Expire idle sessions at most ``chunk`` at a time, the oldest first; yields how
        many each chunk expired, the last one yielded being less than ``chunk``.

        A driver on an event loop (``serve``) lets other work run between chunks, so 100,000
        sessions expiring at once never block it for more than one chunk (about a
        millisecond, ``sessionroute bench stall``). Expiry may free capacity for waiting
        requests, so the admission queue is pumped after each chunk that expired any.

        Args:
            now: the clock time (seconds) the whole sweep expires against.
            chunk: sessions per chunk (>= 1); None: all in one chunk.
        """
        policy = self.policy
        while True:
            expired = policy.sweep(now, chunk)
            if expired and self.admission.waiting:
                self.pump()
            yield expired
            if chunk is None or (expired < chunk and not policy.sweep_pending()):
                return

    # -- workers --------------------------------------------------------------------------
    def add_worker(self, url: str) -> None:
        """Add an available worker (WorkerError if present)."""
        self.cluster.add(url)
        self.health[url] = self._new_health(url)
        self.policy.on_worker_added(url, self.cluster)
        self.pump()

    def remove_worker(self, url: str) -> None:
        """Remove a worker (WorkerError if unknown); its sessions re-place on their next turn.

        O(1) in the number of sessions for the session-keeping policies
        (:meth:`~sessionroute.router.state.SessionTable.displace`: their pins go stale and
        are dropped lazily), so a large worker leaves without stalling the event loop."""
        self.cluster.remove(url)
        self.health.pop(url, None)
        self.policy.on_worker_removed(url, self.cluster)
