"""The benchmark tables read on an 80-column terminal (tiny sizes, not timed)."""

from __future__ import annotations

import pytest

from sessionroute.cli import main


def test_bench_engine_table_fits_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "engine", "--sessions", "4", "--max-context", "8000", "--block-size", "64"]
    assert main([*argv, "--requests", "20", "--reference-requests", "10"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    ratio_row = next(line for line in lines if "requests / wall second" in line)
    assert ratio_row.rstrip(" │").endswith("x"), ratio_row  # fast / reference ratio shown
    assert "fast" in out and "reference" in out
