"""The verdict: which arm is best on the declared objective, which are within noise of it, the
Pareto front, and what each arm costs against the best. Pure: metrics in, a :class:`Verdict`
out (rendering: :mod:`sessionroute.experiments.verdict_text`).

Rules (``docs/objectives.md``):

* An arm's value of a metric is its mean over the runs (seeds) that measured it.
* Eligible arms meet every constraint on those means; a constraint whose metric an arm did not
  measure is not held against it. The best arm is the eligible arm with the best objective
  (the first in arm order on a tie); when no arm is eligible, the best on the objective alone,
  flagged (:attr:`Verdict.eligible` False). An exact tie on the objective goes to the lower
  TTFT p99, then the lower timed-out share. Arms that did not measure the objective are never
  best.
* Within noise: with 2 or more runs per arm on the same seeds (a matched experiment), an arm
  whose seed-by-seed difference from the best has a 95 % confidence interval of its mean
  (Student's t, n - 1 degrees of freedom) that contains zero; on unmatched seeds, a mean
  difference no larger than the larger of the two arms' seed ranges; with one run, no larger
  than a reference spread measured on the same workload (a fraction of the best's value),
  when there is one; otherwise no arm is within noise and the verdict says that no ranking is
  possible below the seed spread. (The interval narrows as seeds are added; the range of the
  differences, the rule before, widens, so more seeds could never settle a ranking.) When
  every arm gave the same objective on each of the 2 or more seeds it measured (a workload
  that draws nothing at random for the seed, such as a trace replayed as recorded, or an
  objective at its limit, such as every turn within the SLO), the seeds measured no spread
  and the verdict says so (``identical``) instead of calling every difference real. Whether
  or not other arms move with the seed, an arm that gave one value on every seed, as the best
  did (on the seeds they share, 2 or more; else each on its own), is neither within noise nor
  outside it: its difference has no measured spread; an exact tie is within noise.
* The Pareto front: arms not dominated on (objective, TTFT p99, timed-out share), each axis
  that every arm measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sessionroute.experiments.objective import Objective, metric_label
from sessionroute.experiments.results import get_path, metric_domain

__all__ = [
    "PARETO_AXES",
    "T_975",
    "ArmJudgement",
    "ArmRuns",
    "Noise",
    "Verdict",
    "change_text",
    "judge",
    "metric_value",
    "paired_half_width",
]

PARETO_AXES: tuple[tuple[str, int], ...] = (
    ("ttft_s.p99", -1),
    ("rollouts_timed_out_share", -1),
)
"""The axes besides the objective on which the Pareto front is taken (lower is better)."""


@dataclass(frozen=True, slots=True)
class ArmRuns:
    """One arm's runs: its name, each run's ``metrics`` dict, and each run's seed (empty:
    run ``k`` of every arm shares a seed, as in ``run_experiment``)."""

    name: str
    runs: tuple[Mapping[str, Any], ...]
    seeds: tuple[int, ...] = ()

    def by_seed(self, path: str) -> dict[int, float]:
        """seed -> the value at ``path`` of the runs that measured it."""
        seeds = self.seeds if len(self.seeds) == len(self.runs) else range(len(self.runs))
        out = {}
        for seed, run in zip(seeds, self.runs, strict=True):
            v = metric_value(run, path)
            if v is not None:
                out[seed] = v
        return out


@dataclass(frozen=True, slots=True)
class Noise:
    """How the verdict tells noise.

    Attributes:
        kind: ``repeats`` (seed ranges of this experiment), ``reference`` (a spread measured
            earlier on the same workload, one run per arm here), ``identical`` (2 or more
            runs per arm, each arm's objective the same on each of the 2 or more seeds it
            measured: no spread measured; only an arm equal to the best is within noise) or
            ``none`` (one run, no reference).
        relative: the reference spread as a fraction of the best's value (``reference``).
        source: where the reference comes from, in words.
        runs: the fewest runs any arm has.
    """

    kind: Literal["repeats", "reference", "identical", "none"]
    relative: float | None = None
    source: str = ""
    runs: int = 1

    @property
    def from_seeds(self) -> bool:
        """The seeds of this experiment tell noise (``repeats``; ``identical`` is the case
        where every arm gave one value on them)."""
        return self.kind in ("repeats", "identical")


@dataclass(frozen=True, slots=True)
class ArmJudgement:
    """One arm in the verdict.

    Attributes:
        name: the arm.
        value: its objective (mean over the runs that measured it); None: not measured.
        seed_values: the objective of each run that measured it.
        violations: the constraints it breaks, each with its value.
        within_noise: its objective is within noise of the best's (False for the best).
        pareto: on the Pareto front.
        costs: phrases, what it costs against the best (empty for the best).
        spread_measured: False when this arm and the best each gave one value on every seed
            they share (2 or more; else each on its own seeds) and their values differ (noise
            ``repeats`` or ``identical``): the seeds measured no spread of their difference,
            so whether it is within noise is unknown (``within_noise`` is False).
    """

    name: str
    value: float | None
    seed_values: tuple[float, ...]
    violations: tuple[str, ...]
    within_noise: bool
    pareto: bool
    costs: tuple[str, ...]
    spread_measured: bool = True

    @property
    def eligible(self) -> bool:
        """Measured the objective and meets every constraint."""
        return self.value is not None and not self.violations


@dataclass(frozen=True, slots=True)
class Verdict:
    """The verdict of one experiment (or one sweep point).

    Attributes:
        objective: what it judged on.
        best: the best arm's name (None: no arm measured the objective).
        eligible: the best meets every constraint (False: none does).
        arms: every arm, best first, then eligible arms by objective, then the rest.
        noise: how noise was told.
        pareto_axes: the axes of the Pareto front (the objective's first).
    """

    objective: Objective
    best: str | None
    eligible: bool
    arms: tuple[ArmJudgement, ...]
    noise: Noise
    pareto_axes: tuple[str, ...]

    def arm(self, name: str) -> ArmJudgement:
        """The judgement of arm ``name``."""
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def within_noise(self) -> tuple[str, ...]:
        """The arms within noise of the best."""
        return tuple(a.name for a in self.arms if a.within_noise)

    @property
    def spread_unmeasured(self) -> tuple[str, ...]:
        """The arms whose difference from the best the seeds measured no spread of
        (:attr:`ArmJudgement.spread_measured`)."""
        return tuple(a.name for a in self.arms if not a.spread_measured)

    @property
    def pareto(self) -> tuple[str, ...]:
        """The arms on the Pareto front."""
        return tuple(a.name for a in self.arms if a.pareto)


def metric_value(metrics: Mapping[str, Any], path: str) -> float | None:
    """The number at ``path``; None when absent, not a number, NaN, or a statistic of a
    summary that measured nothing (``count`` 0)."""
    parent, _, _ = path.rpartition(".")
    if parent and get_path(metrics, f"{parent}.count") == 0:
        return None
    v = get_path(metrics, path)
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        return None
    return float(v)


def _mean(runs: Sequence[Mapping[str, Any]], path: str) -> tuple[float | None, tuple[float, ...]]:
    vals = tuple(x for x in (metric_value(r, path) for r in runs) if x is not None)
    return (sum(vals) / len(vals) if vals else None), vals


def _unit(path: str) -> bool:
    return metric_domain(path) == (0.0, 1.0)


def change_text(path: str, value: float, base: float) -> str:
    """How ``value`` differs from ``base`` on ``path``, as a reader should see it: the
    difference for a share or rate in [0, 1] (``"+0.755"``), a ratio when it is 1.5x or more
    either way (``"×31"``, ``"÷31"``), else a percentage (``"+0.6 %"``); ``"same"`` when
    equal."""
    if value == base:
        return "same"
    if _unit(path):
        return f"{value - base:+.3f}"
    if base == 0:
        return f"{value - base:+,.3g}"
    ratio = value / base
    if ratio >= 1.5:
        return f"×{ratio:.3g}" if ratio < 10 else f"×{ratio:,.0f}"
    if 0 < ratio <= 1 / 1.5:
        return f"÷{1 / ratio:.3g}" if ratio > 0.1 else f"÷{1 / ratio:,.0f}"
    return f"{(ratio - 1) * 100:+.1f} %"


def _fmt(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
"""Student's t distribution, 97.5 % quantile, for 1 to 30 degrees of freedom (the standard
table, e.g. NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.2); 1.96 (the
normal's) beyond."""


def paired_half_width(diffs: Sequence[float]) -> float:
    """Half-width of the 95 % confidence interval of the mean of ``diffs`` (seed-by-seed
    differences between two arms, at least 2): ``t(0.975, n - 1) * sd / sqrt(n)``."""
    n = len(diffs)
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    return t * statistics.stdev(diffs) / math.sqrt(n)


def _within(
    arm: Mapping[int, float], best: Mapping[int, float], noise: Noise, best_value: float
) -> bool:
    """Whether the objective of ``arm`` (seed -> value) is within noise of ``best``'s. On the
    seeds of this experiment (noise ``repeats`` or ``identical``, the latter a case of the
    former where every arm is flat): a paired interval on 2 or more shared seeds, else each
    arm's own range (2 or more seeds each), else only an exact tie."""
    if not arm or not best:
        return False
    diff = abs(sum(arm.values()) / len(arm) - sum(best.values()) / len(best))
    if noise.from_seeds:
        common = sorted(set(arm) & set(best))
        if len(common) >= 2:  # matched seeds: a paired comparison
            d = [arm[k] - best[k] for k in common]
            return abs(statistics.fmean(d)) <= paired_half_width(d)
        if len(arm) >= 2 and len(best) >= 2:
            a, b = list(arm.values()), list(best.values())
            return diff <= max(max(a) - min(a), max(b) - min(b))
        return diff == 0
    if noise.kind == "reference" and noise.relative is not None:
        return diff <= noise.relative * abs(best_value)
    return False


def _flat_pair(arm: Mapping[int, float], best: Mapping[int, float]) -> bool:
    """Whether the seeds measured no spread of the difference between ``arm`` and ``best``
    (seed -> value): on 2 or more shared seeds, each gave one value on them (a paired interval
    of zero width would call any difference real); on fewer, each gave one value on its own
    seeds (ranges of zero width; a single seed has one value)."""
    common = set(arm) & set(best)
    if len(common) >= 2:
        return len({arm[k] for k in common}) == 1 and len({best[k] for k in common}) == 1
    return len(set(arm.values())) == 1 and len(set(best.values())) == 1


def _no_spread(arms: Sequence[ArmRuns], path: str) -> bool:
    """Whether every arm that measured ``path`` gave one value on the 2 or more seeds it
    measured it on (the seeds measured no spread at all). An arm that measured it on a single
    seed makes it False: one seed cannot tell whether the value moves with the seed."""
    measured = [v for v in (a.by_seed(path) for a in arms) if v]
    return bool(measured) and all(len(v) >= 2 and len(set(v.values())) == 1 for v in measured)


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` at least as good on every (higher-is-better) axis and better on one."""
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(
        x > y for x, y in zip(a, b, strict=True)
    )


def judge(
    objective: Objective,
    arms: Sequence[ArmRuns],
    *,
    reference_spread: float | None = None,
    reference_source: str = "",
) -> Verdict:
    """Judge ``arms`` on ``objective`` (rules in the module docstring).

    Args:
        objective: the objective and constraints.
        arms: every arm with its runs' metrics, in arm order.
        reference_spread: the objective's seed spread measured on this workload, as a fraction
            of its value; used when an arm has a single run.
        reference_source: where that spread comes from, in words.

    Raises:
        ValueError: for duplicate arm names.
    """
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate arm names: {names}")
    runs = min((len(a.runs) for a in arms), default=1)
    if runs >= 2 and _no_spread(arms, objective.metric):
        noise = Noise("identical", runs=runs)
    elif runs >= 2:
        noise = Noise("repeats", runs=runs)
    elif reference_spread is not None:
        noise = Noise("reference", reference_spread, reference_source, runs)
    else:
        noise = Noise("none", runs=runs)
    values: dict[str, tuple[float | None, tuple[float, ...]]] = {}
    violations: dict[str, tuple[str, ...]] = {}
    for a in arms:
        values[a.name] = _mean(a.runs, objective.metric)
        broken = []
        for c in objective.constraints:
            v, _ = _mean(a.runs, c.metric)
            if v is not None and not c.holds(v):
                broken.append(f"breaks {c} ({_fmt(v)})")
        violations[a.name] = tuple(broken)
    d = objective.direction
    measured = [a.name for a in arms if values[a.name][0] is not None]
    eligible = [n for n in measured if not violations[n]]
    pool = eligible or measured

    def score(name: str) -> float:
        v = values[name][0]
        return d * v if v is not None else -math.inf

    by_name = {a.name: a for a in arms}

    def tie_break(name: str) -> tuple[float, ...]:
        """The objective, then (on an exact tie) the Pareto axes, lower first."""
        rest = (_mean(by_name[name].runs, p)[0] for p, _ in PARETO_AXES)
        return (score(name), *(-x if x is not None else -math.inf for x in rest))

    best = max(pool, key=tie_break) if pool else None  # max keeps the first of equal keys
    # Pareto front over the axes every measured arm has
    axes = [(objective.metric, d)]
    for path, direction in PARETO_AXES:
        if path != objective.metric and all(
            _mean(a.runs, path)[0] is not None for a in arms if a.name in measured
        ):
            axes.append((path, direction))
    points = {
        a.name: [direction * (_mean(a.runs, p)[0] or 0.0) for p, direction in axes]
        for a in arms
        if a.name in measured
    }
    front = {n for n in points if not any(_dominates(points[m], points[n]) for m in points)}
    judged: list[ArmJudgement] = []
    bv = values[best][0] if best is not None else None
    for a in arms:
        v, seeds = values[a.name]
        costs: list[str] = []
        near = False
        flat = False
        if best is not None and bv is not None and a.name != best:
            if v is not None:
                mine_s = a.by_seed(objective.metric)
                best_s = by_name[best].by_seed(objective.metric)
                flat = noise.from_seeds and v != bv and _flat_pair(mine_s, best_s)
                near = not flat and _within(mine_s, best_s, noise, bv)
                costs.append(f"{objective.label} {change_text(objective.metric, v, bv)}")
            else:
                costs.append(f"{objective.label} not measured")
            for path, _ in axes[1:]:
                mine, theirs = _mean(a.runs, path)[0], _mean(by_name[best].runs, path)[0]
                if mine is not None and theirs is not None:
                    costs.append(f"{metric_label(path)} {change_text(path, mine, theirs)}")
        judged.append(
            ArmJudgement(
                a.name,
                v,
                seeds,
                violations[a.name],
                near,
                a.name in front,
                tuple(costs),
                not flat,
            )
        )

    def order(j: ArmJudgement) -> tuple[int, float]:
        rank = 0 if j.name == best else 1 if j.eligible else 2 if j.value is not None else 3
        return rank, -score(j.name) if j.value is not None else 0.0

    judged.sort(key=order)  # stable: arm order among equals
    return Verdict(
        objective,
        best,
        best is not None and not violations[best],
        tuple(judged),
        noise,
        tuple(p for p, _ in axes),
    )
