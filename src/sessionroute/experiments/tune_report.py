"""What ``sessionroute tune`` writes: the policy file, the trials, the JSON and the report.

* ``tuned.toml``: the policy file (``serve --policy-config``, ``compare --policies @FILE``),
  the tuned options and, under ``[meta]``, the objective, the trial, and the confirmation.
* ``trials.csv``: one row per finished trial (number, each knob, value, feasible).
* ``tune.json``: the same and the best, the importance and the confirmation verdict.
* ``report.html``: the verdict, the study's progress, the knobs' importance, and the objective
  against each knob.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path
from typing import Any

from sessionroute.experiments.report import _png
from sessionroute.experiments.tune import StudyResult, TuneSetup
from sessionroute.experiments.verdict_text import verdict_document, verdict_html, verdict_lines
from sessionroute.router.policies.options import format_policy, policy_file_text

__all__ = ["summary_lines", "tuned_options", "write_tune_outputs"]


def tuned_options(setup: TuneSetup, result: StudyResult) -> dict[str, Any]:
    """The options to deploy: the fixed ones, and the best trial's knobs when the confirmation
    found them better than the defaults beyond noise; the defaults otherwise."""
    chosen = setup.defaults()
    v = result.confirmation
    beats = v is not None and v.best == "tuned" and v.eligible and "defaults" not in v.within_noise
    if result.best is not None and beats:
        chosen = result.params(result.best)
    return {**setup.fixed, **chosen}


def summary_lines(setup: TuneSetup, result: StudyResult) -> list[str]:
    """The study's conclusion in words (terminal and report)."""
    lines = [f"objective: {setup.objective.describe()}"]
    lines.append(
        f"{len(result.trials)} trial(s) of {setup.policy}, {setup.runs_per_trial()} run(s) each"
    )
    if result.best is None:
        lines.append("no trial met the constraints: nothing to recommend")
        return lines
    best = result.trials[[n for n, _, _ in result.trials].index(result.best)]
    lines.append(
        f"best trial {best[0]}: {format_policy(setup.policy, best[1])} "
        f"({setup.objective.label} {best[2].value:,.4g} on the search seeds)"
    )
    v = result.confirmation
    if v is None:
        lines.append("the defaults were the best trial: keep them")
    else:
        lines += verdict_lines(v, title=f"confirmation on {setup.confirm_seeds} fresh seed(s)")
        if v.best == "tuned" and v.eligible and "defaults" not in v.within_noise:
            lines.append("the tuned settings beat the defaults by more than the seed spread")
        else:
            lines.append(
                "the defaults are within noise of the best settings found (or better): "
                "tuned.toml keeps the defaults"
            )
    return lines


def _plots(setup: TuneSetup, result: StudyResult) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[tuple[str, str]] = []
    rows = [(n, p, s.value, s.feasible) for n, p, s in result.trials if s.value is not None]
    if not rows:
        return out
    sign = setup.objective.direction
    fig, ax = plt.subplots(figsize=(9, 3.5))
    xs = [r[0] for r in rows]
    ax.scatter(xs, [r[2] for r in rows], c=["tab:blue" if r[3] else "tab:red" for r in rows])
    best_so_far: list[float] = []
    for r in rows:
        prev = best_so_far[-1] if best_so_far else None
        ok = r[3] and r[2] is not None
        cand = r[2] if ok else prev
        if prev is not None and cand is not None:
            cand = max(prev, cand, key=lambda x: sign * x)
        best_so_far.append(cand if cand is not None else float("nan"))
    ax.step(xs, best_so_far, where="post", color="black", label="best so far (feasible)")
    ax.set_xlabel("trial (red: breaks a constraint)")
    ax.set_ylabel(setup.objective.label)
    ax.legend()
    out.append(("the study's progress", _png(fig)))
    if result.importance:
        fig, ax = plt.subplots(figsize=(6, 0.5 + 0.4 * len(result.importance)))
        names = list(result.importance)
        ax.barh(names, [result.importance[n] for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("importance (fANOVA, share of the objective's variance)")
        out.append(("the knobs' importance", _png(fig)))
    for knob in setup.space:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.scatter([r[1][knob] for r in rows], [r[2] for r in rows])
        ax.axvline(setup.space[knob].default, color="gray", linestyle="--", label="default")
        if setup.space[knob].log:
            ax.set_xscale("log")
        ax.set_xlabel(knob)
        ax.set_ylabel(setup.objective.label)
        ax.legend()
        out.append((f"{setup.objective.label} against {knob}", _png(fig)))
    return out


def write_tune_outputs(setup: TuneSetup, result: StudyResult, out_dir: Path) -> dict[str, Path]:
    """Write ``tuned.toml``, ``trials.csv``, ``tune.json`` and ``report.html``; name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "policy": out_dir / "tuned.toml",
        "trials": out_dir / "trials.csv",
        "json": out_dir / "tune.json",
        "report": out_dir / "report.html",
    }
    options = tuned_options(setup, result)
    meta: dict[str, Any] = {
        "objective": setup.objective.describe(),
        "trials": len(result.trials),
        "seeds": setup.seeds,
    }
    if result.best is not None:
        meta["best_trial"] = result.best
    if result.confirmation is not None:
        meta["confirmation"] = verdict_lines(result.confirmation)[-1]
    paths["policy"].write_text(policy_file_text(setup.policy, options, meta), encoding="utf-8")
    knobs = list(setup.space)
    with paths["trials"].open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["trial", *knobs, setup.objective.metric, "feasible"])
        for n, params, score in result.trials:
            writer.writerow([n, *(params.get(k) for k in knobs), score.value, score.feasible])
    doc = {
        "policy": setup.policy,
        "fixed": setup.fixed,
        "space": {
            k: {"low": s.low, "high": s.high, "log": s.log, "default": s.default}
            for k, s in setup.space.items()
        },
        "objective": setup.objective.as_dict(),
        "trials": [
            {
                "trial": n,
                "params": p,
                "value": s.value,
                "feasible": s.feasible,
                "per_point": [list(x) for x in s.per_point],
            }
            for n, p, s in result.trials
        ],
        "best": result.best,
        "importance": result.importance,
        "confirmation": verdict_document(result.confirmation) if result.confirmation else None,
        "tuned_options": options,
    }
    paths["json"].write_text(json.dumps(doc, indent=2), encoding="utf-8")
    parts = [
        "<!doctype html><meta charset='utf-8'><title>sessionroute tune</title>",
        f"<h1>sessionroute tune: {html.escape(setup.policy)}</h1>",
        "<pre>" + html.escape("\n".join(summary_lines(setup, result))) + "</pre>",
    ]
    if result.confirmation is not None:
        parts.append(verdict_html(result.confirmation))
    for title, png in _plots(setup, result):
        parts.append(f"<h2>{html.escape(title)}</h2><img src='data:image/png;base64,{png}'>")
    parts.append("<h2>tuned.toml</h2><pre>" + html.escape(paths["policy"].read_text()) + "</pre>")
    paths["report"].write_text("\n".join(parts), encoding="utf-8")
    return paths
