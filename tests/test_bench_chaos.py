"""``sessionroute bench chaos``: the short fault schedule over real processes (two routers, a
real redis-server, emulated replicas), and its accounting invariants.

Nothing here asserts a latency or a duration: the machine may be loaded. What must hold is
the accounting: every session completed or aborted with a retryable error, no session lost,
every failed attempt and every move of a session explained by a fault, every session released
through one of the two routers and none left pinned in Redis.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sessionroute.bench import chaos
from sessionroute.bench.chaos import schedule
from sessionroute.bench.chaos_load import Attempt, SessionLog
from sessionroute.bench.chaos_report import account
from sessionroute.bench.chaos_watch import _parse

_EXPLAINED = {"router restart", "replica crash", "replica freeze", "redis restart"}


def test_the_long_schedule_runs_every_fault_five_times_after_warm_up() -> None:
    plan = schedule("long", 1800.0)
    kinds = [k for _, k in plan]
    for kind in ("replica_crash", "replica_freeze", "replica_slow", "redis_restart"):
        assert kinds.count(kind) == 5
    assert kinds.count("router_restart") == 5
    times = [t for t, _ in plan]
    assert times == sorted(times)
    assert times[0] >= 0.1 * 1800 and times[-1] <= 0.8 * 1800
    assert [k for _, k in schedule("short", 60.0)] == kinds[:5]


def test_a_fault_waits_for_the_fleet_to_settle_after_the_previous_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CI run that found it: router 1 was killed 0.1 ms after Redis came back, before it
    had replayed the releases it held, and Redis was left with 7 released pins."""
    import asyncio
    import time
    from collections import Counter

    async def fault(fleet: Any, kind: str, t0: float, open_now: Any) -> dict[str, Any]:
        start = time.monotonic() - t0
        await asyncio.sleep(0.3 if kind == "redis_restart" else 0.0)
        return {"kind": kind, "start_s": start, "end_s": time.monotonic() - t0}

    monkeypatch.setattr(chaos, "_fault", fault)
    monkeypatch.setattr(chaos, "SETTLE_S", 0.2)
    out: list[dict[str, Any]] = []
    plan = [(0.0, "redis_restart"), (0.05, "router_restart"), (0.9, "replica_crash")]
    asyncio.run(chaos._run_faults(None, plan, time.monotonic(), out, Counter()))  # type: ignore[arg-type]
    assert [f["kind"] for f in out] == ["redis_restart", "router_restart", "replica_crash"]
    assert out[1]["start_s"] >= out[0]["end_s"] + 0.2  # not at its planned 0.05 s
    assert out[2]["start_s"] >= 0.9 and out[2]["start_s"] < 0.9 + 0.15  # planned time, later


def _moves(turn1: Attempt) -> dict[str, int]:
    """The moves of a session answered on worker 0, then by ``turn1``, with replica 0
    crashed from 7.18 s to 10.8 s (the CI run that found the case)."""
    log = SessionLog("s", 0, False, 2, "completed", 2)
    log.attempts = [Attempt(0, 0, 6.46, 6.9, True, "w0"), turn1]
    crash = {"kind": "replica_crash", "target": 0, "start_s": 7.18, "end_s": 10.8}
    result = account([log], [crash], lambda url: int(url[1:]))
    return dict(result["moves"])


def test_a_move_the_router_made_after_a_crash_mid_attempt_is_put_down_to_the_crash() -> None:
    # sent at 7.17 towards worker 0, which died at 7.18; the router retried it on worker 1
    assert _moves(Attempt(1, 1, 7.17, 7.6, True, "w1")) == {"replica crash": 1}


def test_a_move_before_any_fault_stays_unexplained() -> None:
    assert _moves(Attempt(1, 1, 7.0, 7.1, True, "w1")) == {"unexplained": 1}


def _redis_moves(*before: Attempt) -> dict[str, int]:
    """The moves of a session answered by ``before``, then on worker 1 through router 1
    while Redis is away (30 s to 33 s)."""
    log = SessionLog("s", 0, False, 3, "completed", 3)
    log.attempts = [*before, Attempt(len(before), 1, 31.0, 31.5, True, "w1")]
    outage = {"kind": "redis_restart", "target": 0, "start_s": 30.0, "end_s": 33.0}
    return dict(account([log], [outage], lambda url: int(url[1:]))["moves"])


