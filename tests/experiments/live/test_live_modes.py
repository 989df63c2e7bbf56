"""The replica and router modes of a live run, each on a tiny workload.

Streaming without taps; already-running servers (``urls``); replicas from a command template
(``sessionroute emulate`` standing in for vLLM); a router from a command template.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionroute.errors import ConfigError
from sessionroute.experiments.live.routers import router_flags
from sessionroute.experiments.live.runner import LiveArmRunner, run_live_experiment
from sessionroute.experiments.spec import parse_experiment
from sessionroute.sim.spec import RouterSection


def tiny(live: dict[str, Any], sessions: int = 3, **top: Any) -> dict[str, Any]:
    return {
        "name": "tiny",
        "workload": {
            "kind": "toy",
            "options": {
                "sessions": sessions, "arrival_rate_per_s": 5.0, "turns_p50": 2,
                "turns_p90": 3, "turns_max": 3, "first_p50": 100, "first_p90": 200,
                "output_p50": 16, "output_p90": 32, "think_p50_s": 0.5, "think_p90_s": 1.0,
            },
        },
        "live": {"time_scale": 10, "router": "sessionroute-inprocess", **live},
        "arms": [{"policy": "sticky_least_loaded"}],
        **top,
    }  # fmt: skip


def _metrics(doc: dict[str, Any]) -> dict[str, Any]:
    out = run_live_experiment(parse_experiment(doc, env={}))
    m: dict[str, Any] = out.results[0].metrics
    assert m["requests_failed"] == 0, m["errors"]
    assert m["sessions_completed"] == doc["workload"]["options"]["sessions"]
    return m


def test_streaming_without_taps_measures_ttft_and_itl() -> None:
    m = _metrics(tiny({"stream": True, "placements": False}))
    assert m["ttft_s"]["count"] == m["requests_completed"]
    assert m["itl_s"]["count"] > 0
    assert m["ttft_s"]["p50"] <= m["turn_latency_s"]["p50"]
    assert m["sessions_per_replica"] is None  # not recorded without taps
    assert m["output_tokens"] > 0


def test_sessions_without_header_are_placed_statelessly() -> None:
    m = _metrics(tiny({}, router={"send_session_header": False}))
    assert m["sessions_new"] == 0  # the router saw no session ids
    assert sum(m["sessions_per_replica"]) == 0


def test_a_policy_without_a_session_table_counts_moves_as_re_pins_as_the_simulator() -> None:
    """round_robin keeps no sessions: as in the simulator, every session seen is new and
    every move between replicas (seen by the taps) a re-pin; a review found 0 re-pins live
    against 302 moves, ~220 re-pins simulated."""
    doc = tiny({}, sessions=4)
    doc["arms"] = [{"policy": "round_robin"}]
    m = _metrics(doc)
    assert m["sessions_new"] == 4
    assert m["session_moves"] > 0 and m["sessions_repinned"] == m["session_moves"]


@pytest.fixture
def emulate_process() -> Iterator[list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sessionroute.cli", "emulate", "--replicas", "2", "--port", "0",
         "--time-scale", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        urls = [proc.stdout.readline().strip() for _ in range(2)]
        assert all(u.startswith("http://") for u in urls), urls
        yield urls
    finally:
        proc.terminate()
        proc.wait(30)


def test_urls_mode_uses_running_servers(emulate_process: list[str]) -> None:
    m = _metrics(tiny({"replicas": "urls", "urls": emulate_process}))
    assert [p["url"] for p in m["per_replica"]] == emulate_process
    assert sum(p["requests"] for p in m["per_replica"]) == m["requests_completed"]


def test_command_replicas_get_ports_cache_dirs_and_health_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cmd = (
        "${PYTHON} -m sessionroute.cli emulate --replicas 1 --port ${PORT} --time-scale 10"
        " --block-size ${BLOCK_SIZE}"
    )
    live = {
        "replicas": "command", "replica_command": cmd, "python": sys.executable,
        "cache_root": str(tmp_path), "keep_cache": True, "stagger_s": 0.1,
        "router": "command",
        "router_command": "${PYTHON_ROUTER} -m sessionroute.cli serve --port ${PORT}"
        " --policy ${POLICY} --worker-urls ${WORKER_URLS} --log-level warning",
        "router_health_path": "/readiness",
    }  # fmt: skip
    monkeypatch.setenv("PYTHON_ROUTER", sys.executable)  # templates see the environment
    m = _metrics(tiny(live, replicas={"count": 2}))
    assert len(m["per_replica"]) == 2
    assert m["live"]["router"] == "command"
    assert m["sessions_new"] is None  # a command router's metrics are not read
    (run_dir,) = tmp_path.iterdir()
    assert {p.name for p in run_dir.iterdir()} >= {"replica-0", "replica-1"}
    assert (run_dir / "replica-0" / "server.log").exists()
    assert m["block_size"] == 16


def test_arms_sharing_processes_must_agree_on_replicas() -> None:
    doc = tiny({"replicas": "urls", "urls": ["http://127.0.0.1:9"]})
    doc["arms"] = [
        {"policy": "random", "name": "a"},
        {"policy": "random", "name": "b", "overrides": {"replicas": {"count": 2}}},
    ]
    doc["allow_differences"] = ["replicas.count"]
    with pytest.raises(ConfigError, match="share replica processes"):
        LiveArmRunner(parse_experiment(doc, env={}))


def test_unknown_policy_option_is_refused_for_a_live_router() -> None:
    with pytest.raises(ConfigError, match="unknown option"):
        router_flags("sticky_least_loaded", {"bogus": 1}, RouterSection(), ours=True)
    with pytest.raises(ConfigError, match="cannot be passed"):
        router_flags("sticky_least_loaded", {"bogus": 1}, RouterSection(), ours=False)
    flags = router_flags("sticky_least_loaded", {"session_ttl_s": 30}, RouterSection(), ours=True)
    assert flags[flags.index("--session-ttl-secs") + 1] == "30.0"
