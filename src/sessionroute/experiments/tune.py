"""``sessionroute tune``: fit a policy's knobs to a workload on its declared objective.

A study searches the knobs a policy declares (:func:`~sessionroute.router.policies.options.
knobs`: ranges and defaults on its ``Config``) with Optuna's TPE sampler (Bergstra et al.,
"Algorithms for Hyper-Parameter Optimization", NeurIPS 2011; https://optuna.org), with the
objective's constraints as the sampler's constraints (an infeasible trial is never best). Each
trial runs the experiment's workload with the trial's settings over ``seeds`` seeds and,
optionally, several load points; its value is the mean over points of the objective's mean over
seeds. Trial 0 is always the defaults.

The best trial of many noisy ones is flattered by its own noise (the winner's curse), so the
study ends by running the best settings and the defaults again on fresh seeds and judging them
with the same verdict as ``compare`` (:func:`~sessionroute.experiments.verdict.judge`): the
tuned settings are called better only when they beat the defaults by more than the seed spread.

Why Optuna rather than Ray Tune: a tuning trial is a handful of independent simulations, and
those runs, not the trials, are what needs a cluster; Ray already runs them
(:mod:`~sessionroute.experiments.executor`). Optuna is a pure-Python library with a file-backed
study (``study.log``, resumable after an interruption, readable by ``optuna`` tools), TPE with
constraints and fANOVA knob importance built in, and the same behaviour on a laptop and a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.experiments.executor import Executor, ProgressReporter
from sessionroute.experiments.objective import Objective
from sessionroute.experiments.results import ArmResult, mean_ci95
from sessionroute.experiments.runner import run_experiment
from sessionroute.experiments.spec import ExperimentSpec, parse_experiment
from sessionroute.experiments.sweep import Knob as LoadKnob
from sessionroute.experiments.sweep import light_simulate_arm, sweep_experiment
from sessionroute.experiments.verdict import PARETO_AXES, ArmRuns, Verdict, judge, metric_value
from sessionroute.router.policies.options import Knob

__all__ = [
    "CONFIRM_SEED_OFFSET",
    "StudyResult",
    "TrialScore",
    "TuneSetup",
    "open_study",
    "per_seed_metrics",
    "run_study",
    "score_runs",
]

CONFIRM_SEED_OFFSET = 1000
"""The confirmation runs use seeds ``seed + 1000 + k``: none of them was seen by the search."""


@dataclass(frozen=True, slots=True)
class TuneSetup:
    """What a study tunes and how.

    Attributes:
        base: the experiment (as a dict) whose workload, replicas and router are kept.
        policy: the policy's registry name or ``module:Class``.
        fixed: options held fixed (given with the policy; never searched).
        space: the knobs searched, by option name.
        objective: the metric to optimise and the constraints.
        seeds: runs per trial and load point (seeds ``seed .. seed + seeds - 1``).
        seed: the first seed; also the sampler's seed.
        load: a load knob and its values (>= 2) to tune over several load points, or None for
            the experiment's own load.
        confirm_seeds: fresh seeds on which the best settings and the defaults are run again.
    """

    base: dict[str, Any]
    policy: str
    fixed: dict[str, Any]
    space: dict[str, Knob]
    objective: Objective
    seeds: int = 3
    seed: int = 0
    load: tuple[LoadKnob, tuple[float, ...]] | None = None
    confirm_seeds: int = 3

    def defaults(self) -> dict[str, Any]:
        """The searched knobs at their defaults."""
        return {name: k.default for name, k in self.space.items()}

    def runs_per_trial(self) -> int:
        """Simulations in one trial."""
        return self.seeds * (len(self.load[1]) if self.load else 1)


@dataclass(frozen=True, slots=True)
class TrialScore:
    """A trial's outcome.

    Attributes:
        value: mean over load points of the objective's mean over seeds (None: no value).
        per_point: ``(mean, lo, hi)`` of the objective per load point (95 % interval).
        violations: per constraint, how far the worst load point is past its bound, relative
            to the bound (<= 0: met); the sampler's constraint values.
    """

    value: float | None
    per_point: tuple[tuple[float, float, float], ...]
    violations: tuple[float, ...]

    @property
    def feasible(self) -> bool:
        """Every constraint met at every load point."""
        return all(v <= 0 for v in self.violations)


@dataclass(slots=True)
class StudyResult:
    """What a study found.

    Attributes:
        trials: ``(number, params, score)`` of every finished trial, in order.
        best: the number of the best feasible trial (None when none is feasible).
        confirmation: the verdict on the fresh seeds, arms ``"defaults"`` and ``"tuned"``
            (None when the best trial is the defaults or no trial is feasible).
        importance: the fANOVA importance of each knob (empty with fewer than 2 finished
            trials or 1 knob).
    """

    trials: list[tuple[int, dict[str, Any], TrialScore]] = field(default_factory=list)
    best: int | None = None
    confirmation: Verdict | None = None
    importance: dict[str, float] = field(default_factory=dict)

    def params(self, number: int) -> dict[str, Any]:
        """The params of trial ``number``."""
        return next(p for n, p, _ in self.trials if n == number)


def _violation(value: float | None, op: str, bound: float) -> float:
    if value is None:
        return 1.0
    scale = abs(bound) if bound else 1.0
    return (value - bound) / scale if op == "<=" else (bound - value) / scale


def score_runs(objective: Objective, points: Sequence[ArmResult]) -> TrialScore:
    """Score one trial from its runs at each load point (an :class:`ArmResult` each)."""
    per_point: list[tuple[float, float, float]] = []
    worst = [-math.inf] * len(objective.constraints)
    for point in points:
        values = [metric_value(r.metrics, objective.metric) for r in point.runs]
        nums = [v for v in values if v is not None]
        if nums:
            per_point.append(mean_ci95(nums))
        for i, c in enumerate(objective.constraints):
            cv = [metric_value(r.metrics, c.metric) for r in point.runs]
            cn = [v for v in cv if v is not None]
            mean = sum(cn) / len(cn) if cn else None
            worst[i] = max(worst[i], _violation(mean, c.op, c.bound))
    value = sum(m for m, _, _ in per_point) / len(per_point) if per_point else None
    if len(per_point) != len(points):
        value = None  # a point measured nothing: no value to compare
    return TrialScore(value, tuple(per_point), tuple(0.0 if w == -math.inf else w for w in worst))


def trial_experiment(
    setup: TuneSetup, named_options: Sequence[tuple[str, dict[str, Any]]], seeds: int, seed: int
) -> ExperimentSpec:
    """One experiment running each ``(name, options)`` of the policy at every load point,
    ``seeds`` seeds from ``seed``; arms are named ``<name>`` or ``<name>@<load>``."""
    data = dict(setup.base)
    data["run"] = {**data.get("run", {}), "seed": seed, "repeats": seeds}
    arms = [
        {"name": name, "policy": setup.policy, "policy_options": {**setup.fixed, **options}}
        for name, options in named_options
    ]
    if setup.load is not None:
        knob, values = setup.load
        return sweep_experiment(data, knob, values, arms, seeds)
    data["arms"] = arms
    return parse_experiment(data, source="<tune>")


def _points(results: Sequence[ArmResult], name: str) -> list[ArmResult]:
    return [r for r in results if r.name == name or r.name.startswith(name + "@")]


def _suggest(trial: Any, space: Mapping[str, Knob]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for name, k in space.items():
        if k.integer:
            params[name] = trial.suggest_int(name, int(k.low), int(k.high), log=k.log)
        else:
            params[name] = trial.suggest_float(name, k.low, k.high, log=k.log)
    return params


def open_study(setup: TuneSetup, path: Path, resume: bool) -> Any:
    """The Optuna study stored in ``path`` (a journal file): created, or loaded when
    ``resume``.

    Raises:
        ConfigError: resuming a study that does not exist or that tunes something else;
            starting one where a study already exists.
    """
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if resume and not path.exists():
        raise ConfigError(f"--resume: no study at {str(path)!r}")
    if not resume and path.exists():
        raise ConfigError(f"a study exists at {str(path)!r}: add --resume, or choose another --out")
    storage = JournalStorage(JournalFileBackend(str(path)))
    sampler = optuna.samplers.TPESampler(seed=setup.seed, n_startup_trials=8)
    direction = (
        optuna.study.StudyDirection.MINIMIZE
        if setup.objective.direction < 0
        else optuna.study.StudyDirection.MAXIMIZE
    )
    identity = {
        "policy": setup.policy,
        "fixed": repr(sorted(setup.fixed.items())),
        "space": sorted(setup.space),
        "objective": setup.objective.metric,
        "seeds": setup.seeds,
        "load": repr(setup.load[1]) if setup.load else "",
    }
    if resume:
        study = optuna.load_study(study_name="tune", storage=storage, sampler=sampler)
        theirs = study.user_attrs.get("identity")
        if theirs != identity:
            raise ConfigError(
                f"--resume: the study at {str(path)!r} tunes {theirs}, not {identity}"
            )
        _resume(study, setup.seed)
        return study
    study = optuna.create_study(
        study_name="tune", storage=storage, sampler=sampler, direction=direction
    )
    study.set_user_attr("identity", identity)
    study.enqueue_trial(setup.defaults())
    return study


def _resume(study: Any, seed: int) -> None:
    """Make a loaded study go on where it stopped: a trial an interrupted run left unfinished
    is closed (as failed, marked ``interrupted``: it does not count against the budget) and
    its settings are asked again first; the sampler is reseeded with ``seed`` plus the number
    of trials so far, so that it does not propose the first trials' settings again (a sampler
    seeded as at the start repeats its random start-up trials)."""
    import optuna

    running = optuna.trial.TrialState.RUNNING
    for t in study.get_trials(deepcopy=False, states=(running,)):
        study.enqueue_trial(t.params)
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    n = len(study.trials)
    study.sampler = optuna.samplers.TPESampler(seed=seed + n, n_startup_trials=8)


def _interrupted(t: Any) -> bool:
    """A trial closed by :func:`_resume`: it never recorded its runs' outcome."""
    import optuna

    return bool(t.state == optuna.trial.TrialState.FAIL and "violations" not in t.user_attrs)


