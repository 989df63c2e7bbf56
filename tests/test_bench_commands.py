"""``sessionroute bench digest`` and ``bench instructions`` (small cases; nothing timed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sessionroute.cli import main

CASES = ["toy/ch", "engine/bs1-"]  # the two fastest: 488 simulated and 500 engine requests


def test_digest_save_then_check_is_identical_and_a_change_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "digests.json"
    assert main(["bench", "digest", "save", str(path), *CASES]) == 0
    saved = json.loads(path.read_text("utf-8"))
    assert set(saved) == {"toy/ch", "engine/bs1-s32-n500"}
    assert saved["toy/ch"][1] > 0 and len(saved["toy/ch"][0]) == 16
    capsys.readouterr()

    assert main(["bench", "digest", "check", str(path), *CASES]) == 0
    assert "ALL IDENTICAL" in capsys.readouterr().out

    saved["toy/ch"][0] = "0" * 16
    path.write_text(json.dumps(saved), "utf-8")
    assert main(["bench", "digest", "--json", "check", str(path), "toy/ch"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["different"] == ["toy/ch"] and doc["missing"] == []


def test_digest_check_names_cases_the_file_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.json"
    path.write_text("{}", "utf-8")
    assert main(["bench", "digest", "check", str(path), "engine/bs1-"]) == 0
    assert "not in the file (not compared): engine/bs1-s32-n500" in capsys.readouterr().out


def test_digest_check_without_the_file_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "digest", "check", str(tmp_path / "nope.json"), "toy/ch"]) == 2
    assert "cannot read digest file" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_instructions_refuses_a_large_run_not_above_the_small_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "instructions", "engine", "--small", "100", "--large", "100"]
    assert main(argv) == 2
    assert "--large (100) must be above --small (100)" in capsys.readouterr().err


def test_instructions_without_valgrind_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert main(["bench", "instructions", "sim"]) == 2
    assert "valgrind is not installed" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sim", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
        (["proxy", "--duration", "0"], "argument --duration: must be a number > 0, got 0"),
        (["proxy", "--duration", "nan"], "argument --duration: must be a number > 0, got nan"),
        (["proxy", "--concurrency", "1", "0"], "argument --concurrency: must be >= 1, got 0"),
        (["proxy", "--repeat", "0"], "argument --repeat: must be >= 1, got 0"),
        (["proxy", "--body-bytes", "-5"], "argument --body-bytes: must be >= 0, got -5"),
        (["policies", "--sessions", "0"], "argument --sessions: must be >= 1, got 0"),
        (["policies", "--workers", "0"], "argument --workers: must be >= 1, got 0"),
        (["policies", "--turns", "-1"], "argument --turns: must be >= 1, got -1"),
        (["policies", "--new", "x"], "argument --new: invalid int value: 'x'"),
    ],
)
def test_out_of_range_bench_options_are_refused_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"sessionroute bench {argv[0]}: error: {message}" in err
    assert "Traceback" not in err


def test_top_level_help_lists_every_bench_target(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for target in ("policies", "engine", "sim", "proxy", "shared-state", "stall", "soak"):
        assert target in text.split("run a benchmark (")[1].split(")")[0]
