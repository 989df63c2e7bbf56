"""Replica wake-ups run in the same callback when they would be the queue's next event: a
differential test against pushing every wake-up through the heap (the plain event loop).

The plain loop replaces ``Simulation._wake``, which only an interpreted class allows: where the
simulator is compiled (:mod:`sessionroute.native`) the test runs again in a subprocess with
``SESSIONROUTE_PURE_PYTHON=1``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from sessionroute.clock import ManualClock
from sessionroute.native import PURE_ENV, compiled_modules
from sessionroute.sim import SimSpec, run_simulation
from sessionroute.sim.replicas import SimReplica
from sessionroute.sim.simulation import Simulation


def _plain_wake(self: Simulation, arg: tuple[SimReplica, int]) -> None:
    """Every wake-up through the heap: run the replica to now (`_sync`), then push the next one
    (`_reschedule`)."""
    rep, token = arg
    if token != rep.wake_token:
        return
    rep.wake_t = None
    self._sync(rep)
    self._reschedule(rep)


def _run(spec: dict[str, Any], policy: str) -> tuple[str, int]:
    res = run_simulation(SimSpec.model_validate(spec), policy, seed=3, wall_clock=ManualClock())
    m = dict(res.metrics)
    events = int(m.pop("events"))
    return json.dumps([m, res.timeseries, res.steps, res.samples], sort_keys=True), events


SPECS: list[tuple[dict[str, Any], str]] = [
    ({"workload": {"kind": "toy"}}, "sticky_least_loaded"),
    (
        {
            "workload": {"kind": "toy"},
            "router": {"network_delay_s": 0.004},
            "faults": [
                {"at_s": 4.0, "replica": 0, "kind": "down"},
                {"at_s": 9.0, "replica": 0, "kind": "up"},
                {"at_s": 2.0, "replica": 1, "kind": "slow", "factor": 3.0},
                {"at_s": 6.0, "kind": "add"},
            ],
        },
        "consistent_hash",
    ),
    (
        {
            "workload": {
                "kind": "swe-rl",
                "steps": 2,
                "options": {"batch_size": 16, "group_size": 4, "trainer_step_s": 5.0},
            },
            "sim": {"max_simulated_s": 120.0},
        },
        "sticky_least_loaded",
    ),
]


def test_the_differential_test_runs_where_the_simulator_is_compiled() -> None:
    if "sessionroute.sim.simulation" not in compiled_modules():
        pytest.skip("the simulator is interpreted here: the test below runs in this process")
    env = {**os.environ, PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", __file__, "-k", "event_count"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{len(SPECS)} passed" in done.stdout


@pytest.mark.parametrize(("spec", "policy"), SPECS)
def test_inline_wakeups_change_nothing_not_even_the_event_count(
    spec: dict[str, Any], policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "sessionroute.sim.simulation" in compiled_modules():
        pytest.skip("compiled Simulation cannot be patched: run in a pure-Python subprocess")
    inline, inline_events = _run(spec, policy)
    monkeypatch.setattr(Simulation, "_wake", _plain_wake)
    plain, plain_events = _run(spec, policy)
    assert inline == plain
    assert inline_events == plain_events > 0
