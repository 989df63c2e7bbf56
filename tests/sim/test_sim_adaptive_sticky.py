"""``adaptive_sticky`` runs unchanged in the simulator: escape and admission in virtual time.

The scaled-down ``swe-rl`` of ``test_sim_thrash`` (3 x ``glm45air-h200-tp8`` with a tenth of the
KV cache, 256-token blocks, groups of 4) pushed past its knee: 96 rollouts in flight, so new
sessions wait at the router (the escape is exercised by the router and serve tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sessionroute.clock import ManualClock
from sessionroute.router.policies.adaptive_sticky import AdaptiveStickyPolicy
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


def _run(policy: str) -> dict[str, Any]:
    return run_simulation(SPEC, policy, seed=0, wall_clock=ManualClock()).metrics


def test_adaptive_sticky_in_the_simulator_moves_and_admits_and_loses_nothing() -> None:
    m = _run("adaptive_sticky")
    decisions, adm = m["router_decisions"], m["admission"]
    assert sum(decisions.values()) >= m["requests_completed"]
    assert decisions["moved"] == m["sessions_repinned"]  # moves are its only re-pins here
    assert adm["placed_after_wait"] > 0 and adm["wait_s_total"] > 0
    assert adm["refused_timeout"] == adm["refused_full"] == 0  # placed anyway, never refused
    assert m["sessions_leaked"] == 0
    # Every attempt without a decision is a turn still held at the router when the run ended.
    undecided = m["requests_submitted"] + m["requests_retried"] - sum(decisions.values())
    assert m["turns_in_flight_at_end"] - m["router_in_flight_at_end"] == undecided
    assert m["workload"]["rollouts_timeout"] == 0
    sll = _run("sticky_least_loaded")
    assert sll["admission"]["placed_after_wait"] == 0 and sll["router_decisions"]["moved"] == 0


class CheckedAdaptiveSticky(AdaptiveStickyPolicy):
    """``adaptive_sticky`` whose closed-form :meth:`first_admitted` is checked, at every pump,
    against asking :meth:`admit` for each waiting request (the contract's default)."""

    checked = 0
    held = 0

    def first_admitted(self, requests: Sequence[RouteRequest], cluster: ClusterView) -> int | None:
        fast = super().first_admitted(requests, cluster)
        slow = Policy.first_admitted(self, requests, cluster)
        assert fast == slow, (fast, slow, [r.prompt_tokens for r in requests])
        type(self).checked += 1
        type(self).held += fast is None
        return fast


def test_the_closed_form_admission_agrees_with_admit_on_every_pump() -> None:
    CheckedAdaptiveSticky.checked = CheckedAdaptiveSticky.held = 0
    m = run_simulation(
        SPEC, f"{__name__}:CheckedAdaptiveSticky", seed=0, wall_clock=ManualClock()
    ).metrics
    assert CheckedAdaptiveSticky.checked > 100 and CheckedAdaptiveSticky.held > 10
    builtin = _run("adaptive_sticky")
    differ = [k for k in builtin if k not in ("policy", "wall_seconds") and m[k] != builtin[k]]
    assert differ == []
