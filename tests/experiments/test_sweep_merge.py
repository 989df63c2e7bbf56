"""``sessionroute sweep --merge DIR``: rerun some arms, take the others from a finished sweep,
judge all; refused unless both sweeps ran the same experiment, values and seeds."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from sessionroute.cli import main
from sessionroute.errors import ConfigError
from sessionroute.experiments.objective import Objective
from sessionroute.experiments.spec import ResolvedArm
from sessionroute.experiments.sweep import KNOBS
from sessionroute.experiments.sweep_merge import EarlierSweep, check_merge, load_earlier

SWEEP = ["sweep", "--workload", "toy", "--knob", "replicas", "--jobs", "1"]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both arms at 2 and 3 replicas, seeds 0-1."""
    out = tmp_path_factory.mktemp("full")
    argv = [*SWEEP, "--values", "2,3", "--policies", "consistent_hash,round_robin"]
    assert main([*argv, "--seeds", "2", "--out", str(out)]) == 0
    return out


def _doc(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((path / "sweep.json").read_text())
    return doc


def _rerun(earlier: Path, out: Path, *extra: str) -> int:
    argv = [*SWEEP, "--policies", "round_robin", "--merge", str(earlier), "--out", str(out)]
    return main([*argv, *extra])


def test_rerunning_one_arm_and_merging_gives_the_full_sweep(full: Path, tmp_path: Path) -> None:
    assert _rerun(full, tmp_path / "m", "--values", "2,3", "--seeds", "2") == 0
    whole, merged = _doc(full), _doc(tmp_path / "m")
    # the simulation is deterministic: the rerun arm's runs are the earlier ones, so the
    # merged sweep is the full one, verdicts, knee and points included
    for key in ("values", "policies", "knee", "verdicts", "verdict_details", "points", "runs"):
        assert merged[key] == whole[key], key
    assert merged["settings"] == whole["settings"] and len(merged["settings"]) == 2
    assert {p["policy"] for p in merged["points"]} == {"consistent_hash", "round_robin"}


def test_a_sweep_json_without_settings_is_checked_against_its_report(
    full: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    old.mkdir()
    doc = _doc(full)
    del doc["settings"]  # as written before sweep.json recorded them
    (old / "sweep.json").write_text(json.dumps(doc))
    (old / "report.html").write_text((full / "report.html").read_text())
    assert _rerun(old, tmp_path / "m", "--values", "2,3", "--seeds", "2") == 0
    assert _doc(tmp_path / "m")["verdicts"] == doc["verdicts"]
    (old / "report.html").unlink()
    with pytest.raises(ConfigError, match="records no settings"):
        load_earlier(old)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--values", "2,4", "--seeds", "2"), "ran values [2, 3], this sweep [2.0, 4.0]"),
        (("--values", "2,3", "--seeds", "1"), "ran seeds [0, 1], this sweep runs [0]"),
        (("--values", "2,3", "--seeds", "2", "--seed", "1"), "ran seeds [0, 1], this sweep runs"),
        (("--values", "2,3", "--seeds", "2", "--knob", "concurrency"), "applies to workloads"),
    ],
)
def test_a_merge_of_another_sweep_is_refused_before_any_run(
    full: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: tuple[str, ...],
    message: str,
) -> None:
    assert _rerun(full, tmp_path / "m", *extra) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err
    assert not (tmp_path / "m").exists()


def test_a_merge_of_another_experiment_is_refused(full: Path) -> None:
    knob = KNOBS["replicas"]
    earlier = load_earlier(full)
    objective = Objective("slo_goodput", +1)

    def arms(**router: Any) -> list[ResolvedArm]:
        out = []
        for value in (2, 3):
            settings = copy.deepcopy(earlier.settings[float(value)])
            settings["router"].update(router)
            out.append(ResolvedArm(name=f"round_robin@{value}", policy="round_robin",
                                   policy_options={}, settings=settings))  # fmt: skip
        return out

    assert check_merge(earlier, knob, [2, 3], [0, 1], arms(), objective)  # the same: fine
    scrape = earlier.settings[2.0]["router"]["scrape_interval_s"]
    with pytest.raises(
        ConfigError, match=rf"settings differ at router.scrape_interval_s: {scrape} there, 7.5"
    ):
        check_merge(earlier, knob, [2, 3], [0, 1], arms(scrape_interval_s=7.5), objective)
    with pytest.raises(ConfigError, match="varied 'replicas', this sweep 'concurrency'"):
        check_merge(earlier, KNOBS["concurrency"], [2, 3], [0, 1], arms(), objective)
    # a setting added since the earlier sweep ran: the same at its default, not otherwise
    for settings in earlier.settings.values():
        settings["router"].pop("cb_half_open_on_recovery")
    assert check_merge(earlier, knob, [2, 3], [0, 1], arms(), objective)
    with pytest.raises(ConfigError, match="cb_half_open_on_recovery: None there, True here"):
        check_merge(earlier, knob, [2, 3], [0, 1], arms(cb_half_open_on_recovery=True), objective)
    earlier.doc["runs"][0].pop("slo_goodput")  # consistent_hash at 2 replicas, seed 0
    with pytest.raises(ConfigError, match="its runs lack slo_goodput"):
        check_merge(earlier, knob, [2, 3], [0, 1], arms(), objective)


