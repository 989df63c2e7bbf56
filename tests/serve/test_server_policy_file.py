"""A policy file (``serve --policy-config``, as ``sessionroute tune`` writes it) and inline
options (``--policy NAME(key=value)``) change what the live router does."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sessionroute.errors import ConfigError
from sessionroute.router.policies.adaptive_hold import AdaptiveHoldPolicy
from sessionroute.router.policies.options import policy_file_text
from sessionroute.serve.config import RouterSettings, settings_from_args
from sessionroute.serve.flags import add_arguments

from .backend import FakeBackend
from .conftest import MakeRouter, post_chat

PREFIX = "You are a careful coding agent. " * 20


def _settings(*flags: str) -> RouterSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_from_args(parser.parse_args(["--worker-urls", "http://a", *flags]))


@pytest.mark.parametrize(("threshold", "expected"), [(0.3, [0, 0, 6]), (1.0, [2, 2, 2])])
async def test_policy_file_changes_placement(
    tmp_path: Path,
    threshold: float,
    expected: list[int],
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    """cache_aware follows a shared prefix at its default threshold; a file that asks for a
    full match (1.0) sends the same prompts by load instead."""
    path = tmp_path / "tuned.toml"
    path.write_text(policy_file_text("cache_aware", {"cache_threshold": threshold}))
    router = await make_router([b.url for b in backends], policy_config=str(path))
    assert router.router.core.policy.config.cache_threshold == threshold
    for turn in range(6):
        status, _ = await post_chat(client, router, None, content=PREFIX + f"t{turn}")
        assert status == 200
    assert sorted(len(b.seen) for b in backends) == expected


def test_inline_options_file_and_flags_layer(tmp_path: Path) -> None:
    s = _settings("--policy", "consistent_hash_bounded_load(c=1.05)")
    assert s.policy_name() == "consistent_hash_bounded_load"
    assert s.policy_options()["c"] == 1.05
    path = tmp_path / "tuned.toml"
    path.write_text(policy_file_text("cache_aware", {"cache_threshold": 0.6, "max_tree_size": 9}))
    layered: dict[str, Any] = _settings(
        "--cache-threshold", "0.2", "--policy-config", str(path),
        "--policy", "cache_aware(cache_threshold=0.7)",
    ).policy_options()  # fmt: skip
    assert (layered["cache_threshold"], layered["max_tree_size"]) == (0.7, 9)
    s = _settings(
        "--policy", "cache_aware(cache_threshold=0.7)", "--policy-option", "cache_threshold=0.9"
    )
    assert s.policy_options()["cache_threshold"] == 0.9


def test_policy_file_disagreeing_with_policy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tuned.toml"
    path.write_text(policy_file_text("cache_aware", {}))
    s = _settings("--policy", "round_robin", "--policy-config", str(path))
    with pytest.raises(ConfigError, match="name different policies"):
        s.policy_name()
    assert _settings("--policy-config", str(path)).policy_name() == "cache_aware"


def test_objective_applies_the_policys_options_for_it() -> None:
    """``--objective serving`` runs adaptive_hold with its serving options, below the ones
    written; without it the policy keeps its own defaults."""
    serving = dict(AdaptiveHoldPolicy.objective_options["serving"])
    options = _settings("--policy", "adaptive_hold", "--objective", "serving").policy_options()
    assert options.items() >= serving.items()
    assert "wait_bound" not in _settings("--policy", "adaptive_hold").policy_options()
    written = _settings(
        "--policy", "adaptive_hold(wait_bound=false)", "--objective", "serving"
    ).policy_options()  # fmt: skip
    assert written["wait_bound"] is False
    assert _settings("--objective", "rl").policy_options() == _settings().policy_options()


def test_objective_help_names_the_serving_options() -> None:
    """``serve --help`` names every option adaptive_hold takes under a serving objective."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    text = " ".join(parser.format_help().split())
    for key, value in AdaptiveHoldPolicy.objective_options["serving"].items():
        if isinstance(value, bool):
            shown = str(value).lower()
        else:
            shown = value if isinstance(value, str) else f"{value:g}"
        assert f"{key}={shown}" in text
