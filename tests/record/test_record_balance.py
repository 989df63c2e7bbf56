"""Balance, thrash and timeout keys of the results builder, on hand-filled records."""

from __future__ import annotations

import math

import pytest

from sessionroute.record import (
    ArmRecord,
    Recorder,
    ReplicaRecord,
    SessionLifecycle,
    arm_metrics,
    hit_dips,
)


def _replica(i: int, running: float, out: int, kv: float, hits: float) -> ReplicaRecord:
    return ReplicaRecord(
        index=i,
        url=f"http://r{i}",
        prefix_cache_hits=hits,
        prefix_cache_queries=1000.0,
        preemptions=0,
        busy_fraction=1.0,
        busy_seconds=100.0,
        output_tokens=out,
        mean_running=running,
        kv_usage=kv,
    )


def _row(t: float, replica: int, hit: float | None, q: float) -> dict[str, object]:
    return {
        "t": t,
        "replica": replica,
        "hit_rate": hit,
        "prefix_cache_queries": q,
        "interval_s": 10.0,
    }


def _arm(timeseries: list[dict[str, object]], workload: dict[str, object]) -> ArmRecord:
    return ArmRecord(
        recorder=Recorder(),
        replicas=[
            _replica(0, 200.0, 3000, 0.9, 950.0),
            _replica(1, 50.0, 1000, 0.3, 400.0),
            _replica(2, 50.0, 1000, 0.3, 900.0),
        ],
        duration_s=100.0,
        simulated=True,
        wall_s=1.0,
        ideal_hit_rate=0.9,
        block_size=16,
        prefix_cache_resets=0,
        sessions=SessionLifecycle(0, 0, 0, 0, 0, 0),
        workload=workload,
        timeseries=timeseries,
    )


def test_balance_keys_see_what_busy_time_cannot() -> None:
    """Every replica busy all the time (busy CoV 0) while one carries 4x the others."""
    m = arm_metrics(_arm([], {"rollouts_timeout": 3, "rollouts_started": 60}))
    assert m["load_imbalance_cov"] == 0.0
    # running 200/50/50: mean 100, population std sqrt((100^2 + 2 * 50^2) / 3)
    assert m["running_cov"] == pytest.approx(math.sqrt(15000 / 3) / 100)
    mean = 5000 / 3
    sq = (3000 - mean) ** 2 + 2 * (1000 - mean) ** 2
    assert m["output_tokens_cov"] == pytest.approx(math.sqrt(sq / 3) / mean)
    assert m["kv_usage_cov"] == pytest.approx(math.sqrt((0.16 + 2 * 0.04) / 3) / 0.5)
    assert m["worst_replica_hit_rate"] == pytest.approx(0.4)
    assert m["rollouts_timed_out"] == 3
    assert m["rollouts_timed_out_share"] == pytest.approx(0.05)
    # no time series: the thrash keys are unmeasured, not zero
    assert m["thrash_share"] is None and m["worst_window_hit_rate"] is None


def test_timeout_keys_are_none_for_a_workload_without_rollouts() -> None:
    m = arm_metrics(_arm([], {"kind": "trace"}))
    assert m["rollouts_timed_out"] is None and m["rollouts_timed_out_share"] is None


def test_a_replica_interval_below_half_the_fleets_hit_rate_is_thrash() -> None:
    rows = [
        _row(10.0, 0, 0.9, 1000),
        _row(10.0, 1, 0.9, 1000),
        _row(10.0, 2, 0.9, 1000),
        # fleet (0.9 + 0.9 + 0.05) / 3 = 0.617; 0.05 < half of it
        _row(20.0, 0, 0.9, 1000),
        _row(20.0, 1, 0.9, 1000),
        _row(20.0, 2, 0.05, 1000),
        # a replica with 5 tokens queried is too thin to judge, even at hit rate 0
        _row(30.0, 0, 0.9, 1000),
        _row(30.0, 1, 0.9, 1000),
        _row(30.0, 2, 0.0, 5),
        # no queries at all in an interval: counted as sampled time, never as thrash
        _row(40.0, 0, None, 0),
        _row(40.0, 1, None, 0),
        _row(40.0, 2, None, 0),
    ]
    d = hit_dips(rows)
    assert d.worst_window_hit_rate == pytest.approx(0.05)
    assert d.thrash_replica_seconds == pytest.approx(10.0)
    assert d.thrash_share == pytest.approx(10.0 / 120.0)
    m = arm_metrics(_arm(rows, {}))
    assert m["thrash_share"] == pytest.approx(10.0 / 120.0)


def test_rows_without_query_counts_give_no_dips() -> None:
    d = hit_dips([{"t": 1.0, "replica": 0, "hit_rate": 0.1}])
    assert d.worst_window_hit_rate is None and d.thrash_replica_seconds == 0.0


def test_cov_is_undefined_when_every_replica_measured_zero() -> None:
    """A live arm whose scrapes never saw a running request: the running CoV is unknown (the
    table prints -), not 0.000 as if the replicas were perfectly balanced."""
    from sessionroute.record.balance import cov_of

    assert cov_of([0.0, 0, 0.0]) is None
    assert cov_of([1.0, None, 1.0]) is None and cov_of([]) is None
    assert cov_of([2.0, 2.0]) == 0.0
    assert cov_of([1.0, 3.0]) == pytest.approx(0.5)
