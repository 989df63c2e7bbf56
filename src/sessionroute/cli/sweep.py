"""``sessionroute sweep``: one load knob x policies x seeds, simulated in parallel."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sessionroute.cli.executing import add_ray_argument, executor_from_args, failed_runs_text

if TYPE_CHECKING:
    from sessionroute.experiments.sweep import Knob

__all__ = ["DEFAULT_STEPS", "register"]


DEFAULT_STEPS = 8
"""RL steps per run of a sweep of the swe-rl workload without ``--steps`` (a compare runs 20):
enough simulated time (~4,500 s) for the one-hour rollout timeout to show, and 16 runs (4 load
points x 4 policies) within about 5 minutes on 2 cores (measured cost: docs/simulator.md,
"Sweeps")."""

_EPILOG = """\
examples:
  sessionroute sweep                                  # rollouts in flight, default workload
  sessionroute sweep --knob replicas --values 2,3,4 --seeds 2
  sessionroute sweep --workload trace:weka --knob concurrency --values 32,64,96,128
  sessionroute sweep --workload trace:mooncake --knob time-scale --values 0.25,0.5,1,2
  sessionroute sweep --objective "max output_tokens_per_s; rollouts_timed_out_share <= 0.01"
  sessionroute sweep FILE --policies adaptive_hold --seeds 3 --merge runs/old --out runs/new
                                                      # rerun one arm, keep the others
