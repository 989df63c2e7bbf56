"""Replica faults: down, up, slow, drain, add. Requests are re-placed, never lost."""

from __future__ import annotations

from typing import Any

from sessionroute.clock import ManualClock
from sessionroute.sim import SimSpec, run_simulation


def toy_run(faults: list[dict[str, Any]], policy: str = "sticky_least_loaded") -> dict[str, Any]:
    spec = SimSpec.model_validate({"workload": {"kind": "toy"}, "faults": faults})
    return run_simulation(spec, policy, seed=0, wall_clock=ManualClock()).metrics


def test_a_replica_going_down_mid_run_has_its_sessions_re_placed_and_loses_none() -> None:
    m = toy_run([{"at_s": 20.0, "replica": 0, "kind": "down"}])
    assert m["requests_failed_over"] > 0  # in-flight requests on replica 0 failed...
    assert m["requests_retried"] >= m["requests_failed_over"]  # ...and were retried
    assert m["sessions_repinned"] > 0  # their sessions moved (counted as re-pins)
    assert m["sessions_completed"] == 48  # none lost
    assert m["turns_in_flight_at_end"] == 0
    assert m["router_in_flight_at_end"] == 0  # every routed attempt completed exactly once
    assert m["requests_submitted"] == m["requests_completed"]
    assert m["per_replica"][0]["up"] is False


def test_consistent_hash_counts_moved_sessions_as_re_pins() -> None:
    m = toy_run([{"at_s": 20.0, "replica": 1, "kind": "down"}], policy="consistent_hash")
    assert m["sessions_repinned"] == m["session_moves"] > 0
    assert m["sessions_completed"] == 48


def test_a_replica_that_comes_back_serves_again_with_an_empty_cache() -> None:
    down_only = toy_run([{"at_s": 10.0, "replica": 2, "kind": "down"}])
    back = toy_run(
        [{"at_s": 10.0, "replica": 2, "kind": "down"}, {"at_s": 11.0, "replica": 2, "kind": "up"}]
    )
    assert back["sessions_completed"] == 48
    assert back["per_replica"][2]["up"] is True
    assert back["per_replica"][2]["requests"] > down_only["per_replica"][2]["requests"]


def test_with_every_replica_down_requests_wait_and_retry_until_one_returns() -> None:
    faults = [{"at_s": 5.0, "replica": i, "kind": "down"} for i in range(3)]
    faults.append({"at_s": 30.0, "replica": 1, "kind": "up"})
    m = toy_run(faults)
    assert m["no_worker_available"] > 0
    assert m["sessions_completed"] == 48
    assert m["turns_in_flight_at_end"] == 0


def test_a_drained_replica_takes_no_new_sessions_and_finishes_its_requests() -> None:
    m = toy_run([{"at_s": 0.0, "replica": 1, "kind": "drain"}])
    assert m["per_replica"][1]["requests"] == 0
    assert m["per_replica"][1]["drained"] is True
    assert m["sessions_completed"] == 48
    mid = toy_run([{"at_s": 15.0, "replica": 1, "kind": "drain"}])
    assert mid["requests_failed_over"] == 0  # draining fails nothing
    assert mid["sessions_repinned"] > 0
    assert mid["sessions_completed"] == 48


def test_an_added_replica_takes_new_sessions() -> None:
    m = toy_run([{"at_s": 5.0, "kind": "add"}])
    assert len(m["per_replica"]) == 4
    assert m["per_replica"][3]["requests"] > 0
    assert m["per_replica"][3]["url"] == "http://127.0.0.1:18004"
    assert m["sessions_completed"] == 48


def test_a_slow_replica_is_busier_for_the_same_work() -> None:
    base = toy_run([])
    slow = toy_run([{"at_s": 0.0, "replica": 0, "kind": "slow", "factor": 4.0}])
    r0_base, r0_slow = base["per_replica"][0], slow["per_replica"][0]
    per_token_base = r0_base["busy_seconds"] / max(1, r0_base["output_tokens"])
    per_token_slow = r0_slow["busy_seconds"] / max(1, r0_slow["output_tokens"])
    assert per_token_slow > 2.0 * per_token_base
    assert slow["sessions_completed"] == 48


def test_a_hung_replica_is_given_up_by_its_health_checks_and_loses_nothing() -> None:
    """A replica that hangs (accepts, never answers) holds its requests until the router's
    health checks fail it: then they are placed again (the core's worker-lost path) and every
    session completes. With checks every 2 s the hang costs seconds, not the run."""
    faults = [{"at_s": 20.0, "replica": 0, "kind": "hang"}]
    router = {"health_check_interval_s": 2.0, "health_check_timeout_s": 1.0}
    spec = SimSpec.model_validate({"workload": {"kind": "toy"}, "faults": faults, "router": router})
    m = run_simulation(spec, "sticky_least_loaded", seed=0, wall_clock=ManualClock()).metrics
    assert m["requests_failed_over"] > 0  # requests waiting on replica 0 were given up...
    assert m["sessions_repinned"] > 0  # ...and placed elsewhere
    assert m["sessions_completed"] == 48
    assert m["turns_in_flight_at_end"] == 0
    assert m["router_in_flight_at_end"] == 0
    assert m["requests_submitted"] == m["requests_completed"]


def test_a_replica_back_up_returns_when_its_health_checks_pass() -> None:
    """``up`` makes no verdict itself: the router's re-checks of the unhealthy replica (every
    health_recheck_interval_s) find it back after health_success_threshold passes."""
    faults = [
        {"at_s": 10.0, "replica": 2, "kind": "down"},
        {"at_s": 11.0, "replica": 2, "kind": "up"},
    ]
    slow = {"health_recheck_interval_s": 50.0, "health_check_interval_s": 60.0}
    fast = toy_run(faults)
    spec = SimSpec.model_validate({"workload": {"kind": "toy"}, "faults": faults, "router": slow})
    late = run_simulation(spec, "sticky_least_loaded", seed=0, wall_clock=ManualClock()).metrics
    assert fast["per_replica"][2]["requests"] > late["per_replica"][2]["requests"]
