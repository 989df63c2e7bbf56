"""The self-contained ``report.html``: the comparison table and plots (matplotlib, PNG inline).

Plots, each the page's full width with a legend, panels of one figure sharing their axes: RL
step time per step; rollouts cancelled (timeout or off-policy) over time; per-replica running
requests, KV usage and prefix-cache hit rate over time (one panel per arm; in the hit-rate
panels the replica with the lowest hit rate over the run is drawn thick and named); CDFs of
GRPO group latency, TTFT and session latency. A series that never changes (busy fraction of a
saturated fleet, say) carries nothing and is not drawn.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from sessionroute.experiments.results import ArmResult, get_path
from sessionroute.experiments.table import (
    better,
    delta_text,
    format_value,
    runs_note,
    shown_value,
    visible_metrics,
)

if TYPE_CHECKING:
    from sessionroute.experiments.verdict import Verdict

__all__ = ["render_plots", "write_report"]

_SERIES = (
    ("busy_fraction", "busy fraction"),
    ("running", "running requests"),
    ("kv_usage", "KV cache usage"),
    ("hit_rate", "prefix-cache hit rate"),
)

_WIDTH_IN = 15.0  # figure width (inches): the page's full width at the report's dpi


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _cancelled_plot(arms: Sequence[ArmResult]) -> str | None:
    """Rollouts cancelled so far (timeouts and off-policy drops) against simulated time."""
    runs = [(arm, arm.runs[0].steps) for arm in arms if arm.runs and arm.runs[0].steps]
    runs = [(a, st) for a, st in runs if any("sessions_cancelled" in s for s in st)]
    if not runs or not any(s.get("sessions_cancelled") for _, st in runs for s in st):
        return None
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 3.2))
    for arm, steps in runs:
        ax.step(
            [0.0, *(float(s["t"]) for s in steps)],
            [0, *(int(s.get("sessions_cancelled", 0)) for s in steps)],
            where="post",
            label=arm.name,
        )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("rollouts cancelled")
    ax.set_title("rollouts cancelled so far (timeout or off-policy), at each RL step's end")
    ax.legend()
    ax.grid(alpha=0.3)
    return _png(fig)


def _step_plot(arms: Sequence[ArmResult]) -> str | None:
    if not any(arm.runs and arm.runs[0].steps for arm in arms):
        return None
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 3.5))
    for arm in arms:
        steps = arm.runs[0].steps if arm.runs else []
        if steps:
            ax.plot([s["step"] for s in steps], [s["step_time_s"] for s in steps], label=arm.name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("RL step")
    ax.set_ylabel("step time (s)")
    ax.set_title("RL step time (first repeat)")
    ax.legend()
    ax.grid(alpha=0.3)
    return _png(fig)


def _worst_replica(ts: list[dict[str, Any]]) -> int | None:
    """The replica with the lowest query-weighted hit rate over the run (None: no queries)."""
    hits: dict[int, float] = {}
    queries: dict[int, float] = {}
    for r in ts:
        q = r.get("prefix_cache_queries")
        if r.get("hit_rate") is None or not q:
            continue
        i = int(r["replica"])
        hits[i] = hits.get(i, 0.0) + float(r["hit_rate"]) * float(q)
        queries[i] = queries.get(i, 0.0) + float(q)
    return min(queries, key=lambda i: hits[i] / queries[i]) if queries else None


def _series_plot(arms: Sequence[ArmResult], key: str, label: str) -> str | None:
    runs = [(arm, arm.runs[0].timeseries) for arm in arms if arm.runs and arm.runs[0].timeseries]
    values = [float(r[key]) for _, ts in runs for r in ts if r.get(key) is not None]
    if not runs or not values:
        return None
    lo, hi = np.percentile(values, [5, 95]).tolist()
    if hi - lo <= 0.02 * max(abs(hi), 1e-9):
        return None  # the same value 90 % of the time (a saturated busy fraction): flat
    cols = min(len(runs), 3)
    nrows = -(-len(runs) // cols)
    fig, axes = plt.subplots(
        nrows,
        cols,
        figsize=(_WIDTH_IN, 3.2 * nrows),
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    for ax, (arm, ts) in zip(axes.flat, runs, strict=False):
        replicas = sorted({int(r["replica"]) for r in ts})
        worst = _worst_replica(ts) if key == "hit_rate" else None
        for rep in replicas:
            rows = [r for r in ts if int(r["replica"]) == rep and r.get(key) is not None]
            name = f"replica {rep}" + (" (lowest hit rate)" if rep == worst else "")
            ax.plot(
                [r["t"] for r in rows],
                [r[key] for r in rows],
                label=name,
                lw=2.4 if rep == worst else 1,
                color="crimson" if rep == worst else None,
                zorder=3 if rep == worst else 2,
            )
        seed = f"seed {arm.runs[0].seed}" + (
            f", first of {len(arm.runs)} repeats" if len(arm.runs) > 1 else ""
        )
        ax.set_title(f"{arm.name} ({seed})", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("time (s)")
    for row in axes:
        row[0].set_ylabel(label)
    fig.suptitle(f"{label} per replica over time")
    fig.tight_layout()
    return _png(fig)


def _cdf_plot(arms: Sequence[ArmResult], key: str, label: str) -> str | None:
    data = [(arm.name, [x for r in arm.runs for x in r.samples.get(key, [])]) for arm in arms]
    data = [(n, v) for n, v in data if v]
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, 3.5))
    for name, values in data:
        xs = np.sort(np.asarray(values, dtype=float))
        ys = np.arange(1, len(xs) + 1) / len(xs)
        ax.plot(xs, ys, label=name)
    ax.set_xscale("log" if all(min(v) > 0 for _, v in data) else "linear")
    ax.set_xlabel(label)
    ax.set_ylabel("fraction")
    ax.set_title(f"CDF of {label}")
    ax.legend()
    ax.grid(alpha=0.3)
    return _png(fig)


def render_plots(arms: Sequence[ArmResult]) -> list[tuple[str, str]]:
    """All plots as ``(title, base64 PNG)`` pairs; plots without data are skipped."""
    out: list[tuple[str, str]] = []
    step = _step_plot(arms)
    if step:
        out.append(("RL step time", step))
    cancelled = _cancelled_plot(arms)
    if cancelled:
        out.append(("Rollouts cancelled over time", cancelled))
    for key, label in _SERIES:
        png = _series_plot(arms, key, label)
        if png:
            out.append((label, png))
    for key, label in (
        ("group_latency_s", "GRPO group latency (s)"),
        ("ttft_s", "TTFT (s)"),
        ("session_latency_s", "session latency (s)"),
    ):
        png = _cdf_plot(arms, key, label)
        if png:
            out.append((label, png))
    return out


def _table_html(arms: Sequence[ArmResult]) -> str:
    head = "".join(
        f"<th>{html.escape(a.name)}<br><small>{html.escape(a.policy)}</small></th>" for a in arms
    )
    rows = []
    base_arm = arms[0] if arms else None
    base = base_arm.metrics if base_arm else {}
    for path, label, direction in visible_metrics(list(arms)):
        values = [shown_value(a.metrics, path) for a in arms]
        cells = []
        for i, (arm, v) in enumerate(zip(arms, values, strict=True)):
            cell = html.escape(format_value(v))
            ci = get_path(arm.intervals, path) if v is not None else None
            if isinstance(ci, list) and len(ci) == 2:
                cell += f" <small>[{format_value(ci[0])}, {format_value(ci[1])}]</small>"
            note = runs_note(arm, path) if v is not None else None
            if note is not None:
                cell += f" <small>{note}</small>"
            delta = delta_text(v, shown_value(base, path), path) if i and base_arm else None
            if delta is not None and base_arm is not None:
                verdict = better(arm, base_arm, path, direction)
                cls = "good" if verdict > 0 else "bad" if verdict < 0 else ""
                cell += f' <span class="{cls}">({html.escape(delta)})</span>'
            cells.append(f"<td>{cell}</td>")
        rows.append(f"<tr><th>{html.escape(label)}</th>{''.join(cells)}</tr>")
    return f"<table><tr><th>metric</th>{head}</tr>{''.join(rows)}</table>"


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
th:first-child{text-align:left}.good{color:#080}.bad{color:#b00}img{width:100%}
pre{background:#f6f6f6;padding:1em;overflow:auto}
"""


