"""``sessionroute bench sim`` prints its measurement (not a timed test)."""

from __future__ import annotations

import json

import pytest

from sessionroute.cli import main


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
