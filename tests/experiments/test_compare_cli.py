"""``sessionroute compare`` end to end on the toy workload: files, schema, report, errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sessionroute.cli import main
from sessionroute.experiments.results import SCHEMA_ID
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy

REQUIRED_METRICS = (
    "sessions_completed",
    "sessions_cancelled",
    "sessions_per_s",
    "output_tokens_per_s",
    "prompt_tokens_per_s",
    "prefix_cache_hit_rate",
    "preemptions",
    "ttft_s",
    "itl_s",
    "turn_latency_s",
    "session_latency_s",
    "per_replica",
    "load_imbalance_cov",
    "max_over_mean_busy",
    "sessions_new",
    "sessions_repinned",
    "sessions_expired",
    "sessions_released",
    "sessions_leaked",
    "wall_seconds",
    "simulated_seconds",
    "requests_per_wall_second",
    "ideal_hit_rate",
    "ideal_busy_seconds",
)


def test_compare_toy_writes_results_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    rc = main(
        [
            "compare",
            "--workload",
            "toy",
            "--policies",
            "consistent_hash,sticky_least_loaded",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout holds exactly the results document
    assert doc == json.loads((out / "results.json").read_text())
    assert doc["schema"] == SCHEMA_ID
    assert [a["policy"] for a in doc["arms"]] == ["consistent_hash", "sticky_least_loaded"]
    for arm in doc["arms"]:
        m = arm["metrics"]
        missing = [k for k in REQUIRED_METRICS if k not in m]
        assert not missing, missing
        assert set(m["ttft_s"]) >= {"p50", "p90", "p99", "max"}
        assert 0.0 <= m["prefix_cache_hit_rate"] <= m["ideal_hit_rate"] <= 1.0
        assert m["sessions_completed"] > 0
        assert len(m["per_replica"]) == 3
    assert doc["experiment"]["workload"]["kind"] == "toy"
    report = (out / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 4
    assert "prefix-cache hit rate" in report
    with (out / "timeseries.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["arm"] for r in rows} == {"consistent_hash", "sticky_least_loaded"}
    assert "toy" in (out / "config.resolved.toml").read_text()
    assert "comparison" not in captured.out.lower()  # the table went to stderr
    assert "worst replica hit" in captured.err and "running CoV" in captured.err


def test_dry_run_prints_plan_without_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["compare", "--dry-run", "--json", "--steps", "3", "--out", str(tmp_path / "x")])
    assert rc == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["workload"]["steps"] == 3
    assert [a["policy"] for a in plan["arms"]][:2] == ["consistent_hash", "sticky_least_loaded"]
    assert not (tmp_path / "x").exists()


def test_dry_run_without_json_is_a_short_summary(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", "--dry-run", "--steps", "3", "--policies", "consistent_hash,random"])
    assert rc == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) < 15
    assert "swe-rl, 3 RL steps" in out and "3 x glm45air-h200-tp8" in out
    assert any(line.split()[:2] == ["random", "random"] for line in lines)


@pytest.mark.parametrize("objective", [None, "rl"])
def test_dry_run_marks_the_options_an_arm_takes_for_the_objective(
    objective: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a trace replay (a serving objective) adaptive_hold's line names its serving options
    and marks them; ``--objective rl`` runs it with its defaults."""
    argv = ["compare", "--dry-run", "--workload", "toy", "--policies", "adaptive_hold"]
    assert main([*argv, *(["--objective", objective] if objective else [])]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = next(x for x in lines if x.split()[:2] == ["adaptive_hold", "adaptive_hold"])
    marked = "pack_past_knee=True, short_place=cache_aware_v2" in line
    assert marked is (objective is None)
    names = ", ".join(sorted(AdaptiveHoldPolicy.objective_options["serving"]))
    assert (f"[{names}: for this objective]" in line) is marked


def test_workload_flag_brings_its_own_default_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--workload toy`` on the built-in experiment runs on toy's default replicas, not on
    the swe-rl defaults the built-in file writes out; replicas a file chose itself are kept.
    A file without ``[replicas]`` shows the defaults it will run on (not "None x None")."""
    assert main(["compare", "--workload", "toy", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "replicas: 3 x toy-8b-h100-tp1" in out and "glm45air" not in out
    own = tmp_path / "own.toml"
    own.write_text(
        'name = "own"\n[workload]\nkind = "toy"\n[replicas]\ncount = 2\n'
        'profile = "glm45air-h200-tp8"\n[[arms]]\npolicy = "random"\n'
    )
    assert main(["compare", str(own), "--workload", "swe-rl", "--dry-run"]) == 0
    assert "replicas: 2 x glm45air-h200-tp8" in capsys.readouterr().out
    bare = tmp_path / "bare.toml"
    bare.write_text('[workload]\nkind = "toy"\n[[arms]]\npolicy = "random"\n')
    assert main(["compare", str(bare), "--dry-run"]) == 0
    assert "replicas: 3 x toy-8b-h100-tp1" in capsys.readouterr().out


def test_policies_replace_a_files_arms_even_when_it_has_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = tmp_path / "noarms.toml"
    exp.write_text('[workload]\nkind = "toy"\n')
    assert main(["compare", str(exp), "--dry-run"]) == 2  # arms are required...
    assert "arms" in capsys.readouterr().err
    rc = main(
        ["compare", str(exp), "--policies", "consistent_hash,round_robin", "--dry-run", "--json"]
    )
    assert rc == 0  # ...unless --policies gives them
    plan = json.loads(capsys.readouterr().out)
    assert [a["policy"] for a in plan["arms"]] == ["consistent_hash", "round_robin"]


def test_bad_policy_and_bad_file_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "--policies", "nope", "--dry-run"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    bad = tmp_path / "e.toml"
    bad.write_text('[workload]\nkind = "toy"\nbogus = 1\n[[arms]]\npolicy = "random"\n')
    assert main(["compare", str(bad), "--dry-run"]) == 2
    assert "unknown key 'workload.bogus'" in capsys.readouterr().err


def _without_wall(doc: dict[str, object]) -> list[dict[str, object]]:
    arms = json.loads(json.dumps(doc["arms"]))
    for arm in arms:
        arm.pop("repeats")
        for key in ("wall_seconds", "requests_per_wall_second"):
            arm["metrics"].pop(key)
    return list(arms)


def test_parallel_runs_give_the_sequential_results(tmp_path: Path) -> None:
    docs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        args = ["compare", "--workload", "toy", "--policies", "random,sticky_least_loaded"]
        assert main([*args, "--jobs", jobs, "--out", str(out)]) == 0
        docs.append(json.loads((out / "results.json").read_text()))
    assert _without_wall(docs[0]) == _without_wall(docs[1])


def test_an_out_dir_with_an_earlier_run_is_said_to_be_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    rc = main(["compare", "--workload", "toy", "--policies", "round_robin", "--out", str(out)])
    assert rc == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "holds an earlier run's files: they are replaced" in err
    assert json.loads((out / "results.json").read_text())["arms"]


def test_fidelity_names_an_arms_options_for_the_objective_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--fidelity`` runs the arms with their options for the objective, live and simulated:
    it says so as a plain run does (the run itself is stubbed out here)."""
    from sessionroute.errors import ConfigError
    from sessionroute.experiments.live import fidelity_run

    def no_run(*args: object, **kwargs: object) -> None:
        raise ConfigError("stubbed")

    monkeypatch.setattr(fidelity_run, "run_fidelity", no_run)
    argv = ["compare", "--workload", "toy", "--policies", "adaptive_hold", "--fidelity"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "stubbed" in err and "adaptive_hold runs with its options for this objective" in err


def test_fidelity_says_which_runs_failed_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live or simulated run that raised is named with its error and traceback, and the exit
    status is 1, as a plain compare's (the figures hold the runs that finished)."""
    from sessionroute.experiments import fidelity_report
    from sessionroute.experiments.executor import RunFailed
    from sessionroute.experiments.live import fidelity_run
    from sessionroute.experiments.runner import ExperimentOutput

    spec = None

    def output(failed: list[RunFailed]) -> ExperimentOutput:
        return ExperimentOutput(spec, [], [], failed)  # type: ignore[arg-type]

    lost = RunFailed("round_robin #3", "BrokenPipeError: gone", "Traceback: [at] line 1")
    doc = tmp_path / "fidelity.json"
    doc.write_text("{}")
    made = fidelity_run.FidelityOutput(
        output([]), output([lost]), {}, {"fidelity": doc, "report": doc, "profile": doc}
    )
    monkeypatch.setattr(fidelity_run, "run_fidelity", lambda *a, **k: made)
    monkeypatch.setattr(fidelity_report, "print_fidelity", lambda *a, **k: None)
    argv = ["compare", "--workload", "toy", "--policies", "round_robin", "--fidelity"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "simulated: 1 run(s) failed" in err and "round_robin #3: BrokenPipeError: gone" in err
    assert "Traceback: [at] line 1" in err  # the detail as it is, brackets and all
    assert "live:" not in err
    clean = fidelity_run.FidelityOutput(
        output([]), output([]), {}, {"fidelity": doc, "report": doc, "profile": doc}
    )
    monkeypatch.setattr(fidelity_run, "run_fidelity", lambda *a, **k: clean)
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
