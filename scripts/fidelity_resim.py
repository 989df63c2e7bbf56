"""Simulate a ``compare --fidelity`` output's arms again and set them beside its live runs.

A change to the simulator or to how the calibration is used can be judged on live runs already
recorded, without running the servers again: this takes an output directory (``fidelity.json``
with the servers' engine settings and worker URLs, the profile it used) and the experiment
file, simulates every arm as ``compare --fidelity`` did (same seeds, 4 placement draws) with the
profile's path delay as a line, as its curve, or as the profile file has it, and prints each
arm's metrics of the fidelity table, live (the output's ``results.json``) and simulated, with
the error (simulated - live, in points for the hit rate, relative otherwise) and ``compare``'s
verdict on it (the bound widened by the noise; preemptions on both sides or neither).

``--refit sharing`` (or ``no-sharing``) fits the servers' sharing of the host (or none) and
then the path delay again from the path probe's kept turns (``OUT/path_probe_turns.json``), on
the profile's step terms, as ``compare --fidelity`` fits them: the same live runs simulated
with and without the sharing (docs/simulator.md, "Measured on the CPU tier").

``--host-speed`` simulates each arm with the profile's step terms scaled by the host's speed
during that arm's live runs against the calibration's (``loop_ms`` in ``fidelity.json``'s
``host_cpu``: :mod:`sessionroute.experiments.live.hostspeed`), or with ``--speed-ref
path_probe`` against the path probe's: how much of the error the host's own speed drift
explains. ``--pace`` scales them by the servers' decode pace measured around the arm's runs
against the calibration's (``decode_pace``). ``--one-factor`` scales every arm by the mean of
those factors instead, so that the arms still differ only in their policy. ``--speed-noise CV``
redraws every replica's step speed every ``--noise-period`` seconds, log-normal with mean 1
(steps per second; a ``slow`` fault whose step-time factor is its inverse) and that
coefficient of variation, ``--noise-schedules`` different draws, each simulated with the arm's
own placement draws: whether a host whose pace moves from second to second, as the CPU tier's
does, would explain a closed-loop error. Diagnoses, not a
calibration: ``compare`` does none of them (docs/simulator.md, "Tried and not kept": each
moved some errors down and others up).

Usage:
    PYTHONPATH=src python scripts/fidelity_resim.py OUT FILE [--path-delay line|curve|profile]
        [--refit sharing|no-sharing]
        [--host-speed [--speed-ref calibration|path_probe] | --pace] [--one-factor]
        [--speed-noise CV [--noise-period S] [--noise-schedules K]]

``FILE`` is the experiment file the output came from (``${TINY_MODEL}`` and the like in its
``[live]`` section are read from the environment, as ``compare`` reads them). Used for
docs/simulator.md, "The request path" (the path delay's curve) and "Measured on the CPU tier"
(the sharing's A/B).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from sessionroute.calibrate.path import curve_from_bins
from sessionroute.calibrate.result import write_path
from sessionroute.errors import ConfigError
from sessionroute.experiments.fidelity import METRICS, compare_arm
from sessionroute.experiments.live.fidelity_run import (
    fidelity_replicas,
    fidelity_sim_spec,
    simulate_draw,
)
from sessionroute.experiments.live.path_probe import fit_probe
from sessionroute.experiments.live_engine import EngineSettings
from sessionroute.experiments.runner import run_experiment
from sessionroute.experiments.spec import load_experiment
from sessionroute.replica.profiles import load_profile_file
from sessionroute.sim.spec import FaultSection


def _profile(path: Path, how: str, work: Path) -> Path:
    """The profile file at ``path`` with its path delay as ``how`` says (a copy in ``work``).

    Raises:
        SystemExit: ``curve`` for a profile whose path probe found no growth to follow.
    """
    if how == "profile":
        return path
    doc = tomllib.loads(path.read_text())
    name = next(iter(doc["profiles"]))
    table = doc["profiles"][name]
    table.pop("path_delay_curve", None)
    fit = doc.get("calibration", {}).get("path") or {}
    if how == "curve":
        if not fit.get("load_dependent") or not fit.get("bins"):
            raise SystemExit(f"{path}: its path delay does not grow with requests in flight")
        bins = [(b["in_flight"], b["requests"], b["median_delay_s"]) for b in fit["bins"]]
        table["path_delay_curve"] = [list(point) for point in curve_from_bins(bins)]
    out = work / "profile.toml"
    out.write_text(tomli_w.dumps(doc))
    return out


def _refit(
    path: Path, probe: Path, sharing: bool, spec: Any, engine: Any, urls: list[str], work: Path
) -> Path:
    """A copy of the profile file at ``path`` with the host's sharing (or none) and the path
    delay fitted again, as ``compare --fidelity`` fits them, from the path probe's kept turns
    (``OUT/path_probe_turns.json``) on the profile's step terms (the replay's engine adds no
    path delay, and :func:`fit_probe` sets the sharing, so the profile's own do not enter).

    Raises:
        SystemExit: no probe request could be replayed.
    """
    turns: dict[str, list[Any]] = json.loads(probe.read_text())
    count, config = fidelity_replicas(spec, str(path), engine, urls)
    fit = fit_probe(turns, config, count, sharing=sharing)
    if fit is None:
        raise SystemExit(f"{probe}: no probe request could be replayed")
    return write_path(path, fit, work / "profile-refit.toml")


_STEP_TERMS = ("b0_s", "b_tok_s", "b_seq_s", "b_req_s", "b_kv_s", "b_pa_s")


def _scaled(path: Path, factor: float, work: Path, name: str) -> Path:
    """A copy of the profile file at ``path`` with its profile's step terms (its own, or its
    ``base``'s) set to the resolved values times ``factor``.

    Raises:
        SystemExit: not a TOML profile file with a ``[profiles.NAME]`` table.
    """
    try:
        resolved = load_profile_file(path).profile
        doc = tomllib.loads(path.read_text())
        table = doc["profiles"][resolved.name]
    except (ConfigError, KeyError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"{path}: not a profile file with a [profiles.NAME] table ({e})") from e
    for term in _STEP_TERMS:
        table[term] = float(getattr(resolved, term)) * factor
    out = work / f"profile-{name}.toml"
    out.write_text(tomli_w.dumps(doc))
    return out


def speed_factors(fid: dict[str, Any], reference: str = "calibration") -> dict[str, float]:
    """Each arm's mean ``loop_ms`` over its live runs over the reference's (arms without a
    measurement left out); empty where the reference's speed is not known.

    ``reference`` is ``calibration`` (measured in this run, or kept in the profile's
    ``[calibration]`` as ``host_loop_ms``) or ``path_probe`` (the probe's requests, whose live
    over replayed pace sets the profile's ``path_step_factor`` and ``peer_busy_slowdown``, so
    the simulator's pace is the host's at the probe, not at the calibration)."""
    cond = fid["conditions"]
    ref = ((cond.get("host_cpu") or {}).get(reference) or {}).get("loop_ms")
    if reference == "calibration":
        ref = ref or (cond.get("calibration") or {}).get("host_loop_ms")  # --profile: its own
    if not ref:
        return {}
    per_arm: dict[str, list[float]] = {}
    for run in (cond.get("decode_pace") or {}).get("runs") or []:
        ms = (run.get("host_cpu") or {}).get("loop_ms")
        if ms:
            per_arm.setdefault(run["arm"], []).append(float(ms))
    return {arm: statistics.fmean(v) / float(ref) for arm, v in per_arm.items()}


def one_factor(factors: dict[str, float]) -> dict[str, float]:
    """Every arm scaled by the mean of the arms' factors: the experiment's pace over its whole
    span, one for all arms, so that the arms still differ only in their policy."""
    if not factors:
        return {}
    mean = statistics.fmean(factors.values())
    return dict.fromkeys(factors, mean)


def pace_factors(fid: dict[str, Any]) -> dict[str, float]:
    """Each arm's mean decode pace around its live runs (before and after, every server) over
    the calibration's (``decode_pace`` in ``fidelity.json``); empty without the calibration's."""
    pace = fid["conditions"].get("decode_pace") or {}
    cal = pace.get("calibration_s")
    if not cal:
        return {}
    per_arm: dict[str, list[float]] = {}
    for run in pace.get("runs") or []:
        got = [float(v) for v in [*run.get("before_s", []), *run.get("after_s", [])] if v > 0]
        per_arm.setdefault(run["arm"], []).extend(got)
    return {arm: statistics.fmean(v) / float(cal) for arm, v in per_arm.items() if v}


def speed_noise(
    cv: float, period_s: float, replicas: int, seed: int, until_s: float
) -> list[FaultSection]:
    """``slow`` faults that redraw each replica's speed every ``period_s`` seconds from 0 to
    ``until_s``: speeds log-normal with mean 1 and coefficient of variation ``cv``, from
    ``random.Random(seed)``; a fault's factor (step time) is the speed's inverse, so the steps
    a busy replica makes per second average what the profile says.

    Raises:
        ValueError: ``cv`` not finite or < 0, ``period_s`` not > 0.
    """
    if not (math.isfinite(cv) and cv >= 0 and period_s > 0):
        raise ValueError(
            f"speed noise needs a finite cv >= 0 and a period > 0 (got {cv}, {period_s})"
        )
    sigma = math.sqrt(math.log1p(cv * cv))
    rng = random.Random(seed)
    faults = []
    for k in range(int(until_s / period_s) + 1):
        for i in range(replicas):
            speed = math.exp(rng.gauss(-sigma * sigma / 2, sigma))
            faults.append(FaultSection(at_s=k * period_s, replica=i, kind="slow", factor=1 / speed))
    return faults


def live_runs(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each arm's live runs' metrics in a ``compare --fidelity`` output's ``results.json``."""
    return {
        arm["name"]: [rep.get("metrics") or {} for rep in arm.get("repeats") or []]
        for arm in results.get("arms") or []
    }


