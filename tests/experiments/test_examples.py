"""Every example experiment file runs as written from a clone: it validates, every workload it
names builds (trace files included, found with no environment set), and every arm of the
simulated ones runs in a shortened form. The live examples need servers: validated only."""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sessionroute.clock import ManualClock
from sessionroute.experiments.spec import load_experiment, resolve_arms
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.workloads.registry import canonical_kind, workload_config
from sessionroute.workloads.traces import TRACES_ENV

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FILES = sorted([*EXAMPLES.glob("*.toml"), *EXAMPLES.glob("regimes/*.toml")])
SIMULATED = [p for p in FILES if not p.name.startswith("live_")]

# A few simulated minutes of each workload: enough to run every arm's code path, not to measure.
SHORT: dict[str, dict[str, Any]] = {
    "swe-rl": {
        "steps": 1,
        "batch_size": 8,
        "group_size": 4,
        "inflight_rollouts": 8,
        "turns_min": 2,
        "turns_p50": 3,
        "turns_p90": 4,
        "turns_p99": 4,
        "turns_max": 4,
    },
    "trace:weka": {"max_sessions": 4, "concurrency": 2},
    "trace:mooncake": {"max_requests": 60},
}


@pytest.fixture
def as_a_clone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the repository root with no trace directory set, as a fresh clone would."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv(TRACES_ENV, raising=False)


def _name(p: Path) -> str:
    return str(p.relative_to(EXAMPLES))


@pytest.mark.parametrize("path", FILES, ids=_name)
def test_example_validates_and_its_workloads_build(path: Path, as_a_clone: None) -> None:
    spec = load_experiment(path, env={})
    arms = resolve_arms(spec)
    assert len(arms) >= 2
    workloads = {repr(a.settings["workload"]): a.settings["workload"] for a in arms}
    for wl in workloads.values():
        cfg = workload_config(wl["kind"], wl.get("steps"), wl.get("options"))
        cfg.build(np.random.default_rng(0))  # loads and validates a trace file


def _shortened(settings: dict[str, Any]) -> dict[str, Any]:
    short = copy.deepcopy(settings)
    wl = short["workload"]
    kind = canonical_kind(wl["kind"])
    wl["options"] = {**wl.get("options", {}), **SHORT.get(kind, {})}
    wl.pop("steps", None)
    return short


@pytest.mark.slow
@pytest.mark.parametrize("path", SIMULATED, ids=_name)
def test_every_arm_of_a_simulated_example_runs_shortened(path: Path, as_a_clone: None) -> None:
    for arm in resolve_arms(load_experiment(path, env={})):
        spec = SimSpec.from_settings(_shortened(arm.settings))
        result = run_simulation(
            spec, arm.policy, arm.policy_options, seed=0, wall_clock=ManualClock()
        )
        m = result.metrics
        assert m["requests_completed"] > 0, arm.name


def test_default_example_is_the_packaged_default() -> None:
    packaged = resources.files("sessionroute").joinpath("data/default.toml").read_text("utf-8")
    assert (EXAMPLES / "default.toml").read_text("utf-8") == packaged
