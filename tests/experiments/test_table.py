"""The comparison table: colour only beyond noise, readable at 80 columns."""

from __future__ import annotations

import io

from rich.console import Console

from sessionroute.experiments.results import ArmResult, RunOutput
from sessionroute.experiments.table import better, print_comparison, repeats_warning


def _arm(name: str, tok_s: list[float], wall: list[float]) -> ArmResult:
    runs = [
        RunOutput(
            seed=i,
            metrics={
                "output_tokens_per_s": v,
                "prefix_cache_hit_rate": 0.9,
                "wall_seconds": w,
                "steps": 0,
            },
        )
        for i, (v, w) in enumerate(zip(tok_s, wall, strict=True))
    ]
    return ArmResult(name, name, {}, runs)


def test_better_only_when_intervals_separate() -> None:
    base = _arm("consistent_hash", [100.0, 101.0, 99.0], [1.0, 1.0, 1.0])
    apart = _arm("a", [120.0, 121.0, 119.0], [1.0, 1.0, 1.0])
    overlap = _arm("b", [90.0, 130.0, 110.0], [1.0, 1.0, 1.0])
    single = _arm("c", [150.0], [1.0])
    assert better(apart, base, "output_tokens_per_s", +1) == 1
    assert better(base, apart, "output_tokens_per_s", +1) == -1
    assert better(overlap, base, "output_tokens_per_s", +1) == 0
    assert better(single, base, "output_tokens_per_s", +1) == 0  # one repeat: no verdict
    # no clear direction (wall time): never a verdict
    slow = _arm("d", [100.0, 100.0, 100.0], [9.0, 9.1, 9.2])
    assert better(slow, base, "wall_seconds", 0) == 0


def test_table_at_80_columns_never_breaks_a_word() -> None:
    names = [
        "consistent_hash",
        "sticky_least_loaded",
        "cache_aware",
        "consistent_hash_bounded_load",
        "power_of_two",
    ]
    arms = [_arm(n, [100.0 + i, 101.0 + i], [1.0, 2.0]) for i, n in enumerate(names)]
    buf = io.StringIO()
    print_comparison(arms, Console(file=buf, width=80, color_system=None))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for n in names:
        for part in n.split("_"):
            assert part in text  # every word whole somewhere in a header
    assert "consistent_h\n" not in text and "…" not in text
    assert "output tok/s" in text
    assert "2 repeats per arm" in text  # the warning below 3 repeats


def test_repeats_warning() -> None:
    assert repeats_warning([_arm("a", [1.0] * 3, [1.0] * 3)]) is None
    assert "one repeat" in (repeats_warning([_arm("a", [1.0], [1.0])]) or "")


def _rl_arm(name: str, groups: list[float]) -> ArmResult:
    from sessionroute.record.recorder import summary

    metrics = {
        "output_tokens_per_s": 100.0,
        "steps": 2,
        "step_time_s": summary([500.0, 520.0]),
        "group_latency_s": summary(groups),
    }
    return ArmResult(name, name, {}, [RunOutput(seed=0, metrics=metrics)])


def test_a_summary_that_measured_nothing_is_shown_as_a_dash_not_zero() -> None:
    """A run too short for any GRPO group to finish has group latency count 0 (its summary
    holds zeros): the table must not print 0.000 s as if the groups took no time."""
    from sessionroute.experiments.table import shown_value, visible_metrics

    empty = _rl_arm("consistent_hash", [])
    assert shown_value(empty.metrics, "group_latency_s.p50") is None
    assert shown_value(empty.metrics, "step_time_s.max") == 520.0
    paths = [p for p, _, _ in visible_metrics([empty, _rl_arm("b", [])])]
    assert "step_time_s.max" in paths and "group_latency_s.p50" not in paths

    some = _rl_arm("sticky_least_loaded", [900.0, 1100.0])
    buf = io.StringIO()
    print_comparison([empty, some], Console(file=buf, width=200, color_system=None))
    row = next(line for line in buf.getvalue().splitlines() if "group latency max" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1] == "-" and cells[2].startswith("1,100")


def test_a_mean_over_the_runs_that_measured_says_how_many_did() -> None:
    """Three repeats, GRPO groups finished in one: the cell shows that run's value and says it
    comes from 1 of 3 runs (the other two would have pulled the mean towards 0)."""
    from sessionroute.record.recorder import summary

    def run(seed: int, groups: list[float]) -> RunOutput:
        m = {"output_tokens_per_s": 100.0, "steps": 1, "group_latency_s": summary(groups)}
        return RunOutput(seed=seed, metrics=m)

    arm = ArmResult("a", "a", {}, [run(0, []), run(1, [300.0, 366.4]), run(2, [])])
    buf = io.StringIO()
    print_comparison([arm], Console(file=buf, width=200, color_system=None))
    row = next(line for line in buf.getvalue().splitlines() if "group latency max" in line)
    assert "366.4" in row and "(1 of 3 runs)" in row, row
    from sessionroute.experiments.report import _table_html

    assert "<small>(1 of 3 runs)</small>" in _table_html([arm])  # the HTML report says it too


def test_a_change_from_zero_is_shown_and_coloured() -> None:
    """0 -> 701 timed-out rollouts with intervals apart: no percentage of 0, but the change
    itself, red in the table and "bad" in the HTML (it was left blank and uncoloured)."""
    from sessionroute.experiments.report import _table_html
    from sessionroute.experiments.table import delta_text

    def arm(name: str, timeouts: list[int]) -> ArmResult:
        runs = [
            RunOutput(seed=i, metrics={"steps": 2, "rollouts_timed_out": t})
            for i, t in enumerate(timeouts)
        ]
        return ArmResult(name, name, {}, runs)

    base, worse = arm("cache_aware", [0, 0, 0]), arm("consistent_hash", [699, 701, 703])
    assert delta_text(701, 0.0) == "+701" and delta_text(0, 0) is None
    assert delta_text(-2.5, 0) == "-2.50" and delta_text(110.0, 100.0) == "+10.0%"
    buf = io.StringIO()
    print_comparison([base, worse], Console(file=buf, width=200, force_terminal=True))
    row = next(line for line in buf.getvalue().splitlines() if "timed out" in line)
    assert "(+701)" in row and "\x1b[31m" in row, row  # red: more timeouts are worse
    assert '<span class="bad">(+701)</span>' in _table_html([base, worse])
