"""The comparison table printed at the end of ``sessionroute compare`` (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from sessionroute.experiments.results import ArmResult, get_path

__all__ = [
    "TABLE_METRICS",
    "comparison_table",
    "format_value",
    "print_comparison",
    "visible_metrics",
]

# (metric path, label, higher is better)
TABLE_METRICS: tuple[tuple[str, str, bool], ...] = (
    ("sessions_completed", "sessions completed", True),
    ("sessions_cancelled", "sessions cancelled", False),
    ("sessions_per_s", "sessions/s", True),
    ("output_tokens_per_s", "output tokens/s", True),
    ("prefix_cache_hit_rate", "prefix-cache hit rate", True),
    ("preemptions", "preemptions", False),
    ("step_time_s.p50", "RL step time p50 (s)", False),
    ("step_time_s.max", "RL step time max (s)", False),
    ("ttft_s.p50", "TTFT p50 (s)", False),
    ("ttft_s.p99", "TTFT p99 (s)", False),
    ("itl_s.p50", "ITL p50 (s)", False),
    ("turn_latency_s.p50", "turn latency p50 (s)", False),
    ("session_latency_s.p50", "session latency p50 (s)", False),
    ("load_imbalance_cov", "busy-time CoV", False),
    ("max_over_mean_busy", "max/mean busy", False),
    ("sessions_repinned", "re-pins (turns moved)", False),
    ("sessions_leaked", "sessions leaked", False),
    ("ideal_hit_rate", "ideal hit rate (infinite cache)", True),
    ("simulated_seconds", "simulated time (s)", False),
    ("wall_seconds", "wall time (s)", False),
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


def comparison_table(arms: list[ArmResult]) -> Table:
    """Each metric a row; each arm a column with its delta against the first arm.

    With two or more repeats, cells show ``mean [lo, hi]`` (95 % interval).
    """
    first = arms[0].name if arms else ""
    table = Table(
        title="sessionroute compare",
        caption=f"(Δ) is relative to {first}; green is better",
        show_lines=False,
    )
    table.add_column("metric", style="bold", no_wrap=True)
    for arm in arms:
        table.add_column(arm.name, justify="right", overflow="fold")
    base = arms[0].metrics if arms else {}
    for path, label, higher_better in visible_metrics(arms):
        values = [get_path(a.metrics, path) for a in arms]
        row = [label]
        for i, (arm, v) in enumerate(zip(arms, values, strict=True)):
            cell = format_value(v)
            ci = get_path(arm.intervals, path)
            if isinstance(ci, list) and len(ci) == 2:
                cell += f" [{format_value(ci[0])}, {format_value(ci[1])}]"
            b = get_path(base, path)
            if i > 0 and isinstance(v, int | float) and isinstance(b, int | float) and b:
                delta = (float(v) - float(b)) / abs(float(b)) * 100.0
                good = (delta > 0) == higher_better
                color = (
                    "green"
                    if good and abs(delta) >= 0.5
                    else "red"
                    if abs(delta) >= 0.5
                    else "white"
                )
                cell += f" [{color}]({delta:+.1f}%)[/{color}]"
            row.append(cell)
        table.add_row(*row)
    return table


def visible_metrics(arms: list[ArmResult]) -> list[tuple[str, str, bool]]:
    """The rows of :data:`TABLE_METRICS` that have data (RL rows only for RL workloads)."""
    rl = any(get_path(a.metrics, "steps") for a in arms)
    return [
        row
        for row in TABLE_METRICS
        if (rl or not row[0].startswith("step_time_s"))
        and any(get_path(a.metrics, row[0]) is not None for a in arms)
    ]


def print_comparison(arms: list[ArmResult], console: Console) -> None:
    """Print :func:`comparison_table` to ``console``."""
    console.print(comparison_table(arms))
