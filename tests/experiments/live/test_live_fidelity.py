"""``sessionroute compare FILE --fidelity`` end to end against emulated servers (one
``sessionroute emulate`` process, a ``sessionroute serve`` router per arm) with a given
profile: fidelity.json, the simulated side's results, the report section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sessionroute.replica import load_profile_file

EXPERIMENT = """
name = "tiny-fidelity"
[workload]
kind = "toy"
[workload.options]
sessions = 5
arrival_rate_per_s = 4.0
turns_p50 = 3
turns_p90 = 3
turns_max = 3
first_p50 = 300
first_p90 = 300
output_p50 = 16
output_p90 = 16
think_p50_s = 0.5
think_p90_s = 0.5
[run]
repeats = 2
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


def test_compare_fidelity_against_emulated_servers(tmp_path: Path) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text(EXPERIMENT.format(root=tmp_path / "work"), "utf-8")
    profile = tmp_path / "profile.toml"
    # the emulator's own profile: the simulator and the servers run the same replica model
    profile.write_text('[profiles.emu]\nbase = "toy-8b-h100-tp1"\n', "utf-8")
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "sessionroute.cli", "compare", str(exp), "--fidelity",
         "--profile", str(profile), "--probe-path", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "fidelity.json").read_text("utf-8"))
    assert set(doc["arms"]) == {"sticky_least_loaded", "round_robin"}
    c = doc["conditions"]
    assert c["repeats_live"] == 2 and c["calibrated"] is False and len(c["worker_urls"]) == 3
    assert c["engine"]["kv_capacity_tokens"] == 65536  # read from the servers' /metrics
    sticky = doc["arms"]["sticky_least_loaded"]["hit_rate"]
    assert c["failed_runs"] == [], r.stderr[-3000:]  # each with its error and traceback
    assert len(sticky["live"]) == 2 and len(sticky["sim_runs"]) == 4
    # same replica model, same content, same worker URLs: sticky's hit rate agrees
    assert abs(sticky["error"]) < 3.0
    assert (out / "sim" / "results.json").is_file()
    assert '<section id="fidelity">' in (out / "report.html").read_text("utf-8")
    assert "simulator vs live" in r.stdout and "rank agreement" in r.stdout
    # the live requests replayed at their send times into the simulator's engine: the router
    # named each one's worker, and the emulators run that engine, so the hits come back
    replay = doc["replay"]["sticky_least_loaded"]
    assert len(replay["runs"]) == 2
    assert all(run["requests"] > 0 and run["skipped"] == 0 for run in replay["runs"])
    assert abs(replay["error_pp"]) < 1.0
    assert "replay at the live send times: sticky_least_loaded: hit rate live" in r.stdout
    # --probe-path: the arms' path probed with requests of its own, its delay in the profile
    assert c["path_probed_here"] is True and c["profile"] == str(out / "profile.toml")
    path = load_profile_file(out / "profile.toml").calibration["path"]
    assert path["samples"] > 0 and [run["run"] for run in path["runs"]] == [
        "alone",
        "light",
        "loaded",
        "heavy",
    ]
    # and how the steps ran on that path, fitted on the alone and light runs' requests
    host = path["host"]
    assert host["samples"] > 0 and sum(b["requests"] for b in host["bins"]) == host["samples"]
    assert load_profile_file(out / "profile.toml").profile.path_step_factor == pytest.approx(
        host["path_step_factor"], rel=1e-3
    )
    assert "steps on the arms' path" in r.stderr
    assert "path delay" in r.stderr
    # where the host's CPU went: the one emulate process answered every arm run's requests
    runs = c["decode_pace"]["runs"]
    assert len(runs) == 4 and all(len(run["host_cpu"]["per_server"]) == 1 for run in runs)
    assert all(run["host_cpu"]["servers"] > 0 for run in runs), runs
    assert c["host_cpu"]["cores"] >= 1 and c["host_cpu"]["path_probe"]["servers"] > 0
    assert c["host_cpu"]["calibration"] is None  # --profile: not calibrated here
    assert c["command_servers_started_here"] == 0 and c["cores_for_servers"] >= 1  # emulators
    assert "servers share this host's" not in r.stderr
    assert "host CPU, cores busy of" in r.stderr
    # and how fast the host's cores ran meanwhile (a fixed loop's CPU time, sampled throughout)
    assert all(run["host_cpu"]["loop_ms"] > 0 for run in runs), runs
    assert "host speed, CPU ms of a fixed loop" in r.stderr
    # scripts/fidelity_resim.py simulates the arms again as compare did: the same TTFT p50
    script = Path(__file__).parents[3] / "scripts" / "fidelity_resim.py"
    again = subprocess.run(
        [sys.executable, str(script), str(out), str(exp)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    line = next(
        ln for ln in again.stdout.splitlines() if "sticky_least_loaded" in ln and "TTFT" in ln
    )
    sim = float(line.split(" sim ")[1].split()[0])
    assert sim == pytest.approx(doc["arms"]["sticky_least_loaded"]["ttft_p50"]["sim"], rel=1e-3)
    ok = doc["arms"]["sticky_least_loaded"]["ttft_p50"]["ok"]
    assert line.endswith("(within)" if ok else "(outside)"), line  # compare's own verdict
    # one simulation per arm (--host-speed's path) with every factor 1: the same TTFT p50
    measured = json.loads((out / "fidelity.json").read_text("utf-8"))
    measured["conditions"]["calibration"]["host_loop_ms"] = 2.0  # as a calibrated profile keeps
    for run in measured["conditions"]["decode_pace"]["runs"]:
        run["host_cpu"]["loop_ms"] = 2.0
    (tmp_path / "measured").mkdir()
    (tmp_path / "measured" / "fidelity.json").write_text(json.dumps(measured), "utf-8")
    (tmp_path / "measured" / "results.json").write_text(
        (out / "results.json").read_text("utf-8"), "utf-8"
    )
    per_arm = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "measured"), str(exp), "--host-speed"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert per_arm.returncode == 0, per_arm.stderr[-3000:]
    factors = "sticky_least_loaded 1.00, round_robin 1.00"
    assert f"step terms x host speed against the calibration's: {factors}" in per_arm.stdout
    line = next(
        ln for ln in per_arm.stdout.splitlines() if "sticky_least_loaded" in ln and "TTFT" in ln
    )
    assert float(line.split(" sim ")[1].split()[0]) == pytest.approx(sim, rel=1e-9)
    # --host-speed needs the calibration's speed, which --profile did not measure
    scaled = subprocess.run(
        [sys.executable, str(script), str(out), str(exp), "--host-speed"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert scaled.returncode == 2 and "host speed is not known" in scaled.stderr
    # --speed-noise: each noise draw simulated, preemptions judged per draw; the noise moves
    # the simulated TTFT (the noise's faults reach the simulation)
    noisy = subprocess.run(
        [sys.executable, str(script), str(out), str(exp), "--speed-noise", "0.5",
         "--noise-schedules", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert noisy.returncode == 0, noisy.stderr[-3000:]
    assert "step speed redrawn every 0.5 s (cv 0.5), 2 draws" in noisy.stdout
    preempted = [ln for ln in noisy.stdout.splitlines() if "preemptions" in ln]
    assert preempted and all("of 2 noise draws" in ln for ln in preempted), preempted
    line = next(
        ln for ln in noisy.stdout.splitlines() if "sticky_least_loaded" in ln and "TTFT" in ln
    )
    assert float(line.split(" sim ")[1].split()[0]) != pytest.approx(sim, rel=1e-6)
    wrong = subprocess.run(
        [sys.executable, str(script), str(out), str(exp), "--noise-period", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong.returncode == 2 and "need --speed-noise" in wrong.stderr


def test_fidelity_refuses_in_process_emulators(tmp_path: Path) -> None:
    exp = tmp_path / "exp.toml"
    text = EXPERIMENT.format(root=tmp_path).replace('emulate_mode = "process"\n', "")
    exp.write_text(text, "utf-8")
    r = subprocess.run(
        [sys.executable, "-m", "sessionroute.cli", "compare", str(exp), "--fidelity"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2
    assert not (tmp_path / "runs").exists()  # refused before any output directory
    assert "running servers" in r.stderr
