"""``sessionroute bench scale`` on a small fleet: the shape of its result and the round trips
of a later turn (nothing here asserts a latency or a CPU time: the machine may be loaded)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_scale_bench_measures_each_level_and_a_later_turn_costs_one_round_trip() -> None:
    cmd = [sys.executable, "-m", "sessionroute.cli", "bench", "scale", "--json"]
    cmd += ["--workers", "4", "--sessions", "20", "60", "--measure-secs", "0.3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["errors"] == 0 and r["ok"]
    phases = [(row["mode"], row["phase"]) for row in r["rows"]]
    assert phases == [
        (mode, phase) for mode in ("local", "redis") for phase in ("20", "60", "20 again")
    ]
    for row in r["rows"]:
        assert row["requests"] > 0 and row["router_cpu_us_per_req"] > 0
        assert row["router_rss_mib"] > 0 and row["direct_p99_ms"] > 0
        if row["mode"] == "redis":
            assert row["router_round_trips_per_req"] == 1.0  # one LOAD, no commit
    assert set(r["summary"]) == {"local", "redis"}
    assert "redis_bytes_per_session" in r["summary"]["redis"]  # too few sessions to weigh
