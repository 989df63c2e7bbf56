"""``sessionroute compare --live`` end to end: subprocesses (``sessionroute emulate``,
``sessionroute serve``), outputs, and cleanup by process id on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = """
name = "tiny-live"
[workload]
kind = "toy"
[workload.options]
sessions = {sessions}
arrival_rate_per_s = 4.0
turns_p50 = 2
turns_p90 = 3
turns_max = 3
first_p50 = 100
first_p90 = 200
output_p50 = 16
output_p90 = 32
think_p50_s = {think}
think_p90_s = {think}
[live]
emulate_mode = "process"
router = "sessionroute"
time_scale = 10
cache_root = "{root}"
[[arms]]
policy = "sticky_least_loaded"
[[arms]]
policy = "round_robin"
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sessionroute.cli", *args]


def test_compare_live_writes_results_with_process_replicas_and_router(tmp_path: Path) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text(TINY.format(sessions=4, think=0.5, root=tmp_path / "work"), "utf-8")
    out = tmp_path / "out"
    r = subprocess.run(
        _cli("compare", "--live", str(exp), "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text("utf-8"))
    names = [a["name"] for a in doc["arms"]]
    assert names == ["sticky_least_loaded", "round_robin"]
    for arm in doc["arms"]:
        m = arm["metrics"]
        assert m["sessions_completed"] == 4
        assert m["requests_failed"] == 0
        assert m["requests_completed"] == m["requests_submitted"] > 4
        assert 0.0 < m["prefix_cache_hit_rate"] < 1.0
        assert m["live"]["replicas"] == "emulate"
    assert doc["arms"][0]["metrics"]["sessions_released"] == 4
    assert (out / "report.html").exists()
    assert list((tmp_path / "work").iterdir()) == []  # the run's directory is removed


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_ctrl_c_stops_every_process_it_started(tmp_path: Path) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text(TINY.format(sessions=40, think=5.0, root=tmp_path / "work"), "utf-8")
    proc = subprocess.Popen(
        _cli("compare", "--live", str(exp), "--out", str(tmp_path / "out")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        kids: set[int] = set()
        while len(kids) < 2:  # the emulate process, then the arm's router
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no router and emulator started: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            kids = _children(proc.pid)
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 130
    assert not [k for k in kids if _alive(k)]
