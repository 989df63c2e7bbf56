"""Aggregation over repeats and the results document schema."""

from __future__ import annotations

import pytest

from sessionroute.experiments.results import (
    SCHEMA_ID,
    ArmResult,
    RunOutput,
    aggregate_metrics,
    mean_ci95,
    results_document,
)


def test_mean_ci95_known_values() -> None:
    m, lo, hi = mean_ci95([1.0, 2.0, 3.0])
    assert m == pytest.approx(2.0)
    # t_{0.975,2} = 4.303, s = 1, n = 3 -> half width 4.303 / sqrt(3)
    assert hi - m == pytest.approx(4.303 / 3**0.5, rel=1e-6)
    assert lo == pytest.approx(2 * m - hi)
    assert mean_ci95([5.0]) == (5.0, 5.0, 5.0)
    with pytest.raises(ValueError):
        mean_ci95([])


def test_aggregate_nested_and_lists() -> None:
    runs = [
        {"a": 1.0, "s": {"p50": 2.0}, "per_replica": [{"x": 1.0}], "name": "k"},
        {"a": 3.0, "s": {"p50": 4.0}, "per_replica": [{"x": 3.0}], "name": "k"},
    ]
    means, cis = aggregate_metrics(runs)
    assert means["a"] == pytest.approx(2.0)
    assert means["s"]["p50"] == pytest.approx(3.0)
    assert means["per_replica"][0]["x"] == pytest.approx(2.0)
    assert means["name"] == "k"
    assert cis["a"][0] < 2.0 < cis["a"][1]


def test_results_document_shape() -> None:
    arm = ArmResult("a", "random", {}, [RunOutput(seed=1, metrics={"sessions_per_s": 2.0})])
    doc = results_document({"name": "x"}, [arm])
    assert doc["schema"] == SCHEMA_ID
    assert doc["arms"][0]["metrics"]["sessions_per_s"] == 2.0
    assert doc["arms"][0]["repeats"][0]["seed"] == 1
    assert doc["arms"][0]["intervals"] == {}


def test_intervals_are_clipped_to_each_metrics_domain() -> None:
    """Two far-apart repeats: the raw Student-t interval of a hit rate leaves [0, 1] and that
    of a count goes below 0; the reported ones stay inside the domain."""
    runs = [
        {"prefix_cache_hit_rate": 0.8, "preemptions": 0, "ttft_s": {"p50": 0.1}},
        {"prefix_cache_hit_rate": 0.99, "preemptions": 50, "ttft_s": {"p50": 2.0}},
    ]
    _, cis = aggregate_metrics(runs)
    assert cis["prefix_cache_hit_rate"][1] == 1.0 and cis["prefix_cache_hit_rate"][0] < 0.8
    assert cis["preemptions"][0] == 0.0 and cis["preemptions"][1] > 50
    assert cis["ttft_s"]["p50"][0] == 0.0
    # the raw interval really did leave the domain (the clip is doing the work)
    _m, _lo, hi = mean_ci95([0.8, 0.99])
    assert hi > 1.0 and mean_ci95([0.0, 50.0])[1] < 0.0


def test_a_summary_that_measured_nothing_is_left_out_of_the_mean() -> None:
    """Three repeats, one GRPO group finished in one of them only: the group latency is that
    run's value, not a third of it (the other two summaries hold zeros with count 0)."""
    empty = {"count": 0, "mean": 0.0, "p50": 0.0}
    runs: list[dict[str, object]] = [
        {"group_latency_s": empty, "a": 1.0},
        {"group_latency_s": {"count": 4, "mean": 300.0, "p50": 366.4}, "a": 2.0},
        {"group_latency_s": dict(empty), "a": 3.0},
    ]
    means, cis = aggregate_metrics(runs)
    assert means["group_latency_s"]["p50"] == pytest.approx(366.4)
    assert means["group_latency_s"]["runs_measured"] == 1
    assert means["group_latency_s"]["count"] == pytest.approx(4 / 3)
    assert "group_latency_s" not in cis  # one measured run: no interval
    both: list[dict[str, object]] = [
        runs[1],
        {"group_latency_s": {"count": 2, "mean": 100.0, "p50": 166.4}},
        runs[0],
    ]
    means, cis = aggregate_metrics(both)
    assert means["group_latency_s"]["p50"] == pytest.approx(266.4)
    assert cis["group_latency_s"]["p50"][0] < 266.4 < cis["group_latency_s"]["p50"][1]


def test_results_json_says_null_for_a_summary_that_measured_nothing() -> None:
    """No GRPO group finished in any run: results.json gives null statistics, count 0 and
    runs_measured 0, not 0.0 s with a [0, 0] interval (which W&B would log as 0 s)."""
    from sessionroute.record.recorder import summary

    assert summary([])["p50"] is None and summary([])["count"] == 0
    runs = [RunOutput(seed=s, metrics={"group_latency_s": summary([])}) for s in (0, 1)]
    doc = results_document({"name": "x"}, [ArmResult("a", "random", {}, runs)])
    arm = doc["arms"][0]
    assert arm["metrics"]["group_latency_s"]["p50"] is None
    assert arm["metrics"]["group_latency_s"]["runs_measured"] == 0
    assert "group_latency_s" not in arm["intervals"]


def test_a_cov_of_shares_is_not_clipped_to_one() -> None:
    from sessionroute.experiments.results import metric_domain

    assert metric_domain("kv_usage_cov") == (0.0, float("inf"))
    assert metric_domain("per_replica.kv_usage") == (0.0, 1.0)
    assert metric_domain("worst_window_hit_rate") == (0.0, 1.0)
