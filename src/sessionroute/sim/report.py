"""The ``metrics`` dict of a simulation: the simulator's side of the one results builder.

:func:`build_metrics` reads a finished :class:`~sessionroute.sim.simulation.Simulation` into an
:class:`~sessionroute.record.ArmRecord` and hands it to :func:`~sessionroute.record.arm_metrics`
(``shared/WORKLOADS.md``, "What an experiment reports"). Rates are per simulated second; every
value is measured, so none is None. The simulator adds the router's own counters
(``requests_rejected``, ``requests_retried``, ``requests_failed_over``,
``no_worker_available``), ``events`` and the in-flight counts at the end.
"""

from __future__ import annotations

from typing import Any

from sessionroute.record import ArmRecord, ReplicaRecord, SessionLifecycle, arm_metrics
from sessionroute.sim.replicas import SimReplica
from sessionroute.sim.simulation import Simulation

__all__ = ["build_metrics"]

_ROUTER_COUNTERS = (
    "requests_rejected",
    "requests_retried",
    "requests_failed_over",
    "no_worker_available",
)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _replica(rep: SimReplica, t: float) -> ReplicaRecord:
    k = rep.counters()
    n = rep.samples
    return ReplicaRecord(
        index=rep.index,
        url=rep.url,
        prefix_cache_hits=k["prefix_cache_hits"],
        prefix_cache_queries=k["prefix_cache_queries"],
        preemptions=int(k["num_preemptions"]),
        busy_fraction=min(1.0, _ratio(k["busy_time_s"], t)),  # float rounding only
        busy_seconds=k["busy_time_s"],
        requests=rep.requests,
        prompt_tokens=rep.prompt_tokens,
        output_tokens=rep.output_tokens,
        mean_running=_ratio(rep.running_sum, n),
        mean_waiting=_ratio(rep.waiting_sum, n),
        kv_usage=_ratio(rep.kv_sum, n),
        extra={"engine_steps": int(k["steps"]), "up": rep.up, "drained": rep.drained},
    )


def _sessions(sim: Simulation) -> SessionLifecycle:
    """The policy's session counts; for a policy that keeps no sessions, every session seen
    counts as new and every move as a re-pin."""
    policy = sim.core.policy
    if not policy.keeps_sessions:
        c = sim.rec.counts
        return SessionLifecycle(c["sessions_seen"], c["session_moves"], 0, 0, 0, 0)
    st = policy.session_stats()
    leaked = (
        sum(1 for s in sim.ended_sessions if policy.worker_of(s) is not None)
        if sim.router.finish_sessions
        else None  # clients do not release: every session is held by design
    )
    held = sum(policy.session_counts().values())
    return SessionLifecycle(st.new, st.repinned, st.expired, st.released, leaked, held)


def _admission(sim: Simulation) -> dict[str, float]:
    """The router core's admission counters: requests placed after waiting (of them, at their
    deadline), refused, and the seconds they waited (sum)."""
    q = sim.core.admission
    return {
        "placed_after_wait": q.admitted_after_wait,
        "placed_at_deadline": q.placed_at_deadline,
        "refused_full": q.refused_full,
        "placed_when_full": q.placed_when_full,
        "refused_timeout": q.refused_timeout,
        "wait_s_total": round(q.wait_s_total, 3),
    }


def build_metrics(
    sim: Simulation,
    workload: dict[str, Any],
    wall_s: float,
    events: int = 0,
    timeseries: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Reduce a finished simulation to its metrics dict.

    Args:
        sim: the simulation, after its run.
        workload: the workload's own counters (merged under ``"workload"``).
        wall_s: wall-clock seconds the run took.
        events: events the queue ran.
        timeseries: the run's :class:`~sessionroute.sim.sampling.Sampler` rows (for the
            hit-rate dips); None: none sampled.
    """
    sim.sync_all()
    t = sim.now()
    extra = {k: v for k, v in sim.extra().items() if k != "prefix_cache_resets"}
    counts = sim.rec.counts
    record = ArmRecord(
        recorder=sim.rec,
        replicas=[_replica(rep, t) for rep in sim.replicas],
        duration_s=t,
        simulated=True,
        wall_s=wall_s,
        ideal_hit_rate=sim.ideal.hit_rate,
        block_size=sim.block_size,
        prefix_cache_resets=sim.prefix_resets,
        sessions=_sessions(sim),
        workload=workload,
        extra={
            **{name: counts[name] for name in _ROUTER_COUNTERS},
            "router_decisions": {k.value: n for k, n in sim.core.decisions.items()},
            "admission": _admission(sim),
            "policy_counters": sim.core.policy.counters(),
            "events": events,
            **extra,
        },
        timeseries=timeseries or [],
    )
    return arm_metrics(record)
