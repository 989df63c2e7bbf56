"""Issue 8's acceptance runs on emulated replicas (real HTTP, real routers, real time).

- the small live experiment (3 emulated toy replicas, 30 sessions, 2 arms) agrees with the
  simulator: prefix-cache hit rate within 3 points, output tokens/s within 15 %;
- vllm-router and sessionroute with sticky_least_loaded give the same per-replica session counts.

Both give the routers the simulator's worker URLs (``[replicas] urls``; the recording taps
listen there), so URL-hashing tie-breaks match the simulator's.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionroute.experiments.live.procs import free_port
from sessionroute.experiments.live.runner import run_live_experiment
from sessionroute.experiments.runner import run_experiment, write_outputs
from sessionroute.experiments.sim_arm import simulate_arm
from sessionroute.experiments.spec import load_experiment, parse_experiment

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def free_ports(n: int = 3) -> tuple[int, ...]:
    """``n`` distinct loopback ports that were free a moment ago (so two test runs on one
    machine don't collide on fixed ports)."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return tuple(sorted(ports))


def fidelity_experiment(ports: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The CI experiment: 3 x toy-8b-h100-tp1 emulated at 5x, 30 toy sessions, 2 arms (on
    ``ports``, or three free ones)."""
    if ports is None:
        ports = free_ports()
    return {
        "name": "live-fidelity",
        "workload": {"kind": "toy", "options": {"sessions": 30}},
        "replicas": {"urls": [f"http://127.0.0.1:{p}" for p in ports]},
        "live": {"time_scale": 5, "router": "sessionroute-inprocess"},
        "arms": [{"policy": "sticky_least_loaded"}, {"policy": "consistent_hash"}],
    }


@pytest.mark.slow
def test_live_toy_run_agrees_with_the_simulator(tmp_path: Path) -> None:
    spec = parse_experiment(fidelity_experiment(), env={})
    live = run_live_experiment(spec)
    sim = run_experiment(spec, simulate_arm)
    paths = write_outputs(live, tmp_path / "run")
    doc = json.loads(paths["results"].read_text("utf-8"))
    assert [a["name"] for a in doc["arms"]] == ["sticky_least_loaded", "consistent_hash"]
    assert paths["report"].exists()
    for got, want in zip(live.results, sim.results, strict=True):
        m, s = got.metrics, want.metrics
        assert m["requests_failed"] == 0, m["errors"]
        assert m["sessions_completed"] == s["sessions_completed"] == 30
        assert m["requests_completed"] == s["requests_completed"]
        assert m["output_tokens"] == s["output_tokens"]
        # the chat template's tokens are compensated: the servers saw the simulator's prompts
        assert abs(m["prompt_tokens"] / s["prompt_tokens"] - 1) < 0.001
        assert m["ideal_hit_rate"] == pytest.approx(s["ideal_hit_rate"])
        assert abs(m["prefix_cache_hit_rate"] - s["prefix_cache_hit_rate"]) <= 0.03, got.name
        ratio = m["output_tokens_per_s"] / s["output_tokens_per_s"]
        assert 0.85 <= ratio <= 1.15, (got.name, ratio)
        assert sum(m["sessions_per_replica"]) == 30
    sticky = live.results[0].metrics
    assert sticky["sessions_released"] == 30
    assert sticky["sessions_leaked"] == 0
    assert sticky["session_moves"] == 0


def _vllm_router_installed() -> bool:
    return (Path(sys.executable).parent / "vllm-router").exists() or bool(
        shutil.which("vllm-router")
    )


@pytest.mark.slow
def test_vllm_router_and_sessionroute_place_sessions_alike() -> None:
    if not _vllm_router_installed():
        pytest.skip("vllm-router is not installed (pip install vllm-router==0.1.17)")
    data = load_experiment(EXAMPLES / "live_side_by_side.toml", env={}).model_dump()
    data["workload"]["options"]["sessions"] = 13
    data["replicas"]["urls"] = [f"http://127.0.0.1:{p}" for p in free_ports()]
    data["live"]["time_scale"] = 2.0
    spec = parse_experiment(data, env={})
    out = run_live_experiment(spec)
    assert not out.failed, [(f.label, f.error, f.detail) for f in out.failed]
    theirs, ours = (r.metrics for r in out.results)
    assert theirs["requests_failed"] == ours["requests_failed"] == 0
    assert sum(ours["sessions_per_replica"]) == 13
    assert theirs["sessions_per_replica"] == ours["sessions_per_replica"]
    assert ours["sessions_new"] == 13
    assert theirs["sessions_new"] is None  # vllm-router's /metrics are not read
