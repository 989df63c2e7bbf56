"""Every peer policy runs unchanged in the simulator and ``compare --live`` (emulated replicas,
the real router over HTTP); ``trajectory_admission`` holds and resumes turns in both."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.errors import ConfigError
from sessionroute.experiments.live.routers import router_flags
from sessionroute.experiments.live.runner import run_live_experiment
from sessionroute.experiments.spec import parse_experiment
from sessionroute.router.policies.registry import PEER_POLICIES
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.sim.spec import RouterSection

TOY: dict[str, Any] = {
    "sessions": 6, "arrival_rate_per_s": 5.0, "turns_p50": 3, "turns_p90": 4, "turns_max": 4,
    "first_p50": 300, "first_p90": 600, "output_p50": 16, "output_p90": 32,
    "followup_p50": 64, "followup_p90": 128, "think_p50_s": 0.5, "think_p90_s": 1.0,
}  # fmt: skip

PAUSING: dict[str, Any] = {
    "kv_capacity_tokens": 600,
    "max_pause_s": 2.0,
    "check_interval_s": 0.5,
}
"""A capacity so small that sessions pause, and a short forced resume."""


@pytest.mark.parametrize("policy", PEER_POLICIES)
def test_each_peer_policy_completes_every_session_in_the_simulator(policy: str) -> None:
    spec = SimSpec.model_validate({"workload": {"kind": "toy"}, "sim": {"sample_interval_s": 1}})
    m = run_simulation(spec, policy, seed=0, wall_clock=ManualClock()).metrics
    assert m["sessions_completed"] == 48
    assert m["turns_in_flight_at_end"] == 0 and m["router_in_flight_at_end"] == 0
    assert m["requests_completed"] == m["requests_submitted"]


def test_trajectory_admission_holds_and_resumes_turns_in_virtual_time() -> None:
    spec = SimSpec.model_validate(
        {"workload": {"kind": "toy", "options": TOY}, "sim": {"sample_interval_s": 1}}
    )
    m = run_simulation(
        spec, "trajectory_admission", PAUSING, seed=0, wall_clock=ManualClock()
    ).metrics
    assert m["sessions_completed"] == TOY["sessions"]
    assert m["admission_placed_after_wait"] > 0  # turns were held, then placed
    assert m["admission_refused_timeout"] == 0 and m["router_in_flight_at_end"] == 0


def test_peer_policies_run_live_through_the_real_router() -> None:
    """One tiny live arm per peer policy (emulated replicas, ``sessionroute serve``); the
    pausing options travel to the router as ``--policy-option``."""
    arms: list[dict[str, Any]] = [
        {"policy": p} for p in PEER_POLICIES if p != "trajectory_admission"
    ]
    arms.append({"policy": "trajectory_admission", "policy_options": PAUSING})
    doc = {
        "name": "peers-live",
        "workload": {"kind": "toy", "options": {**TOY, "sessions": 3}},
        "live": {"time_scale": 10, "router": "sessionroute-inprocess"},
        "arms": arms,
    }
    out = run_live_experiment(parse_experiment(doc, env={}))
    assert [r.policy for r in out.results] == list(PEER_POLICIES)
    for r in out.results:
        m = r.metrics
        assert m["requests_failed"] == 0, (r.policy, m["errors"])
        assert m["sessions_completed"] == 3, r.policy


def test_live_router_flags_carry_every_option_of_ours_and_validate_them() -> None:
    flags = router_flags("kv_cost", {"temperature": 0.5}, RouterSection(), ours=True)
    assert flags[flags.index("--policy-option") + 1] == "temperature=0.5"
    with pytest.raises(ConfigError, match="bogus"):
        router_flags("kv_cost", {"bogus": 1}, RouterSection(), ours=True)
    with pytest.raises(ConfigError, match="cannot be passed"):
        router_flags("kv_cost", {"temperature": 0.5}, RouterSection(), ours=False)


def test_serve_policy_option_flags_reach_the_policy_config() -> None:
    import argparse

    from sessionroute.router.policies.registry import choose_policy
    from sessionroute.serve import settings_from_args
    from sessionroute.serve.flags import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def settings(*flags: str) -> Any:
        return settings_from_args(parser.parse_args(["--worker-urls", "http://a", *flags]))

    s = settings(
        "--policy", "cache_aware_v2", "--cache-threshold", "0.5",
        "--policy-option", "kv_overload_threshold=0.85", "--policy-option", "cache_threshold=0.4",
    )  # fmt: skip
    assert s.policy_options() == {
        "cache_threshold": 0.4,  # --policy-option wins over the named flag
        "balance_abs_threshold": 64,  # SMG's names for the spill gate
        "balance_rel_threshold": 1.5,
        "kv_overload_threshold": 0.85,
    }
    choice = choose_policy(s.policy, s.policy_options())
    assert choice.config.kv_overload_threshold == 0.85
    s = settings("--policy", "trajectory_admission", "--policy-option", "kv_capacity_tokens=null")
    assert s.policy_options() == {"kv_capacity_tokens": None}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        settings("--policy", "kv_cost", "--policy-option", "temperature").policy_options()
    bad = settings("--policy", "kv_cost", "--policy-option", "bogus=1")
    with pytest.raises(ConfigError, match="bogus"):
        choose_policy(bad.policy, bad.policy_options())
