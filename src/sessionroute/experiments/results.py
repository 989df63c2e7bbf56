"""Experiment results: per-arm runs, aggregation over repeats, and the ``results.json`` document.

Schema id ``sessionroute.results/1`` (``shared/WORKLOADS.md``, "What an experiment reports"):
``{"schema", "experiment", "arms": [{"name", "policy", "policy_options", "metrics",
"intervals", "repeats"}]}``. ``metrics`` holds the mean over repeats of every numeric leaf;
``intervals`` the 95 % confidence interval (Student t) of each numeric leaf when repeats >= 2,
clipped to the metric's domain (:func:`metric_domain`: a hit rate or share stays in [0, 1],
a count or a time never goes below 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "SCHEMA_ID",
    "ArmResult",
    "RunOutput",
    "add_slo_metrics",
    "aggregate_metrics",
    "get_path",
    "mean_ci95",
    "metric_domain",
    "results_document",
    "slo_metrics",
]

SCHEMA_ID = "sessionroute.results/1"

# Two-sided 95 % Student t quantiles t_{0.975, df} for df = 1..30 (standard tables).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@dataclass(slots=True)
class RunOutput:
    """One run (one arm, one repeat).

    Attributes:
        seed: the seed used.
        metrics: JSON-serializable metrics (keys of WORKLOADS.md).
        timeseries: rows ``{"t": s, "replica": i, "busy_fraction", "running", "waiting",
            "kv_usage", "hit_rate"}`` sampled over simulated (or wall) time.
        steps: rows ``{"step": k, "t": s, "step_time_s": s}`` (RL workloads).
        samples: raw distributions for plots, e.g. ``{"ttft_s": [...],
            "session_latency_s": [...]}`` (seconds).
        turns: per answered turn of a live run with ``[live] record_turns`` (see
            :class:`~sessionroute.experiments.live.host.LiveHost`); empty otherwise. Not
            written to ``results.json``.
    """

    seed: int
    metrics: dict[str, Any]
    timeseries: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    turns: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class ArmResult:
    """All runs of one arm."""

    name: str
    policy: str
    policy_options: dict[str, Any]
    runs: list[RunOutput] = field(default_factory=list)

    @property
    def metrics(self) -> dict[str, Any]:
        """Mean over repeats of every numeric leaf (the single run's metrics when K == 1)."""
        return aggregate_metrics([r.metrics for r in self.runs])[0]

    @property
    def intervals(self) -> dict[str, Any]:
        """95 % intervals ``[lo, hi]`` per numeric leaf (empty when K < 2)."""
        return aggregate_metrics([r.metrics for r in self.runs])[1]


def mean_ci95(values: list[float]) -> tuple[float, float, float]:
    """Mean and two-sided 95 % Student-t interval of ``values``: ``(mean, lo, hi)``.

    With one value the interval is degenerate (``lo == hi == mean``).

    Raises:
        ValueError: if ``values`` is empty.
    """
    if not values:
        raise ValueError("mean_ci95 needs at least one value")
    arr = np.asarray(values, dtype=float)
    m = float(arr.mean())
    n = len(arr)
    if n < 2:
        return m, m, m
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    half = t * float(arr.std(ddof=1)) / math.sqrt(n)
    return m, m - half, m + half


_UNIT_MARKERS = ("hit_rate", "share", "fraction", "kv_usage")


def metric_domain(key: str) -> tuple[float, float]:
    """The values a metric can take, ``(lo, hi)``: [0, 1] for hit rates, shares, fractions and
    KV usage; [0, inf) for everything else ``results.json`` holds (counts, rates, seconds,
    CoVs, ratios)."""
    if key.endswith("slo_goodput"):  # a share of turns (slo_goodput_per_s is a rate)
        return 0.0, 1.0
    if key.endswith("_cov"):  # a CoV of shares (kv_usage_cov) still reaches sqrt(n - 1)
        return 0.0, math.inf
    if any(m in key for m in _UNIT_MARKERS):
        return 0.0, 1.0
    return 0.0, math.inf


def slo_metrics(
    ttft_s: Sequence[float],
    turn_itl_s: Sequence[float],
    *,
    slo_ttft_s: float,
    slo_itl_s: float,
    turns_refused: int = 0,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """The SLO goodput keys of one run.

    A turn meets the SLO when its TTFT is at most ``slo_ttft_s`` and its mean inter-token gap
    at most ``slo_itl_s`` (a one-token answer has no gap and meets the ITL part).

    Args:
        ttft_s: TTFT per finished turn (seconds).
        turn_itl_s: mean inter-token gap per finished turn, aligned with ``ttft_s``
            (:attr:`~sessionroute.record.recorder.Recorder.turn_itl_s`).
        slo_ttft_s, slo_itl_s: the SLO (seconds).
        turns_refused: turns the router or a replica refused or failed; they miss the SLO.
        duration_s: the run's length on its own clock; None: no ``slo_goodput_per_s``.

    Returns:
        ``{"slo_goodput": share of turns (finished + refused) meeting the SLO, in [0, 1]
        (None with no turn), "slo_goodput_per_s": those turns per second (None without
        ``duration_s``), "slo": {"ttft_s", "itl_s"}}``.

    Raises:
        ValueError: if the two lists differ in length.
    """
    if len(ttft_s) != len(turn_itl_s):
        raise ValueError(f"ttft_s has {len(ttft_s)} turns, turn_itl_s {len(turn_itl_s)}")
    good = 0
    if ttft_s:
        t = np.asarray(ttft_s, dtype=float)
        i = np.asarray(turn_itl_s, dtype=float)
        good = int(np.count_nonzero((t <= slo_ttft_s) & (i <= slo_itl_s)))
    turns = len(ttft_s) + turns_refused
    return {
        "slo_goodput": good / turns if turns else None,
        "slo_goodput_per_s": good / duration_s if duration_s else None,
        "slo": {"ttft_s": slo_ttft_s, "itl_s": slo_itl_s},
    }


def add_slo_metrics(run: RunOutput, slo_ttft_s: float, slo_itl_s: float) -> RunOutput:
    """Add :func:`slo_metrics` to ``run.metrics`` from its ``ttft_s`` and ``turn_itl_s``
    samples, and drop ``turn_itl_s`` (read only here). A run without those samples (a live arm
    that does not stream) gets ``slo_goodput`` None. Turns refused (``requests_rejected``,
    ``requests_failed``) count as missed. Returns ``run``."""
    ttft = run.samples.get("ttft_s")
    itl = run.samples.pop("turn_itl_s", None)
    m = run.metrics
    if ttft is None or itl is None or len(ttft) != len(itl):
        m.update(slo_goodput=None, slo_goodput_per_s=None)
        m["slo"] = {"ttft_s": slo_ttft_s, "itl_s": slo_itl_s}
        return run
    refused = sum(int(m.get(k) or 0) for k in ("requests_rejected", "requests_failed"))
    duration = m.get("simulated_seconds") or m.get("wall_seconds")
    m.update(
        slo_metrics(
            ttft,
            itl,
            slo_ttft_s=slo_ttft_s,
            slo_itl_s=slo_itl_s,
            turns_refused=refused,
            duration_s=float(duration) if duration else None,
        )
    )
    return run


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def aggregate_metrics(
    runs: Sequence[Mapping[str, Any]], parent: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Mean of numeric leaves across runs, and their 95 % intervals (K >= 2) clipped to
    :func:`metric_domain` of the leaf's key (``parent`` and the key for a nested summary, e.g.
    ``prefix_cache_hit_rate`` or ``ttft_s.p50``).

    A summary with a ``count`` is averaged over the runs where it measured something
    (``count`` > 0); ``runs_measured`` then says how many, and ``count`` is the mean over all
    runs. Lists of dicts (per-replica rows) are aggregated element-wise; other values are taken
    from the first run.
    """
    if not runs:
        return {}, {}
    first = runs[0]
    means: dict[str, Any] = {}
    cis: dict[str, Any] = {}
    for key, v in first.items():
        vals = [r.get(key) for r in runs]
        if _is_num(v) and all(_is_num(x) for x in vals):
            nums = [float(x) for x in vals]  # type: ignore[arg-type]
            if any(math.isnan(x) for x in nums):
                means[key] = float("nan")
                continue
            m, lo, hi = mean_ci95(nums)
            if all(isinstance(x, int) for x in vals) and m.is_integer():
                means[key] = int(m)  # counts and indexes stay whole: 0 preemptions, replica 2
            else:
                means[key] = m
            if len(runs) > 1:
                d_lo, d_hi = metric_domain(f"{parent}{key}")
                cis[key] = [max(lo, d_lo), min(hi, d_hi)]
        elif isinstance(v, Mapping) and all(isinstance(x, Mapping) for x in vals):
            subs: list[Mapping[str, Any]] = vals  # type: ignore[assignment]
            measured = [x for x in subs if x.get("count", 1) != 0]
            if len(measured) < len(subs):
                # A summary that measured nothing in some runs (count 0: e.g. no GRPO group
                # finished) holds no values: average only the runs that measured.
                sub_m, sub_c = aggregate_metrics(measured or subs[:1], f"{parent}{key}.")
                counts = [x.get("count", 0) for x in subs]
                sub_m["count"] = counts[0] if len(subs) == 1 else sum(counts) / len(subs)
                sub_m["runs_measured"] = len(measured)
            else:
                sub_m, sub_c = aggregate_metrics(subs, f"{parent}{key}.")
            means[key] = sub_m
            if sub_c:
                cis[key] = sub_c
        elif isinstance(v, list) and v and all(isinstance(x, Mapping) for x in v):
            lists = [x for x in vals if isinstance(x, list) and len(x) == len(v)]
            if len(lists) == len(runs):
                means[key] = [
                    aggregate_metrics([lst[i] for lst in lists], f"{parent}{key}.")[0]
                    for i in range(len(v))
                ]
            else:
                means[key] = v
        else:
            means[key] = v
    return means, cis


def get_path(d: Mapping[str, Any], path: str) -> Any:
    """``get_path(m, "ttft_s.p50")`` -> nested value or None."""
    cur: Any = d
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def results_document(experiment: Mapping[str, Any], arms: list[ArmResult]) -> dict[str, Any]:
    """The ``results.json`` document (schema ``sessionroute.results/1``)."""
    out_arms = []
    for arm in arms:
        means, cis = aggregate_metrics([r.metrics for r in arm.runs])
        out_arms.append(
            {
                "name": arm.name,
                "policy": arm.policy,
                "policy_options": arm.policy_options,
                "metrics": means,
                "intervals": cis,
                "repeats": [{"seed": r.seed, "metrics": r.metrics} for r in arm.runs],
            }
        )
    return {"schema": SCHEMA_ID, "experiment": dict(experiment), "arms": out_arms}
