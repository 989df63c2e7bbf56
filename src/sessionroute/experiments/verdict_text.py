"""The verdict in words: terminal lines, HTML and the ``results.json`` form; and the glossary
of the comparison table's terms (``compare --explain``, the end of ``report.html``).

The decisions are :mod:`sessionroute.experiments.verdict`'s; this module only words them.
"""

from __future__ import annotations

import html
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sessionroute.experiments.objective import Objective, metric_label
from sessionroute.experiments.results import metric_domain
from sessionroute.experiments.verdict import Verdict

if TYPE_CHECKING:
    from rich.console import Console

    from sessionroute.experiments.spec import ResolvedArm

__all__ = [
    "GLOSSARY",
    "explain_text",
    "glossary_html",
    "glossary_text",
    "print_verdict",
    "verdict_document",
    "verdict_html",
    "verdict_lines",
]

GLOSSARY: tuple[tuple[str, str], ...] = (
    (
        "mean RL step time",
        "mean over the run's RL steps of the time from one trainer step to the next: the time "
        "to collect a batch of finished GRPO groups (step_time_s.mean). The RL default "
        "objective: a faster step is a faster training run.",
    ),
    (
        "SLO goodput",
        "share of turns whose TTFT and mean inter-token gap both meet the SLO (default 2 s and "
        "0.2 s, the MLPerf Inference Llama-2-70B server limits); turns refused count as missed "
        "(slo_goodput; slo_goodput_per_s: those turns per second). The serving default.",
    ),
    (
        "timed-out share",
        "rollouts cancelled by the rollout timeout over rollouts started "
        "(rollouts_timed_out_share): their tokens are wasted and their group scored short.",
    ),
    (
        "group latency p50/p90/max",
        "GRPO group: admission to its slowest rollout's end (a timed-out rollout counts the "
        "timeout); a group is trained on only when its last rollout ends.",
    ),
    (
        "hit rate",
        "engine-side prefix-cache hit rate: cached prompt tokens over prompt tokens queried, "
        "token-weighted over all replicas.",
    ),
    ("worst replica hit", "the lowest per-replica hit rate over the run."),
    (
        "worst 10 s hit",
        "the lowest hit rate of any replica in any sample interval (10 s by default), among "
        "replicas that queried at least 10 % of the fleet's mean that interval: the deepest "
        "cache-thrash dip.",
    ),
    (
        "thrash share",
        "share of sampled replica-seconds whose hit rate was below half the fleet's in the "
        "same interval (cache thrash: the replica keeps evicting what its sessions reuse).",
    ),
    (
        "running CoV",
        "coefficient of variation (population std / mean) over replicas of their mean running "
        "requests: 0 is perfectly even load; busy time saturates under load, this does not.",
    ),
    ("output tokens CoV", "the same CoV over replicas of the output tokens each produced."),
    ("KV usage CoV", "the same CoV over replicas of their mean KV-cache usage (0..1)."),
    (
        "preemptions",
        "requests the engines preempted (KV cache full: evicted, recomputed later).",
    ),
    ("TTFT", "time to first token, client side, per finished request (p50, p99)."),
    ("ITL", "mean inter-token gap of a request (time per output token after the first)."),
    ("re-pins", "sessions moved to another replica after their first placement."),
    (
        "ideal hit (inf. cache)",
        "the hit rate an infinite shared cache would reach on the same requests: the ceiling.",
    ),
    (
        "within noise",
        "a difference no larger than the seed spread: with --repeats >= 2, the 95 % confidence "
        "interval of the mean seed-by-seed difference between the two arms (arms run the same "
        "seeds) contains zero; with one repeat, the spread of that difference measured on the "
        "same workload over seeds 0-2, when it was measured. No ranking is possible below it. "
        "An arm that gave one value on every seed, as the best did, has no measured spread "
        "against it: unknown.",
    ),
    (
        "Pareto front",
        "the arms no other arm beats on every axis at once (objective, TTFT p99, timed-out "
        "share): the real trade-offs.",
    ),
    (
        "changes",
        "shares and rates in [0, 1] change by their difference (+0.755), other metrics by a "
        "percentage (+0.6 %) or, from 1.5x either way, a ratio (×31).",
    ),
)
"""The table's and the verdict's terms, with definitions (from docs/simulator.md and the
results builder)."""


