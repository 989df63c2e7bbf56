"""Running ``sessionroute compare FILE --fidelity``: calibrate, every arm live, every arm
simulated with the servers' settings, then :mod:`sessionroute.experiments.fidelity`.

Output directory::

    OUT/results.json, report.html, ...   the live runs (report.html gains a fidelity section)
    OUT/sim/results.json, report.html    the simulated runs
    OUT/profile.toml                     the calibrated profile (when calibrated here)
    OUT/fidelity.json                    the comparison
    OUT/turns.json                       every live run's answered turns (send time, replica,
                                         lengths, block keys, cached tokens, TTFT), per arm
    OUT/path_probe_turns.json            the path probe runs' turns, by run (when probed here)
    OUT/host_speed.txt                   the host's speed sampled throughout (monotonic s,
                                         loop ms: experiments/live/hostspeed.py)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.experiments.fidelity import arm_groups, fidelity_document, write_fidelity
from sessionroute.experiments.live.cpuslice import host_cpus
from sessionroute.experiments.live.hostcpu import BusyCores, HostCpu, crowding_note
from sessionroute.experiments.live.hostcpu import describe as describe_cpu
from sessionroute.experiments.live.hostspeed import HostSpeed
from sessionroute.experiments.live.pace import PacedRunner, calibrated_pace_s
from sessionroute.experiments.live_engine import EngineSettings, engine_from_servers
from sessionroute.experiments.live_section import LiveSection
from sessionroute.experiments.replay import replay_arms
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.runner import ExperimentOutput, run_experiment, write_outputs
from sessionroute.experiments.spec import (
    ExperimentSpec,
    ResolvedArm,
    parse_experiment,
    resolve_arms,
)
from sessionroute.replica.api import ReplicaConfig

__all__ = [
    "SIM_DRAWS",
    "FidelityOutput",
    "fidelity_live_spec",
    "fidelity_replicas",
    "fidelity_sim_spec",
    "run_fidelity",
    "simulate_draw",
]

Say = Callable[[str], None]


@dataclass(slots=True)
class FidelityOutput:
    """What :func:`run_fidelity` made.

    Attributes:
        live: the live runs (``repeats`` per arm, the same seed).
        sim: the simulated runs (one per arm).
        doc: the ``fidelity.json`` document.
        paths: ``fidelity``, ``profile``, ``report``, ``results``, ``sim_results`` -> path.
    """

    live: ExperimentOutput
    sim: ExperimentOutput
    doc: dict[str, Any]
    paths: dict[str, Path]


def fidelity_live_spec(spec: ExperimentSpec) -> ExperimentSpec:
    """``spec`` as the live side of a fidelity run: streamed (TTFT and ITL), without recording
    taps (the router's worker URLs are the servers', as in the simulator).

    Raises:
        ConfigError: in-process emulated replicas (no servers to read before the arms run).
    """
    live = spec.live
    if live.replicas == "emulate" and live.emulate_mode == "in-process":
        raise ConfigError(
            "compare --fidelity compares the simulator with running servers: give [live] "
            'replicas = "command" or "urls" (or emulate_mode = "process" for emulated ones)'
        )
    data = spec.model_dump()
    data["live"] = {**data["live"], "stream": True, "placements": False, "record_turns": True}
    return parse_experiment(data, source=f"{spec.name} (fidelity, live)")


SIM_DRAWS = 4
"""Simulated runs per arm: the same workload (seed), placement draws ``seed .. seed + 3``."""


def fidelity_sim_spec(
    spec: ExperimentSpec, profile: str, engine: EngineSettings, urls: list[str]
) -> ExperimentSpec:
    """``spec`` as the simulated side: the profile file, the servers' engine settings and
    worker URLs, :data:`SIM_DRAWS` runs per arm (see :func:`simulate_draw`)."""
    data = spec.model_dump()
    data["replicas"] = {
        **data["replicas"],
        "profile": profile,
        "profiles_file": None,
        "urls": list(urls),
        **engine.replicas_overrides(),
    }
    data["run"] = {**data["run"], "repeats": SIM_DRAWS}
    return parse_experiment(data, source=f"{spec.name} (fidelity, simulated)")


class _SameSeed:
    """An arm runner that runs every repeat with ``seed`` (run-to-run noise only)."""

    def __init__(self, runner: Callable[[ResolvedArm, int, Callable[[float], None]], RunOutput],
                 seed: int) -> None:  # fmt: skip
        self.runner = runner
        self.seed = seed

    def __call__(self, arm: ResolvedArm, seed: int, progress: Callable[[float], None]) -> RunOutput:
        return self.runner(arm, self.seed, progress)


def simulate_draw(arm: ResolvedArm, seed: int, progress: Callable[[float], None]) -> RunOutput:
    """Simulate ``arm`` with its experiment's workload seed and ``seed`` as the placement seed
    (``run_experiment`` passes ``run.seed + k`` for repeat ``k``)."""
    from sessionroute.sim import SimSpec, run_simulation

    spec = SimSpec.from_settings(arm.settings)
    base = int(arm.settings["run"]["seed"])
    result = run_simulation(spec, arm.policy, arm.policy_options, base, progress, policy_seed=seed)
    return RunOutput(seed, result.metrics, result.timeseries, result.steps, result.samples)


def _calibration_progress(say: Say) -> Callable[[int, int, str], None]:
    """A ``calibrate`` progress callback that says a line about every tenth of the rounds."""
    shown = [-1]

    def progress(done: int, total: int, label: str) -> None:
        tenth = 10 * done // max(1, total)
        if tenth != shown[0]:
            shown[0] = tenth
            say(f"  calibrate: {done} of {total} rounds ({label})")

    return progress


def _read_servers(urls: list[str], live: LiveSection, fallback: Mapping[str, Any]) -> Any:
    import aiohttp

    from sessionroute.calibrate import inspect_servers

    async def read() -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await inspect_servers(
                session,
                urls,
                max_num_seqs=fallback.get("max_num_seqs"),
                max_num_batched_tokens=fallback.get("max_num_batched_tokens"),
            )

    return asyncio.run(read())


def fidelity_replicas(
    spec: ExperimentSpec, profile: str, engine: EngineSettings, urls: list[str]
) -> tuple[int, ReplicaConfig]:
    """How many replicas the simulated side runs and their ``ReplicaConfig`` (its first arm's)
    on the profile file ``profile`` with the servers' settings (:func:`fidelity_sim_spec`)."""
    from sessionroute.sim import SimSpec, replica_config

    sim_arm = resolve_arms(fidelity_sim_spec(spec, profile, engine, urls))[0]
    return replica_config(SimSpec.from_settings(sim_arm.settings))


def _probe_path(
    runner: Any,
    live_spec: ExperimentSpec,
    spec: ExperimentSpec,
    profile: str,
    engine: EngineSettings,
    urls: list[str],
    say: Say,
    keep: Path | None = None,
) -> Any:
    """The arms' request path, probed on the servers and fitted on ``profile`` (no path delay
    yet): :func:`sessionroute.experiments.live.path_probe.probe_path`; says the fit. The probe
    runs' turns go to ``keep`` (JSON, by run name) where given."""
    from sessionroute.experiments.live.path_probe import probe_path

    count, config = fidelity_replicas(spec, profile, engine, urls)
    turns: dict[str, Any] = {}
    try:
        fit = probe_path(
            runner, resolve_arms(live_spec)[0], config, count, seed=spec.run.seed, say=say,
            keep=turns,
        )  # fmt: skip
    finally:  # kept even when the fit fails, for a look at what the probe saw
        if keep is not None:
            keep.write_text(json.dumps(turns), "utf-8")
    if fit is None:
        say(
            "path probe: no request's server known (the router does not name it): the "
            "simulator adds no path delay"
        )
    else:
        say(describe_path(fit))
    return fit


def describe_terms(terms: Any) -> str:
    """One line: the fitted step terms with their fit errors (``FitResult.terms``)."""
    return "; ".join(f"{t.name} {t.value:.3g} s ({t.error_text(terse=True)})" for t in terms)


def describe_path(fit: Any) -> str:
    """One line: the fitted path delay with its fit errors (a :class:`PathFit`)."""

    def err(e: float | None) -> str:
        return "at 0" if e is None else f"±{e:.0%}"

    d0 = f"path delay {fit.d0_s * 1e3:.1f} ms ({err(fit.d0_err)})"
    if fit.load_dependent:
        d0 += f" + {fit.d1_s * 1e3:.2f} ms ({err(fit.d1_err)}) per other request in flight"
    else:
        d0 += ", constant (no measurable growth with requests in flight)"
    bins = ", ".join(f"{n:.1f}: {m * 1e3:.0f}" for n, _, m in fit.bins)
    line = (
        f"{d0}; the line's RMS {fit.rms_error * 1e3:.1f} ms over {fit.samples} probe requests "
        f"(median ms by mean others in flight: {bins})"
    )
    if fit.curve:
        points = ", ".join(f"{n:.1f}: {d * 1e3:.0f}" for n, d in fit.curve)
        line += f"; the simulator interpolates them, made non-decreasing ({points})"
    host = fit.host
    if host is not None:
        ratios = ", ".join(f"{b:.2f}: {m:.2f}" for b, _, m in host.bins)
        line += (
            f"\nsteps on the arms' path: x{host.path_step_factor:.2f} the calibrated step terms"
            + (
                f", +{host.peer_busy_slowdown:.0%} per other server busy"
                if host.shared
                else ", no measurable slowdown while other servers are busy"
            )
            + f" (live / replayed time per token by mean other servers busy: {ratios})"
        )
    return line


def run_fidelity(
    spec: ExperimentSpec,
    out_dir: Path,
    *,
    profile: str | None = None,
    probe: str = "together",
    probe_path: bool | None = None,
    reporter: Any = None,
    say: Say = print,
    command: str = "",
) -> FidelityOutput:
    """Calibrate (unless ``profile``), run every arm live and simulated, compare, write.

    Args:
        spec: an experiment with a ``[live]`` section naming servers.
        out_dir: the output directory (created).
        profile: a profile file fitted to these servers; None calibrates them first (as
            ``probe`` says) and writes ``out_dir/profile.toml``.
        probe: how to calibrate them (``calibrate``'s ``probe``): ``"together"`` every
            server at once, in lockstep, as the arms load them; ``"first"`` the first server
            alone, the others read (docs/simulator.md, "Calibrating against a real server").
        probe_path: probe the arms' request path and fit its delay into the profile
            (:mod:`sessionroute.experiments.live.path_probe`; written to
            ``out_dir/profile.toml``); None: when calibrating here, not with ``profile``.
        reporter: progress of the runs (``RichReporter``).
        say: one-line notes (where the settings came from, calibration phases).
        command: the command line, recorded in ``fidelity.json``.

    Raises:
        ConfigError: see :func:`fidelity_live_spec`; a profile file that cannot be read.
        CalibrationError: a server cannot be read or probed.
        LiveStartError: a replica or router did not start.
    """
    from sessionroute.calibrate import calibrate, write_profile
    from sessionroute.calibrate.result import write_path
    from sessionroute.experiments.live.runner import LiveArmRunner
    from sessionroute.replica.profiles import load_profile_file
    from sessionroute.sim import SimSpec, replica_config

    live_spec = fidelity_live_spec(spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    _, rcfg = replica_config(SimSpec.from_settings(resolve_arms(live_spec)[0].settings))
    # the servers' batch limits where /server_info does not give them: the flags the preset or
    # command starts them with, the emulator's own settings
    emulated = live_spec.live.replicas == "emulate"
    fallback = {
        "max_num_seqs": rcfg.seqs if emulated else live_spec.live.max_num_seqs,
        "max_num_batched_tokens": rcfg.batched_tokens if emulated else None,
    }
    calibration: dict[str, Any] = {}
    with LiveArmRunner(live_spec) as runner, HostSpeed(out_dir / "host_speed.txt") as speed:
        urls = list(runner.fleet.urls)
        servers = _read_servers(urls, live_spec.live, fallback)
        engine = engine_from_servers(servers)
        say(f"servers: {engine.source}")
        if runner.fleet.cpu_note:
            say(runner.fleet.cpu_note)
        meter = HostCpu(runner.fleet.server_pids, speed)
        # servers whose speed is the host's cores (emulators sleep out their steps)
        started = len(runner.fleet.server_pids) if live_spec.live.replicas == "command" else 0
        cores = host_cpus()
        crowded = crowding_note(started, cores)
        if crowded:
            say(crowded)
        cpu: list[tuple[str, BusyCores | None]] = []
        if profile is None:
            say(f"calibrating {len(urls)} servers (probe {probe}) ...")
            start = meter.sample()
            result = calibrate(
                urls,
                probe=probe,
                max_num_seqs=fallback["max_num_seqs"],
                max_num_batched_tokens=fallback["max_num_batched_tokens"],
                progress=_calibration_progress(say),
            )
            busy = meter.between(start, meter.sample())
            cpu.append(("calibration", busy))
            if busy is not None and "loop_ms" in busy:
                result = dataclasses.replace(result, host_loop_ms=busy["loop_ms"])
            profile_path = write_profile(result, out_dir / "profile.toml")
            say(f"calibrated in {result.wall_s:.0f} s: {describe_terms(result.fit.terms)}")
            calibration = {
                "calibrated_here": True,
                "calibration_wall_s": result.wall_s,
                "calibration_probe": result.probe,
            }
            say(f"profile: {profile_path}")
        else:
            profile_path = Path(profile)
        if probe_path or (profile is None and probe_path is None):
            # the arms' request path (client, router, chat endpoint), probed on the servers
            say("the request path's delay ...")
            start = meter.sample()
            path = _probe_path(
                runner, live_spec, spec, str(profile_path), engine, urls, say,
                out_dir / "path_probe_turns.json",
            )  # fmt: skip
            cpu.append(("path probe", meter.between(start, meter.sample())))
            if path is not None:
                profile_path = write_path(profile_path, path, out_dir / "profile.toml")
                say(f"profile: {profile_path}")
            calibration["path_probed_here"] = path is not None
        pf = load_profile_file(profile_path)
        calibration = {
            **calibration,
            "profile": str(profile_path),
            "replica_cpus": runner.fleet.replica_cpus,
            "command_servers_started_here": started,
            "cores_for_servers": cores,
            "profile_name": pf.profile.name,
            "calibrated": any(k != "path" for k in pf.calibration),  # step terms fitted
            "calibration": pf.calibration,
        }
        paced = PacedRunner(_SameSeed(runner, spec.run.seed), servers, meter)
        live_out = run_experiment(live_spec, paced, reporter, jobs=1)
        pace_cal = calibrated_pace_s(pf.calibration)
        say(paced.describe(pace_cal))
        calibration["host_cpu"] = {
            "cores": meter.cores,
            "calibration": dict(cpu).get("calibration"),
            "path_probe": dict(cpu).get("path probe"),
        }
        cpu += [(r["arm"], r["host_cpu"]) for r in paced.records]
        if any(d is not None for _, d in cpu):
            say(describe_cpu(meter.cores, cpu))
        calibrated_speed = pf.calibration.get("host_loop_ms")
        if profile is not None and calibrated_speed is not None:
            say(f"host speed when {profile_path} was calibrated: {calibrated_speed:.1f} ms")
        calibration["decode_pace"] = {"calibration_s": pace_cal, "runs": paced.records}
    sim_spec = fidelity_sim_spec(spec, str(profile_path), engine, urls)
    # the servers are stopped by now: the simulated runs may take every core
    jobs = min(os.cpu_count() or 1, len(sim_spec.arms) * SIM_DRAWS)
    sim_out = run_experiment(sim_spec, simulate_draw, reporter, jobs=jobs)
    conditions = {
        "experiment": spec.name,
        "command": command,
        "seed": spec.run.seed,
        "repeats_live": spec.run.repeats,
        "repeats_sim": SIM_DRAWS,
        "worker_urls": urls,
        "engine": {**engine.replicas_overrides(), "source": engine.source},
        "servers": [
            {
                "url": s.url,
                "model": s.model,
                "kv_capacity_tokens": s.kv_capacity_tokens,
                "vllm_version": s.vllm_version,
            }
            for s in servers
        ],
        **calibration,
        # runs that raised: their arms' figures hold the runs that finished (none silently lost)
        "failed_runs": [
            {"side": side, "label": f.label, "error": f.error}
            for side, out in (("live", live_out), ("sim", sim_out))
            for f in out.failed
        ],
    }
    replay = replay_arms(live_out.results, resolve_arms(sim_spec))
    doc = fidelity_document(
        live_out.results, sim_out.results, arm_groups(live_out.arms), conditions, replay
    )
    paths = write_outputs(live_out, out_dir)
    sim_paths = write_outputs(sim_out, out_dir / "sim")
    turns = {a.name: [r.turns for r in a.runs] for a in live_out.results}
    (out_dir / "turns.json").write_text(json.dumps(turns) + "\n", encoding="utf-8")
    out = {
        "fidelity": write_fidelity(doc, out_dir / "fidelity.json"),
        "profile": profile_path,
        "report": paths["report"],
        "results": paths["results"],
        "sim_results": sim_paths["results"],
    }
    from sessionroute.experiments.fidelity_report import add_report_section

    add_report_section(out["report"], doc)
    return FidelityOutput(live_out, sim_out, doc, out)
