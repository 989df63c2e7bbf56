"""``sessionroute bench sim`` prints its measurement (not a timed test)."""

from __future__ import annotations

import json

import pytest

from sessionroute.cli import main
from sessionroute.native import PURE_ENV


def test_bench_sim_json_reports_requests_per_wall_second(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "sim", "--json", "--workload", "toy", "--block-size", "64"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"requests_per_wall_second", "simulated_requests", "wall_seconds"}
    assert doc["simulated_requests"] > 400
    assert doc["wall_seconds"] > 0
    assert doc["requests_per_wall_second"] == pytest.approx(
        doc["simulated_requests"] / doc["wall_seconds"]
    )


@pytest.mark.parametrize("pure", [False, True])
def test_bench_sim_json_says_on_stderr_when_pure_python_was_asked_for(
    pure: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JSON document keeps exactly its three keys; a run under SESSIONROUTE_PURE_PYTHON
    says so on stderr (the table's caption does it without --json)."""
    if pure:
        monkeypatch.setenv(PURE_ENV, "1")
    else:
        monkeypatch.delenv(PURE_ENV, raising=False)
    assert main(["bench", "sim", "--json", "--workload", "toy", "--block-size", "64"]) == 0
    out = capsys.readouterr()
    assert set(json.loads(out.out)) == {
        "requests_per_wall_second",
        "simulated_requests",
        "wall_seconds",
    }
    assert ("note: hot modules as pure Python (SESSIONROUTE_PURE_PYTHON is set)" in out.err) is pure


def test_bench_sim_repeat_reports_the_median_run_and_every_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "sim", "--json", "--workload", "toy", "--block-size", "64", "--repeat", "3"]
    assert main(argv) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    runs = doc["runs"]
    assert len(runs) == 3 and sorted(runs)[1] == doc["requests_per_wall_second"]
    assert doc["requests_per_wall_second"] == pytest.approx(
        doc["simulated_requests"] / doc["wall_seconds"]
    )
    assert doc["loadavg_1m_at_end"] >= 0
    assert out.err.count("requests / wall second") == 3  # one progress line per run


def test_bench_sim_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--workload", "toy", "--block-size", "64"]) == 0
    assert "requests / wall second" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "sim", "--steps", "0"], "--steps: Input should be greater than or equal to 1"),
        (["bench", "sim", "--replicas", "0"], "--replicas: "),
        (["bench", "engine", "--requests", "0"], "--requests must be >= 1, got 0"),
    ],
)
def test_bench_bad_values_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.startswith(f"sessionroute bench {argv[1]}: error:")