def test_a_move_over_a_redis_outage_is_put_down_to_what_the_routers_knew() -> None:
    by_0 = Attempt(0, 0, 28.0, 28.5, True, "w0")
    by_1 = Attempt(1, 1, 29.0, 29.5, True, "w0")
    assert _redis_moves(by_0, by_1) == {"redis restart: pin not restored": 1}
    assert _redis_moves(by_0) == {"redis outage: pin known to one router only": 1}
    begun = Attempt(0, 0, 30.5, 30.9, True, "w0")
    assert _redis_moves(begun) == {"redis outage: session begun during it": 1}


def test_a_long_schedule_shorter_than_30_minutes_is_refused() -> None:
    cmd = [sys.executable, "-m", "sessionroute.cli", "bench", "chaos", "--schedule", "long"]
    proc = subprocess.run(
        [*cmd, "--duration", "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--duration >= 1800" in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_short_chaos_schedule_loses_no_session_and_explains_every_error(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    cmd = [sys.executable, "-m", "sessionroute.cli", "bench", "chaos", "--duration", "40"]
    cmd += ["--rate", "2", "--concurrency", "12", "--out", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert json.loads(proc.stdout) == r
    a = r["accounting"]
    assert [f["kind"] for f in r["faults"]] == [
        "replica_crash",
        "replica_freeze",
        "replica_slow",
        "redis_restart",
        "router_restart",
    ]
    assert r["restarts"]["replica0"] == 1 and r["restarts"]["redis"] == 1
    assert r["restarts"]["router1"] == 1
    assert a["sessions"] >= 10  # fewer arrive when a loaded machine slows every turn
    assert a["lost"] == 0
    assert a["completed"] + a["aborted"] == a["sessions"]
    assert a["turns_ok"] + a["turns_failed"] + a["turns_not_sent"] == a["turns_planned"]
    assert a["turns_failed"] == a["aborted"]
    assert set(a["failed_attempts"]) <= _EXPLAINED, a["failed_attempt_details"]
    assert a["unexplained_errors"] == 0
    assert "replica slowed" not in a["failed_attempts"]  # slow answers are still answers
    slow = r["faults"][2]
    assert slow["target"] == 2 and set(slow["placed_per_worker"]) <= {"0", "1", "2"}
    assert a["ok_without_worker_header"] == 0
    assert a["unexplained_moves"] == 0, a["moved_session_traces"]
    assert a["unexplained_flaps"] == 0, a["moved_session_traces"]
    assert r["finish"]["failed"] == 0
    assert sum(r["finish"]["ok_per_router"]) == a["sessions"]
    assert min(r["finish"]["ok_per_router"]) >= a["sessions"] // 3  # retries go elsewhere
    assert r["finish"]["after_run"] == 0  # each released as it ended
    red = r["redis_after"]  # pins left: released ones a router wrote back after Redis' loss
    assert red["pins"] == red["counted"] == red["restored_after_release"]
    for samples in r["rss_mib"].values():
        assert all(samples[p] > 0 for p in r["rss_points"])
    assert r["ok"], r["problems"]
    assert proc.returncode == 0


def test_a_move_off_a_worker_one_router_held_unavailable_is_put_down_to_that_router() -> None:
    log = SessionLog("s", 0, False, 2, "completed", 2)
    log.attempts = [Attempt(0, 1, 40.0, 40.5, True, "w0"), Attempt(1, 0, 41.0, 41.5, True, "w1")]
    span: list[list[Any]] = [[30.0, 60.0, "circuit open"]]
    down: dict[tuple[int, int | None], list[list[Any]]] = {(0, 0): span}  # router 0, worker 0
    moves = account([log], [], lambda url: int(url[1:]), down=down)["moves"]
    assert moves == {"routers disagree on a worker (circuit open on one)": 1}
    other: dict[tuple[int, int | None], list[list[Any]]] = {(1, 1): span}  # the new worker
    assert account([log], [], lambda url: int(url[1:]), down=other)["moves"] == moves
    assert account([log], [], lambda url: int(url[1:]), down={(1, 0): span})["moves"] == {
        "unexplained": 1
    }


def test_the_watcher_reads_availability_and_circuit_state_per_worker() -> None:
    page = (
        "# HELP sessionroute_worker_available 1 when ...\n"
        'sessionroute_worker_available{worker="http://127.0.0.1:1"} 0.0\n'
        'sessionroute_worker_available{worker="http://127.0.0.1:2"} 1.0\n'
        'sessionroute_circuit_state{worker="http://127.0.0.1:1"} 1.0\n'
        'sessionroute_circuit_state{worker="http://127.0.0.1:2"} 0.0\n'
    )
    assert _parse(page) == {"http://127.0.0.1:1": (False, 1), "http://127.0.0.1:2": (True, 0)}
