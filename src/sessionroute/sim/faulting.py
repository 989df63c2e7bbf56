"""Replica faults and the router's health checks in the simulator (:class:`ReplicaFaults`, a
base of :class:`~sessionroute.sim.simulation.Simulation`).

A replica joins, crashes, hangs or comes back (:mod:`sessionroute.sim.faults` applies the
faults of an experiment file); the router learns of it as the live router does, through the
core: a crashed replica's requests break after they were sent (``attempt_failed``), a request
sent to it is refused, and the core's health checks (probed here, folded in by
``core.observe_check``) give up a hung one (``worker_lost``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sessionroute.record import Recorder
from sessionroute.replica import ReplicaConfig
from sessionroute.router.actions import WorkerLost
from sessionroute.router.core import RoutingCore
from sessionroute.router.retry import AttemptFailure, WorkerLostAction
from sessionroute.sim.dispatch import Dispatcher
from sessionroute.sim.events import PRIO_TIMER, EventQueue
from sessionroute.sim.inflight import ENGINE, ROUTED, InFlight
from sessionroute.sim.replicas import SimReplica

__all__ = ["ReplicaFaults"]


class ReplicaFaults:
    """Replica lifecycle and health checks (module docstring); the attributes it reads are
    set by :class:`~sessionroute.sim.simulation.Simulation`."""

    queue: EventQueue
    replicas: list[SimReplica]
    core: RoutingCore
    config: ReplicaConfig
    rec: Recorder
    dispatch: Dispatcher
    _by_url: dict[str, SimReplica]
    _reqs: dict[int, InFlight]
    _url_for: Callable[[int], str]
    _fast: bool

    if TYPE_CHECKING:

        def _sync(self, rep: SimReplica) -> None: ...

        def sync(self, rep: SimReplica) -> None: ...

        def _reschedule(self, rep: SimReplica) -> None: ...

        def host_changed(self) -> None: ...

    def add_replica(self) -> SimReplica:
        """A new replica with the next index joins the cluster and the router."""
        i = len(self.replicas)
        rep = SimReplica(i, self._url_for(i), self.config, fast=self._fast)
        hook = self.replicas[0].on_engine if self.replicas else None
        if hook is not None:  # the KV event feed follows new replicas too
            rep.on_engine = hook
            hook(rep, True)
        self.replicas.append(rep)
        self._by_url[rep.url] = rep
        self.core.add_worker(rep.url)
        self.host_changed()
        return rep

    def fail_replica(self, rep: SimReplica) -> None:
        """``rep`` crashes now (or a hung one is restarted): its engine and cache are lost and
        each of its in-flight requests breaks after it was sent (an upstream failure at the
        router: ``attempt_failed``, which retries it); the router learns that it is down when
        it next tries to connect (the connection is refused) or from its health checks."""
        if rep.hung:
            rep.unfreeze()
        elif rep.engine is None:
            return
        else:
            self._sync(rep)
        stranded = list(rep.inflight.values())
        rep.fail()
        if stranded:
            self.host_changed()
        for req in stranded:
            self.rec.counts["requests_failed_over"] += 1
            self.dispatch.attempt_failed(
                req, AttemptFailure.SENT, f"{rep.url}: connection reset (replica crashed)"
            )

    def hang_replica(self, rep: SimReplica) -> None:
        """``rep`` hangs now: it accepts connections and answers nothing (its engine stops),
        until its health checks fail and the router gives its requests up
        (:meth:`worker_lost`), or a fault restarts it."""
        if rep.engine is None:
            return
        self.sync(rep)
        rep.freeze()
        self.host_changed()

    # -- the router's health checks --------------------------------------------------------------
    def _probe(self, url: str) -> None:
        """One health check of ``url``: it passes on a live replica; a replica that is down
        refuses it at once; a hung one fails it when the check times out."""
        rep = self._by_url.get(url)
        if rep is not None and rep.hung:
            t = self.queue.now() + self.core.config.health_check_timeout_s
            self.queue.push(t, PRIO_TIMER, self._check_done, (url, False))
        else:
            self._check_done((url, rep is not None and rep.engine is not None))

    def _check_done(self, arg: tuple[str, bool]) -> None:
        url, ok = arg
        _, lost = self.core.observe_check(url, ok, "" if ok else "health check failed")
        if lost is not None:
            self.worker_lost(lost)

    def worker_lost(self, lost: WorkerLost) -> None:
        """A worker turned unhealthy: each request sent to it (travelling or in its engine)
        is given up there and placed again, as the core says (a simulated client reads its
        answer whole, so none has started)."""
        rep = self._by_url.get(lost.url)
        if rep is None:
            return
        core = self.core
        for req in [r for r in self._reqs.values() if r.rep is rep]:
            if req.state != ROUTED and req.state != ENGINE:
                continue
            if core.on_worker_lost(False) is not WorkerLostAction.REPLACE:
                continue  # pragma: no cover - nothing started reaching the client
            if req.state == ENGINE:
                rep.inflight.pop(req.rid, None)
                if rep.engine is not None:
                    self._sync(rep)
                    rep.engine.abort(req.rid, self.queue.clock._t)
                    self._reschedule(rep)
            self.rec.counts["requests_failed_over"] += 1
            self.dispatch.attempt_failed(
                req, AttemptFailure.HUNG, f"{rep.url}: worker unavailable: {lost.reason}"
            )
