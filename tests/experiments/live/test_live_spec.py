"""The [live] section: validation, command templates kept for later, per-arm routers."""

from __future__ import annotations

from typing import Any

import pytest

from sessionroute.errors import ConfigError
from sessionroute.experiments.live_section import LiveSection, expand_experiment_env
from sessionroute.experiments.spec import parse_experiment, resolve_arms
from sessionroute.sim.spec import SimSpec


def _doc(**live: Any) -> dict[str, Any]:
    return {
        "workload": {"kind": "toy"},
        "live": {"replicas": "command", "model": "${MODEL_DIR}", **live},
        "arms": [{"policy": "sticky_least_loaded"}],
    }


def test_templates_are_not_expanded_at_load_time() -> None:
    tmpl = "${PYTHON} -m server --port ${PORT} --model ${MODEL}"
    spec = parse_experiment(_doc(replica_command=tmpl), env={"MODEL_DIR": "/m"})
    assert spec.live.replica_command == tmpl
    assert spec.live.model == "/m"


def test_other_live_strings_still_need_their_variables() -> None:
    with pytest.raises(ConfigError, match="MODEL_DIR"):
        parse_experiment(_doc(), env={})


def test_arm_override_templates_are_kept_too() -> None:
    doc = {
        "arms": [
            {"policy": "random"},
            {
                "policy": "random",
                "name": "b",
                "overrides": {"live": {"router_command": "r ${PORT}"}},
            },
        ],
        "allow_differences": ["live.router_command"],
    }
    out = expand_experiment_env(doc, {})
    assert out["arms"][1]["overrides"]["live"]["router_command"] == "r ${PORT}"
    arms = resolve_arms(parse_experiment(doc, env={}))
    assert arms[1].settings["live"]["router_command"] == "r ${PORT}"


def test_arms_differing_in_router_must_declare_it() -> None:
    doc: dict[str, Any] = {
        "arms": [
            {"name": "a", "policy": "sticky_least_loaded"},
            {"name": "b", "policy": "sticky_least_loaded",
             "overrides": {"live": {"router": "vllm-router"}}},
        ]
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"live\.router"):
        parse_experiment(doc, env={})
    doc["allow_differences"] = ["live.router"]
    arms = resolve_arms(parse_experiment(doc, env={}))
    assert [a.settings["live"]["router"] for a in arms] == ["sessionroute", "vllm-router"]


def test_unknown_live_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'live\.replica'"):
        parse_experiment({"live": {"replica": "x"}, "arms": [{"policy": "random"}]}, env={})


def test_the_simulator_ignores_the_live_section() -> None:
    spec = parse_experiment(_doc(), env={"MODEL_DIR": "/m"})
    arm = resolve_arms(spec)[0]
    assert SimSpec.from_settings(arm.settings).workload.kind == "toy"
    assert LiveSection().replicas == "emulate"
