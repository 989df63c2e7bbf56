"""docs/tuning.md's worked example runs as written: compare, tune, compare with the tuned file,
and serve's settings read the tuned file."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from sessionroute.cli import main
from sessionroute.router.policies.options import load_policy_file
from sessionroute.serve.config import settings_from_args
from sessionroute.serve.flags import add_arguments

DOC = Path(__file__).resolve().parents[2] / "docs" / "tuning.md"


def _commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    lines = [ln for b in blocks for ln in b.splitlines() if ln.startswith("sessionroute ")]
    return [shlex.split(ln)[1:] for ln in lines]


@pytest.mark.slow
def test_the_worked_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("optuna")
    monkeypatch.chdir(tmp_path)
    commands = _commands()
    assert [c[0] for c in commands] == ["compare", "tune", "compare", "serve"]
    for argv in commands[:3]:
        assert main(argv) == 0, argv
    name, options = load_policy_file("tuning-example/tune/tuned.toml")
    assert name == "consistent_hash_bounded_load" and set(options) == {"c"}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = settings_from_args(parser.parse_args(commands[3][1:]))
    assert settings.policy_name() == name
    assert settings.policy_options()["c"] == options["c"]
