"""The one results builder (``sessionroute.record.arm_metrics``) on hand-filled records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sessionroute.record import (
    ArmRecord,
    Recorder,
    ReplicaRecord,
    SessionLifecycle,
    arm_metrics,
)


def _recorder() -> Recorder:
    rec = Recorder()
    rec.requests_submitted = 4
    rec.request_done(0.5, 0.01, 100, 2.0, 0.1, 1000, 600)
    rec.request_done(1.5, 0.03, 1, 4.0, 0.3, 3000, 0)
    rec.counts["sessions_completed"] = 2
    rec.counts["session_moves"] = 1
    rec.session_latency_s += [10.0, 30.0]
    rec.step(1, 50.0, 40.0)
    rec.ideal_work_s = 9.0
    return rec


def _replica(i: int, busy_s: float | None, busy_fraction: float | None) -> ReplicaRecord:
    return ReplicaRecord(
        index=i,
        url=f"http://r{i}",
        prefix_cache_hits=300.0 * (i + 1),
        prefix_cache_queries=1000.0 * (i + 1),
        preemptions=i,
        busy_fraction=busy_fraction,
        busy_seconds=busy_s,
        requests=i + 1,
        extra={"mine": i},
    )


def _arm(**over: Any) -> ArmRecord:
    fields: dict[str, Any] = {
        "recorder": _recorder(),
        "replicas": [_replica(0, 20.0, 0.2), _replica(1, 60.0, 0.6), _replica(2, 40.0, 0.4)],
        "duration_s": 100.0,
        "simulated": True,
        "wall_s": 4.0,
        "ideal_hit_rate": 0.75,
        "block_size": 16,
        "prefix_cache_resets": 2,
        "sessions": SessionLifecycle(5, 1, 2, 3, 0, 4),
        "workload": {"kind": "test"},
    }
    fields.update(over)
    return ArmRecord(**fields)


def test_shared_keys_are_computed_from_the_record() -> None:
    m = arm_metrics(_arm())
    assert m["sessions_completed"] == 2
    assert m["sessions_per_s"] == pytest.approx(0.02)
    assert m["output_tokens_per_s"] == pytest.approx(101 / 100)
    assert m["prompt_tokens_per_s"] == pytest.approx(4000 / 100)
    # token-weighted over replicas: (300 + 600 + 900) / (1000 + 2000 + 3000)
    assert m["prefix_cache_hit_rate"] == pytest.approx(0.3)
    assert m["preemptions"] == 0 + 1 + 2
    assert m["ttft_s"]["count"] == 2 and m["ttft_s"]["max"] == 1.5
    assert m["itl_s"]["count"] == 1  # the one-token request has no inter-token gap
    assert m["queue_time_s"]["max"] == pytest.approx(0.3)
    assert m["steps"] == 1 and m["step_time_s"]["p50"] == 40.0
    assert m["group_latency_s"]["count"] == 0
    assert (m["sessions_new"], m["sessions_released"], m["sessions_held_at_end"]) == (5, 3, 4)
    assert m["session_moves"] == 1
    assert m["requests_per_wall_second"] == pytest.approx(2 / 4.0)
    assert m["simulated_seconds"] == 100.0
    assert m["ideal_busy_seconds"] == pytest.approx(9.0 / 3)
    assert m["replicas"] == 3 and m["prefix_cache_resets"] == 2
    assert list(m)[-1] == "workload" and m["workload"] == {"kind": "test"}
    json.dumps(m, allow_nan=False)


def test_per_replica_rows_carry_the_drivers_own_keys() -> None:
    rows = arm_metrics(_arm())["per_replica"]
    assert [r["replica"] for r in rows] == [0, 1, 2]
    assert rows[1]["hit_rate"] == pytest.approx(0.3)
    assert rows[1]["busy_seconds"] == 60.0 and rows[1]["busy_fraction"] == 0.6
    assert [r["mine"] for r in rows] == [0, 1, 2]
    assert rows[0]["mean_running"] is None  # not given: not measured


def test_imbalance_uses_busy_seconds_or_else_the_measured_fractions() -> None:
    exact = arm_metrics(_arm())
    assert exact["max_over_mean_busy"] == pytest.approx(60.0 / 40.0)
    sampled = [_replica(0, None, 0.2), _replica(1, None, 0.6), _replica(2, None, None)]
    m = arm_metrics(_arm(replicas=sampled))
    assert m["max_over_mean_busy"] == pytest.approx(0.6 / 0.4)
    assert m["load_imbalance_cov"] == pytest.approx(0.5)  # std 0.2 / mean 0.4
    none = arm_metrics(_arm(replicas=[_replica(0, None, None)]))
    assert none["load_imbalance_cov"] is None and none["max_over_mean_busy"] is None


def test_unmeasured_keys_are_none_and_extras_are_appended() -> None:
    arm = _arm(
        simulated=False,
        sessions=None,
        unmeasured=frozenset({"queue_time_s", "ttft_s", "ideal_busy_seconds"}),
        extra={"requests_failed": 3},
    )
    m = arm_metrics(arm)
    assert m["queue_time_s"] is None and m["ttft_s"] is None and m["ideal_busy_seconds"] is None
    assert m["itl_s"] is not None
    assert m["simulated_seconds"] is None
    assert m["sessions_new"] is None and m["sessions_leaked"] is None
    assert m["requests_failed"] == 3


def test_an_unknown_unmeasured_key_is_refused() -> None:
    with pytest.raises(ValueError, match="ttft"):
        arm_metrics(_arm(unmeasured=frozenset({"ttft"})))
