"""The comparison table printed at the end of ``sessionroute compare`` (rich).

Each metric is a row, each arm a column. A cell is ``mean [lo, hi] (Δ)``: the 95 % interval
(Student t, clipped to the metric's domain) when the arm ran two or more repeats, and the change
against the first arm (a difference for shares and rates in [0, 1], else a percentage). A cell
is coloured only when the metric has a clear better direction (:data:`TABLE_METRICS`) and the
two arms' intervals do not overlap; a single repeat colours nothing (one seed cannot tell a
difference from noise). Latencies whose direction depends on the trade-off (ITL, turn latency)
and times of the run itself are never coloured. When the arms do not fit the console's width the
table is printed in parts, each with the first arm for reference; no cell or name is ever broken
inside a word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sessionroute.experiments.results import ArmResult, get_path, metric_domain

__all__ = [
    "TABLE_METRICS",
    "better",
    "comparison_tables",
    "delta_text",
    "format_value",
    "print_comparison",
    "repeats_warning",
    "runs_note",
    "shown_value",
    "visible_metrics",
]

# (metric path, label, better direction: +1 higher, -1 lower, 0 no clear direction)
TABLE_METRICS: tuple[tuple[str, str, int], ...] = (
    ("output_tokens_per_s", "output tok/s", +1),
    ("sessions_per_s", "sessions/s", +1),
    ("sessions_completed", "sessions completed", +1),
    ("sessions_cancelled", "sessions cancelled", -1),
    ("rollouts_timed_out", "rollouts timed out", -1),
    ("rollouts_timed_out_share", "timed-out share", -1),
    ("step_time_s.mean", "RL step mean (s)", -1),
    ("step_time_s.p50", "RL step p50 (s)", -1),
    ("step_time_s.max", "RL step max (s)", -1),
    ("group_latency_s.p50", "group latency p50 (s)", -1),
    ("group_latency_s.p90", "group latency p90 (s)", -1),
    ("group_latency_s.max", "group latency max (s)", -1),
    ("prefix_cache_hit_rate", "hit rate", +1),
    ("worst_replica_hit_rate", "worst replica hit", +1),
    ("worst_window_hit_rate", "worst 10 s hit", +1),
    ("thrash_share", "thrash share", -1),
    ("preemptions", "preemptions", -1),
    ("running_cov", "running CoV", -1),
    ("output_tokens_cov", "output tokens CoV", -1),
    ("kv_usage_cov", "KV usage CoV", -1),
    ("slo_goodput", "SLO goodput", +1),
    ("ttft_s.p50", "TTFT p50 (s)", 0),
    ("ttft_s.p99", "TTFT p99 (s)", -1),
    ("itl_s.p50", "ITL p50 (s)", 0),
    ("turn_latency_s.p50", "turn latency p50 (s)", 0),
    ("session_latency_s.p50", "session latency p50 (s)", 0),
    ("sessions_repinned", "re-pins", 0),
    ("sessions_leaked", "sessions leaked", -1),
    ("ideal_hit_rate", "ideal hit (inf. cache)", 0),
    ("simulated_seconds", "simulated time (s)", 0),
    ("wall_seconds", "wall time (s)", 0),
)


def format_value(v: Any) -> str:
    """Compact human formatting of a metric value."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.2f}"
        return f"{v:.3f}"
    return str(v)


def _interval(arm: ArmResult, path: str) -> tuple[float, float] | None:
    ci = get_path(arm.intervals, path)
    if isinstance(ci, list) and len(ci) == 2:
        return float(ci[0]), float(ci[1])
    return None


def better(arm: ArmResult, base: ArmResult, path: str, direction: int) -> int:
    """+1 when ``arm`` is better than ``base`` on ``path`` beyond noise, -1 when worse, 0 when
    the metric has no direction, either arm has no interval (one repeat) or the intervals
    overlap."""
    if not direction:
        return 0
    a, b = _interval(arm, path), _interval(base, path)
    if a is None or b is None:
        return 0
    if a[0] > b[1]:
        return direction
    if a[1] < b[0]:
        return -direction
    return 0


def shown_value(metrics: Mapping[str, Any], path: str) -> Any:
    """The value at ``path`` as the table shows it: None (printed ``-``) for a statistic of a
    summary that measured nothing (``count`` 0: e.g. group latency in a run too short for a
    GRPO group to finish, whose statistics are None), else the value itself."""
    parent, _, _ = path.rpartition(".")
    if parent and get_path(metrics, f"{parent}.count") == 0:
        return None
    return get_path(metrics, path)


def _cell(
    arm: ArmResult, base: ArmResult, path: str, direction: int, first: bool, two_lines: bool
) -> Text:
    v = shown_value(arm.metrics, path)
    text = Text(format_value(v))
    delta = None if first else delta_text(v, shown_value(base.metrics, path), path)
    if delta is not None:
        verdict = better(arm, base, path, direction)
        style = "green" if verdict > 0 else "red" if verdict < 0 else ""
        text.append(f" ({delta})", style=style)
    ci = _interval(arm, path) if v is not None else None
    sep = "\n" if two_lines else " "
    if ci is not None:
        text.append(f"{sep}[{format_value(ci[0])}, {format_value(ci[1])}]", style="dim")
    note = runs_note(arm, path) if v is not None else None
    if note is not None:
        text.append(f"{sep}{note}", style="dim")
    return text


