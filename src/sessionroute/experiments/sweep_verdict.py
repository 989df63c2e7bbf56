"""A sweep's verdict lines and its knee, both on the objective (:mod:`~sessionroute.
experiments.sweep`'s docstring has the rule); pure functions of the per-point verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sessionroute.experiments.results import metric_domain
from sessionroute.experiments.verdict import Verdict


class Knob(Protocol):
    """What these functions read of a :class:`sessionroute.experiments.sweep.Knob`."""

    @property
    def name(self) -> str: ...

    @property
    def offers_load(self) -> bool: ...

    def load(self, value: float) -> float: ...


__all__ = ["KNEE_EFFICIENCY", "objective_knee", "value_label", "verdict_line"]

KNEE_EFFICIENCY = 0.9
"""The knee: the best objective (per unit of load, for a rate) below this fraction of the
lightest point's."""


def value_label(knob: Knob, value: float) -> str:
    """``"608 in flight"``, ``"3 replicas"``: a knob value in words."""
    v = f"{value:g}"
    return {
        "inflight": f"{v} in flight",
        "concurrency": f"concurrency {v}",
        "replicas": f"{v} replicas",
    }.get(knob.name, f"time scale {v}")


def _fmt(v: float, path: str) -> str:
    if metric_domain(path) == (0.0, 1.0):
        return f"{v:.3f}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def verdict_line(knob: Knob, value: float, v: Verdict) -> str:
    """One line: the best policy on the objective, those within noise, each other's cost."""
    label = value_label(knob, value)
    if v.best is None:
        return f"at {label}: no policy measured {v.objective.label}"
    best = v.arm(v.best)
    shown = _fmt(best.value, v.objective.metric) if best.value is not None else "-"
    head = f"at {label}: best {v.best} ({v.objective.label} {shown}"
    head += ")" if v.eligible else f"; no policy meets every constraint: {best.violations[0]})"
    if v.noise.kind == "none":
        near = "; within noise: unknown (one seed: no ranking below the seed spread)"
    elif v.noise.kind == "identical":
        near = "; within noise: unknown (each policy gave one value on every seed: no spread)"
        if v.within_noise:
            near += f"; equal: {', '.join(v.within_noise)}"
    else:
        near = f"; within noise: {', '.join(v.within_noise) or 'none'}"
        if v.spread_unmeasured:
            near += f"; unknown (no spread measured): {', '.join(v.spread_unmeasured)}"
    costs = [f"{a.name} {', '.join([*a.costs, *a.violations])}" for a in v.arms if a.name != v.best]
    return head + near + (f"; cost: {'; '.join(costs)}" if costs else "")


def _rate_like(path: str) -> bool:
    """Whether an objective is a rate of work (per second, or an RL step time: its inverse)."""
    return path.endswith("_per_s") or path.startswith("step_time_s.")


def objective_knee(
    knob: Knob, values: Sequence[float], judgements: Sequence[Verdict]
) -> float | None:
    """The knee on the objective (module docstring): the first value by increasing load where
    no policy meets the constraints, or the best policy's objective (oriented: higher is
    better; a time becomes its inverse; per unit of load for a rate of work when the knob
    offers load) is below :data:`KNEE_EFFICIENCY` x the lightest point's. None: no knee."""
    order = sorted(range(len(values)), key=lambda i: knob.load(values[i]))

    def quality(i: int) -> float | None:
        v = judgements[i]
        best = v.arm(v.best).value if v.best is not None else None
        if best is None or not v.eligible:
            return None
        q = best if v.objective.direction > 0 else (1.0 / best if best > 0 else float("inf"))
        if knob.offers_load and _rate_like(v.objective.metric):
            q /= knob.load(values[i])
        return q

    q0 = quality(order[0])
    for i in order[1:]:
        q = quality(i)
        if q is None or (q0 is not None and q < KNEE_EFFICIENCY * q0):
            return values[i]
    return None