def run_study(
    setup: TuneSetup,
    study: Any,
    executor: Executor,
    *,
    trials: int,
    timeout_s: float | None,
    clock: Callable[[], float],
    reporter: ProgressReporter | None = None,
    on_trial: Callable[[int, dict[str, Any], TrialScore], None] | None = None,
) -> StudyResult:
    """Run trials until ``trials`` have ended (those of an earlier, resumed run count, and so do
    failed ones: a trial fails when a run fails or the objective was not measured) or
    ``timeout_s`` has passed, then confirm the best on fresh seeds.

    Args:
        setup: what to tune.
        study: from :func:`open_study`.
        executor: where the simulations run.
        trials: the trial budget.
        timeout_s: wall-time budget in seconds (checked between trials), or None.
        clock: the wall clock (``time.monotonic``), injected.
        reporter: progress of every simulation.
        on_trial: called after each trial with its number, params and score.
    """
    import optuna

    start = clock()
    ended = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
    while True:
        # a failed trial counts too, one a stop interrupted does not (see _resume)
        done = [t for t in study.trials if t.state in ended and not _interrupted(t)]
        if len(done) >= trials or (timeout_s is not None and clock() - start >= timeout_s):
            break
        trial = study.ask()
        params = _suggest(trial, setup.space)
        name = f"trial{trial.number}"
        spec = trial_experiment(setup, [(name, params)], setup.seeds, setup.seed)
        output = run_experiment(spec, light_simulate_arm, reporter, executor=executor)
        score = score_runs(setup.objective, _points(output.results, name))
        trial.set_user_attr("violations", list(score.violations))
        for c, v in zip(setup.objective.constraints, score.violations, strict=True):
            trial.set_constraint(str(c), v)  # the sampler's feasibility (<= 0: met)
        trial.set_user_attr("per_point", [list(p) for p in score.per_point])
        if score.value is None or output.failed:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        study.tell(trial, score.value)
        if on_trial:
            on_trial(trial.number, params, score)
    return summarize_study(setup, study, executor, reporter)


