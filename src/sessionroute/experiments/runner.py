"""Running an experiment: every arm, every repeat, with progress, then the output directory.

The runner is independent of how an arm is executed: :func:`run_experiment` takes an
``arm_runner`` (the simulator by default; the live runner for ``--live``) that turns one
resolved arm and a seed into a :class:`~sessionroute.experiments.results.RunOutput`.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import tomli_w

from sessionroute.experiments.executor import (
    ArmRunner,
    Executor,
    LocalExecutor,
    ProgressFn,
    ProgressReporter,
    RunFailed,
    Task,
)
from sessionroute.experiments.report import write_report
from sessionroute.experiments.results import (
    ArmResult,
    RunOutput,
    add_slo_metrics,
    results_document,
)
from sessionroute.experiments.spec import ExperimentSpec, ResolvedArm, resolve_arms
from sessionroute.experiments.verdict import ArmRuns, Verdict, judge

__all__ = [
    "ArmRunner",
    "ExperimentOutput",
    "clean_toml",
    "default_out_dir",
    "experiment_verdict",
    "run_experiment",
    "write_outputs",
]


@dataclass(slots=True)
class ExperimentOutput:
    """The results of a whole experiment.

    Attributes:
        spec: the experiment.
        arms: the arms that finished at least one run.
        results: their runs.
        failed: the runs that failed (an arm none of whose runs finished is left out of
            ``arms`` and ``results``).
    """

    spec: ExperimentSpec
    arms: list[ResolvedArm]
    results: list[ArmResult]
    failed: list[RunFailed] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        """The ``results.json`` document, with the objective and the verdict."""
        from sessionroute.experiments.verdict_text import verdict_document

        doc = results_document(resolved_experiment(self.spec, self.arms), self.results)
        verdict = self.verdict()
        doc["objective"] = verdict.objective.as_dict()
        doc["verdict"] = verdict_document(verdict)
        return doc

    def verdict(self) -> Verdict:
        """The verdict on the experiment's objective (:mod:`~sessionroute.experiments.verdict`;
        with one repeat, the noise is the seed spread measured on the same workload, when
        ``data/seed_spread.json`` has it)."""
        return experiment_verdict(self.spec, self.arms, self.results)


def experiment_verdict(
    spec: ExperimentSpec, arms: list[ResolvedArm], results: list[ArmResult]
) -> Verdict:
    """The verdict of ``results`` on ``spec``'s objective, citing the reference spread of the
    arms' workload (:func:`~sessionroute.experiments.spread.reference_for`) when there is one."""
    from sessionroute.experiments.spread import reference_for

    objective = spec.resolved_objective()
    ref = reference_for(arms[0].settings) if arms else None
    spread = ref.relative_spread.get(objective.metric) if ref else None
    return judge(
        objective,
        [
            ArmRuns(r.name, tuple(run.metrics for run in r.runs), tuple(run.seed for run in r.runs))
            for r in results
        ],
        reference_spread=spread,
        reference_source=ref.source if ref and spread is not None else "",
    )


def resolved_experiment(spec: ExperimentSpec, arms: list[ResolvedArm]) -> dict[str, Any]:
    """The fully resolved experiment as a plain dict (what ``config.resolved.toml`` holds)."""
    doc = spec.model_dump(exclude={"arms"}, exclude_none=True)
    doc["arms"] = [
        {
            "name": a.name,
            "policy": a.policy,
            "policy_options": a.policy_options,
            "settings": a.settings,
        }
        for a in arms
    ]
    return doc


