"""Runs one experiment arm in the simulator (the default arm runner of ``compare``)."""

from __future__ import annotations

from collections.abc import Callable

from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import ResolvedArm
from sessionroute.sim import SimSpec, run_simulation

__all__ = ["simulate_arm"]


def simulate_arm(arm: ResolvedArm, seed: int, progress: Callable[[float], None]) -> RunOutput:
    """Simulate ``arm`` once with ``seed``.

    Raises:
        ConfigError: for invalid settings, an unknown workload, profile or policy.
    """
    spec = SimSpec.from_settings(arm.settings)
    result = run_simulation(spec, arm.policy, arm.policy_options, seed, progress)
    return RunOutput(
        seed=seed,
        metrics=result.metrics,
        timeseries=result.timeseries,
        steps=result.steps,
        samples=result.samples,
    )
