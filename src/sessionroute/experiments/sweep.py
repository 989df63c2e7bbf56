"""``sessionroute sweep``: one load knob x policies x seeds, and where the policies part ways.

A sweep is one experiment whose arms are ``policy @ knob value``: each arm overrides the knob's
setting (declared in ``allow_differences``), so the runner's matching check still refuses any
other difference, and every arm of every point runs the same seeds. The result per point and
policy is the mean and 95 % interval over seeds (:func:`~sessionroute.experiments.results.
mean_ci95`) of :data:`SWEEP_METRICS`.

Each point gets a verdict on the experiment's objective (:mod:`~sessionroute.experiments.
verdict`: the best policy among those meeting the constraints, those within noise, the Pareto
front and each policy's cost).

The knee comes from the objective too: the first point, in order of increasing load, at which
no policy meets the constraints, or the best policy's objective falls below
:data:`KNEE_EFFICIENCY` of its value at the lightest point, per unit of load for an objective
that is a rate of work (tokens or turns per second, or steps per second: the inverse of an RL
step time), as it is: past it, more load no longer buys the objective in proportion (the fleet
saturates, caches thrash, rollouts queue). Load is the knob's value for ``inflight`` and
``concurrency`` and its inverse for ``time-scale`` (arrivals come faster). ``replicas``
changes the capacity, not the work offered, so the objective should hold, not scale: its
knee is the first replica count, going down, at which the best policy's objective falls below
:data:`KNEE_EFFICIENCY` of its value at the most replicas (the fleet became the bottleneck).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.experiments.objective import Objective
from sessionroute.experiments.results import (
    ArmResult,
    RunOutput,
    mean_ci95,
    metric_domain,
)
from sessionroute.experiments.spec import ExperimentSpec, ResolvedArm, parse_experiment
from sessionroute.experiments.sweep_verdict import (
    KNEE_EFFICIENCY,
    objective_knee,
    value_label,
    verdict_line,
)
from sessionroute.experiments.table import shown_value
from sessionroute.experiments.verdict import ArmRuns, Verdict, judge

__all__ = [
    "KNEE_EFFICIENCY",
    "KNOBS",
    "SWEEP_METRICS",
    "Knob",
    "SweepPoint",
    "SweepResult",
    "light_simulate_arm",
    "summarize",
    "sweep_experiment",
    "value_label",
    "write_sweep",
]

THROUGHPUT = Objective("output_tokens_per_s", +1, origin="throughput")
"""The objective of :func:`summarize` when none is given (the sweep's rule before objectives)."""


@dataclass(frozen=True, slots=True)
class Knob:
    """A setting a sweep varies.

    Attributes:
        name: the ``--knob`` name.
        section: the experiment section holding it.
        key: its key there (under ``options`` for a workload option).
        label: axis label.
        inverse_load: a larger value means less load (more replicas, slower arrivals).
        offers_load: the knob changes the work offered (throughput should grow with it), not
            the capacity serving it (``replicas``: throughput should hold).
        kinds: workload kinds it applies to (empty: any).
        cast: int or float.
        default_values: the values swept when ``--values`` is not given (the default
            workload's knob, or a generic range).
    """

    name: str
    section: str
    key: str
    label: str
    inverse_load: bool
    kinds: tuple[str, ...]
    cast: type
    default_values: tuple[float, ...]
    offers_load: bool = True

    @property
    def path(self) -> str:
        """The dotted setting (``allow_differences`` form)."""
        if self.section == "workload" and self.key != "steps":
            return f"workload.options.{self.key}"
        return f"{self.section}.{self.key}"

    def load(self, value: float) -> float:
        """Load at ``value`` (larger is heavier)."""
        return 1.0 / value if self.inverse_load else value


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "inflight",
            "workload",
            "inflight_rollouts",
            "rollouts in flight",
            False,
            ("swe-rl",),
            int,
            (448, 544, 608, 672),
        ),
        Knob(
            "concurrency",
            "workload",
            "concurrency",
            "sessions in progress (trace concurrency)",
            False,
            ("trace:weka",),
            int,
            (32, 64, 96, 128),
        ),
        Knob("replicas", "replicas", "count", "replicas", True, (), int, (2, 3, 4, 6), False),
        Knob(
            "time-scale",
            "workload",
            "time_scale",
            "arrival time scale (x recorded times)",
            True,
            ("trace:mooncake",),
            float,
            (0.25, 0.5, 1.0, 2.0),
        ),
    )
}

SWEEP_METRICS: tuple[tuple[str, str], ...] = (
    ("output_tokens_per_s", "output tok/s"),
    ("step_time_s.mean", "RL step time mean (s)"),
    ("step_time_s.p50", "RL step time p50 (s)"),
    ("step_time_s.max", "RL step time max (s)"),
    ("rollouts_timed_out_share", "rollouts timed out (share)"),
    ("group_latency_s.p90", "group latency p90 (s)"),
    ("slo_goodput", "SLO goodput"),
    ("prefix_cache_hit_rate", "prefix-cache hit rate"),
    ("worst_window_hit_rate", "worst replica 10 s hit rate"),
    ("thrash_share", "thrash share"),
    ("ttft_s.p99", "TTFT p99 (s)"),
)


