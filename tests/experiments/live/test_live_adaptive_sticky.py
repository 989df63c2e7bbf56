"""``adaptive_sticky`` live on emulated replicas agrees with the simulator (issue 18).

The experiment of ``test_live_acceptance`` (3 emulated ``toy-8b-h100-tp1`` replicas at 5x, 30
``toy`` sessions, the simulator's worker URLs) with ``adaptive_sticky`` as its arm: the same
policy code places the same sessions in ``serve``'s router core and in the simulator's.
"""

from __future__ import annotations

import pytest

from sessionroute.experiments.live.runner import run_live_experiment
from sessionroute.experiments.runner import run_experiment
from sessionroute.experiments.sim_arm import simulate_arm
from sessionroute.experiments.spec import parse_experiment

from .test_live_acceptance import fidelity_experiment


@pytest.mark.slow
def test_adaptive_sticky_live_agrees_with_the_simulator() -> None:
    data = fidelity_experiment()
    data["name"] = "live-fidelity-adaptive"
    data["arms"] = [{"policy": "adaptive_sticky"}]
    spec = parse_experiment(data, env={})
    (live,) = run_live_experiment(spec).results
    (sim,) = run_experiment(spec, simulate_arm).results
    m, s = live.metrics, sim.metrics
    assert m["requests_failed"] == 0, m["errors"]
    assert m["sessions_completed"] == s["sessions_completed"] == 30
    assert m["output_tokens"] == s["output_tokens"]
    assert abs(m["prefix_cache_hit_rate"] - s["prefix_cache_hit_rate"]) <= 0.03
    assert 0.85 <= m["output_tokens_per_s"] / s["output_tokens_per_s"] <= 1.15
    assert m["sessions_leaked"] == 0
