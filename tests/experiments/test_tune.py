"""``sessionroute tune``: scoring, the keep-the-defaults rule, the files, resuming, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sessionroute.cli import main
from sessionroute.experiments.objective import Constraint, Objective
from sessionroute.experiments.results import ArmResult, RunOutput
from sessionroute.experiments.tune import (
    StudyResult,
    TrialScore,
    TuneSetup,
    _interrupted,
    _suggest,
    open_study,
    score_runs,
)
from sessionroute.experiments.tune_report import tuned_options
from sessionroute.experiments.verdict import ArmRuns, judge
from sessionroute.router.policies.options import Knob, load_policy_file

pytest.importorskip("optuna")

STEP = Objective("step_time_s.mean", -1, (Constraint("rollouts_timed_out_share", "<=", 0.01),))


def _point(steps: list[float], timed_out: list[float]) -> ArmResult:
    runs = [
        RunOutput(seed=i, metrics={"step_time_s": {"mean": s, "count": 1},
                                   "rollouts_timed_out_share": t})
        for i, (s, t) in enumerate(zip(steps, timed_out, strict=True))
    ]  # fmt: skip
    return ArmResult("trial1", "p", {}, runs)


def test_score_is_the_mean_over_points_and_the_worst_point_breaks_constraints() -> None:
    score = score_runs(STEP, [_point([500, 520], [0, 0]), _point([600, 640], [0.0, 0.04])])
    assert score.value == pytest.approx((510 + 620) / 2)
    assert [round(m) for m, _, _ in score.per_point] == [510, 620]
    assert score.violations[0] == pytest.approx((0.02 - 0.01) / 0.01) and not score.feasible
    assert score_runs(STEP, [_point([500], [0.0])]).feasible


def _setup() -> TuneSetup:
    return TuneSetup(
        base={}, policy="consistent_hash_bounded_load", fixed={},
        space={"c": Knob(1.0, 2.0, default=1.25)}, objective=STEP,
    )  # fmt: skip


def _verdict(defaults: list[float], tuned: list[float]) -> Any:
    def runs(xs: list[float]) -> tuple[dict[str, Any], ...]:
        return tuple({"step_time_s": {"mean": x, "count": 1}} for x in xs)

    return judge(STEP, [ArmRuns("defaults", runs(defaults)), ArmRuns("tuned", runs(tuned))])


@pytest.mark.parametrize(
    ("defaults", "tuned", "expected_c"),
    [
        ([600, 610, 605], [500, 505, 510], 1.05),  # better by far more than the seed spread
        ([600, 640, 580], [590, 620, 575], 1.25),  # better, but within noise: keep defaults
        ([500, 505, 510], [600, 610, 605], 1.25),  # worse on fresh seeds
    ],
)
def test_tuned_settings_are_kept_only_when_they_beat_the_defaults_beyond_noise(
    defaults: list[float], tuned: list[float], expected_c: float
) -> None:
    score = TrialScore(500.0, ((500.0, 490.0, 510.0),), (0.0,))
    result = StudyResult(trials=[(0, {"c": 1.25}, score), (1, {"c": 1.05}, score)], best=1)
    result.confirmation = _verdict(defaults, tuned)
    assert tuned_options(_setup(), result) == {"c": expected_c}


def _tune(tmp_path: Path, *extra: str) -> int:
    return main(
        ["tune", "--workload", "toy", "--policy", "consistent_hash_bounded_load",
         "--seeds", "1", "--confirm-seeds", "1", "--out", str(tmp_path / "study"), *extra]
    )  # fmt: skip


@pytest.mark.slow
def test_tune_writes_a_policy_file_and_resumes(tmp_path: Path) -> None:
    assert _tune(tmp_path, "--trials", "2") == 0
    out = tmp_path / "study"
    doc = json.loads((out / "tune.json").read_text())
    assert [t["trial"] for t in doc["trials"]] == [0, 1]
    assert doc["trials"][0]["params"] == {"c": 1.25}  # trial 0: the defaults
    name, options = load_policy_file(out / "tuned.toml")
    assert name == "consistent_hash_bounded_load" and set(options) == {"c"}
    assert (out / "report.html").read_text().count("<img") >= 2
    assert _tune(tmp_path, "--trials", "2") == 2  # a study is there: --resume or another --out
    assert _tune(tmp_path, "--trials", "3", "--resume") == 0
    doc = json.loads((out / "tune.json").read_text())
    assert [t["trial"] for t in doc["trials"]] == [0, 1, 2]  # 0 and 1 were not run again


def test_a_resumed_study_reruns_the_interrupted_trial_and_samples_anew(tmp_path: Path) -> None:
    setup, path = _setup(), tmp_path / "study.log"
    study = open_study(setup, path, resume=False)
    asked = []
    for value in (600.0, 590.0, None):  # trial 2 is interrupted: asked, never told
        trial = study.ask()
        asked.append(_suggest(trial, setup.space))
        if value is not None:
            study.tell(trial, value)
    assert asked[0] == {"c": 1.25}  # trial 0: the defaults
    resumed = open_study(setup, path, resume=True)
    again = _suggest(resumed.ask(), setup.space)
    assert again == asked[2]  # the interrupted trial's settings first
    fresh = _suggest(resumed.ask(), setup.space)
    assert fresh not in asked  # not the first run's start-up sequence again
    closed = resumed.trials[2]
    assert _interrupted(closed) and not _interrupted(resumed.trials[1])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--policy", "round_robin"], "nothing to tune"),
        (["--policy", "cache_aware", "--space", "nope=1:2"], "KNOB=LOW:HIGH"),
        (["--policy", "cache_aware", "--space", "cache_threshold=a:b"], "must be numbers"),
        (["--policy", "consistent_hash_bounded_load(c=1.1)"], "nothing to tune"),
        (["--policy", "cache_aware", "--resume"], "--resume needs --out"),
        (["--policy", "cache_aware", "--knob", "inflight"], "go together"),
    ],
)
def test_tune_errors_name_the_problem(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", "--workload", "toy", "--dry-run", *argv]) == 2
    assert says in capsys.readouterr().err


def test_dry_run_prints_the_space(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["tune", "--workload", "toy", "--dry-run", "--policy", "cache_aware", "--space",
            "cache_threshold=0.1:0.6", "--space", "balance_rel_threshold=fixed"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "cache_threshold: 0.1 .. 0.6" in text and "balance_rel_threshold" not in text
    assert "[default for toy]" in text or "SLO goodput" in text


def test_without_optuna_tune_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "optuna", None)
    assert main(["tune", "--workload", "toy", "--policy", "cache_aware"]) == 2
    assert "sessionroute[tune]" in capsys.readouterr().err