def live_span_s(runs: dict[str, list[dict[str, Any]]]) -> float | None:
    """The longest of the live runs of :func:`live_runs` (output tokens over output tok/s),
    seconds; None where none says."""
    spans = []
    for arm_runs in runs.values():
        for m in arm_runs:
            tokens, rate = m.get("output_tokens"), m.get("output_tokens_per_s")
            if tokens and rate:
                spans.append(float(tokens) / float(rate))
    return max(spans) if spans else None


def describe_arm(name: str, live: list[dict[str, Any]], per_schedule: list[list[Any]]) -> list[str]:
    """One line per fidelity metric of arm ``name``: live and simulated means and the error
    with ``compare``'s own verdict (:func:`~sessionroute.experiments.fidelity.compare_arm`:
    the bound widened by the noise; preemptions on both sides or neither), for every noise
    schedule's simulated runs (one verdict, or in how many schedules it held)."""
    cmps = [compare_arm(live, [r.metrics for r in runs]) for runs in per_schedule]
    lines = []
    for m in METRICS:
        cs = [c[m.key] for c in cmps if c[m.key]["error"] is not None]
        if not cs:
            continue
        lv = cs[0]["live_mean"]
        sim = statistics.fmean(c["sim"] for c in cs)
        error = statistics.fmean(c["error"] for c in cs)
        if m.error == "count":
            text = f"{error:+6.2f}"
            verdict = "both or neither", "one side only"
        else:
            text = f"{error:+6.1f} {'pp' if m.error == 'pp' else '%'}"
            verdict = "within", "outside"
        if m.bound is not None or m.error == "count":
            held = sum(bool(c["ok"]) for c in cs)
            text += (
                f" ({verdict[0] if held else verdict[1]})"
                if len(cs) == 1
                else (f" ({verdict[0]} in {held} of {len(cs)} noise draws)")
            )
        lines.append(f"  {name:32s} {m.label:12s} live {lv:10.4g} sim {sim:10.4g} error {text}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a compare --fidelity output directory")
    parser.add_argument("file", type=Path, help="the experiment file it came from")
    parser.add_argument(
        "--path-delay",
        choices=("line", "curve", "profile"),
        default="profile",
        help="the path delay as the fitted line, as the curve of the probe's bins (refitted "
        "from [calibration.path]), or as the profile file has it (default)",
    )
    parser.add_argument(
        "--refit",
        choices=("sharing", "no-sharing"),
        help="fit the servers' sharing of the host (or none) and then the path delay again "
        "from the path probe's kept turns (OUT/path_probe_turns.json), as compare "
        "--fidelity fits them, instead of the profile's",
    )
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument(
        "--host-speed",
        action="store_true",
        help="scale each arm's step terms by the host's speed during its live runs against "
        "the calibration's (needs loop_ms in fidelity.json: compare --fidelity since "
        "2026-12-07)",
    )
    parser.add_argument(
        "--speed-ref",
        choices=("calibration", "path_probe"),
        default="calibration",
        help="with --host-speed: whose loop time the arms' loop times are divided by, the "
        "calibration's (default) or the path probe's",
    )
    parser.add_argument(
        "--one-factor",
        action="store_true",
        help="with --host-speed or --pace: scale every arm by the mean of the arms' factors "
        "(one factor for the whole experiment) instead of each by its own",
    )
    scale.add_argument(
        "--pace",
        action="store_true",
        help="scale each arm's step terms by the servers' decode pace measured around its live "
        "runs against the calibration's",
    )
    parser.add_argument(
        "--speed-noise",
        type=float,
        default=0.0,
        metavar="CV",
        help="redraw every replica's step speed every --noise-period seconds, log-normal with "
        "mean 1 and this coefficient of variation (default 0: none)",
    )
    parser.add_argument(
        "--noise-period",
        type=float,
        metavar="S",
        help="seconds between redraws (default 0.5; with --speed-noise)",
    )
    parser.add_argument(
        "--noise-schedules",
        type=int,
        metavar="K",
        help="different noise draws per arm, each simulated as compare does (default 4; with "
        "--speed-noise)",
    )
    args = parser.parse_args()
    if not (math.isfinite(args.speed_noise) and args.speed_noise >= 0):
        parser.error("--speed-noise must be a finite coefficient of variation >= 0")
    if not args.speed_noise and (args.noise_period is not None or args.noise_schedules is not None):
        parser.error("--noise-period and --noise-schedules need --speed-noise")
    period = 0.5 if args.noise_period is None else args.noise_period
    draws = 4 if args.noise_schedules is None else args.noise_schedules
    if period <= 0 or draws < 1:
        parser.error("--noise-period must be > 0 and --noise-schedules >= 1")
    if args.speed_ref != "calibration" and not args.host_speed:
        parser.error("--speed-ref needs --host-speed")
    if args.one_factor and not (args.host_speed or args.pace):
        parser.error("--one-factor needs --host-speed or --pace")
    fid_path = args.out / "fidelity.json"
    if not fid_path.is_file():
        print(f"{fid_path}: not found (not a compare --fidelity output?)", file=sys.stderr)
        return 2
    fid = json.loads(fid_path.read_text())
    cond = fid["conditions"]
    e = cond["engine"]
    engine = EngineSettings(
        e.get("kv_capacity_tokens"), e.get("max_num_seqs"), e.get("max_model_len"),
        e.get("block_size"), e.get("max_num_batched_tokens"), "fidelity.json",
    )  # fmt: skip
    try:
        spec = load_experiment(args.file, env=dict(os.environ))
    except (ConfigError, OSError) as e:  # the message names the file
        print(f"{args.file}: {e}" if isinstance(e, OSError) else str(e), file=sys.stderr)
        return 2
    source = Path(cond["profile"])
    if not source.is_file():
        print(f"{source}: the profile fidelity.json names is not there (relative to where "
              "compare ran?)", file=sys.stderr)  # fmt: skip
        return 2
    probe = args.out / "path_probe_turns.json"
    if args.refit and not probe.is_file():
        print(f"{probe}: not found (compare --fidelity keeps it since 2026-12-07)", file=sys.stderr)
        return 2
    factors = (
        speed_factors(fid, args.speed_ref) if args.host_speed
        else pace_factors(fid) if args.pace else {}
    )  # fmt: skip
    if args.host_speed and not factors:
        missing = "no loop_ms in fidelity.json's host_cpu or in its arms' runs"
        if args.speed_ref == "calibration":
            missing += ", no host_loop_ms in the profile's [calibration]"
        where = args.speed_ref.replace("_", " ")
        print(f"{fid_path}: the {where}'s host speed is not known ({missing})", file=sys.stderr)
        return 2
    if args.pace and not factors:
        print(f"{fid_path}: no decode pace measured", file=sys.stderr)
        return 2
    if args.one_factor:
        factors = one_factor(factors)
    results_path = args.out / "results.json"
    if not results_path.is_file():
        print(f"{results_path}: not found (the live runs of the output)", file=sys.stderr)
        return 2
    live = live_runs(json.loads(results_path.read_text()))
    schedules: list[list[FaultSection]] = [[]]
    if args.speed_noise > 0:
        span = live_span_s(live)
        if span is None:
            print(f"{results_path}: no live run's length to cover with noise", file=sys.stderr)
            return 2
        replicas = len(cond["worker_urls"])
        until = 2 * span + 60  # the simulated runs' lengths differ from the live ones'
        schedules = [
            speed_noise(args.speed_noise, period, replicas, seed=k, until_s=until)
            for k in range(draws)
        ]
    # arm -> one list of simulated runs per noise schedule
    runs: dict[str, list[list[Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="fidelity-resim-") as work:
        if args.refit:
            source = _refit(
                source, probe, args.refit == "sharing", spec, engine, cond["worker_urls"],
                Path(work),
            )  # fmt: skip
        profile = _profile(source, args.path_delay, Path(work))
        arms = [[a] for a in spec.arms] if factors else [spec.arms]
        for group in arms:
            use = profile
            if factors:
                name = group[0].name or group[0].policy
                use = _scaled(profile, factors.get(name, 1.0), Path(work), name)
            for noise in schedules:
                # the noise's slow faults come after the file's own, and replace their factor
                one = spec.model_copy(update={"arms": group, "faults": [*spec.faults, *noise]})
                sim_spec = fidelity_sim_spec(one, str(use), engine, cond["worker_urls"])
                for arm in run_experiment(sim_spec, simulate_draw, None, jobs=1).results:
                    runs.setdefault(arm.name, []).append(list(arm.runs))
    how = f"path delay as {args.path_delay}"
    if args.refit:
        how += f", refitted from the path probe's turns ({args.refit})"
    if factors:
        what = f"host speed against the {args.speed_ref}'s" if args.host_speed else "decode pace"
        what += ", one factor for every arm" if args.one_factor else ""
        how += f"; step terms x {what}: " + ", ".join(f"{a} {f:.2f}" for a, f in factors.items())
    if args.speed_noise > 0:
        how += (
            f"; step speed redrawn every {period:g} s (cv {args.speed_noise:g}), "
            f"{len(schedules)} draws"
        )
    print(f"{args.out}: {how}")
    for name, per_schedule in runs.items():
        for line in describe_arm(name, live[name], per_schedule):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
