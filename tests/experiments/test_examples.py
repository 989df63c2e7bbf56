"""Every example experiment file validates; the packaged default matches examples/default.toml."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from sessionroute.experiments.spec import load_experiment, resolve_arms

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.toml")), ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    spec = load_experiment(path, env={})
    arms = resolve_arms(spec)
    assert len(arms) >= 2
    assert len({a.policy for a in arms}) >= 1


def test_default_example_is_the_packaged_default() -> None:
    packaged = resources.files("sessionroute").joinpath("data/default.toml").read_text("utf-8")
    assert (EXAMPLES / "default.toml").read_text("utf-8") == packaged