def delta_text(v: Any, base: Any, path: str = "") -> str | None:
    """The change from the first arm's value: ``"+12.5%"``; the difference itself for a share
    or rate in [0, 1] (``path``'s :func:`~sessionroute.experiments.results.metric_domain`: a hit
    rate from 0.051 to 0.806 reads ``"+0.755"``, not ``"+1472.8%"``) and when the first arm's
    value is 0 (``"+701"``: no percentage of 0, but a change all the same, to be coloured like
    any other); None when either is not a number or they are equal at 0."""
    if not isinstance(v, int | float) or not isinstance(base, int | float):
        return None
    if isinstance(v, bool) or isinstance(base, bool):
        return None
    if path and metric_domain(path) == (0.0, 1.0):
        if v == base:
            return None if not v else "+0.000"
        return f"{float(v) - float(base):+.3f}"
    if base:
        return f"{(float(v) - float(base)) / abs(float(base)) * 100.0:+.1f}%"
    if not v:
        return None
    return ("+" if v > 0 else "-") + format_value(abs(v))


def runs_note(arm: ArmResult, path: str) -> str | None:
    """``"(1 of 3 runs)"`` when the value at ``path`` is a mean over only the runs whose
    summary measured something (``runs_measured`` of :func:`aggregate_metrics`), else None."""
    parent, _, _ = path.rpartition(".")
    measured = get_path(arm.metrics, f"{parent}.runs_measured") if parent else None
    if isinstance(measured, int) and measured < len(arm.runs):
        return f"({measured} of {len(arm.runs)} runs)"
    return None


def _width(text: Text) -> int:
    return max(len(line) for line in text.plain.split("\n"))


def _header(name: str, width: int) -> str:
    """``name`` broken at underscores into lines of at most ``width`` (a part longer than
    ``width`` stays whole: never broken inside a word)."""
    lines: list[str] = []
    for part in name.split("_"):
        if lines and len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += "_" + part
        else:
            lines.append(part if not lines else "_" + part)
    return "\n".join(lines)


def visible_metrics(arms: Sequence[ArmResult]) -> list[tuple[str, str, int]]:
    """The rows of :data:`TABLE_METRICS` that have data (RL rows only for RL workloads, the
    SLO goodput only for the others: a serving SLO says little of an agent's rollout)."""
    rl = any(get_path(a.metrics, "steps") for a in arms)
    return [
        row
        for row in TABLE_METRICS
        if (rl or not row[0].startswith(("step_time_s", "group_latency_s", "rollouts_")))
        and not (rl and row[0] == "slo_goodput")
        and any(shown_value(a.metrics, row[0]) is not None for a in arms)
    ]


def comparison_tables(arms: Sequence[ArmResult], width: int = 10_000) -> list[Table]:
    """The comparison as one table, or several (each with the first arm) when the arms do not
    fit in ``width`` columns; a narrow table puts each interval under its value."""
    if not arms:
        return []
    base = arms[0]
    rows = visible_metrics(arms)
    label_w = max(len("metric"), *(len(lbl) for _, lbl, _ in rows))

    def build(two_lines: bool) -> tuple[dict[str, list[Text]], dict[str, int]]:
        cells = {
            a.name: [_cell(a, base, p, d, i == 0, two_lines) for p, _, d in rows]
            for i, a in enumerate(arms)
        }
        widths = {
            a.name: max(
                max((_width(c) for c in cells[a.name]), default=1),
                max(len(p) for p in a.name.split("_")) + 1,
            )
            for a in arms
        }
        return cells, widths

    cells, widths = build(False)
    # a rich table with a box: one rule per column plus one, and one space padding each side
    if 1 + (label_w + 3) + sum(w + 3 for w in widths.values()) > width:
        cells, widths = build(True)
    groups: list[list[ArmResult]] = []
    used = 0
    for a in arms[1:]:
        w = widths[a.name] + 3
        if not groups or used + w > width:
            groups.append([base])
            used = 1 + (label_w + 3) + widths[base.name] + 3
        groups[-1].append(a)
        used += w
    if not groups:
        groups = [[base]]
    repeats = min(len(a.runs) for a in arms)
    caption = (
        f"(Δ) vs {base.name} (shares: difference; others: %); green/red: better/worse with "
        "95 % intervals apart"
        if repeats >= 2
        else f"(Δ) vs {base.name} (shares: difference; others: %); one repeat: no intervals, "
        "nothing coloured"
    )
    tables = []
    for k, group in enumerate(groups):
        title = "sessionroute compare" + (f" ({k + 1}/{len(groups)})" if len(groups) > 1 else "")
        table = Table(title=title, caption=caption, show_lines=False)
        table.add_column("metric", style="bold", no_wrap=True, min_width=label_w)
        for a in group:
            w = widths[a.name]
            table.add_column(_header(a.name, w), justify="right", no_wrap=True, min_width=w)
        for j, (_, label, _) in enumerate(rows):
            table.add_row(label, *(cells[a.name][j] for a in group))
        tables.append(table)
    return tables


def repeats_warning(arms: Sequence[ArmResult]) -> str | None:
    """A warning when arms ran fewer than 3 repeats (None otherwise)."""
    n = min((len(a.runs) for a in arms), default=0)
    if n >= 3 or not arms:
        return None
    if n == 1:
        return (
            "one repeat per arm: no intervals, and differences of a few percent can be seed "
            "noise; run --repeats 3 (or more) before choosing a policy"
        )
    return (
        "2 repeats per arm: 95 % intervals from 2 runs are wide (Student t quantile 12.7, "
        "4.3 with 3 runs); run --repeats 3 (or more) before choosing a policy"
    )


def print_comparison(arms: Sequence[ArmResult], console: Console) -> None:
    """Print :func:`comparison_tables` to ``console`` at its width, then any repeats warning."""
    for table in comparison_tables(arms, console.width):
        console.print(table)
    warning = repeats_warning(arms)
    if warning:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
