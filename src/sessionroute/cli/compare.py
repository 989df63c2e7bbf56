"""``sessionroute compare``: matched A/B experiments of routing policies, with a report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from sessionroute.cli.executing import add_ray_argument, executor_from_args, failed_runs_text
from sessionroute.cli.experiment_args import experiment_from_args

__all__ = ["experiment_from_args", "register"]

_EPILOG = """\
examples:
  sessionroute compare                              # the default: simulated swe-rl, 5 arms
  sessionroute compare --steps 5 --policies consistent_hash,sticky_least_loaded
  sessionroute compare --workload trace:weka        # replay Claude Code sessions
  sessionroute compare --workload toy --repeats 3   # small, with 95 % intervals
  sessionroute compare examples/replica_failure.toml --dry-run
  sessionroute compare --live examples/live_side_by_side.toml   # real HTTP, emulated replicas
  sessionroute compare --objective "min step_time_s.mean; ttft_s.p99 <= 60"
  sessionroute compare --explain                    # the objective, the verdict and the terms
  sessionroute compare examples/fidelity_vllm_cpu.toml --fidelity   # simulator vs real vLLM
"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare routing policies on a workload (simulated or live)",
        # RawDescriptionHelpFormatter keeps the epilog's layout, so the description is
        # wrapped here
        description=(
            "Run matched arms that differ only in the routing policy on the same workload and\n"
            "seed, then print a comparison table and write results.json, config.resolved.toml,\n"
            "timeseries.csv, steps.csv and report.html. Without FILE, runs the built-in default\n"
            "experiment (examples/default.toml)."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", nargs="?", metavar="FILE", help="experiment file (TOML)")
    parser.add_argument(
        "--workload",
        help=(
            "swe-rl, toy, trace:weka, trace:mooncake, or a .csv/.jsonl trace path "
            "(replaces the kind and options of FILE's [workload])"
        ),
    )
    parser.add_argument(
        "--policies",
        help="comma-separated policies, one arm each (replaces FILE's arms); each is a name, "
        "name(key=value, ...) with the policy's options (sessionroute policies NAME lists "
        "them), or @FILE, a policy file such as one `sessionroute tune` writes; e.g. "
        "'consistent_hash_bounded_load(c=1.05),adaptive_sticky'",
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="RL steps to run (swe-rl; default: the file's, 20 in the default experiment)",
    )
    parser.add_argument("--seed", type=int, help="base seed (repeat k uses seed + k)")
    parser.add_argument("--repeats", type=int, help="runs per arm; >= 2 shows 95 %% intervals")
    parser.add_argument(
        "--out", metavar="DIR", help="output directory (default runs/<time>-<name>)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=(
            "runs in parallel processes (default: every run at once, up to twice the CPU "
            "count: runs of unequal length then share the cores instead of queueing)"
        ),
    )
    add_ray_argument(parser)
    parser.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="log each arm as a Weights & Biases run in PROJECT, one group per experiment "
        "(offline without an API key; needs pip install 'sessionroute[wandb]')",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="run through real HTTP: replicas and routers of FILE's [live] section "
        "(emulated replicas by default; docs/live.md); arms run one after another",
    )
    parser.add_argument(
        "--objective",
        metavar="TEXT",
        help="what the verdict judges arms on (replaces FILE's [objective]): 'rl', 'serving', "
        "or 'min|max METRIC; METRIC <= N; ...' (default: the workload's, docs/objectives.md); "
        "it also sets the options a policy takes for that kind of objective, below the arm's "
        "own (adaptive_hold under 'serving'; --dry-run lists them)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print the experiment's objective, how the verdict is reached and a glossary of "
        "the table's terms, and exit",
    )
    parser.add_argument(
        "--fidelity",
        action="store_true",
        help="for a file whose [live] section names servers: calibrate them (or take "
        "--profile), run every arm live (repeats runs, the same seed) and simulated with the "
        "servers' KV size, batch limits and worker URLs, and write fidelity.json, a table and "
        "a report section (docs/simulator.md, 'How far to trust it')",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="with --fidelity: a profile file fitted to these servers (sessionroute calibrate "
        "--out FILE) instead of calibrating them first",
    )
    parser.add_argument(
        "--calibrate-probe",
        choices=("together", "first", "all"),
        default=None,
        help="with --fidelity: how the servers are calibrated (sessionroute calibrate "
        "--probe): together (default: every server at once, in lockstep, as the arms load "
        "them), first (the first server alone, the others read), all (one after the "
        "other); docs/simulator.md, 'Calibrating against a real server'",
    )
    parser.add_argument(
        "--probe-path",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --fidelity: send probe requests the arms' way (the live client, the arm's "
        "router, streamed chat completions), fit their delay outside the engine's queue and "
        "prefill as d0 + d1 * (requests in flight) and write it into OUT/profile.toml "
        "(default: when calibrating here, not with --profile)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print a short plan (workload, replicas, one line per arm) and exit",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print results.json on stdout (progress and tables go to stderr); with "
        "--dry-run, the full resolved plan as JSON",
    )
    parser.set_defaults(handler=_run)


