"""The one results builder: an arm's record -> its ``metrics`` dict (``results.json``).

``shared/WORKLOADS.md`` ("What an experiment reports") lists the keys. The simulator
(:func:`sessionroute.sim.report.build_metrics`) and the live runner
(:func:`sessionroute.experiments.live.metrics.build_live_metrics`) each fill one
:class:`ArmRecord` and call :func:`arm_metrics`, so both kinds of arm compute every shared key
the same way. Every value is a plain int, float, str, list, dict or None (JSON-serializable, no
NaN). Rates are per second of the run's clock (simulated, emulated or wall seconds). Latency
summaries are :func:`~sessionroute.record.recorder.summary` dicts in seconds. None means the
arm could not measure the value (a live arm without streaming has no TTFT, for example), an
empty summary (``count`` 0) that it measured nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sessionroute.record.balance import cov_of, hit_dips
from sessionroute.record.recorder import Recorder, summary

__all__ = ["ArmRecord", "ReplicaRecord", "SessionLifecycle", "arm_metrics"]


@dataclass(slots=True)
class ReplicaRecord:
    """What one replica did over an arm, from its engine's counters and gauges.

    Attributes:
        index: position in the fleet (0-based).
        url: the worker id the router knows it by.
        prefix_cache_hits: prefix-cache hit tokens over the arm.
        prefix_cache_queries: prefix-cache queried tokens over the arm.
        preemptions: preemptions over the arm.
        busy_fraction: fraction of the arm's time it was running a request (live: the fraction
            of ``/metrics`` scrapes that saw one running); None without a measure.
        busy_seconds: seconds it was running a request, where measured exactly (simulator);
            None otherwise.
        requests: finished requests (None: the replica does not report it).
        prompt_tokens: prompt tokens of its finished requests (None: not reported).
        output_tokens: output tokens of its finished requests (None: not reported).
        mean_running: mean running requests over the samples (None: no samples).
        mean_waiting: mean waiting requests over the samples (None: no samples).
        kv_usage: mean KV-cache usage (0..1) over the samples (None: no samples).
        extra: the driver's own per-replica keys, appended as they are.
    """

    index: int
    url: str
    prefix_cache_hits: float
    prefix_cache_queries: float
    preemptions: int
    busy_fraction: float | None
    busy_seconds: float | None = None
    requests: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    mean_running: float | None = None
    mean_waiting: float | None = None
    kv_usage: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionLifecycle:
    """The router's session counts over an arm (``sessions_*`` keys).

    Attributes:
        new: sessions placed for the first time.
        repinned: sessions moved to another replica after their first placement.
        expired: sessions dropped by the router's TTL.
        released: sessions released by their client (``/finish_session``).
        leaked: sessions still held at the end that should have been released; None when
            clients do not release sessions (``[router] finish_sessions = false``): then
            every session is held until its TTL by design.
        held_at_end: sessions the router still held at the end.
    """

    new: int
    repinned: int | None
    expired: int
    released: int
    leaked: int | None
    held_at_end: int


@dataclass(slots=True)
class ArmRecord:
    """Everything one finished arm recorded, in the shape :func:`arm_metrics` reads.

    Attributes:
        recorder: what the clients saw (latencies, counters, RL steps).
        replicas: one record per replica, in index order.
        duration_s: length of the run on its own clock (seconds).
        simulated: whether that clock is simulated or emulated (then it is reported as
            ``simulated_seconds``; otherwise ``simulated_seconds`` is None).
        wall_s: wall-clock seconds the run took.
        ideal_hit_rate: the ideal hit rate of the arm's requests
            (:class:`~sessionroute.replica.ideal.IdealCache`).
        block_size: tokens per KV block of the replicas.
        prefix_cache_resets: prefix-cache resets the workload asked for.
        sessions: the router's session counts; None when the router does not report them.
        workload: the workload's own counters (reported under ``"workload"``).
        unmeasured: metric keys the driver cannot measure (reported as None), e.g.
            ``queue_time_s`` or ``ideal_busy_seconds`` for a live arm.
        extra: the driver's own top-level keys, appended as they are.
        timeseries: per-replica sample rows with ``hit_rate``, ``prefix_cache_queries`` and
            ``interval_s`` (:func:`~sessionroute.record.balance.hit_dips`); empty when the
            driver samples no hit rates (then the thrash keys are None).
    """

    recorder: Recorder
    replicas: list[ReplicaRecord]
    duration_s: float
    simulated: bool
    wall_s: float
    ideal_hit_rate: float
    block_size: int
    prefix_cache_resets: int
    sessions: SessionLifecycle | None
    workload: dict[str, Any]
    unmeasured: frozenset[str] = frozenset()
    extra: dict[str, Any] = field(default_factory=dict)
    timeseries: list[dict[str, Any]] = field(default_factory=list)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _replica_metrics(r: ReplicaRecord) -> dict[str, Any]:
    return {
        "replica": r.index,
        "url": r.url,
        "busy_fraction": r.busy_fraction,
        "busy_seconds": r.busy_seconds,
        "requests": r.requests,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "mean_running": r.mean_running,
        "mean_waiting": r.mean_waiting,
        "kv_usage": r.kv_usage,
        "hit_rate": _ratio(r.prefix_cache_hits, r.prefix_cache_queries),
        "preemptions": r.preemptions,
        **r.extra,
    }


def _busy(replicas: list[ReplicaRecord]) -> list[float]:
    """The busy measure the imbalance keys use: every replica's busy seconds where each has
    them, else the busy fractions that were measured."""
    seconds = [r.busy_seconds for r in replicas]
    if replicas and all(s is not None for s in seconds):
        return [s for s in seconds if s is not None]
    return [r.busy_fraction for r in replicas if r.busy_fraction is not None]


def _timeouts(workload: dict[str, Any]) -> tuple[int | None, float | None]:
    """``(rollouts timed out, their share of rollouts started)`` from an RL workload's
    counters; None for a workload without rollout timeouts."""
    n = workload.get("rollouts_timeout")
    if not isinstance(n, int):
        return None, None
    started = workload.get("rollouts_started")
    return n, _ratio(n, started) if isinstance(started, int) else None


def _balance(arm: ArmRecord) -> dict[str, Any]:
    """The balance and thrash keys (:mod:`sessionroute.record.balance`)."""
    reps = arm.replicas
    rates = [_ratio(r.prefix_cache_hits, r.prefix_cache_queries) for r in reps]
    judged = [h for h, r in zip(rates, reps, strict=True) if r.prefix_cache_queries > 0]
    dips = hit_dips(arm.timeseries) if arm.timeseries else None
    return {
        "running_cov": cov_of([r.mean_running for r in reps]),
        "output_tokens_cov": cov_of([r.output_tokens for r in reps]),
        "kv_usage_cov": cov_of([r.kv_usage for r in reps]),
        "worst_replica_hit_rate": min(judged) if judged else None,
        "worst_window_hit_rate": dips.worst_window_hit_rate if dips else None,
        "thrash_replica_seconds": dips.thrash_replica_seconds if dips else None,
        "thrash_share": dips.thrash_share if dips else None,
    }


def arm_metrics(arm: ArmRecord) -> dict[str, Any]:
    """The ``metrics`` dict of one arm (see the module docstring for units and None).

    ``load_imbalance_cov`` and ``max_over_mean_busy`` are over busy seconds when every replica
    has them, else over the measured busy fractions (the same ratios when both exist), and None
    when no replica has a busy measure; they saturate under load (every replica busy all the
    time), so the table shows ``running_cov``, ``output_tokens_cov`` and ``kv_usage_cov``
    instead (CoV over replicas of their mean running requests, output tokens and mean KV
    usage; None when a replica does not report it). ``worst_replica_hit_rate`` is the lowest
    per-replica hit rate over the run, ``worst_window_hit_rate`` the lowest in any sample
    interval, ``thrash_replica_seconds`` / ``thrash_share`` the replica-seconds (and their
    share) below half the fleet's hit rate (:func:`~sessionroute.record.balance.hit_dips`).
    ``rollouts_timed_out`` and ``rollouts_timed_out_share`` (of rollouts started) come from an
    RL workload's ``rollouts_timeout`` counter (None for other workloads).
    ``ideal_busy_seconds`` is the recorder's ``ideal_work_s`` divided evenly over the replicas.
    """
    rec = arm.recorder
    c = rec.all_counts()
    t = arm.duration_s
    hits = queries = 0.0
    preemptions = 0
    for r in arm.replicas:
        hits += r.prefix_cache_hits
        queries += r.prefix_cache_queries
        preemptions += r.preemptions
    busy = _busy(arm.replicas)
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    s = arm.sessions
    requests = c["requests_completed"]
    timed_out, timed_out_share = _timeouts(arm.workload)
    out: dict[str, Any] = {
        "sessions_completed": c["sessions_completed"],
        "sessions_cancelled": c["sessions_cancelled"],
        "sessions_per_s": _ratio(c["sessions_completed"], t),
        "output_tokens_per_s": _ratio(c["output_tokens"], t),
        "prompt_tokens_per_s": _ratio(c["prompt_tokens"], t),
        "prefix_cache_hit_rate": _ratio(hits, queries),
        "preemptions": preemptions,
        "ttft_s": summary(rec.ttft_s),
        "itl_s": summary(rec.itl_s),
        "turn_latency_s": summary(rec.turn_latency_s),
        "queue_time_s": summary(rec.queue_s),
        "session_latency_s": summary(rec.session_latency_s),
        "steps": len(rec.steps),
        "step_time_s": summary([float(x["step_time_s"]) for x in rec.steps]),
        "group_latency_s": summary(rec.group_latency_s),
        "rollouts_timed_out": timed_out,
        "rollouts_timed_out_share": timed_out_share,
        "per_replica": [_replica_metrics(r) for r in arm.replicas],
        **_balance(arm),
        "load_imbalance_cov": cov_of(busy),
        "max_over_mean_busy": _ratio(max(busy), mean_busy) if busy else None,
        "sessions_new": s.new if s is not None else None,
        "sessions_repinned": s.repinned if s is not None else None,
        "sessions_expired": s.expired if s is not None else None,
        "sessions_released": s.released if s is not None else None,
        "sessions_leaked": s.leaked if s is not None else None,
        "sessions_held_at_end": s.held_at_end if s is not None else None,
        "session_moves": c["session_moves"],
        "requests_submitted": c["requests_submitted"],
        "requests_completed": requests,
        "requests_cancelled": c["requests_cancelled"],
        "prompt_tokens": c["prompt_tokens"],
        "output_tokens": c["output_tokens"],
        "cached_tokens": c["cached_tokens"],
        "wall_seconds": arm.wall_s,
        "simulated_seconds": t if arm.simulated else None,
        "requests_per_wall_second": _ratio(requests, arm.wall_s),
        "ideal_hit_rate": arm.ideal_hit_rate,
        "ideal_busy_seconds": rec.ideal_work_s / max(1, len(arm.replicas)),
        "block_size": arm.block_size,
        "replicas": len(arm.replicas),
        "prefix_cache_resets": arm.prefix_cache_resets,
    }
    for key in arm.unmeasured:
        if key not in out:
            raise ValueError(f"unmeasured names no metric: {key!r}")
        out[key] = None
    out.update(arm.extra)
    out["workload"] = arm.workload
    return out
