"""A live arm and a simulated arm of one experiment report through the same builder.

Both have every shared key (``sessionroute.record.arm_metrics``); each adds only its documented
own keys, and the per-replica rows differ only in the driver's own columns.
"""

from __future__ import annotations

from typing import Any

from sessionroute.experiments.live.runner import run_live_experiment
from sessionroute.experiments.runner import run_experiment
from sessionroute.experiments.sim_arm import simulate_arm
from sessionroute.experiments.spec import parse_experiment

SIM_ONLY = {
    "requests_rejected",
    "requests_retried",
    "requests_failed_over",
    "no_worker_available",
    "events",
    "turns_in_flight_at_end",
    "router_in_flight_at_end",
    # the simulated router's admission queue (live: the router's sessionroute_admission metric)
    "admission_placed_after_wait",
    "admission_refused_timeout",
    "admission_refused_full",
    # the policy's own counters (Policy.counters; not exported by serve yet)
    "policy_counters",
}
LIVE_ONLY = {"sessions_per_replica", "requests_failed", "run_seconds", "errors", "live"}
SIM_REPLICA_ONLY = {"engine_steps", "up", "drained"}
LIVE_REPLICA_ONLY = {"sessions", "scrape_ok"}


def _experiment() -> dict[str, Any]:
    return {
        "name": "shapes",
        "workload": {
            "kind": "toy",
            "options": {
                "sessions": 4, "arrival_rate_per_s": 5.0, "turns_p50": 2, "turns_p90": 3,
                "turns_max": 3, "first_p50": 100, "first_p90": 200, "output_p50": 16,
                "output_p90": 32, "think_p50_s": 0.5, "think_p90_s": 1.0,
            },
        },
        "live": {"time_scale": 10, "router": "sessionroute-inprocess", "stream": True},
        "arms": [{"policy": "sticky_least_loaded"}],
    }  # fmt: skip


def test_live_and_simulated_metrics_have_the_same_shape() -> None:
    spec = parse_experiment(_experiment(), env={})
    live = run_live_experiment(spec).results[0].metrics
    sim = run_experiment(spec, simulate_arm).results[0].metrics
    assert live["requests_failed"] == 0, live["errors"]
    assert set(sim) - set(live) == SIM_ONLY
    assert set(live) - set(sim) == LIVE_ONLY
    sim_row, live_row = set(sim["per_replica"][0]), set(live["per_replica"][0])
    assert sim_row - live_row == SIM_REPLICA_ONLY
    assert live_row - sim_row == LIVE_REPLICA_ONLY
    # the same workload, seed and ideal cache: the same requests and ideal bound
    assert live["requests_completed"] == sim["requests_completed"]
    assert live["ideal_hit_rate"] == sim["ideal_hit_rate"]
    # what a client cannot see is None live, measured in the simulator
    assert live["queue_time_s"] is None and sim["queue_time_s"]["count"] > 0
    assert live["ideal_busy_seconds"] is None and sim["ideal_busy_seconds"] > 0
    assert all(r["busy_seconds"] is None for r in live["per_replica"])
    assert live["ttft_s"]["count"] == live["requests_completed"]  # streamed
    assert live["sessions_released"] == sim["sessions_released"] == 4