def _score_of(t: Any) -> TrialScore:
    return TrialScore(
        t.value,
        tuple(tuple(p) for p in t.user_attrs.get("per_point", ())),
        tuple(t.user_attrs.get("violations", ())),
    )


def summarize_study(
    setup: TuneSetup, study: Any, executor: Executor, reporter: ProgressReporter | None
) -> StudyResult:
    """The finished trials, the best feasible one, the knobs' importance, and the best and
    the defaults run again on fresh seeds."""
    import optuna

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    result = StudyResult(trials=[(t.number, dict(t.params), _score_of(t)) for t in complete])
    feasible = [(n, s) for n, _, s in result.trials if s.feasible and s.value is not None]
    if feasible:
        sign = setup.objective.direction
        result.best = max(feasible, key=lambda ns: sign * (ns[1].value or 0.0))[0]
    if len(complete) >= 2 and len(setup.space) >= 2:
        try:
            importance = optuna.importance.get_param_importances(study)
            result.importance = {k: float(v) for k, v in importance.items()}
        except (RuntimeError, ValueError):  # too few distinct values to tell
            result.importance = {}
    best = result.params(result.best) if result.best is not None else None
    if best is not None and best != setup.defaults() and setup.confirm_seeds > 0:
        spec = trial_experiment(
            setup,
            [("defaults", setup.defaults()), ("tuned", best)],
            setup.confirm_seeds,
            setup.seed + CONFIRM_SEED_OFFSET,
        )
        output = run_experiment(spec, light_simulate_arm, reporter, executor=executor)
        runs = [
            ArmRuns(name, per_seed_metrics(setup.objective, _points(output.results, name)))
            for name in ("defaults", "tuned")
        ]
        result.confirmation = judge(setup.objective, runs)
    return result


