"""What the clients of one arm saw (``shared/WORKLOADS.md``, "What an experiment reports").

:class:`Recorder` collects per-request, per-session, per-group and per-step values as the run
goes; the simulator and the live host fill the same class. :func:`summary` reduces a list of
seconds to ``{p50, p90, p99, max, mean, count}`` (numpy's linear interpolation; zeros for an
empty list) and :func:`cov` gives a coefficient of variation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Recorder", "cov", "summary"]


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """``{"p50", "p90", "p99", "max", "mean", "count"}`` of ``values``; with no values every
    statistic is None (``null`` in results.json, ``-`` in tables) and ``count`` 0: nothing was
    measured, which is not a latency of 0 s."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None, "count": 0}
    arr = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99]).tolist()
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
        "count": len(values),
    }


def cov(values: Sequence[float]) -> float:
    """Coefficient of variation (population std / mean); 0.0 for an empty or all-zero list."""
    if not values:
        return 0.0
    arr = np.asarray(values, dtype=np.float64)
    m = float(arr.mean())
    return float(arr.std()) / m if m > 0 else 0.0


class Recorder:
    """Per-request, per-session and per-step records of one run (seconds, tokens).

    Seconds are those of the run's clock: simulated, emulated (a live run against emulated
    replicas) or wall seconds (real servers). A driver that cannot measure a distribution leaves
    its list empty and says so to the results builder
    (:attr:`sessionroute.record.build.ArmRecord.unmeasured`).

    Attributes:
        ttft_s: client-side time to first token per finished request.
        itl_s: mean inter-token gap per finished request with more than one output token.
        turn_itl_s: mean inter-token gap per request of :attr:`ttft_s`, aligned with it (entry
            ``i`` is the same request), 0.0 for a request with one output token (it has no gap):
            with :attr:`ttft_s`, what the SLO goodput reads
            (:func:`sessionroute.experiments.results.slo_metrics`).
        turn_latency_s: request sent to last token received, per finished request.
        queue_s: engine queue time per finished request (simulator only).
        session_latency_s: first turn sent to session end, per ended session.
        group_latency_s: GRPO group admission to its slowest rollout's end.
        steps: rows ``{"step", "t", "step_time_s", "output_tokens", "sessions_cancelled"}``,
            the last two cumulative at the step's end (per-step history: throughput and
            cancelled rollouts over time).
        requests_submitted, requests_completed, prompt_tokens, output_tokens, cached_tokens:
            the per-request counters (plain int fields: a named entry of ``counts`` costs two
            dict lookups per update).
        counts: the other named counters; :meth:`all_counts` has every counter. Both drivers:
            ``requests_cancelled``, ``sessions_completed``, ``sessions_cancelled``,
            ``sessions_seen``, ``session_moves`` (a session's turn served by another replica
            than its previous turn; live only when placements are recorded). The simulator's
            router: ``requests_rejected`` (larger than the replicas' context or cache),
            ``requests_retried``, ``requests_failed_over``, ``no_worker_available``. The live
            host: ``requests_failed`` (the turn's HTTP exchange failed or timed out).
        ideal_work_s: compute seconds at ideal reuse, summed (simulator only; see
            :func:`sessionroute.sim.simulation.ideal_work_s`).
    """

    def __init__(self) -> None:
        self.ttft_s: list[float] = []
        self.itl_s: list[float] = []
        self.turn_itl_s: list[float] = []
        self.turn_latency_s: list[float] = []
        self.queue_s: list[float] = []
        self.session_latency_s: list[float] = []
        self.group_latency_s: list[float] = []
        self.steps: list[dict[str, Any]] = []
        self.requests_submitted = 0
        self.requests_completed = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "requests_cancelled",
                "requests_rejected",
                "requests_retried",
                "requests_failed_over",
                "sessions_completed",
                "sessions_cancelled",
                "session_moves",
                "sessions_seen",
                "no_worker_available",
                "requests_failed",
            ),
            0,
        )
        self.ideal_work_s = 0.0

    def request_done(
        self,
        ttft: float,
        itl: float,
        output_tokens: int,
        latency: float,
        queue: float,
        prompt_tokens: int,
        cached_tokens: int,
    ) -> None:
        """Record one finished request (client-side latencies in seconds)."""
        self.requests_completed += 1
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        self.cached_tokens += cached_tokens
        self.ttft_s.append(ttft)
        self.turn_itl_s.append(itl if output_tokens > 1 else 0.0)
        if output_tokens > 1:
            self.itl_s.append(itl)
        self.turn_latency_s.append(latency)
        self.queue_s.append(queue)

    def all_counts(self) -> dict[str, int]:
        """Every counter by name: the per-request fields and :attr:`counts`."""
        c = self.counts
        return {
            "requests_submitted": self.requests_submitted,
            "requests_completed": self.requests_completed,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            **c,
        }

    def step(self, step: int, t: float, step_time_s: float) -> None:
        """Record an RL trainer step ending at ``t`` (with the cumulative counters then)."""
        self.steps.append(
            {
                "step": step,
                "t": t,
                "step_time_s": step_time_s,
                "output_tokens": self.output_tokens,
                "sessions_cancelled": self.counts["sessions_cancelled"],
            }
        )

    def samples(self) -> dict[str, list[float]]:
        """Raw distributions for plots (seconds)."""
        return {
            "ttft_s": list(self.ttft_s),
            "itl_s": list(self.itl_s),
            "turn_itl_s": list(self.turn_itl_s),
            "turn_latency_s": list(self.turn_latency_s),
            "session_latency_s": list(self.session_latency_s),
            "group_latency_s": list(self.group_latency_s),
            "step_time_s": [float(s["step_time_s"]) for s in self.steps],
        }
