"""Command templates and processes started and stopped by id."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sessionroute.errors import ConfigError
from sessionroute.experiments.live.procs import (
    LiveStartError,
    ProcessSet,
    StartedProcess,
    expand_command,
    wait_healthy,
)


def test_expand_command_splits_and_expands() -> None:
    argv = expand_command(
        "${PY} -m x --port ${PORT} --urls ${WORKER_URLS} --name 'a b' --home ${HOME}",
        {"PY": "/bin/py", "PORT": "8000", "WORKER_URLS": "http://a http://b"},
        {"HOME": "/root", "PORT": "1"},
        "t",
    )
    assert argv == [
        "/bin/py", "-m", "x", "--port", "8000", "--urls", "http://a", "http://b",
        "--name", "a b", "--home", "/root",
    ]  # fmt: skip


def test_expand_command_names_a_missing_variable() -> None:
    with pytest.raises(ConfigError, match="MISSING"):
        expand_command("run ${MISSING}", {}, {}, "live.replica_command")
    with pytest.raises(ConfigError, match="cannot split"):
        expand_command("run 'open", {}, {}, "t")


def test_process_set_stops_what_it_started(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    with ProcessSet() as procs:
        a = procs.start("a", sleeper, {}, tmp_path / "a.log")
        b = procs.start("b", sleeper, {}, tmp_path / "b.log")
        assert a.exited() is None and b.exited() is None
    assert a.exited() is not None
    assert b.exited() is not None


def test_a_process_that_exits_fails_the_health_wait_with_its_log(tmp_path: Path) -> None:
    proc = StartedProcess(
        "replica 0",
        [sys.executable, "-c", "print('boom: no model'); raise SystemExit(3)"],
        {},
        tmp_path / "r.log",
    )
    try:
        with pytest.raises(LiveStartError, match="boom: no model"):
            wait_healthy("http://127.0.0.1:9/health", proc, 30.0, "replica 0", interval_s=0.05)
    finally:
        proc.stop()


def test_a_missing_program_is_a_start_error(tmp_path: Path) -> None:
    with pytest.raises(LiveStartError, match="cannot run"):
        StartedProcess("x", [str(tmp_path / "nope")], {}, tmp_path / "x.log")


def test_health_wait_times_out() -> None:
    with pytest.raises(LiveStartError, match="not healthy"):
        wait_healthy("http://127.0.0.1:9/health", None, 0.2, "router", interval_s=0.05)


def test_a_started_process_leads_its_own_session(tmp_path: Path) -> None:
    # a session (scheduler autogroup) per server: its share of the cores does not move with how
    # many other servers are busy (docs/simulator.md, "Each server its own share of the host")
    import os

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    with ProcessSet() as procs:
        p = procs.start("a", sleeper, {}, tmp_path / "a.log")
        assert os.getpgid(p.pid) == p.pid
        assert os.getsid(p.pid) == p.pid != os.getsid(0)
    assert p.exited() is not None


DRIVER = """
import signal, sys, time
from pathlib import Path
from sessionroute.experiments.live.procs import ProcessSet
out = Path(sys.argv[1])
child = [sys.executable, "-c", (
    "import subprocess, sys, time;"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
    "print(g.pid, flush=True); time.sleep(120)"
)]
with ProcessSet() as procs:
    p = procs.start("replica 0", child, {}, out / "r.log")
    deadline = time.monotonic() + 60
    while not (out / "r.log").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.02)
    print(p.pid, (out / "r.log").read_text().strip(), flush=True)
    time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # exited; its new parent has not reaped it yet


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_stopping_the_driver_stops_its_children_and_theirs(tmp_path: Path, how: str) -> None:
    """The children lead sessions and groups of their own: a terminal's Ctrl-C (SIGINT to the
    driver's foreground group only) or SIGTERM to the driver still stops each child and what it
    started."""
    import os
    import signal
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=env, process_group=0,
    )  # fmt: skip
    try:
        assert driver.stdout is not None
        child, grandchild = (int(x) for x in driver.stdout.readline().split())
        assert not _gone(child) and not _gone(grandchild)
        assert os.getpgid(child) == child != os.getpgid(driver.pid)
        if how == "sigterm":
            driver.send_signal(signal.SIGTERM)
        else:
            os.killpg(driver.pid, signal.SIGINT)
        driver.wait(60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert _gone(child) and _gone(grandchild)
