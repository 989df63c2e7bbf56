"""A fixed CPU share per started replica (cgroup quota): the rule, the config, the real cap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sessionroute.errors import ConfigError
from sessionroute.experiments.live import replicas
from sessionroute.experiments.live.cpuslice import CpuSlice, auto_replica_cpus, cgroup_cpu_root
from sessionroute.experiments.live.procs import ProcessSet
from sessionroute.experiments.live.replicas import ReplicaFleet
from sessionroute.experiments.live.runner import LiveArmRunner
from sessionroute.experiments.live_section import LiveSection
from sessionroute.experiments.spec import parse_experiment

CAN_CAP = cgroup_cpu_root()[0] is not None
needs_cgroup = pytest.mark.skipif(not CAN_CAP, reason=f"no CPU quota here: {cgroup_cpu_root()[1]}")


def test_auto_shares_the_cores_less_a_reserve_only_when_servers_would_contend() -> None:
    assert auto_replica_cpus(3, 2) == 0.5
    assert auto_replica_cpus(4, 2) == 0.375
    assert auto_replica_cpus(1, 1) == 0.5
    assert auto_replica_cpus(2, 2) == 0.75
    assert auto_replica_cpus(3, 16) is None  # 5.2 cores each: no contention, no cap
    assert auto_replica_cpus(1, 2) is None  # 1.5 cores: enough for one server


def test_replica_cpus_is_auto_a_non_negative_number_or_refused() -> None:
    assert LiveSection().replica_cpus == 0  # no cap unless asked
    assert LiveSection(replica_cpus=0.5).replica_cpus == 0.5
    assert LiveSection(replica_cpus=0).replica_cpus == 0
    with pytest.raises(ValidationError, match=">= 0 cores"):
        LiveSection(replica_cpus=-1)
    with pytest.raises(ValidationError):
        LiveSection.model_validate({"replica_cpus": "half"})


def _fleet(live: dict[str, Any], count: int = 3) -> ReplicaFleet:
    settings = parse_experiment(
        {
            "name": "t",
            "replicas": {"count": count},
            "live": {"replicas": "command", **live},
            "arms": [{"policy": "random"}],
        },
        env={},
    )
    from sessionroute.experiments.spec import resolve_arms

    arm = resolve_arms(settings)[0].settings
    return ReplicaFleet(LiveSection.model_validate(arm["live"]), arm, ProcessSet())


def test_the_fleet_says_what_it_caps_and_refuses_a_cap_it_cannot_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replicas, "host_cpus", lambda: 2)
    monkeypatch.setattr(replicas, "cgroup_cpu_root", lambda: (Path("/x"), 1))
    fleet = _fleet({"preset": "vllm-cpu", "model": "/m", "replica_cpus": "auto"})
    assert fleet.replica_cpus == 0.5
    assert fleet.cpu_note == "replica CPU: 0.5 cores each (3 servers, 2 cores)"
    fleet.close()
    fleet = _fleet({"replica_command": "run ${PORT}", "replica_cpus": "auto"})  # vllm-cpu only
    assert fleet.replica_cpus is None and "vllm-cpu only" in fleet.cpu_note
    fleet.close()
    fleet = _fleet({"replica_command": "run ${PORT}", "replica_cpus": 0.25})
    assert fleet.replica_cpus == 0.25
    fleet.close()
    fleet = _fleet({"preset": "vllm-cpu", "model": "/m"})  # the default: no cap
    assert fleet.replica_cpus is None and "replica_cpus = 0" in fleet.cpu_note
    fleet.close()
    monkeypatch.setattr(replicas, "cgroup_cpu_root", lambda: (None, "not root"))
    fleet = _fleet({"preset": "vllm-cpu", "model": "/m", "replica_cpus": "auto"})
    assert fleet.replica_cpus is None
    assert "uncapped" in fleet.cpu_note and "not root" in fleet.cpu_note
    fleet.close()
    with pytest.raises(ConfigError, match="cannot cap CPU here: not root"):
        _fleet({"replica_command": "run ${PORT}", "replica_cpus": 0.5})


_SPIN = (
    "import sys, time\n"
    "sys.stdin.readline()\n"  # wait until the parent has put us in the slice
    "t0 = time.monotonic()\n"
    "while time.monotonic() - t0 < 1.0: pass\n"
    "print(time.process_time())\n"
)


@needs_cgroup
def test_a_slice_caps_a_busy_process_and_is_removed() -> None:
    piece = CpuSlice(f"sessionroute-test-{id(object())}", 0.25)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        piece.add(proc.pid)
        out, _ = proc.communicate("go\n", timeout=30)
        cpu_s = float(out)
        # a quarter of a core for 1 s of spinning (plus the interpreter's start, before the cap)
        assert cpu_s < 0.5, cpu_s
        assert piece.throttled_s() > 0.3
    finally:
        piece.remove()
    assert not piece.path.exists()


@needs_cgroup
def test_started_replicas_run_in_their_slices_until_the_fleet_closes(tmp_path: Path) -> None:
    cmd = "${PYTHON} -m sessionroute.cli emulate --replicas 1 --port ${PORT} --time-scale 10"
    doc = {
        "name": "t",
        "replicas": {"count": 2},
        "live": {
            "replicas": "command", "replica_command": cmd, "python": sys.executable,
            "replica_cpus": 0.5, "cache_root": str(tmp_path),
        },
        "arms": [{"policy": "random"}],
    }  # fmt: skip
    with LiveArmRunner(parse_experiment(doc, env={})) as runner:
        fleet = runner.fleet
        paths = [s.path for s in fleet._slices]
        assert len(paths) == 2
        for proc, path in zip(fleet._started, paths, strict=True):
            lines = Path(f"/proc/{proc.pid}/cgroup").read_text().splitlines()
            assert any(line.endswith("/" + path.name) for line in lines), lines
    assert not any(p.exists() for p in paths)
