"""The sweep's ``report.html``: each metric against the knob per policy, the knee marked."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sessionroute.experiments.report import _CSS, _png
from sessionroute.experiments.sweep import SWEEP_METRICS, SweepResult

__all__ = ["sweep_figure", "write_sweep_report"]


def sweep_figure(result: SweepResult) -> str | None:
    """One panel per metric with data (mean and 95 % interval per policy against the knob,
    shared x axis, the knee as a dashed line); base64 PNG, None without data."""
    metrics = [
        (path, label)
        for path, label in SWEEP_METRICS
        if any(path in p.stats for p in result.points)
    ]
    if not metrics:
        return None
    cols = 2
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.4 * rows), sharex=True, squeeze=False)
    xs = sorted(result.values)
    for ax, (path, label) in zip(axes.flat, metrics, strict=False):
        for policy in result.policies:
            pts = [result.point(policy, v) for v in xs]
            ok = [(v, p.stats[path]) for v, p in zip(xs, pts, strict=True) if path in p.stats]
            if not ok:
                continue
            vals = [v for v, _ in ok]
            mean = [s[0] for _, s in ok]
            ax.plot(vals, mean, marker="o", label=policy)
            if any(s[1] != s[2] for _, s in ok):
                ax.fill_between(vals, [s[1] for _, s in ok], [s[2] for _, s in ok], alpha=0.15)
        if result.knee is not None:
            ax.axvline(result.knee, color="k", ls="--", lw=1, label="knee")
        ax.set_ylim(bottom=0)  # every swept metric is >= 0: a 2 % change must not look a cliff
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(metrics) :]:
        ax.set_visible(False)
    for col in range(cols):  # the lowest shown panel of each column carries the x axis
        shown = [axes[r][col] for r in range(rows) if r * cols + col < len(metrics)]
        if shown:
            shown[-1].xaxis.set_tick_params(labelbottom=True)
            shown[-1].set_xlabel(result.knob.label)
    axes.flat[0].set_xticks(xs, [f"{v:g}" for v in xs])  # the swept values, not 2.25, 2.5
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(6, len(labels)), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return _png(fig)


def write_sweep_report(path: Path, result: SweepResult, experiment_toml: str) -> Path:
    """Write the self-contained sweep report to ``path`` and return it."""
    from sessionroute.experiments.verdict_text import glossary_html

    knee = (
        f"knee at {result.knee:g} ({html.escape(result.knob.label)})"
        if result.knee is not None
        else f"no knee in this range ({html.escape(result.objective.label)} kept up with load)"
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>sessionroute sweep: {html.escape(result.knob.name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>sessionroute sweep: {html.escape(result.knob.label)}</h1>",
        f"<p>objective: {html.escape(result.objective.describe())}</p>",
        f"<p><b>{knee}</b></p><h2>Verdict per load point</h2><ul>",
        *(f"<li>{html.escape(v)}</li>" for v in result.verdicts),
        "</ul>",
    ]
    png = sweep_figure(result)
    if png:
        parts.append(f"<img src='data:image/png;base64,{png}'>")
    parts.append(
        "<p><small>Mean over seeds with the 95 % interval (Student t) shaded where there are "
        "two or more seeds. The knee: the first value, by increasing load, at which no policy "
        "meets the objective's constraints or the best policy's objective falls below 0.9 x "
        "the lightest point's, per unit of load for a rate of work (tok/s, turns/s, RL steps/s "
        "for a step time); for replicas, which change capacity rather than load, the objective "
        "itself (docs/objectives.md).</small></p>"
    )
    parts.append(f"<h2>Experiment</h2><pre>{html.escape(experiment_toml)}</pre>")
    parts.append(glossary_html() + "</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
