"""The short plan ``sessionroute compare --dry-run`` prints (the full one with ``--json``)."""

from __future__ import annotations

from typing import Any

from sessionroute.experiments.spec import ExperimentSpec, ResolvedArm
from sessionroute.workloads.registry import default_replicas

__all__ = ["plan_summary"]


def _workload(wl: dict[str, Any]) -> str:
    text = str(wl["kind"])
    if wl.get("steps") is not None:
        text += f", {wl['steps']} RL steps"
    opts = wl.get("options") or {}
    if opts:
        text += ", " + ", ".join(f"{k}={v}" for k, v in sorted(opts.items()))
    return text


def _diff(base: dict[str, Any], other: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two settings dicts."""
    out: list[str] = []
    for key in sorted(set(base) | set(other)):
        a, b = base.get(key), other.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}={b!r}")
    return out


def _set(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def plan_summary(spec: ExperimentSpec, arms: list[ResolvedArm]) -> str:
    """A few lines: the experiment, the shared settings, and one line per arm (its policy,
    options and any setting that differs from the first arm's)."""
    first = arms[0].settings if arms else {}
    wl_kind = first.get("workload", {}).get("kind")
    rep = {**(default_replicas(wl_kind) if wl_kind else {}), **_set(first.get("replicas", {}))}
    run = spec.run
    seeds = ", ".join(str(run.seed + k) for k in range(run.repeats))
    n_runs = len(arms) * run.repeats
    lines = [
        f"experiment {spec.name!r}: {spec.description}" if spec.description else spec.name,
        f"  workload: {_workload(first.get('workload', {}))}",
        f"  replicas: {rep.get('count')} x {rep.get('profile')}",
        f"  repeats:  {run.repeats} per arm (seeds {seeds}); {n_runs} run{'s' * (n_runs != 1)}",
        f"  objective: {spec.resolved_objective().describe()}",
        f"  arms ({len(arms)}):",
    ]
    width = max((len(a.name) for a in arms), default=0)
    for a in arms:
        line = f"    {a.name:<{width}}  {a.policy}"
        if a.policy_options:
            line += " " + ", ".join(f"{k}={v}" for k, v in sorted(a.policy_options.items()))
        if a.objective_options:
            line += f"  [{', '.join(sorted(a.objective_options))}: for this objective]"
        diff = _diff(first, a.settings)
        if diff:
            line += f"  [differs: {'; '.join(diff)}]"
        lines.append(line)
    lines.append("(--dry-run --json prints the full resolved plan)")
    return "\n".join(lines)


def objective_options_note(arms: list[ResolvedArm]) -> list[str]:
    """One line per arm that runs with its policy's options for the objective's kind
    (``Policy.objective_options``), naming them; none when no arm does."""
    named = {a.name: a.objective_options for a in arms if a.objective_options}
    return [
        f"{name} runs with its options for this objective: "
        + ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
        + " (docs/objectives.md; write the option in the arm to override)"
        for name, options in named.items()
    ]
