"""The ``metrics`` dict of a simulation (``shared/WORKLOADS.md``, "What an experiment reports").

Every value is a plain int, float, str, list or dict (JSON-serializable, no NaN). Rates are per
simulated second. Latency summaries are ``{p50, p90, p99, max, mean, count}`` in seconds.
"""

from __future__ import annotations

from typing import Any

from sessionroute.sim.metrics import cov, summary
from sessionroute.sim.simulation import Simulation

__all__ = ["build_metrics"]


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def build_metrics(
    sim: Simulation, workload: dict[str, Any], wall_s: float, events: int = 0
) -> dict[str, Any]:
    """Reduce a finished simulation to its metrics dict.

    Args:
        sim: the simulation, after its run.
        workload: the workload's own counters (merged under ``"workload"``).
        wall_s: wall-clock seconds the run took.
        events: events the queue ran.
    """
    sim.sync_all()
    rec = sim.rec
    c = rec.all_counts()
    t = sim.now()
    per: list[dict[str, Any]] = []
    busy: list[float] = []
    hits = queries = preempt = 0.0
    for rep in sim.replicas:
        k = rep.counters()
        hits += k["prefix_cache_hits"]
        queries += k["prefix_cache_queries"]
        preempt += k["num_preemptions"]
        busy.append(k["busy_time_s"])
        n = rep.samples
        per.append(
            {
                "replica": rep.index,
                "url": rep.url,
                "busy_fraction": _ratio(k["busy_time_s"], t),
                "busy_seconds": k["busy_time_s"],
                "requests": rep.requests,
                "prompt_tokens": rep.prompt_tokens,
                "output_tokens": rep.output_tokens,
                "mean_running": _ratio(rep.running_sum, n),
                "mean_waiting": _ratio(rep.waiting_sum, n),
                "kv_usage": _ratio(rep.kv_sum, n),
                "hit_rate": _ratio(k["prefix_cache_hits"], k["prefix_cache_queries"]),
                "preemptions": int(k["num_preemptions"]),
                "engine_steps": int(k["steps"]),
                "up": rep.up,
                "drained": rep.drained,
            }
        )
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    policy = sim.core.policy
    if policy.keeps_sessions:
        st = policy.session_stats()
        new, repinned, expired, released = st.new, st.repinned, st.expired, st.released
        leaked = sum(1 for s in sim.ended_sessions if policy.worker_of(s) is not None)
        held = sum(policy.session_counts().values())
    else:
        new, repinned = c["sessions_seen"], c["session_moves"]
        expired = released = leaked = held = 0
    n_replicas = max(1, len(sim.replicas))
    requests = c["requests_completed"]
    return {
        "sessions_completed": c["sessions_completed"],
        "sessions_cancelled": c["sessions_cancelled"],
        "sessions_per_s": _ratio(c["sessions_completed"], t),
        "output_tokens_per_s": _ratio(c["output_tokens"], t),
        "prompt_tokens_per_s": _ratio(c["prompt_tokens"], t),
        "prefix_cache_hit_rate": _ratio(hits, queries),
        "preemptions": int(preempt),
        "ttft_s": summary(rec.ttft_s),
        "itl_s": summary(rec.itl_s),
        "turn_latency_s": summary(rec.turn_latency_s),
        "queue_time_s": summary(rec.queue_s),
        "session_latency_s": summary(rec.session_latency_s),
        "steps": len(rec.steps),
        "step_time_s": summary([float(s["step_time_s"]) for s in rec.steps]),
        "group_latency_s": summary(rec.group_latency_s),
        "per_replica": per,
        "load_imbalance_cov": cov(busy),
        "max_over_mean_busy": _ratio(max(busy, default=0.0), mean_busy),
        "sessions_new": new,
        "sessions_repinned": repinned,
        "sessions_expired": expired,
        "sessions_released": released,
        "sessions_leaked": leaked,
        "sessions_held_at_end": held,
        "session_moves": c["session_moves"],
        "requests_submitted": c["requests_submitted"],
        "requests_completed": requests,
        "requests_cancelled": c["requests_cancelled"],
        "requests_rejected": c["requests_rejected"],
        "requests_retried": c["requests_retried"],
        "requests_failed_over": c["requests_failed_over"],
        "no_worker_available": c["no_worker_available"],
        "prompt_tokens": c["prompt_tokens"],
        "output_tokens": c["output_tokens"],
        "cached_tokens": c["cached_tokens"],
        "wall_seconds": wall_s,
        "simulated_seconds": t,
        "requests_per_wall_second": _ratio(requests, wall_s),
        "events": events,
        "ideal_hit_rate": sim.ideal.hit_rate,
        "ideal_busy_seconds": rec.ideal_work_s / n_replicas,
        "block_size": sim.block_size,
        "replicas": len(sim.replicas),
        **sim.extra(),
        "workload": workload,
    }
