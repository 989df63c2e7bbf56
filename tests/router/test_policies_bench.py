"""``sessionroute bench policies``: the JSON document has exactly the agreed shape."""

from __future__ import annotations

import json

import pytest

from sessionroute.bench.policies import bench_policy
from sessionroute.cli import main
from sessionroute.router.policies import policy_names

KEYS = ["policy", "workers", "sessions", "p50_us", "p99_us", "new_session_us"]


def test_bench_policies_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "policies", "--json", "--workers", "4", "--sessions", "40"]
    assert main([*argv, "--turns", "30", "--new", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["results"]
    assert [row["policy"] for row in doc["results"]] == policy_names()
    for row in doc["results"]:
        assert list(row) == KEYS
        assert (row["workers"], row["sessions"]) == (4, 40)
        assert 0 < row["p50_us"] <= row["p99_us"]
        assert row["new_session_us"] > 0


def test_bench_policies_table_and_policy_filter(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "policies", "--policy", "sticky_least_loaded", "--workers", "3"]
    assert main([*argv, "--sessions", "9", "--turns", "5", "--new", "2"]) == 0
    out = capsys.readouterr().out
    assert "sticky_least_loaded" in out and "consistent_hash" not in out


def test_bench_policy_reports_its_sizes_and_rejects_bad_ones() -> None:
    row = bench_policy("consistent_hash_bounded_load", 5, 25, 10, 4)
    assert (row["policy"], row["workers"], row["sessions"]) == (
        "consistent_hash_bounded_load",
        5,
        25,
    )
    with pytest.raises(ValueError, match="sessions"):
        bench_policy("random", 4, 0, 10, 1)