def _round_robin_arms(earlier: EarlierSweep) -> list[ResolvedArm]:
    """round_robin at 2 and 3 replicas on the earlier sweep's settings."""
    return [
        ResolvedArm(name=f"round_robin@{v}", policy="round_robin", policy_options={},
                    settings=copy.deepcopy(earlier.settings[float(v)]))
        for v in (2, 3)
    ]  # fmt: skip


def test_a_merge_of_a_file_is_refused_with_a_clear_error(full: Path, tmp_path: Path) -> None:
    """``--merge DIR/sweep.json`` (the file, not its directory): a clear error, no traceback."""
    with pytest.raises(ConfigError, match=r"cannot read .*sweep\.json: Not a directory"):
        load_earlier(full / "sweep.json")
    assert _rerun(full / "sweep.json", tmp_path / "m", "--values", "2,3", "--seeds", "2") == 2


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        ("runs", "lacks runs"),
        ("values", "lacks values"),
        ("settings", "records settings for 1 value"),
    ],
)
def test_a_cut_sweep_json_is_refused_naming_what_it_lacks(
    cut: str, message: str, full: Path, tmp_path: Path
) -> None:
    """A ``sweep.json`` cut short or edited by hand: a ConfigError naming the file and what
    is missing, not a KeyError or zip()'s message."""
    doc = _doc(full)
    if cut == "settings":
        doc["settings"] = doc["settings"][:1]
    else:
        del doc[cut]
    (tmp_path / "sweep.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}/sweep.json") + f".*{message}"):
        load_earlier(tmp_path)


def test_keeping_an_arm_whose_options_depend_on_the_objective_kind_is_refused(
    full: Path,
) -> None:
    """An arm kept from a sweep judged on an RL objective is refused in a sweep judged on a
    serving one when its policy takes other options under each (adaptive_hold); one whose
    policy takes none (round_robin), or the same kind, passes."""
    knob = KNOBS["replicas"]
    earlier = load_earlier(full)
    arms = _round_robin_arms(earlier)
    serving = Objective("slo_goodput", +1)
    earlier.doc["objective"] = {"metric": "step_time_s.mean"}
    assert check_merge(earlier, knob, [2, 3], [0, 1], arms, serving)  # consistent_hash: none
    for row in earlier.doc["runs"]:
        if row["policy"] == "consistent_hash":
            row["policy"] = "adaptive_hold"
    with pytest.raises(ConfigError, match="ran adaptive_hold under the objective step_time_s"):
        check_merge(earlier, knob, [2, 3], [0, 1], arms, serving)
    earlier.doc["objective"] = {"metric": "ttft_s.p99"}  # serving too: the same options
    assert check_merge(earlier, knob, [2, 3], [0, 1], arms, serving)


def test_a_merge_of_a_sweep_judged_against_another_slo_is_refused(full: Path) -> None:
    """The earlier runs' SLO goodput was counted against the SLO of that sweep's objective:
    under another SLO they are not this sweep's runs, whatever the objective's metric."""
    knob = KNOBS["replicas"]
    earlier = load_earlier(full)
    arms = _round_robin_arms(earlier)
    assert earlier.doc["objective"]["slo"] == {"ttft_s": 2.0, "itl_s": 0.2}
    assert check_merge(earlier, knob, [2, 3], [0, 1], arms, Objective("ttft_s.p99", -1))
    tight = Objective("slo_goodput", +1, slo_ttft_s=1.0)
    with pytest.raises(
        ConfigError, match=r"against TTFT <= 2 s and ITL <= 0.2 s, this sweep against TTFT <= 1 s"
    ):
        check_merge(earlier, knob, [2, 3], [0, 1], arms, tight)
