"""``sessionroute sweep``: arms per knob value, the knee, the verdicts, the files."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sessionroute.cli import main
from sessionroute.errors import ConfigError
from sessionroute.experiments.results import ArmResult, RunOutput
from sessionroute.experiments.spec import ResolvedArm
from sessionroute.experiments.sweep import KNOBS, summarize, sweep_experiment


def _arm(policy: str, value: int) -> ResolvedArm:
    return ResolvedArm(name=f"{policy}@{value}", policy=policy, policy_options={}, settings={})


def _result(policy: str, value: int, tok_s: list[float]) -> ArmResult:
    runs = [RunOutput(seed=i, metrics={"output_tokens_per_s": v}) for i, v in enumerate(tok_s)]
    return ArmResult(f"{policy}@{value}", policy, {}, runs)


def test_knee_is_where_throughput_stops_scaling_with_load() -> None:
    """Best tok/s per rollout in flight: 10.0 at 100, 10.0 at 200, 8.5 at 300 (< 0.9 x 10)."""
    knob = KNOBS["inflight"]
    table = {
        ("a", 100): [1000.0, 1000.0],
        ("b", 100): [990.0, 1010.0],
        ("a", 200): [2000.0, 2000.0],
        ("b", 200): [1900.0, 1910.0],
        ("a", 300): [2400.0, 2420.0],
        ("b", 300): [2550.0, 2550.0],
    }
    arms = [_arm(p, v) for p, v in table]
    results = [_result(p, v, x) for (p, v), x in table.items()]
    s = summarize(knob, results, arms)
    assert s.knee == 300.0
    assert s.values == [100.0, 200.0, 300.0] and s.policies == ["a", "b"]
    # at 100 the two are within their seed ranges of each other; at 200 and 300 they are not
    assert (
        s.verdicts[0].startswith("at 100 in flight: best a") and "within noise: b" in s.verdicts[0]
    )
    assert s.verdicts[1] == (
        "at 200 in flight: best a (output tok/s 2,000); within noise: none; "
        "cost: b output tok/s -4.7 %"
    )
    assert s.verdicts[2].startswith("at 300 in flight: best b")
    assert len(s.runs) == 12


def test_one_policy_with_two_settings_is_judged_as_two_arms() -> None:
    knob = KNOBS["inflight"]
    labels = ("chwbl(c=1.25)", "chwbl(c=1.05)")
    arms = [
        ResolvedArm(name=f"{label}@{v}", policy="chwbl", policy_options={}, settings={})
        for v in (100, 200)
        for label in labels
    ]
    results = [
        ArmResult(arm.name, "chwbl", {}, [RunOutput(seed=0, metrics={"output_tokens_per_s": x})])
        for arm, x in zip(arms, (900.0, 1000.0, 1800.0, 2000.0), strict=True)
    ]
    s = summarize(knob, results, arms)
    assert s.policies == list(labels)
    assert [j.best for j in s.judgements] == ["chwbl(c=1.05)", "chwbl(c=1.05)"]


def test_intervals_stay_in_each_metrics_domain_and_empty_summaries_are_left_out() -> None:
    """Two far-apart seeds: the raw Student-t interval of a hit rate passes 1 and that of a
    step time goes below 0; the sweep's bands are clipped to the metric's domain. A step-time
    summary that measured nothing (count 0) is not averaged in as 0 s."""
    from sessionroute.record.recorder import summary

    knob = KNOBS["inflight"]

    def run(seed: int, hit: float, steps: list[float]) -> RunOutput:
        m = {
            "output_tokens_per_s": 100.0,
            "prefix_cache_hit_rate": hit,
            "step_time_s": summary(steps),
        }
        return RunOutput(seed=seed, metrics=m)

    res = ArmResult("a@100", "a", {}, [run(0, 0.8, [10.0]), run(1, 0.99, [400.0]), run(2, 0.9, [])])
    s = summarize(knob, [res], [_arm("a", 100)])
    m, lo, hi = s.points[0].stats["prefix_cache_hit_rate"]
    assert hi == 1.0 and 0.0 <= lo < m
    m, lo, hi = s.points[0].stats["step_time_s.max"]
    assert m == pytest.approx(205.0) and lo == 0.0 and hi > 400.0
    assert [r["step_time_s.max"] for r in s.runs] == [10.0, 400.0, None]


def test_a_knob_for_another_workload_is_refused() -> None:
    base = {"workload": {"kind": "toy"}, "arms": [{"policy": "random"}]}
    with pytest.raises(ConfigError, match="concurrency"):
        sweep_experiment(base, KNOBS["concurrency"], [1, 2], ["random"], 1)
    with pytest.raises(ConfigError, match="2 distinct"):
        sweep_experiment(base, KNOBS["replicas"], [2, 2], ["random"], 1)


def test_sweep_cli_writes_csv_json_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sw"
    rc = main(
        [
            "sweep", "--workload", "toy", "--knob", "replicas", "--values", "2,3",
            "--policies", "consistent_hash,round_robin", "--seeds", "2", "--jobs", "1",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.startswith("objective: maximise SLO goodput")  # the default for toy
    for value in (2, 3):  # a verdict paragraph per point, every other policy's cost in it
        block = printed.split(f"at {value} replicas:\n", 1)[1]
        block = block.split(f"at {value + 1} replicas:", 1)[0]  # up to the next point
        assert block.startswith("  best: ") and "cost against" in block
    with (out / "sweep.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 2  # values x policies x seeds
    assert {(r["replicas"], r["policy"]) for r in rows} == {
        (v, p) for v in ("2", "3") for p in ("consistent_hash", "round_robin")
    }  # a whole-number knob is written as one
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["values"] == [2, 3] and all(isinstance(p["value"], int) for p in doc["points"])
    assert doc["schema"] == "sessionroute.sweep/1" and doc["knob"]["setting"] == "replicas.count"
    assert len(doc["points"]) == 4 and all(p["seeds"] == 2 for p in doc["points"])
    assert doc["objective"]["metric"] == "slo_goodput"
    details = doc["verdict_details"]
    assert [d["value"] for d in details] == [2, 3]
    for d in details:
        best = max(d["arms"], key=lambda a: a["objective"])["objective"]
        assert (
            d["best"] and next(a for a in d["arms"] if a["name"] == d["best"])["objective"] == best
        )
    report = (out / "report.html").read_text()
    assert "data:image/png;base64," in report and "Verdict per load point" in report
    assert "Glossary" in report


def test_sweep_names_an_arms_options_for_the_objective_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line naming adaptive_hold's serving options is printed once for the arm, not once
    per load point."""
    argv = ["sweep", "--workload", "toy", "--knob", "replicas", "--values", "2,3"]
    argv += ["--policies", "adaptive_hold", "--seeds", "1", "--jobs", "1"]
    assert main([*argv, "--out", str(tmp_path / "sw")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("runs with its options for this objective") == 1
    assert "adaptive_hold runs with its options" in printed


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ("", "--values: no value given in ''"),
        (" , ", "--values: no value given"),
        ("1.5,2.5", "--values: replicas takes whole numbers, got 1.5"),
        ("2,abc", "--values: 'abc' is not a number"),
    ],
)
def test_bad_sweep_values_are_refused_before_any_run(
    values: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "--workload", "toy", "--knob", "replicas", "--values", values]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_replicas_knee_is_where_throughput_falls_not_where_spare_capacity_appears() -> None:
    """4 / 6 / 8 replicas at 1,001 / 1,017 / 1,020 tok/s: the fleet has room at every point,
    so no knee (tok/s x replicas put one at 6). Halving the throughput at 2 replicas is one."""
    knob = KNOBS["replicas"]
    table = {4: 1001.0, 6: 1017.0, 8: 1020.0}
    arms = [_arm("a", v) for v in table]
    s = summarize(knob, [_result("a", v, [x]) for v, x in table.items()], arms)
    assert s.knee is None
    table[2] = 510.0
    arms = [_arm("a", v) for v in table]
    s = summarize(knob, [_result("a", v, [x]) for v, x in table.items()], arms)
    assert s.knee == 2.0