"""


def register(sub: Any) -> None:
    from sessionroute.experiments.sweep import KNOBS

    parser = sub.add_parser(
        "sweep",
        help="sweep a load knob across policies and seeds (simulated)",
        description=(
            "Run FILE's experiment (or the built-in default) at several values of one load\n"
            "knob, once per policy and seed, in parallel processes. Writes sweep.csv (one row\n"
            "per run), sweep.json and report.html (output tok/s, RL step time p50/max and\n"
            "timeouts against load per policy, the knee marked) and prints, per point, a\n"
            "verdict on the objective (docs/objectives.md): the best policy among those meeting\n"
            "the constraints, those within noise of it, and what each other policy costs."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", nargs="?", metavar="FILE", help="experiment file (TOML)")
    parser.add_argument(
        "--knob",
        choices=sorted(KNOBS),
        default="inflight",
        help="inflight: swe-rl rollouts in flight; concurrency: trace:weka (or a Weka-format "
        "CSV) sessions at once; replicas: replica count; time-scale: trace:mooncake arrival "
        "time scale (default: inflight)",
    )
    parser.add_argument(
        "--values",
        help="comma-separated knob values (default: the knob's range, e.g. "
        "448,544,608,672 rollouts in flight)",
    )
    parser.add_argument(
        "--policies",
        default=None,
        help="comma-separated policies, as for compare: name, name(key=value, ...) or @FILE "
        "(default: the experiment's arms, with their options; the default experiment's five)",
    )
    parser.add_argument("--seeds", type=int, default=1, help="seeds per point (default 1)")
    parser.add_argument("--workload", help="replace FILE's workload (as for compare)")
    parser.add_argument(
        "--steps",
        type=int,
        help=f"RL steps per run (swe-rl; default {DEFAULT_STEPS} unless FILE is given)",
    )
    parser.add_argument("--seed", type=int, help="base seed (seed k is seed + k)")
    parser.add_argument(
        "--objective",
        metavar="TEXT",
        help="what the verdicts and the knee judge on: 'rl', 'serving', or 'min|max METRIC; "
        "METRIC <= N; ...' (default: FILE's [objective], else the workload's); it also sets "
        "the options a policy takes for that kind of objective, below the arm's own "
        "(adaptive_hold under 'serving', docs/objectives.md)",
    )
    parser.add_argument("--out", metavar="DIR", help="output directory (default runs/...)")
    parser.add_argument(
        "--merge",
        metavar="DIR",
        help="add the arms run now to the finished sweep in DIR: the runs of DIR's other arms "
        "are taken from DIR/sweep.json and the verdicts and knee computed over all arms "
        "(refused unless DIR varied the same knob over the same values with the same seeds, "
        "settings and SLO, and kept only arms whose options do not depend on a changed kind "
        "of objective; arms run now replace DIR's of the same name; DIR is not changed "
        "unless --out is DIR)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, help="runs in parallel processes (default: CPU count)"
    )
    add_ray_argument(parser)
    parser.set_defaults(
        handler=_run, repeats=None, live=False, dry_run=False, json=False, wandb=None, explain=False
    )


def _values(text: str, knob: Knob) -> list[float]:
    """``--values`` as numbers of the knob's type.

    Raises:
        ValueError: naming ``--values``, for an empty list, a word that is not a number, or a
            fraction for a whole-number knob (replicas, rollouts in flight, concurrency).
    """
    values: list[float] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        try:
            value = float(word)
        except ValueError:
            raise ValueError(f"--values: {word!r} is not a number") from None
        if knob.cast is int and not value.is_integer():
            raise ValueError(f"--values: {knob.name} takes whole numbers, got {word}")
        values.append(value)
    if not values:
        raise ValueError(f"--values: no value given in {text!r} (e.g. --values 2,3,4)")
    return values


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from sessionroute.cli.experiment_args import experiment_from_args
    from sessionroute.errors import SessionRouteError
    from sessionroute.experiments.sweep import KNOBS, sweep_experiment

    console = Console(stderr=True)
    out = Console()
    knob = KNOBS[args.knob]
    try:
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        if args.steps is None and args.file is None and (args.workload in (None, "swe-rl")):
            args.steps = DEFAULT_STEPS
        base = experiment_from_args(args).model_dump(exclude_none=True)
        values = list(knob.default_values) if args.values is None else _values(args.values, knob)
        policies = [
            {
                "policy": a["policy"],
                "policy_options": a.get("policy_options", {}),
                "name": a.get("name") or a["policy"],
            }
            for a in base["arms"]
        ]
        spec = sweep_experiment(base, knob, values, policies, args.seeds)
        from sessionroute.experiments.spec import resolve_arms

        arms = resolve_arms(spec)
        seeds = [spec.run.seed + k for k in range(args.seeds)]
        earlier = None
        by_arm: dict[Any, Any] = {}  # with --merge: the earlier sweep's other arms' runs
        if args.merge is not None:
            from sessionroute.experiments.sweep_merge import check_merge, load_earlier

            earlier = load_earlier(Path(args.merge))
            by_arm = check_merge(earlier, knob, values, seeds, arms, spec.resolved_objective())
    except (SessionRouteError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    from sessionroute.experiments.progress import OverallReporter
    from sessionroute.experiments.runner import (
        default_out_dir,
        resolved_experiment,
        run_experiment,
    )
    from sessionroute.experiments.sweep import light_simulate_arm, summarize, write_sweep

    runs = len(arms) * args.seeds
    jobs = args.jobs or max(1, min(os.cpu_count() or 1, runs))
    t0 = time.monotonic()
    try:
        executor = executor_from_args(args, jobs)
        with OverallReporter(console, f"sweep {knob.name}", runs) as reporter:
            output = run_experiment(spec, light_simulate_arm, reporter, executor=executor)
    except SessionRouteError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    if output.failed:
        console.print(escape(failed_runs_text(output.failed)), highlight=False)
        if not output.results:
            return 1
    import tomli_w

    from sessionroute.experiments.runner import clean_toml
    from sessionroute.experiments.sweep_merge import merge_arms, settings_by_value

    objective = spec.resolved_objective()
    all_arms, all_results = output.arms, output.results
    if earlier is not None:
        all_arms, all_results = merge_arms(
            earlier, knob, values, by_arm, output.arms, output.results
        )
    result = summarize(knob, all_results, all_arms, objective)
    by_value = settings_by_value(output.arms)
    result.settings = [by_value[v] for v in result.values if v in by_value]
    out_dir = Path(args.out) if args.out else default_out_dir(spec.name)
    toml_text = tomli_w.dumps(clean_toml(resolved_experiment(spec, output.arms)))
    paths = write_sweep(result, out_dir, toml_text)
    from sessionroute.experiments.spread import short_run_warning
    from sessionroute.experiments.sweep import value_label
    from sessionroute.experiments.verdict_text import verdict_lines

    out.print(f"objective: {result.objective.describe()}", highlight=False, markup=False)
    from sessionroute.experiments.plan import objective_options_note

    per_arm = {a.name.rpartition("@")[0]: a for a in output.arms}  # not per load point
    for line in objective_options_note(
        [a.model_copy(update={"name": n}) for n, a in per_arm.items()]
    ):
        out.print(line, highlight=False, markup=False)
    if result.knee is not None:
        out.print(f"knee: {result.knee:g} ({knob.label})", highlight=False)
    else:
        out.print(
            f"knee: none in this range ({result.objective.label} kept up with load)",
            highlight=False,
        )
    for value, verdict in zip(result.values, result.judgements, strict=True):
        lines = verdict_lines(verdict, title=f"at {value_label(knob, value)}")
        out.print(lines[0].split(":", 1)[0] + ":", style="bold", highlight=False, markup=False)
        for line in lines[1:]:
            out.print("  " + line, highlight=False, markup=False)
    warning = short_run_warning(output.arms[0].settings) if output.arms else None
    if warning:
        out.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    out.print(
        f"wall time {time.monotonic() - t0:.1f} s ({runs} runs, "
        f"{'on Ray' if args.ray is not None else f'{jobs} processes'}); "
        f"report: {paths['report']}  csv: {paths['csv']}  json: {paths['json']}",
        highlight=False,
    )
    return 1 if output.failed else 0
