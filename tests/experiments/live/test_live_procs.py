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


def test_a_started_process_leads_its_own_group_in_our_session(tmp_path: Path) -> None:
    # one scheduler autogroup (one session) for the whole test-bed: the client and router are
    # not starved by the servers' busy groups (docs/simulator.md, "Conditions")
    import os

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    with ProcessSet() as procs:
        p = procs.start("a", sleeper, {}, tmp_path / "a.log")
        assert os.getpgid(p.pid) == p.pid
        assert os.getsid(p.pid) == os.getsid(0)
    assert p.exited() is not None