def _check_arms(arms: list[Any]) -> None:
    """Resolve each arm's replicas and build its workload once, so that an unknown replica
    profile or a malformed trace fails (naming file, line and field) before any arm runs,
    ``--dry-run`` included.

    Raises:
        SessionRouteError: what resolving the replicas or building the workload raises
            (``ConfigError``, ``TraceFormatError``, ...).
    """
    import numpy as np

    from sessionroute.sim import SimSpec
    from sessionroute.sim.runner import replica_config
    from sessionroute.workloads.registry import workload_config

    seen: set[str] = set()
    for arm in arms:
        replica_config(SimSpec.from_settings(arm.settings))
        wl = arm.settings["workload"]
        key = json.dumps(wl, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            cfg = workload_config(wl["kind"], wl.get("steps"), wl.get("options"))
            cfg.build(np.random.default_rng(0))


def _with_live_engine(spec: Any, arms: list[Any], console: Any) -> tuple[Any, list[Any]]:
    """For a ``[live]`` file naming real servers: the experiment with the servers' KV size and
    batch limits in ``[replicas]`` (:mod:`sessionroute.experiments.live_engine`), a line
    saying where they came from on ``console``; ``(spec, arms)`` unchanged otherwise."""
    from sessionroute.experiments.live_engine import apply_engine_settings, live_engine_settings
    from sessionroute.experiments.spec import parse_experiment, resolve_arms

    engine = live_engine_settings(arms[0].settings)
    if engine is None:
        return spec, arms
    console.print(f"simulating the [live] servers' engine: {engine.source}", markup=False)
    if not engine.replicas_overrides():
        return spec, arms
    data = spec.model_dump()
    apply_engine_settings(data, engine)
    spec = parse_experiment(data, source=f"{spec.name} (the [live] servers' engine)")
    return spec, resolve_arms(spec)


def _run_fidelity(args: argparse.Namespace, spec: Any, err_console: Any, out_console: Any) -> int:
    from rich.markup import escape

    from sessionroute.errors import SessionRouteError
    from sessionroute.experiments.fidelity_report import print_fidelity
    from sessionroute.experiments.live.fidelity_run import run_fidelity
    from sessionroute.experiments.progress import RichReporter
    from sessionroute.experiments.runner import default_out_dir

    out_dir = default_out_dir(spec.name) if args.out is None else Path(args.out)
    t0 = time.monotonic()
    try:
        with RichReporter(err_console) as reporter:
            result = run_fidelity(
                spec,
                out_dir,
                profile=args.profile,
                probe=args.calibrate_probe or "together",
                probe_path=args.probe_path,
                reporter=reporter,
                say=lambda line: err_console.print(line, highlight=False, markup=False),
                command=" ".join(["sessionroute", *sys.argv[1:]]),
            )
    except SessionRouteError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    print_fidelity(result.doc, out_console)
    out_console.print(
        f"wall time {time.monotonic() - t0:.1f} s; fidelity: {result.paths['fidelity']}  "
        f"report: {result.paths['report']}  profile: {result.paths['profile']}",
        highlight=False,
    )
    if args.json:
        sys.stdout.write(result.paths["fidelity"].read_text("utf-8"))
    # as a plain compare: the figures hold the runs that finished, each failure said, exit 1
    for side, failed in (("live", result.live.failed), ("simulated", result.sim.failed)):
        if failed:
            err_console.print(f"{side}: " + escape(failed_runs_text(failed)), highlight=False)
            for f in failed:
                err_console.print(f.detail, highlight=False, markup=False)
    return 1 if result.live.failed or result.sim.failed else 0


def _jobs(args: argparse.Namespace, spec: Any) -> int:
    runs: int = len(spec.arms) * spec.run.repeats
    if args.jobs is not None:
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        return int(args.jobs)
    # Oversubscribing up to 2x lets a short arm finish beside two long ones instead of
    # queueing behind them: the wall time tends to total CPU / cores.
    return max(1, min(2 * (os.cpu_count() or 1), runs))


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from sessionroute.errors import SessionRouteError

    err_console = Console(stderr=True)
    out_console = err_console if args.json else Console()
    try:
        spec = experiment_from_args(args)
        jobs = _jobs(args, spec)
        if args.live and args.ray is not None:
            raise ValueError("--ray runs simulations; a --live experiment runs here")
        executor = executor_from_args(args, jobs)
    except (SessionRouteError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, highlight=False)
        return 2
    if args.explain:
        from sessionroute.experiments.verdict_text import explain_text

        print(explain_text(spec.resolved_objective()))
        return 0
    from sessionroute.experiments.runner import (
        default_out_dir,
        resolved_experiment,
        run_experiment,
        write_outputs,
    )
    from sessionroute.experiments.spec import resolve_arms

    if args.profile and not args.fidelity:
        err_console.print("[red]error:[/red] --profile goes with --fidelity", highlight=False)
        return 2
    if args.calibrate_probe and (not args.fidelity or args.profile):
        why = "goes with --fidelity" if not args.fidelity else "calibrates: not with --profile"
        err_console.print(f"[red]error:[/red] --calibrate-probe {why}", highlight=False)
        return 2
    if args.fidelity and args.live:
        err_console.print(
            "[red]error:[/red] --fidelity runs the arms live and simulated: drop --live",
            highlight=False,
        )
        return 2
    try:
        arms = resolve_arms(spec)
        if not args.live and not args.fidelity:
            spec, arms = _with_live_engine(spec, arms, err_console)
        _check_arms(arms)
    except (SessionRouteError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    if args.dry_run:
        if args.json:
            print(json.dumps(resolved_experiment(spec, arms), indent=2))
        else:
            from sessionroute.experiments.plan import plan_summary

            print(plan_summary(spec, arms))
        return 0
    if args.out is not None:  # a bad --out fails now, not after the whole run
        if (Path(args.out) / "results.json").exists():
            err_console.print(
                "note: " + escape(f"{args.out} holds an earlier run's files: they are replaced"),
                highlight=False,
            )
        try:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            err_console.print(
                "[red]error:[/red] "
                + escape(f"cannot create output directory {args.out!r}: {exc}"),
                highlight=False,
            )
            return 2
    from sessionroute.experiments.plan import objective_options_note
    from sessionroute.experiments.progress import RichReporter
    from sessionroute.experiments.sim_arm import simulate_arm
    from sessionroute.experiments.table import print_comparison

    for line in objective_options_note(arms):  # the live and simulated arms alike
        err_console.print(escape(line), highlight=False)
    if args.fidelity:
        return _run_fidelity(args, spec, err_console, out_console)
    t0 = time.monotonic()
    try:
        with RichReporter(err_console) as reporter:
            if args.live:
                from sessionroute.experiments.live.runner import run_live_experiment

                output = run_live_experiment(spec, reporter)
            else:
                output = run_experiment(spec, simulate_arm, reporter, executor=executor)
    except SessionRouteError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    if output.failed:
        err_console.print(escape(failed_runs_text(output.failed)), highlight=False)
        if not output.results:
            return 1
    out_dir = default_out_dir(spec.name) if args.out is None else Path(args.out)
    paths = write_outputs(output, out_dir)
    print_comparison(output.results, out_console)
    if not args.live:
        from sessionroute.experiments.live_engine import profile_note

        out_console.print(profile_note(arms[0].settings), highlight=False, markup=False)
    from sessionroute.experiments.verdict_text import print_verdict

    print_verdict(output.verdict(), output.arms, out_console)
    if spec.wandb.project:
        from sessionroute.experiments.tracking import log_experiment, resolve_mode

        try:
            names = log_experiment(
                spec.wandb,
                resolved_experiment(spec, output.arms),
                output.results,
                [paths["report"], paths["results"]],
                out_dir,
            )
        except SessionRouteError as exc:
            err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
            return 2
        out_console.print(
            f"W&B ({resolve_mode(spec.wandb)}): project {spec.wandb.project}, runs "
            f"{', '.join(names)}"
            + (
                f"; sync with: wandb sync {out_dir / 'wandb'}/offline-run-*"
                if resolve_mode(spec.wandb) == "offline"
                else ""
            ),
            highlight=False,
        )
    out_console.print(
        f"wall time {time.monotonic() - t0:.1f} s; report: {paths['report']}  "
        f"results: {paths['results']}",
        highlight=False,
    )
    if args.json:
        sys.stdout.write(paths["results"].read_text("utf-8") + "\n")
    return 1 if output.failed else 0
