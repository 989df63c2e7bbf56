"""``sessionroute tune``: fit a policy's knobs to an experiment's workload and objective."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from sessionroute.cli.executing import add_ray_argument, executor_from_args

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``tune`` subcommand to ``sub`` (an argparse subparsers object)."""
    parser = sub.add_parser(
        "tune",
        help="fit a policy's knobs to a workload on its objective (simulated)",
        description=(
            "Search the tunable knobs of a policy (sessionroute policies NAME lists them) on "
            "FILE's workload, replicas and [objective] (or the built-in default experiment), "
            "each trial over --seeds seeds and optionally several load points, with Optuna's "
            "TPE sampler; trial 0 is the defaults. The best settings and the defaults then run "
            "again on fresh seeds: the tuned settings are kept only when they beat the "
            "defaults by more than the seed spread. Writes tuned.toml (for serve "
            "--policy-config and compare --policies @FILE), trials.csv, tune.json and "
            "report.html. An interrupted study resumes with --resume --out DIR. "
            "See docs/tuning.md."
        ),
        allow_abbrev=False,
    )
    parser.add_argument("file", nargs="?", help="experiment TOML (default: the built-in one)")
    parser.add_argument(
        "--policy",
        required=True,
        help="the policy to tune; options written with it are held fixed, e.g. "
        "'adaptive_sticky(admission=false)'",
    )
    parser.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="KNOB=LOW:HIGH",
        help="search KNOB in [LOW, HIGH] instead of its declared range (repeatable); "
        "KNOB=fixed holds it at its default",
    )
    parser.add_argument("--trials", type=int, default=40, help="trial budget (default 40)")
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="MINUTES", help="wall-time budget"
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per trial (default 3)")
    parser.add_argument(
        "--confirm-seeds",
        type=int,
        default=None,
        help="fresh seeds for the final best-vs-defaults runs (default: --seeds)",
    )
    parser.add_argument("--knob", default=None, help="a load knob to tune across (see sweep)")
    parser.add_argument("--values", default=None, help="its values, comma-separated (>= 2)")
    parser.add_argument("--workload", help="replace FILE's workload (as for compare)")
    parser.add_argument("--steps", type=int, help="RL steps per run (swe-rl)")
    parser.add_argument("--seed", type=int, help="first seed (and the sampler's seed)")
    parser.add_argument(
        "--objective",
        help="the objective, as for compare (e.g. 'min step_time_s.mean; "
        "rollouts_timed_out_share <= 0.01', or rl / serving)",
    )
    parser.add_argument("--out", metavar="DIR", help="output directory (default runs/...)")
    parser.add_argument("--resume", action="store_true", help="continue the study in --out DIR")
    parser.add_argument("--jobs", type=int, default=None, help="parallel processes (default: CPUs)")
    parser.add_argument("--dry-run", action="store_true", help="print the search space and exit")
    add_ray_argument(parser)
    parser.set_defaults(handler=_run, policies=None, repeats=None, wandb=None, live=False)


