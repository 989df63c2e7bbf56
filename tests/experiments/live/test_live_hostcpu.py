"""Where the host's CPU went during a live run: the arithmetic, and real processes measured."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessionroute.experiments.live.hostcpu import (
    CpuSample,
    HostCpu,
    busy_cores,
    crowding_note,
    describe,
)

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")


def test_busy_cores_divides_each_part_by_the_wall_time_and_leaves_the_rest_to_other() -> None:
    a = CpuSample(wall_s=10.0, host_s=100.0, servers_s=(5.0, 7.0), client_s=1.0)
    b = CpuSample(wall_s=12.0, host_s=103.6, servers_s=(6.0, 8.6), client_s=1.4)
    got = busy_cores(a, b)
    assert got == {
        "host": 1.8,
        "servers": 1.3,
        "per_server": [0.5, 0.8],
        "client": 0.2,
        "other": 0.3,
    }
    assert busy_cores(a, None) is None and busy_cores(None, b) is None
    assert busy_cores(b, a) is None  # no time between them
    line = describe(2, [("calibration", got), ("skipped", None), ("sticky", got)])
    assert line == (
        "host CPU, cores busy of 2 (servers/client/other): calibration 1.30/0.20/0.30; "
        "sticky 1.30/0.20/0.30"
    )


# a session leader that sleeps while a child of its own spins: the child counts for its server
_LEADER = (
    "import subprocess, sys\n"
    "spin = 'import time\\nt = time.monotonic()\\nwhile time.monotonic() - t < 1.5: pass'\n"
    "sys.stdin.readline()\n"
    "subprocess.run([sys.executable, '-c', spin])\n"
)


def test_a_server_counts_every_process_of_its_session_and_an_idle_one_nothing() -> None:
    busy = subprocess.Popen(
        [sys.executable, "-c", _LEADER], stdin=subprocess.PIPE, text=True, start_new_session=True
    )
    idle = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()"],
        stdin=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        meter = HostCpu([busy.pid, idle.pid])
        assert meter.cores >= 1
        start = meter.sample()
        assert busy.stdin is not None
        busy.stdin.write("go\n")
        busy.stdin.flush()
        time.sleep(1.2)  # the spinning child counts while it lives: sample before it ends
        got = busy_cores(start, meter.sample())
    finally:
        for proc in (busy, idle):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
    assert got is not None
    spin, rest = got["per_server"]
    assert spin > 0.1, got  # most of a core, less on a loaded machine
    assert rest < 0.05, got
    assert got["client"] < 0.3, got  # this process slept
    assert got["host"] >= got["servers"] - 0.05, got


def test_more_servers_than_cores_are_named_and_as_many_as_cores_are_not() -> None:
    assert crowding_note(2, 2) is None and crowding_note(1, 2) is None
    assert crowding_note(0, 1) is None  # servers started elsewhere
    note = crowding_note(3, 2)
    assert note is not None
    assert note.startswith("note: 3 servers share this host's 2 cores")
    assert "at most one server per core" in note