SATURATED_SHARE = 0.05
"""A share to maximise (SLO goodput) below which, for every arm, the verdict says that no arm
serves the load: a ranking between 0.0003 and 0.005 (the Mooncake replay at 4x its arrival
rate, where every arm's ITL p50 is above the SLO) is a ranking of a few turns."""


def saturated(v: Verdict) -> bool:
    """Whether ``v`` maximises a share (in [0, 1]) that every arm measured keeps under
    :data:`SATURATED_SHARE`."""
    obj = v.objective
    if obj.direction != 1 or metric_domain(obj.metric) != (0.0, 1.0):
        return False
    values = [a.value for a in v.arms if a.value is not None]
    return bool(values) and max(values) < SATURATED_SHARE


def _v(x: float, path: str = "") -> str:
    if path and metric_domain(path) == (0.0, 1.0):
        return f"{x:.3f}"  # a share: 1.000, not 1.00
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def _seed_counts(v: Verdict) -> tuple[int, int]:
    """The fewest and most seeds on which an arm measured the objective."""
    counts = [len(a.seed_values) for a in v.arms if a.seed_values] or [v.noise.runs]
    return min(counts), max(counts)


def _noise_line(v: Verdict) -> str:
    n = v.noise
    near = ", ".join(v.within_noise) or "none"
    lo, hi = _seed_counts(v)
    seeds = f"{lo}" if lo == hi else f"{lo} to {hi}"  # arms may have run different numbers
    if n.kind == "repeats":
        line = (
            f"within noise of it ({seeds} seeds; the 95 % interval of its seed-by-seed "
            f"difference from the best contains zero): {near}"
        )
        if v.spread_unmeasured:
            line += (
                f"; unknown for {', '.join(v.spread_unmeasured)} (one value on every seed, "
                "as the best: no spread measured)"
            )
        return line
    if n.kind == "reference" and n.relative is not None:
        return (
            f"within noise of it (one seed; the seed spread measured on this workload, "
            f"{n.source}, is ±{n.relative * 100:.1f} % of the objective: no ranking is "
            f"possible below it): {near}"
        )
    if n.kind == "identical":
        equal = f"; equal to it on every seed: {near}" if v.within_noise else ""
        every = f"all {lo} seeds" if lo == hi else f"every seed ({seeds} per arm)"
        return (
            f"within noise of it: unknown (each arm gave the same {v.objective.label} on "
            f"{every}: no spread measured; a trace replayed as recorded draws nothing "
            "random for a seed, and an objective at its limit, such as every turn within the "
            "SLO, cannot move; a small difference can reverse under a slightly different "
            f"load){equal}"
        )
    return (
        "one seed and no spread measured for this workload: no ranking is possible below the "
        "seed spread (differences of a few percent can be noise); run 3 seeds (compare "
        "--repeats 3, sweep --seeds 3)"
    )


def verdict_lines(v: Verdict, *, title: str = "verdict") -> list[str]:
    """The verdict as plain lines (the terminal's paragraph; ``title`` heads it)."""
    lines = [f"{title}: {v.objective.describe()}"]
    if v.best is None:
        return [*lines, f"no arm measured {v.objective.label}: no verdict"]
    best = v.arm(v.best)
    value = _v(best.value, v.objective.metric) if best.value is not None else "-"
    if best.value is not None and v.objective.metric.split(".")[0].endswith("_s"):
        value += " s"
    if v.eligible:
        lines.append(f"best: {v.best} ({v.objective.label} {value}; meets every constraint)")
    else:
        lines.append(
            f"no arm meets every constraint; best on {v.objective.label} alone: {v.best} "
            f"({value}; {'; '.join(best.violations)})"
        )
    if saturated(v):
        lines.append(
            f"every arm keeps {v.objective.label} under {SATURATED_SHARE * 100:.0f} %: no "
            "arm serves this load, and the ranking is one of a few requests; compare the "
            "latencies and the completion time instead"
        )
    lines.append(_noise_line(v))
    axes = " vs ".join(metric_label(p) for p in v.pareto_axes)
    lines.append(f"Pareto front ({axes}): {', '.join(v.pareto) or 'none'}")
    others = [a for a in v.arms if a.name != v.best]
    if others:
        lines.append(f"cost against {v.best}:")
        for a in others:
            parts = list(a.costs) + list(a.violations)
            tag = ""
            if a.within_noise:
                tag = " (within noise)"
            elif not a.spread_measured:
                tag = " (no spread measured)"
            lines.append(f"  {a.name}{tag}: {', '.join(parts) or 'no difference'}")
    return lines