def _knob_kind_ok(knob: Knob, kind: str) -> bool:
    """Whether ``knob`` applies to workload ``kind`` (a trace path counts as the kind it
    replays)."""
    from sessionroute.workloads.registry import canonical_kind

    return not knob.kinds or canonical_kind(kind) in knob.kinds


def sweep_experiment(
    base: dict[str, Any],
    knob: Knob,
    values: Sequence[float],
    policies: Sequence[str | dict[str, Any]],
    seeds: int,
) -> ExperimentSpec:
    """The experiment of a sweep: one arm per policy and value, ``seeds`` repeats each.

    Args:
        base: an experiment as a dict (its arms are replaced).
        knob: what to vary.
        values: the knob's values (at least 2, distinct).
        policies: registry names, or arms (``{"policy", "policy_options"}`` and an optional
            ``"name"``, at least 1); each arm is named ``<name>@<value>`` (the name defaults
            to the policy's), so a name appears once: one policy may run with several option
            settings under different names.
        seeds: repeats per arm (>= 1).

    Raises:
        ConfigError: for a knob that does not apply to the workload, too few or repeated
            values, or what validating the experiment raises.
    """
    kind = str(base.get("workload", {}).get("kind", ""))
    if not _knob_kind_ok(knob, kind):
        raise ConfigError(
            f"knob {knob.name!r} applies to workloads {', '.join(knob.kinds)}; this "
            f"experiment's workload is {kind!r}"
        )
    if len(values) < 2 or len(set(values)) != len(values):
        raise ConfigError(f"a sweep needs at least 2 distinct values, got {list(values)}")
    if not policies:
        raise ConfigError("a sweep needs at least one policy")
    chosen: list[dict[str, Any]] = [p if isinstance(p, dict) else {"policy": p} for p in policies]
    names = [str(p.get("name") or p["policy"]) for p in chosen]
    if len(set(names)) != len(names):
        raise ConfigError(f"a sweep runs each policy once, got {names}")
    arms = []
    for v in values:
        value = knob.cast(v)
        if knob.section == "workload":
            override: dict[str, Any] = {"workload": {"options": {knob.key: value}}}
        else:
            override = {knob.section: {knob.key: value}}
        for name, p in zip(names, chosen, strict=True):
            arms.append(
                {
                    "name": f"{name}@{value}",
                    "policy": p["policy"],
                    "policy_options": dict(p.get("policy_options") or {}),
                    "overrides": override,
                }
            )
    data = dict(base)
    data["arms"] = arms
    data["allow_differences"] = sorted({*data.get("allow_differences", []), knob.path})
    data["run"] = {**data.get("run", {}), "repeats": seeds}
    data["name"] = f"sweep-{knob.name}-{data.get('name', 'experiment')}"
    return parse_experiment(data, source="<sweep>")


def light_simulate_arm(arm: ResolvedArm, seed: int, progress: Callable[[float], None]) -> RunOutput:
    """Simulate one arm, keeping its metrics and RL steps (a sweep needs no time series or
    raw samples, which would otherwise travel back from every worker process)."""
    from sessionroute.experiments.sim_arm import simulate_arm

    out = simulate_arm(arm, seed, progress)
    out.metrics.pop("per_replica", None)
    # only what the SLO goodput reads (run_experiment counts it, then drops turn_itl_s)
    samples: dict[str, list[float]] = {
        k: out.samples[k] for k in ("ttft_s", "turn_itl_s") if k in out.samples
    }
    return RunOutput(seed=out.seed, metrics=out.metrics, steps=out.steps, samples=samples)


@dataclass(slots=True)
class SweepPoint:
    """One policy at one knob value: ``{metric: (mean, lo, hi)}`` over seeds."""

    policy: str
    value: float
    stats: dict[str, tuple[float, float, float]]
    seeds: int


@dataclass(slots=True)
class SweepResult:
    """A summarized sweep.

    Attributes:
        knob: what was varied.
        values: its values, in sweep order.
        policies: the policies, in arm order.
        points: one per policy and value.
        knee: the value at the knee (None: the objective kept up over the whole range).
        verdicts: one actionable line per value.
        runs: every run's flat row (the CSV).
        objective: what the verdicts and the knee judge on.
        judgements: the verdict of each value, in :attr:`values` order.
        settings: the settings the arms of each value ran with, in :attr:`values` order
            (``sweep.json`` records them, so that ``--merge`` can check a later sweep ran the
            same experiment; empty when not known).
    """

    knob: Knob
    values: list[float]
    policies: list[str]
    points: list[SweepPoint]
    knee: float | None
    verdicts: list[str]
    runs: list[dict[str, Any]]
    objective: Objective = THROUGHPUT
    judgements: list[Verdict] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)

    def point(self, policy: str, value: float) -> SweepPoint:
        """The point of ``policy`` at ``value``."""
        for p in self.points:
            if p.policy == policy and p.value == value:
                return p
        raise KeyError((policy, value))


