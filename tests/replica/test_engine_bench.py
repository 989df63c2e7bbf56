"""``sessionroute bench engine`` runs and prints the agreed JSON shape (tiny sizes, not timed)."""

from __future__ import annotations

import json

import pytest

from sessionroute.cli import main


def test_bench_engine_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "bench",
            "engine",
            "--json",
            "--sessions",
            "8",
            "--max-context",
            "9000",
            "--requests",
            "40",
            "--reference-requests",
            "20",
            "--block-size",
            "64",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fast"]["requests"] == 40 and doc["reference"]["requests"] == 20
    assert doc["fast"]["requests_per_wall_second"] > 0
    assert doc["reference"]["requests_per_wall_second"] > 0
    assert doc["block_size"] == 64
    assert 0.0 <= doc["fast"]["prefix_cache_hit_rate"] <= 1.0


def test_bench_engine_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "engine", "--sessions", "4", "--max-context", "8000", "--requests", "10"]
    assert main([*argv, "--reference-requests", "0"]) == 0
    out = capsys.readouterr().out
    assert "fast" in out and "skipped" in out