def verdict_html(v: Verdict) -> str:
    """The verdict as an HTML fragment (a heading, a paragraph and a list)."""
    lines = verdict_lines(v)
    head, rest = lines[0], lines[1:]
    items = []
    sub: list[str] = []
    for line in rest:
        if line.startswith("  "):
            sub.append(f"<li>{html.escape(line.strip())}</li>")
        else:
            items.append(f"<li>{html.escape(line)}</li>")
    cost = f"<ul>{''.join(sub)}</ul>" if sub else ""
    return f"<h2>Verdict</h2><p><b>{html.escape(head)}</b></p><ul>{''.join(items)}</ul>{cost}"


def verdict_document(v: Verdict) -> dict[str, Any]:
    """The verdict's ``results.json`` form (``"verdict"``)."""
    return {
        "objective": v.objective.as_dict(),
        "best": v.best,
        "best_meets_constraints": v.eligible,
        "saturated": saturated(v),
        "within_noise": list(v.within_noise),
        "noise": {
            "kind": v.noise.kind,
            "relative_spread": v.noise.relative,
            "source": v.noise.source or None,
            "runs": v.noise.runs,
        },
        "pareto_axes": list(v.pareto_axes),
        "pareto_front": list(v.pareto),
        "arms": [
            {
                "name": a.name,
                "objective": a.value,
                "seed_values": list(a.seed_values),
                "meets_constraints": a.eligible,
                "violations": list(a.violations),
                "within_noise": a.within_noise,
                "spread_measured": a.spread_measured,
                "pareto": a.pareto,
                "cost": list(a.costs),
            }
            for a in v.arms
        ],
        "text": verdict_lines(v),
    }


def glossary_text() -> str:
    """The glossary as plain text (``compare --explain``)."""
    width = max(len(t) for t, _ in GLOSSARY) + 2
    return "\n".join(
        textwrap.fill(d, 96, initial_indent=t.ljust(width), subsequent_indent=" " * width)
        for t, d in GLOSSARY
    )


def glossary_html() -> str:
    """The glossary as an HTML section (a definition list)."""
    items = "".join(
        f"<dt><b>{html.escape(t)}</b></dt><dd>{html.escape(d)}</dd>" for t, d in GLOSSARY
    )
    return f"<h2>Glossary</h2><dl>{items}</dl>"


def explain_text(objective: Objective) -> str:
    """``compare --explain``: the objective, how the verdict is reached, and the glossary."""
    return "\n".join(
        [
            f"objective: {objective.describe()}",
            "",
            "The verdict names the best arm on the objective among the arms that meet every",
            "constraint (on their mean over seeds), the arms within noise of it, the Pareto",
            "front on the objective vs TTFT p99 and timed-out share, and what each other arm",
            "costs against the best. Declare another objective with [objective] in the",
            "experiment file or --objective (docs/objectives.md).",
            "",
            glossary_text(),
        ]
    )


def print_verdict(v: Verdict, arms: Sequence[ResolvedArm], console: Console) -> None:
    """Print the verdict paragraph to ``console``, with a warning when the run is too short
    for a stable ranking (:func:`~sessionroute.experiments.spread.short_run_warning`)."""
    from sessionroute.experiments.spread import short_run_warning

    lines = verdict_lines(v)
    console.print(lines[0], style="bold", highlight=False, markup=False)
    for line in lines[1:]:
        console.print(line, highlight=False, markup=False)
    warning = short_run_warning(arms[0].settings) if arms else None
    if warning:
        console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
