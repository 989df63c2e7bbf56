"""The live client's event-loop lateness (a starved client stamps first tokens late)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessionroute.experiments.live.looplag import STALL_S, LoopLag, cpu_wait_s, summarise


def test_summarise_counts_and_sums_the_stalls() -> None:
    s = summarise([0.001, 0.3, 0.002, 0.05, STALL_S], wall_s=10.0)
    assert s["samples"] == 5 and s["wall_s"] == 10.0
    assert s["stalls"] == 2  # over STALL_S only
    assert s["stalled_s"] == pytest.approx(0.35)
    assert s["max_lag_s"] == 0.3
    empty = summarise([], wall_s=0.0)
    assert empty["stalls"] == 0 and empty["stalled_s"] == 0.0 and empty["max_lag_s"] == 0.0


def test_a_loop_held_by_blocking_work_is_seen_late() -> None:
    async def main() -> LoopLag:
        lag = LoopLag(interval_s=0.005)
        task = asyncio.ensure_future(lag.run())
        await asyncio.sleep(0)  # the monitor's first sleep is pending
        await asyncio.sleep(0.01)
        time.sleep(0.2)  # blocks the loop: the monitor's sleep ends at least this late
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return lag

    s = asyncio.run(main()).summary()
    assert s["stalls"] >= 1
    assert s["max_lag_s"] >= 0.15
    assert s["wall_s"] >= 0.2
    if s["cpu_wait_s"] is not None:  # held by its own work, not waiting for a core
        assert s["cpu_wait_s"] < 0.1, s


@pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="needs Linux schedstat"
)
def test_a_thread_sharing_its_core_with_a_busy_process_waits_for_it() -> None:
    cpu = min(os.sched_getaffinity(0))
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 3: pass"
    mask = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        os.sched_setaffinity(busy.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # this thread only, on the busy process's core
        before = cpu_wait_s()
        t = time.monotonic()
        while time.monotonic() - t < 0.6:  # want the core half of the time
            pass
        after = cpu_wait_s()
    finally:
        os.sched_setaffinity(0, mask)
        busy.kill()
        busy.wait()
    assert before is not None and after is not None
    if before == after == 0.0:
        pytest.skip("this kernel does not account run-queue waits (schedstat reads 0)")
    assert after - before > 0.1  # the other half it waited on the run queue


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        LoopLag(interval_s=0)