def _space(args: argparse.Namespace, cls: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The knobs to search and the options fixed with ``--policy``.

    Raises:
        ConfigError: for a --space entry that is malformed or names no knob of the policy.
    """
    import dataclasses

    from sessionroute.errors import ConfigError
    from sessionroute.router.policies.options import Knob, knobs, parse_policy

    _, fixed = parse_policy(args.policy)
    space = {k: v for k, v in knobs(cls).items() if k not in fixed}
    for item in args.space:
        key, eq, rng = item.partition("=")
        key = key.strip()
        if not eq or key not in knobs(cls):
            raise ConfigError(
                f"--space {item!r}: expected KNOB=LOW:HIGH with KNOB one of "
                f"{', '.join(knobs(cls)) or '(this policy declares no knobs)'}"
            )
        if rng.strip() == "fixed":
            space.pop(key, None)
            continue
        lo, colon, hi = rng.partition(":")
        try:
            low, high = float(lo), float(hi)
        except ValueError:
            raise ConfigError(f"--space {item!r}: LOW and HIGH must be numbers") from None
        if not colon:
            raise ConfigError(f"--space {item!r}: expected KNOB=LOW:HIGH")
        old = knobs(cls)[key]
        space[key] = Knob(low, high, log=old.log, integer=old.integer, default=old.default)
        if not low <= old.default <= high:
            space[key] = dataclasses.replace(space[key], default=min(max(old.default, low), high))
    if not space:
        raise ConfigError(
            f"policy {cls.name!r} has nothing to tune here (its knobs: "
            f"{', '.join(knobs(cls)) or 'none'}; held fixed: {', '.join(fixed) or 'none'})"
        )
    return space, fixed


def _setup(args: argparse.Namespace) -> Any:
    """The study's :class:`~sessionroute.experiments.tune.TuneSetup` from the arguments."""
    from sessionroute.cli.experiment_args import experiment_from_args
    from sessionroute.cli.sweep import DEFAULT_STEPS, _values
    from sessionroute.errors import ConfigError
    from sessionroute.experiments.sweep import KNOBS
    from sessionroute.experiments.tune import TuneSetup
    from sessionroute.router.policies.options import parse_policy
    from sessionroute.router.policies.registry import make_config, policy_class

    for flag in ("trials", "seeds"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.steps is None and args.file is None and args.workload in (None, "swe-rl"):
        args.steps = DEFAULT_STEPS
    name, _ = parse_policy(args.policy)
    cls = policy_class(name)
    space, fixed = _space(args, cls)
    make_config(cls, fixed)  # a bad fixed option fails now
    spec = experiment_from_args(args)
    base = spec.model_dump(exclude_none=True)
    for arm in base["arms"]:  # the file's options of this policy are kept, fixed
        if arm["policy"] == name:
            fixed = {**arm.get("policy_options", {}), **fixed}
            break
    fixed = {k: v for k, v in fixed.items() if k not in space}
    load = None
    if (args.knob is None) != (args.values is None):
        raise ValueError("--knob and --values go together")
    if args.knob is not None:
        if args.knob not in KNOBS:
            raise ConfigError(f"--knob {args.knob!r}: one of {', '.join(KNOBS)}")
        knob = KNOBS[args.knob]
        load = (knob, tuple(_values(args.values, knob)))
        if len(load[1]) < 2:
            raise ValueError("--values: give at least 2 load points (or leave out --knob)")
    return TuneSetup(
        base=base,
        policy=name,
        fixed=fixed,
        space=space,
        objective=spec.resolved_objective(),
        seeds=args.seeds,
        seed=spec.run.seed,
        load=load,
        confirm_seeds=args.seeds if args.confirm_seeds is None else args.confirm_seeds,
    )


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from sessionroute.errors import SessionRouteError
    from sessionroute.router.policies.options import format_policy

    console = Console(stderr=True)
    out = Console()
    try:
        import optuna  # noqa: F401
    except ImportError:
        console.print(
            "[red]error:[/red] sessionroute tune needs Optuna: "
            + escape("pip install 'sessionroute[tune]'"),
            highlight=False,
        )
        return 2
    try:
        setup = _setup(args)
        jobs = args.jobs or max(1, min(os.cpu_count() or 1, setup.runs_per_trial()))
        executor = executor_from_args(args, jobs)
        if args.resume and not args.out:
            raise ValueError("--resume needs --out DIR, the study's directory")
    except (SessionRouteError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    if args.dry_run:
        out.print(
            f"policy {setup.policy}, fixed {setup.fixed or '-'}", highlight=False, markup=False
        )
        for k, spec in setup.space.items():
            out.print(f"  {k}: {spec.describe()}", highlight=False, markup=False)
        out.print(f"objective: {setup.objective.describe()}", highlight=False, markup=False)
        out.print(
            f"{args.trials} trials x {setup.runs_per_trial()} runs, then "
            f"{2 * setup.confirm_seeds * (len(setup.load[1]) if setup.load else 1)} "
            "confirmation runs",
            highlight=False,
            markup=False,
        )
        return 0
    from sessionroute.experiments.progress import OverallReporter
    from sessionroute.experiments.runner import default_out_dir
    from sessionroute.experiments.tune import open_study, run_study
    from sessionroute.experiments.tune_report import summary_lines, write_tune_outputs

    out_dir = Path(args.out) if args.out else default_out_dir(f"tune-{setup.policy}")
    t0 = time.monotonic()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        study = open_study(setup, out_dir / "study.log", args.resume)
        runs = args.trials * setup.runs_per_trial()
        with OverallReporter(console, f"tune {setup.policy}", runs) as reporter:

            def on_trial(number: int, params: dict[str, Any], score: Any) -> None:
                mark = "" if score.feasible else " (breaks a constraint)"
                console.print(
                    f"trial {number}: {format_policy(setup.policy, params)} -> "
                    f"{score.value:,.4g}{mark}",
                    highlight=False,
                    markup=False,
                )

            result = run_study(
                setup,
                study,
                executor,
                trials=args.trials,
                timeout_s=args.timeout * 60 if args.timeout else None,
                clock=time.monotonic,
                reporter=reporter,
                on_trial=on_trial,
            )
    except (SessionRouteError, OSError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    paths = write_tune_outputs(setup, result, out_dir)
    for line in summary_lines(setup, result):
        out.print(line, highlight=False, markup=False)
    out.print(
        f"wall time {time.monotonic() - t0:.1f} s; policy file: {paths['policy']}  "
        f"report: {paths['report']}",
        highlight=False,
        markup=False,
    )
    return 0