def run_experiment(
    spec: ExperimentSpec,
    arm_runner: ArmRunner,
    reporter: ProgressReporter | None = None,
    jobs: int = 1,
    executor: Executor | None = None,
) -> ExperimentOutput:
    """Run every arm ``spec.run.repeats`` times (repeat k uses seed ``run.seed + k``).

    Runs that execute one after the other (live servers, ``jobs=1``) go in counterbalanced
    order, repeat by repeat, the arms in order on even repeats and reversed on odd ones (A B B
    A with two arms and two repeats): a test-bed whose speed drifts during the experiment then
    shifts every arm's mean alike and widens each arm's spread, instead of passing for a
    difference between arms, as it would with each arm's repeats back to back.

    Args:
        spec: the experiment.
        arm_runner: executes one run; must be a picklable module-level callable when
            ``jobs > 1`` or with a Ray executor.
        reporter: receives progress.
        jobs: runs executed in parallel worker processes (1 runs in this process), when no
            ``executor`` is given.
        executor: where the runs execute (:mod:`~sessionroute.experiments.executor`; a
            :class:`LocalExecutor` of ``jobs`` when omitted). Results do not depend on it:
            every run is independent and seeded.

    Raises:
        ConfigError: if the arms do not match (see :func:`resolve_arms`). A run that raises is
            recorded in :attr:`ExperimentOutput.failed`; the others go on.
    """
    arms = resolve_arms(spec)
    objective = spec.resolved_objective()
    slo = (objective.slo_ttft_s, objective.slo_itl_s)
    tasks: list[tuple[int, ResolvedArm, int, str]] = []
    for k in range(spec.run.repeats):
        order = list(enumerate(arms))
        for i, arm in order if k % 2 == 0 else reversed(order):
            label = arm.name if spec.run.repeats == 1 else f"{arm.name} #{k + 1}"
            tasks.append((i, arm, spec.run.seed + k, label))
    runs = executor if executor is not None else LocalExecutor(jobs)
    outputs = runs.run(
        [Task(arm, seed, label) for _, arm, seed, label in tasks],
        WithSloMetrics(arm_runner, *slo),
        reporter,
    )
    results = [ArmResult(a.name, a.policy, a.policy_options) for a in arms]
    failed: list[RunFailed] = []
    for (i, _, _, _), out in zip(tasks, outputs, strict=True):
        if isinstance(out, RunFailed):
            failed.append(out)
        else:
            results[i].runs.append(out)
    kept = [k for k, r in enumerate(results) if r.runs]
    return ExperimentOutput(spec, [arms[k] for k in kept], [results[k] for k in kept], failed)


@dataclass(frozen=True, slots=True)
class WithSloMetrics:
    """An arm runner whose runs also count the SLO goodput
    (:func:`~sessionroute.experiments.results.add_slo_metrics`), where they run: the per-turn
    samples it reads stay in the worker."""

    arm_runner: ArmRunner
    slo_ttft_s: float
    slo_itl_s: float

    def __call__(self, arm: ResolvedArm, seed: int, progress: ProgressFn) -> RunOutput:
        run = self.arm_runner(arm, seed, progress)
        return add_slo_metrics(run, self.slo_ttft_s, self.slo_itl_s)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "experiment"


def default_out_dir(name: str, now: datetime | None = None) -> Path:
    """``runs/<YYYYmmdd-HHMMSS>-<name>/`` under the current directory."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{_slug(name)}"


def clean_toml(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): clean_toml(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [clean_toml(v) for v in value if v is not None]
    return value


def write_outputs(output: ExperimentOutput, out_dir: Path) -> dict[str, Path]:
    """Write ``results.json``, ``config.resolved.toml``, ``timeseries.csv``, ``steps.csv`` and
    ``report.html`` into ``out_dir`` (created). Returns name -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = output.document()
    paths = {
        "results": out_dir / "results.json",
        "config": out_dir / "config.resolved.toml",
        "timeseries": out_dir / "timeseries.csv",
        "steps": out_dir / "steps.csv",
        "report": out_dir / "report.html",
    }
    paths["results"].write_text(json.dumps(doc, indent=2, default=_json_default), encoding="utf-8")
    toml_text = tomli_w.dumps(clean_toml(resolved_experiment(output.spec, output.arms)))
    paths["config"].write_text(toml_text, encoding="utf-8")
    _write_rows(paths["timeseries"], output.results, "timeseries")
    _write_rows(paths["steps"], output.results, "steps")
    write_report(
        paths["report"],
        f"sessionroute compare: {output.spec.name}",
        output.results,
        toml_text,
        output.spec.description,
        verdict=output.verdict(),
    )
    return paths


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _write_rows(path: Path, results: list[ArmResult], attr: str) -> None:
    rows: list[dict[str, Any]] = []
    for arm in results:
        for k, run in enumerate(arm.runs):
            for row in getattr(run, attr):
                rows.append({"arm": arm.name, "repeat": k, **row})
    fields: list[str] = []
    for row in rows:
        for key in row:
            if key not in fields:
                fields.append(key)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields or ["arm", "repeat"])
        writer.writeheader()
        writer.writerows(rows)
