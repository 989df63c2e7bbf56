"""``adaptive_sticky`` runs unchanged in the simulator: escape and admission in virtual time.

The scaled-down ``swe-rl`` of ``test_sim_thrash`` (3 x ``glm45air-h200-tp8`` with a tenth of the
KV cache, 256-token blocks, groups of 4) pushed past its knee: 96 rollouts in flight, so the
replicas' scraped gauges reach the escape gate and the admission knee.
"""

from __future__ import annotations

from typing import Any

from sessionroute.clock import ManualClock
from sessionroute.sim import SimSpec, run_simulation

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


def _run(policy: str) -> dict[str, Any]:
    return run_simulation(SPEC, policy, seed=0, wall_clock=ManualClock()).metrics


def test_adaptive_sticky_in_the_simulator_moves_and_admits_and_loses_nothing() -> None:
    m = _run("adaptive_sticky")
    decisions, adm = m["router_decisions"], m["admission"]
    # Every request was decided once: routed turns = decisions (no request lost at the router).
    assert sum(decisions.values()) == m["requests_submitted"] + m["requests_retried"]
    assert decisions["moved"] > 0 and decisions["moved"] == m["sessions_repinned"]
    assert adm["placed_after_wait"] > 0 and adm["wait_s_total"] > 0
    assert adm["refused_timeout"] == adm["refused_full"] == 0  # placed anyway, never refused
    assert m["sessions_leaked"] == 0
    assert m["router_in_flight_at_end"] == m["turns_in_flight_at_end"]  # nothing stranded
    assert m["workload"]["rollouts_timeout"] == 0
    sll = _run("sticky_least_loaded")
    assert sll["admission"]["placed_after_wait"] == 0 and sll["router_decisions"]["moved"] == 0
