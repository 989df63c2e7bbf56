"""The simulated cluster: clients, router and replicas in virtual time.

:class:`Simulation` implements the workload :class:`~sessionroute.workloads.base.Host`. It
drives the same :class:`~sessionroute.router.RoutingCore` that ``sessionroute serve`` drives and
makes no routing decision of its own: a turn's request is built by ``core.requests`` (as the
live router builds it from headers and body), placed by ``core.place`` (admission, select +
reserve), and every outcome of an attempt goes to the core as the live proxy's does
(``attempt_failed``, ``attempt_answered``). A turn reaches its replica ``network_delay_s`` after
it was placed, plus the profile's path delay (``StepTimeProfile.path_delay(n)``, ``n`` the
other turns in flight when it is sent: what a request's path outside the engine adds, as
``compare --fidelity`` measures it), and its response reaches the client ``network_delay_s``
after the replica finished it. Replicas advance lazily: on an arrival at time ``t`` the replica
runs to ``t`` and takes the request; a wake-up event at its ``next_event_time()`` collects
completions.

The router side of a turn (placement, admission waits, retries, the client's re-sends) is
:class:`~sessionroute.sim.dispatch.Dispatcher`'s; this module owns the turn's life around it:
the replicas, delivery to the workload and cancellation; faults and health checks are
:class:`~sessionroute.sim.faulting.ReplicaFaults`'. A replica that goes down behaves as a
crashed server does behind the live router: its in-flight requests break (an upstream failure)
and are retried; a request sent to it is refused, which marks it unavailable at once, and the
retry places the session elsewhere. Turns are never lost, and every routed attempt is completed
at the router exactly once (finished, failed, or cancelled).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Final

from sessionroute.record import Recorder
from sessionroute.replica import ReplicaConfig, RequestResult
from sessionroute.replica.ideal import IdealCache
from sessionroute.router.core import Reservation, RoutingCore
from sessionroute.router.retry import AttemptFailure
from sessionroute.sim.coretimers import CoreTimers
from sessionroute.sim.dispatch import Dispatcher
from sessionroute.sim.events import PRIO_ARRIVAL, PRIO_TIMER, EventQueue
from sessionroute.sim.faulting import ReplicaFaults
from sessionroute.sim.inflight import (
    CANCELLED,
    DELIVER,
    DONE,
    ENGINE,
    ROUTED,
    InFlight,
)
from sessionroute.sim.replicas import SimReplica
from sessionroute.sim.spec import RouterSection
from sessionroute.sim.wakeups import ReplicaWakeups
from sessionroute.workloads.base import SessionEnd, Turn, TurnOutcome

__all__ = ["Simulation", "ideal_work_s"]

_LATE_S: Final = 300.0  # timers further ahead (rollout timeouts) go to the queue's FIFO lane


def _invoke(fn: Callable[[], None]) -> None:
    fn()


def ideal_work_s(
    b_tok_s: float, b_pa_s: float, b_kv_s: float, prompt_len: int, hit: int, output_len: int
) -> float:
    """Compute-term seconds of one request at ideal reuse: the simulator's bound on work
    (``ideal_busy_seconds``; the hit-rate bound is :class:`~sessionroute.replica.ideal.IdealCache`,
    shared with live arms).

    The compute terms of the step-time model (``shared/ENGINE.md``, the coefficients of a
    :class:`~sessionroute.replica.StepTimeProfile`) at ideal reuse: ``b_tok * (P + O) + b_pa *
    P * (H + P / 2) + b_kv * O * (L + (O - 1) / 2)`` with ``L`` prompt tokens, ``H`` ideal hit
    tokens, ``P = L - H`` and ``O`` output tokens. Summed over requests and divided evenly over
    the replicas. The per-step overhead ``b0`` and the weight-read time (which batching shares)
    are left out, so it is a lower bound. Only the simulator knows the step-time model, so a
    live arm reports None.
    """
    p = prompt_len - hit
    o = output_len
    return (
        b_tok_s * (p + o) + b_pa_s * p * (hit + p / 2.0) + b_kv_s * o * (prompt_len + (o - 1) / 2.0)
    )


class Simulation(ReplicaFaults, ReplicaWakeups):
    """The workloads' host: turns' lifecycle over the replicas, with the router side in
    :attr:`dispatch`.

    Args:
        queue: the event queue (owns the virtual clock the policy was given).
        core: routing core over a cluster whose workers are ``replicas``' urls.
        replicas: the initial replicas.
        router: router and client settings.
        recorder: where metrics go.
        url_for: url of the replica with a given index (for ``add`` faults).
        config: engine configuration of replicas added later.
        fast: engine implementation of replicas added later.
    """

    def __init__(
        self,
        queue: EventQueue,
        core: RoutingCore,
        replicas: list[SimReplica],
        router: RouterSection,
        recorder: Recorder,
        url_for: Callable[[int], str],
        config: ReplicaConfig,
        *,
        fast: bool = True,
    ) -> None:
        super().__init__(queue, replicas)
        self.core = core
        self.router = router
        self.rec = recorder
        self._url_for = url_for
        self.config = config
        self._fast = fast
        profile = config.profile
        # the step-time coefficients of ideal_work_s, read once
        self._b_tok_s = profile.b_tok_s
        self._b_pa_s = profile.b_pa_s
        self._b_kv_s = profile.b_kv_s
        self._by_url = {r.url: r for r in replicas}
        self._reqs: dict[int, InFlight] = {}
        self._handle = 0
        self._delay = router.network_delay_s
        self._profile = profile
        self._shared_host = profile.peer_busy_slowdown > 0
        self._session_start: dict[str, float] = {}
        self._last_rep: dict[str, int] = {}
        self.ended_sessions: list[str] = []
        self.ideal = IdealCache(config.block_size)
        self.prefix_resets = 0
        # hot-path copies of fixed settings and of the recorder's lists
        self._model_len = config.model_len
        self._bs = config.block_size
        self._nblocks = config.num_blocks
        self._ttft = recorder.ttft_s
        self._itl = recorder.itl_s
        self._turn_itl = recorder.turn_itl_s
        self._latency = recorder.turn_latency_s
        self._queue_s = recorder.queue_s
        # bound methods made once (scheduling ``self._deliver`` made a new one every time)
        self._deliver_cb = self._deliver
        self._arrive_cb = self._arrive
        self.dispatch = Dispatcher(queue, core, router, recorder.counts, self._send, self._bs)
        self.timers = CoreTimers(queue, core, self._probe)
        """The router core's timers on the event queue (:meth:`CoreTimers.start` starts the
        health checks and sweeps)."""

    # -- Host protocol --------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        """Tokens per KV block of the replicas."""
        return self.config.block_size

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output the replicas accept (tokens)."""
        return self.config.model_len

    def now(self) -> float:
        """Simulated time in seconds."""
        return self.queue.clock._t

    def call_at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at simulated time ``t``."""
        if type(fn) is partial and len(fn.args) == 1 and not fn.keywords:
            self.call_at_with(t, fn.func, fn.args[0])  # fn(): fn.func(arg), one call less
        else:
            self.call_at_with(t, _invoke, fn)

    def call_at_with(self, t: float, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` at simulated time ``t`` (timers over ``_LATE_S`` ahead go to the
        queue's FIFO lane)."""
        queue = self.queue
        if t - queue.clock._t > _LATE_S:
            queue.push_late(t, PRIO_TIMER, fn, arg)
        else:
            queue.push(t, PRIO_TIMER, fn, arg)

    def submit(self, turn: Turn, on_done: Callable[[TurnOutcome], None]) -> int:
        """Send a turn now; see :class:`~sessionroute.workloads.base.Host`."""
        now = self.queue.clock._t
        self._handle += 1
        handle = self._handle
        req = InFlight(handle, turn, on_done, now)
        rec = self.rec
        rec.requests_submitted += 1
        counts = rec.counts
        sid = turn.session_id
        if sid not in self._session_start:
            self._session_start[sid] = now
            counts["sessions_seen"] += 1
        plen = turn.prompt_len
        olen = turn.output_len
        total = plen + olen
        if plen < 1 or olen < 1 or total > self._model_len or -(-total // self._bs) > self._nblocks:
            counts["requests_rejected"] += 1
            req.state = DELIVER
            self._reqs[handle] = req
            req.out = TurnOutcome(turn, now, now, False, 0, -1)
            self.queue.push(now, PRIO_TIMER, self._deliver_cb, req)
            return handle
        req.hit = self.ideal.observe(req.keys, plen, olen, turn.cache_salt)
        self._reqs[handle] = req
        self.dispatch.route(req)
        return handle

    def cancel(self, handle: int) -> None:
        """Abort a turn wherever it is; its reservation is completed once; no response."""
        req = self._reqs.pop(handle, None)
        if req is None:
            return
        if req.state == ENGINE and req.rep is not None:
            rep = req.rep
            self._sync(rep)
            if req.state == ENGINE and rep.engine is not None:
                rep.engine.abort(req.rid, self.queue.clock._t)
                rep.inflight.pop(req.rid, None)
                self._complete(req)
                self._reschedule(rep)
            elif req.state == ENGINE:  # waiting on a hung replica
                rep.inflight.pop(req.rid, None)
                self._complete(req)
        else:
            self.dispatch.cancel(req)
        req.state = CANCELLED
        self.rec.counts["requests_cancelled"] += 1

    def end_session(self, session_id: str, how: SessionEnd) -> None:
        """Record the session's end and release it at the router if clients do."""
        counts = self.rec.counts
        counts["sessions_completed" if how == "completed" else "sessions_cancelled"] += 1
        start = self._session_start.pop(session_id, None)
        if start is not None:
            self.rec.session_latency_s.append(self.queue.clock._t - start)
        self._last_rep.pop(session_id, None)
        self.ended_sessions.append(session_id)
        if self.router.finish_sessions:
            self.core.finish_session(session_id)

    def reset_prefix_cache(self) -> None:
        """``reset_prefix_cache`` on every live replica (after running it to now)."""
        self.prefix_resets += 1
        for rep in self.replicas:
            if rep.engine is not None:
                self._sync(rep)
                rep.engine.reset_prefix_cache()
                self._reschedule(rep)

    def record_step(self, step: int, step_time_s: float) -> None:
        """Record an RL trainer step that ended now."""
        self.rec.step(step, self.queue.clock._t, step_time_s)

    def record_group(self, latency_s: float) -> None:
        """Record a GRPO group's latency (seconds)."""
        self.rec.group_latency_s.append(latency_s)

    def stop(self) -> None:
        """End the run after the current event."""
        self.queue.stop()

    # -- request lifecycle ----------------------------------------------------------------------
    def _send(self, req: InFlight, res: Reservation) -> None:
        """Send the attempt to ``res.worker``'s replica (it arrives ``network_delay_s`` later,
        plus the profile's path delay with the other turns in flight now)."""
        rep = self._by_url[res.worker]
        sid = req.turn.session_id
        index = rep.index
        last_rep = self._last_rep
        last = last_rep.get(sid)
        if last is None:
            last_rep[sid] = index
        elif last != index:
            self.rec.counts["session_moves"] += 1
            last_rep[sid] = index
        req.res = res
        req.rep = rep
        req.state = ROUTED
        delay = self._delay + self._profile.path_delay(len(self._reqs) - 1)
        if delay > 0:
            queue = self.queue
            queue.push(queue.clock._t + delay, PRIO_ARRIVAL, self._arrive_cb, req)
        else:
            self._arrive(req)

    def _arrive(self, req: InFlight) -> None:
        if req.state != ROUTED:
            return
        rep = req.rep
        engine = None if rep is None else rep.engine
        if rep is None or engine is None:
            if rep is not None and rep.hung:  # accepted, and never answered
                req.state = ENGINE
                rep.inflight[req.rid] = req
                return
            self.dispatch.attempt_failed(
                req, AttemptFailure.CONNECT, "connection refused (replica down)"
            )
            return
        queue = self.queue
        now = queue.clock._t
        turn = req.turn
        rid = req.rid
        results, t = engine.arrive(
            rid, turn.prompt_len, turn.output_len, req.keys, turn.cache_salt, now
        )
        for result in results:
            self._finish(rep, result)
        req.state = ENGINE
        inflight = rep.inflight
        inflight[rid] = req
        self._schedule_wake(rep, t)  # _reschedule with the engine's next event time known
        if self._shared_host and len(inflight) == 1:
            self.host_changed()

    def _complete(self, req: InFlight) -> None:
        if req.res is not None:
            self.core.complete(req.res)

    def _finish(self, rep: SimReplica, r: RequestResult) -> None:
        inflight = rep.inflight
        req: InFlight | None = inflight.get(r.request_id)
        if req is None:
            raise RuntimeError(f"replica {rep.url} finished unknown request {r.request_id!r}")
        del inflight[r.request_id]
        res = req.res
        if res is not None:  # a replica answers 200: a success of its worker, relayed
            core = self.core
            core.attempt_answered(res, 200, req.attempt)
            core.complete(res)
        d = self._delay
        sent = req.sent_s
        done = r.finish_s + d
        turn = req.turn
        prompt = r.prompt_tokens
        output = r.output_tokens
        cached = r.cached_tokens
        rec = self.rec
        rec.requests_completed += 1
        rec.prompt_tokens += prompt
        rec.output_tokens += output
        rec.cached_tokens += cached
        self._ttft.append(r.first_token_s + d - sent)
        if output > 1:
            self._itl.append(r.itl_mean_s)
            self._turn_itl.append(r.itl_mean_s)
        else:
            self._turn_itl.append(0.0)
        self._latency.append(done - sent)
        self._queue_s.append(r.queue_time_s)
        rec.ideal_work_s += ideal_work_s(
            self._b_tok_s, self._b_pa_s, self._b_kv_s, turn.prompt_len, req.hit, turn.output_len
        )
        rep.requests += 1
        rep.prompt_tokens += prompt
        rep.output_tokens += output
        req.state = DELIVER
        req.out = TurnOutcome(turn, sent, done, True, cached, rep.index)
        queue = self.queue
        now = queue.clock._t
        queue.push(done if done > now else now, PRIO_TIMER, self._deliver_cb, req)
        if self._shared_host and not inflight:
            self.host_changed()

    def _deliver(self, req: InFlight) -> None:
        if req.state != DELIVER:
            return
        req.state = DONE
        del self._reqs[req.handle]
        out = req.out
        if out is not None:
            req.on_done(out)

    # -- observation ----------------------------------------------------------------------------
    def in_flight(self) -> int:
        """Turns submitted and not yet delivered or cancelled."""
        return len(self._reqs)

    def extra(self) -> dict[str, Any]:
        """Counters of the simulation itself."""
        cluster = self.core.cluster
        admission = self.core.admission
        return {
            "prefix_cache_resets": self.prefix_resets,
            "turns_in_flight_at_end": len(self._reqs),
            "router_in_flight_at_end": sum(cluster.in_flight(w) for w in cluster.workers()),
            "admission_placed_after_wait": admission.admitted_after_wait,
            "admission_refused_timeout": admission.refused_timeout,
            "admission_refused_full": admission.refused_full,
        }