def _put(metrics: dict[str, Any], path: str, value: float | None) -> None:
    *parents, last = path.split(".")
    node = metrics
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def per_seed_metrics(
    objective: Objective, points: Sequence[ArmResult]
) -> tuple[dict[str, Any], ...]:
    """One metrics dict per seed over several load points: the objective's mean over the
    points, each constraint's worst point, the Pareto axes' mean (what the verdict reads);
    with one point, its runs' metrics as they are."""
    if len(points) == 1:
        return tuple(dict(r.metrics) for r in points[0].runs)
    seeds = min(len(p.runs) for p in points)
    out: list[dict[str, Any]] = []
    for k in range(seeds):
        metrics: dict[str, Any] = {}
        paths = [(objective.metric, "mean")] + [
            (c.metric, "max" if c.op == "<=" else "min") for c in objective.constraints
        ]
        paths += [(p, "mean") for p, _ in PARETO_AXES]
        for path, how in paths:
            vals = [metric_value(p.runs[k].metrics, path) for p in points]
            nums = [v for v in vals if v is not None]
            if len(nums) != len(vals):
                continue  # a point did not measure it: left out, as the verdict expects
            agg = {"mean": sum(nums) / len(nums), "max": max(nums), "min": min(nums)}[how]
            _put(metrics, path, agg)
        out.append(metrics)
    return tuple(out)
