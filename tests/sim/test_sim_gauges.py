"""The router's engine gauges are scraped into the cluster view, as a live router's would be."""

from __future__ import annotations

from typing import ClassVar

from sessionroute.clock import ManualClock
from sessionroute.router.policies.base import Policy, require_healthy
from sessionroute.router.state.cluster import ClusterView
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.types import Decision, DecisionKind, EngineGauges, RouteRequest


class FewestRunning(Policy):
    """Routes every turn to the replica with the fewest running requests per its gauges."""

    name: ClassVar[str] = "fewest_running"
    seen: ClassVar[list[EngineGauges | None]] = []

    def select(self, request: RouteRequest, cluster: ClusterView) -> Decision:
        healthy = require_healthy(cluster)
        gauges = [cluster.gauges(w) for w in healthy]
        FewestRunning.seen.extend(gauges)
        best = min(range(len(healthy)), key=lambda i: (gauges[i] or EngineGauges()).running)
        return Decision(healthy[best], DecisionKind.STATELESS)


def test_a_policy_sees_the_scraped_engine_gauges() -> None:
    FewestRunning.seen.clear()
    spec = SimSpec.model_validate(
        {"workload": {"kind": "toy"}, "router": {"scrape_interval_s": 0.5}}
    )
    m = run_simulation(spec, f"{__name__}:FewestRunning", seed=0, wall_clock=ManualClock()).metrics
    assert m["sessions_completed"] == 48
    assert FewestRunning.seen and all(g is not None for g in FewestRunning.seen)
    assert any(g is not None and g.running > 0 for g in FewestRunning.seen)
    assert any(g is not None and g.kv_usage > 0 for g in FewestRunning.seen)


def test_without_scraping_the_gauges_stay_unknown() -> None:
    FewestRunning.seen.clear()
    spec = SimSpec.model_validate(
        {"workload": {"kind": "toy"}, "router": {"scrape_interval_s": None}}
    )
    run_simulation(spec, f"{__name__}:FewestRunning", seed=0, wall_clock=ManualClock())
    assert FewestRunning.seen and all(g is None for g in FewestRunning.seen)