def write_report(
    path: Path,
    title: str,
    arms: Sequence[ArmResult],
    experiment_toml: str,
    notes: str = "",
    *,
    verdict: Verdict | None = None,
) -> Path:
    """Write the self-contained HTML report to ``path`` and return it: the verdict (when
    given) first, then the table, the plots, the experiment and the glossary."""
    from sessionroute.experiments.verdict_text import glossary_html, verdict_html

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if notes:
        parts.append(f"<p>{html.escape(notes)}</p>")
    if verdict is not None:
        parts.append(verdict_html(verdict))
    parts.append("<h2>Comparison</h2>")
    parts.append(_table_html(arms))
    parts.append(
        "<p><small>Δ is the change from the first arm: a difference for shares and rates in "
        "[0, 1] (hit rates, timed-out share), else a percentage. With repeats, cells show mean "
        "[95 % interval]; green/red mark a better/worse value whose interval does not overlap "
        "the first arm's, on metrics with a clear better direction only (one repeat colours "
        "nothing).</small></p>"
    )
    for plot_title, png in render_plots(arms):
        parts.append(f"<h2>{html.escape(plot_title)}</h2><img src='data:image/png;base64,{png}'>")
    parts.append(f"<h2>Experiment</h2><pre>{html.escape(experiment_toml)}</pre>")
    parts.append(glossary_html() + "</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
