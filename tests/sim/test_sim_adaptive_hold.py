"""``adaptive_hold`` runs unchanged in the simulator: running sessions held and resumed in
virtual time through the router core's admission queue, nothing lost.

The scaled-down ``swe-rl`` of ``test_sim_adaptive_sticky`` (a tenth of the KV cache, 96
rollouts in flight: past the knee).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy
from sessionroute.router.policies.base import Policy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.types import RouteRequest

SPEC = SimSpec.model_validate(
    {
        "workload": {
            "kind": "swe-rl",
            "steps": 3,
            "options": {"batch_size": 24, "group_size": 4, "inflight_rollouts": 96},
        },
        "replicas": {"block_size": 256, "kv_capacity_tokens": 440_000},
        "router": {"finish_sessions": True},
    }
)


class CheckedAdaptiveHold(AdaptiveHoldPolicy):
    """``adaptive_hold`` whose :meth:`first_admitted` is checked, at every pump, against
    asking :meth:`admit` for each waiting request (the contract's default)."""

    checked = 0
    holding = 0

    def first_admitted(self, requests: Sequence[RouteRequest], cluster: ClusterView) -> int | None:
        fast = super().first_admitted(requests, cluster)
        slow = Policy.first_admitted(self, requests, cluster)
        assert fast == slow, (fast, slow)
        type(self).checked += 1
        type(self).holding += any(r.session_id in self.held() for r in requests)
        return fast


@pytest.mark.parametrize(
    "options", [{}, {"wait_bound": True}, {"wait_bound": True, "wait_bound_new": True}]
)
def test_adaptive_hold_in_the_simulator_holds_resumes_and_loses_nothing(
    options: dict[str, Any],
) -> None:
    CheckedAdaptiveHold.checked = CheckedAdaptiveHold.holding = 0
    m = run_simulation(
        SPEC, f"{__name__}:CheckedAdaptiveHold", options, seed=0, wall_clock=ManualClock()
    ).metrics
    assert CheckedAdaptiveHold.checked > 100 and CheckedAdaptiveHold.holding > 0
    c = m["policy_counters"]
    # rule 6: held turns leave once they waited their engine's queueing delay (when on)
    assert (c["released"]["waited"] > 0) == options.get("wait_bound", False)
    assert (c["new_at_wait_bound"] > 0) == options.get("wait_bound_new", False)
    assert c["holds"] > 0 and c["held_turns"] > 0 and c["held_turn_wait_s_total"] > 0
    assert sum(c["released"].values()) + c["held_now"] == c["holds"]
    assert 0 < c["held_sessions"] <= c["holds"] and c["held_sample"]
    assert m["sessions_leaked"] == 0
    assert m["workload"]["rollouts_timeout"] == 0
    decisions = m["router_decisions"]
    undecided = m["requests_submitted"] + m["requests_retried"] - sum(decisions.values())
    assert m["turns_in_flight_at_end"] - m["router_in_flight_at_end"] == undecided


def test_rule_8_leaves_the_default_and_an_rl_run_unchanged() -> None:
    """Rule 8 (``overload_window_s``) is off by default, and on an RL run it has nothing to
    act on even when on (rule 7: rollouts are long sessions): the scaled-down ``swe-rl`` run
    gives the same results with it as without it."""

    def run(options: dict[str, Any]) -> dict[str, Any]:
        m = run_simulation(SPEC, "adaptive_hold", options, seed=0, wall_clock=ManualClock()).metrics
        counters = m.pop("policy_counters")
        assert counters.get("overload_diverted", 0) == 0
        return m

    default = run({})
    assert run({"overload_window_s": 120.0, "short_turns": 3.0}) == default
    assert run({"overload_window_s": 0.0}) == default
