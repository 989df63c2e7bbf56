"""Experiment-file validation: unknown keys, env expansion, unmatched arms."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from sessionroute.errors import ConfigError
from sessionroute.experiments.spec import (
    ResolvedArm,
    load_experiment,
    parse_experiment,
    resolve_arms,
)
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy

BASE = """
name = "t"
[workload]
kind = "toy"
[[arms]]
policy = "consistent_hash"
[[arms]]
policy = "sticky_least_loaded"
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(text)
    return p


def test_valid_file_resolves_two_arms(tmp_path: Path) -> None:
    spec = load_experiment(_write(tmp_path, BASE))
    arms = resolve_arms(spec)
    assert [a.name for a in arms] == ["consistent_hash", "sticky_least_loaded"]
    assert arms[0].settings == arms[1].settings
    assert arms[0].settings["workload"]["kind"] == "toy"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'replicas.cuont'"):
        load_experiment(_write(tmp_path, BASE + "\n[replicas]\ncuont = 3\n"))


def test_unknown_top_level_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'sead'"):
        parse_experiment({"sead": 1, "arms": [{"policy": "least_loaded"}]})


def test_unknown_policy_and_option() -> None:
    with pytest.raises(ConfigError, match="unknown policy 'stiky'"):
        parse_experiment({"arms": [{"policy": "stiky"}]})
    with pytest.raises(ConfigError, match="session_tll_s"):
        parse_experiment(
            {"arms": [{"policy": "sticky_least_loaded", "policy_options": {"session_tll_s": 1}}]}
        )


def test_env_expansion_with_default_and_value() -> None:
    data = {
        "name": "${EXP_NAME:-fallback}",
        "workload": {"kind": "${KIND}"},
        "arms": [{"policy": "least_loaded"}],
    }
    spec = parse_experiment(data, env={"KIND": "toy"})
    assert spec.name == "fallback"
    assert spec.workload.kind == "toy"
    spec = parse_experiment(data, env={"KIND": "toy", "EXP_NAME": "mine"})
    assert spec.name == "mine"


def test_unset_env_without_default_names_variable() -> None:
    with pytest.raises(ConfigError, match=r"workload\.kind.*'MISSING_VAR'"):
        parse_experiment(
            {"workload": {"kind": "${MISSING_VAR}"}, "arms": [{"policy": "least_loaded"}]}
        )


def test_unmatched_arms_refused_with_difference_shown() -> None:
    data = {
        "replicas": {"count": 3},
        "arms": [
            {"policy": "consistent_hash"},
            {"policy": "sticky_least_loaded", "overrides": {"replicas": {"count": 4}}},
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_experiment(data)
    msg = str(info.value)
    assert "replicas.count" in msg
    assert "3" in msg and "4" in msg
    assert "allow_differences" in msg


def test_declared_difference_is_accepted() -> None:
    data = {
        "allow_differences": ["router.finish_sessions"],
        "arms": [
            {"name": "release", "policy": "sticky_least_loaded"},
            {
                "name": "leak",
                "policy": "sticky_least_loaded",
                "overrides": {"router": {"finish_sessions": False}},
            },
        ],
    }
    arms = resolve_arms(parse_experiment(data))
    assert arms[0].settings["router"]["finish_sessions"] is True
    assert arms[1].settings["router"]["finish_sessions"] is False


def test_duplicate_arm_names_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate arm name 'least_loaded'"):
        parse_experiment({"arms": [{"policy": "least_loaded"}, {"policy": "least_loaded"}]})


def test_bad_override_value_is_explained() -> None:
    data = {
        "allow_differences": ["replicas"],
        "arms": [{"policy": "least_loaded", "overrides": {"replicas": {"count": 0}}}],
    }
    with pytest.raises(ConfigError, match=r"replicas\.count"):
        parse_experiment(data)


def test_missing_and_non_toml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read experiment file"):
        load_experiment(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_experiment(bad)


def test_an_unset_setting_is_shown_as_unset_in_the_difference() -> None:
    data = {
        "arms": [
            {"policy": "consistent_hash"},
            {"policy": "sticky_least_loaded", "overrides": {"replicas": {"block_size": 64}}},
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_experiment(data)
    msg = str(info.value)
    assert "replicas.block_size" in msg
    assert "(unset: default)" in msg and "None" not in msg and "64" in msg


def _hold_arm(kind: str, extra: str = "", options: str = "") -> ResolvedArm:
    text = f'name = "t"\n[workload]\nkind = "{kind}"\n{extra}\n[[arms]]\npolicy = "adaptive_hold"\n'
    return resolve_arms(parse_experiment(tomllib.loads(text + options)))[0]


def test_objective_options_go_under_the_written_ones() -> None:
    """adaptive_hold's options for a serving objective apply to a serving workload (toy), not
    to swe-rl, not when the objective is declared RL, and never over an option written."""
    serving = dict(AdaptiveHoldPolicy.objective_options["serving"])
    assert serving["wait_bound"] is True
    served = _hold_arm("toy")
    assert served.policy_options == serving == served.objective_options
    assert _hold_arm("swe-rl").policy_options == {}
    assert _hold_arm("toy", '[objective]\npreset = "rl"').policy_options == {}
    assert _hold_arm("swe-rl", '[objective]\npreset = "serving"').policy_options == serving
    written = _hold_arm("toy", options="policy_options = { wait_bound = false }")
    assert written.policy_options == {**serving, "wait_bound": False}
    assert "wait_bound" not in written.objective_options