def summarize(
    knob: Knob,
    results: list[ArmResult],
    arms: list[ResolvedArm],
    objective: Objective = THROUGHPUT,
) -> SweepResult:
    """Means, intervals, the knee and the verdicts of a finished sweep, on ``objective`` (the
    experiment's: :meth:`ExperimentSpec.resolved_objective`); each run's row holds
    :data:`SWEEP_METRICS` and the objective's metrics."""
    paths = _stat_paths(objective)
    points: list[SweepPoint] = []
    runs: list[dict[str, Any]] = []
    values: list[float] = []
    policies: list[str] = []
    for arm, res in zip(arms, results, strict=True):
        label, _, shown_value_text = arm.name.rpartition("@")
        value = float(shown_value_text)
        if value not in values:
            values.append(value)
        if label not in policies:
            policies.append(label)
        stats: dict[str, tuple[float, float, float]] = {}
        for path in paths:
            nums = [shown_value(r.metrics, path) for r in res.runs]  # None: measured nothing
            nums = [x for x in nums if x is not None]
            if nums and all(isinstance(x, int | float) for x in nums):
                m, lo, hi = mean_ci95([float(x) for x in nums])
                d_lo, d_hi = metric_domain(path)
                stats[path] = (m, max(lo, d_lo), min(hi, d_hi))
        points.append(SweepPoint(label, value, stats, len(res.runs)))
        for r in res.runs:
            shown = knob.cast(value)  # replicas 2, not 2.0, in sweep.csv
            row: dict[str, Any] = {knob.name: shown, "policy": label, "seed": r.seed}
            for path in paths:
                row[path] = shown_value(r.metrics, path)
            runs.append(row)
    judgements = [
        judge(
            objective,
            [
                ArmRuns(
                    arm.name.rpartition("@")[0],  # the arm's label: one policy may run twice
                    tuple(r.metrics for r in res.runs),
                    tuple(r.seed for r in res.runs),
                )
                for arm, res in zip(arms, results, strict=True)
                if float(arm.name.rsplit("@", 1)[1]) == v
            ],
        )
        for v in values
    ]
    knee = objective_knee(knob, values, judgements)
    verdicts = [verdict_line(knob, v, j) for v, j in zip(values, judgements, strict=True)]
    return SweepResult(knob, values, policies, points, knee, verdicts, runs, objective, judgements)


def _stat_paths(objective: Objective) -> list[str]:
    """:data:`SWEEP_METRICS` and the objective's metrics."""
    paths = [p for p, _ in SWEEP_METRICS]
    for p in (objective.metric, *(c.metric for c in objective.constraints)):
        if p not in paths:
            paths.append(p)
    return paths


def sweep_document(result: SweepResult) -> dict[str, Any]:
    """The ``sweep.json`` document (schema ``sessionroute.sweep/1``); knob values in the
    knob's type (replicas 2, not 2.0)."""
    from sessionroute.experiments.verdict_text import verdict_document

    cast = result.knob.cast
    return {
        "schema": "sessionroute.sweep/1",
        "knob": {"name": result.knob.name, "setting": result.knob.path},
        "values": [cast(v) for v in result.values],
        "policies": result.policies,
        "knee": None if result.knee is None else cast(result.knee),
        "objective": result.objective.as_dict(),
        "knee_rule": (
            f"first value (by increasing load) where no policy meets the constraints or the "
            f"best {result.objective.label} (per unit of load for a rate of work) is below "
            f"{KNEE_EFFICIENCY} x the lightest point's"
        ),
        "verdicts": result.verdicts,
        "verdict_details": [
            {"value": cast(v), **verdict_document(j)}
            for v, j in zip(result.values, result.judgements, strict=True)
        ],
        "points": [
            {
                "policy": p.policy,
                "value": cast(p.value),
                "seeds": p.seeds,
                "metrics": {
                    k: {"mean": m, "lo": lo, "hi": hi} for k, (m, lo, hi) in p.stats.items()
                },
            }
            for p in result.points
        ],
        "runs": result.runs,
        **({"settings": result.settings} if result.settings else {}),
    }


def write_sweep(result: SweepResult, out_dir: Path, experiment_toml: str) -> dict[str, Path]:
    """Write ``sweep.csv`` (one row per run), ``sweep.json`` and ``report.html``."""
    from sessionroute.experiments.sweep_report import write_sweep_report

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out_dir / "sweep.csv",
        "json": out_dir / "sweep.json",
        "report": out_dir / "report.html",
    }
    fields = [result.knob.name, "policy", "seed", *_stat_paths(result.objective)]
    with paths["csv"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(result.runs)
    paths["json"].write_text(json.dumps(sweep_document(result), indent=2), encoding="utf-8")
    write_sweep_report(paths["report"], result, experiment_toml)
    return paths
