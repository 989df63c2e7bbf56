"""The host's speed, sampled by a child process: real samples, windows, and a clean stop."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

from sessionroute.experiments.live.hostcpu import HostCpu, describe
from sessionroute.experiments.live.hostspeed import HostSpeed, loop_ms

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")


def test_the_loop_costs_cpu_time_in_proportion_to_its_iterations() -> None:
    short = min(loop_ms(20_000) for _ in range(5))
    long = min(loop_ms(200_000) for _ in range(5))
    assert short > 0
    assert 4 < long / short < 20, (short, long)


def test_the_child_samples_until_stopped_and_a_window_takes_the_median_of_its_own(
    tmp_path: Path,
) -> None:
    with HostSpeed(tmp_path / "speed.txt", interval_s=0.05) as speed:
        t0 = time.monotonic()
        deadline = t0 + 20
        while len(speed.samples) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        t1 = time.monotonic()
        proc = speed._proc
    assert proc is not None and proc.exited() is not None  # stopped on exit
    inside = [ms for t, ms in speed.samples if t0 <= t <= t1]
    assert len(inside) >= 5, speed.samples
    assert speed.median_ms(t0, t1) == round(statistics.median(inside), 2)
    assert speed.median_ms(t1 + 100, t1 + 200) is None
    count = len(speed.samples)
    time.sleep(0.3)
    assert len(speed.samples) == count  # nothing after the stop


def test_the_host_cpu_meter_adds_the_speed_of_each_interval_and_says_it(tmp_path: Path) -> None:
    with HostSpeed(tmp_path / "speed.txt", interval_s=0.05) as speed:
        meter = HostCpu([], speed)
        start = meter.sample()
        deadline = time.monotonic() + 20
        while len(speed.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = meter.between(start, meter.sample())
    assert got is not None and got["loop_ms"] > 0
    assert HostCpu([]).between(start, meter.sample()) is not None
    assert "loop_ms" not in (HostCpu([]).between(start, meter.sample()) or {})
    line = describe(2, [("calibration", got), ("arm", got)])
    second = line.split("\n")[1]
    assert second == (
        "host speed, CPU ms of a fixed loop (higher: slower cores): "
        f"calibration {got['loop_ms']:.1f}; arm {got['loop_ms']:.1f}"
    )
