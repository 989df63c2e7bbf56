"""Where runs execute changes nothing: this process, a process pool and Ray give the same
numbers; a run that fails is reported and the others still finish."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionroute.cli import main
from sessionroute.cli.experiment_args import experiment_from_args
from sessionroute.errors import ConfigError
from sessionroute.experiments.executor import LocalExecutor, RayExecutor, RunFailed, Task
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.runner import run_experiment
from sessionroute.experiments.sim_arm import simulate_arm
from sessionroute.experiments.spec import ExperimentSpec, ResolvedArm, resolve_arms

WALL = ("wall_seconds", "requests_per_wall_second")


def _toy(policies: str = "consistent_hash,sticky_least_loaded", repeats: int = 1) -> ExperimentSpec:
    argv = ["compare", "--workload", "toy", "--policies", policies, "--repeats", str(repeats)]
    from sessionroute.cli import build_parser

    return experiment_from_args(build_parser().parse_args(argv))  # type: ignore[no-any-return]


def _numbers(out: RunOutput | RunFailed) -> dict[str, Any]:
    assert isinstance(out, RunOutput), out
    return {k: v for k, v in out.metrics.items() if k not in WALL}


def _fails_on_sticky(arm: ResolvedArm, seed: int, progress: Any) -> RunOutput:
    if arm.policy == "sticky_least_loaded":
        raise RuntimeError("injected failure")
    return simulate_arm(arm, seed, progress)


def _tasks(spec: ExperimentSpec) -> list[Task]:
    return [Task(a, spec.run.seed, a.name) for a in resolve_arms(spec)]


def test_pool_gives_the_same_numbers_as_this_process() -> None:
    tasks = _tasks(_toy())
    here = LocalExecutor(1).run(tasks, simulate_arm)
    pool = LocalExecutor(2).run(tasks, simulate_arm)
    assert [_numbers(o) for o in here] == [_numbers(o) for o in pool]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_run_is_reported_and_the_rest_finish(jobs: int) -> None:
    spec = _toy("consistent_hash,sticky_least_loaded,round_robin")
    output = run_experiment(spec, _fails_on_sticky, jobs=jobs)
    assert [a.name for a in output.arms] == ["consistent_hash", "round_robin"]
    assert [f.label for f in output.failed] == ["sticky_least_loaded"]
    assert "RuntimeError: injected failure" in output.failed[0].error
    assert all(len(r.runs) == 1 for r in output.results)


def test_runs_go_in_counterbalanced_order_and_each_arm_keeps_its_repeats_in_order() -> None:
    """A B C C B A A B C: a test-bed that drifts during the experiment shifts every arm alike."""
    spec = _toy("consistent_hash,sticky_least_loaded,round_robin", repeats=3)
    called: list[tuple[str, int]] = []

    def record(arm: ResolvedArm, seed: int, progress: Any) -> RunOutput:
        called.append((arm.policy, seed - spec.run.seed))
        return simulate_arm(arm, seed, progress)

    output = run_experiment(spec, record, jobs=1)
    ch, sticky, rr = "consistent_hash", "sticky_least_loaded", "round_robin"
    assert called == [
        (ch, 0), (sticky, 0), (rr, 0),
        (rr, 1), (sticky, 1), (ch, 1),
        (ch, 2), (sticky, 2), (rr, 2),
    ]  # fmt: skip
    assert [a.name for a in output.arms] == [ch, sticky, rr]
    # each arm's runs stay in repeat order: run k is the arm's run with seed run.seed + k
    arms = resolve_arms(spec)
    for arm, result in zip(arms, output.results, strict=True):
        alone = [simulate_arm(arm, spec.run.seed + k, lambda _f: None) for k in range(3)]
        got = [_numbers(r) for r in result.runs]  # + the SLO goodput run_experiment adds
        assert [{k: g[k] for k in _numbers(a)} for g, a in zip(got, alone, strict=True)] == [
            _numbers(a) for a in alone
        ]
        assert _numbers(alone[0]) != _numbers(alone[1])  # the repeats do differ


def test_ray_missing_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r"sessionroute\[ray\]"):
        RayExecutor()
    rc = main(["compare", "--workload", "toy", "--policies", "round_robin", "--ray"])
    assert rc == 2


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Any:
    """One local Ray instance on loopback for this module's tests (stopped at the end)."""
    ray.init(
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=2,
        log_to_driver=False,
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


def test_ray_gives_the_same_numbers_as_the_pool(local_ray: Any) -> None:
    tasks = _tasks(_toy(repeats=1))
    pool = LocalExecutor(2).run(tasks, simulate_arm)
    on_ray = RayExecutor().run(tasks, simulate_arm)
    assert [_numbers(o) for o in on_ray] == [_numbers(o) for o in pool]


def test_ray_retries_a_run_whose_worker_died(local_ray: Any, tmp_path: Path) -> None:
    marker = tmp_path / "died-once"

    def dies_once(arm: ResolvedArm, seed: int, progress: Any) -> RunOutput:
        if not marker.exists():
            marker.touch()
            os._exit(1)  # the worker process dies: Ray re-runs the task
        return simulate_arm(arm, seed, progress)

    tasks = _tasks(_toy("round_robin"))
    (out,) = RayExecutor(max_retries=2).run(tasks, dies_once)
    assert marker.exists() and isinstance(out, RunOutput)

    def always_dies(arm: ResolvedArm, seed: int, progress: Any) -> RunOutput:
        os._exit(1)

    (failed,) = RayExecutor(max_retries=0).run(tasks, always_dies)
    assert isinstance(failed, RunFailed) and failed.label == "round_robin"
    assert "WorkerCrashedError" in failed.error or "died" in failed.error, failed.error
