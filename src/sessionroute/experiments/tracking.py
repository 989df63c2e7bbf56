"""Experiment tracking with Weights & Biases (``--wandb PROJECT`` or ``[wandb]``).

Each run of each arm becomes one W&B run named after the arm (``consistent-hash``,
``sticky-least-loaded``: the naming of prime-rl's public consistent-hash vs sticky-least-loaded
runs), all in one group per experiment. Per RL step the history holds the step time, the
output tokens per second over the step and the sessions cancelled so far; the summary holds
every final metric (nested keys flattened with dots); ``report.html`` and ``results.json`` are
logged as an artifact of each run. Without an API key the runs are written offline (under the
output directory's ``wandb/``), to be uploaded later with ``wandb sync``.

wandb is an optional dependency: ``pip install 'sessionroute[wandb]'``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from sessionroute.errors import ConfigError
from sessionroute.experiments.results import ArmResult, RunOutput
from sessionroute.experiments.spec import WandbSection

__all__ = ["flatten", "history_rows", "log_experiment", "resolve_mode", "run_name"]


def run_name(arm: str, seed: int | None = None) -> str:
    """The W&B run name of an arm: ``sticky_least_loaded`` -> ``sticky-least-loaded``, with
    ``-seed<k>`` when the arm ran several seeds."""
    name = re.sub(r"[^A-Za-z0-9.@-]+", "-", arm).strip("-")
    return name if seed is None else f"{name}-seed{seed}"


def resolve_mode(
    section: WandbSection, env: Mapping[str, str] | None = None
) -> Literal["online", "offline"]:
    """``online`` or ``offline``: the section's mode; else ``WANDB_MODE``; else online when an
    API key is configured (``WANDB_API_KEY``, or an ``api.wandb.ai`` entry in ``~/.netrc``)."""
    environ = os.environ if env is None else env
    if section.mode is not None:
        return section.mode
    mode = environ.get("WANDB_MODE")
    if mode == "online":
        return "online"
    if mode == "offline":
        return "offline"
    if environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if "api.wandb.ai" in netrc.read_text(encoding="utf-8"):
            return "online"
    except OSError:
        pass
    return "offline"


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Numeric and string leaves of a nested dict as ``{"ttft_s.p50": ...}`` (lists such as
    ``per_replica`` become ``per_replica.0.hit_rate``); None leaves are dropped."""
    out: dict[str, Any] = {}
    for key, v in d.items():
        name = f"{prefix}{key}"
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{name}."))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, Mapping):
                    out.update(flatten(item, f"{name}.{i}."))
        elif isinstance(v, bool | int | float | str):
            out[name] = v
    return out


def history_rows(run: RunOutput) -> list[dict[str, float]]:
    """One row per RL step: ``rl_step``, ``t_s``, ``step_time_s``, ``output_tokens_per_s``
    (over the step: output tokens since the previous step's end over the time since) and
    ``sessions_cancelled`` (cumulative)."""
    rows: list[dict[str, float]] = []
    prev_t, prev_tok = 0.0, 0.0
    for s in run.steps:
        t = float(s["t"])
        row = {"rl_step": float(s["step"]), "t_s": t, "step_time_s": float(s["step_time_s"])}
        if "output_tokens" in s:
            tok = float(s["output_tokens"])
            row["output_tokens_per_s"] = (tok - prev_tok) / (t - prev_t) if t > prev_t else 0.0
            prev_tok = tok
        if "sessions_cancelled" in s:
            row["sessions_cancelled"] = float(s["sessions_cancelled"])
        prev_t = t
        rows.append(row)
    return rows


def log_experiment(
    section: WandbSection,
    experiment: Mapping[str, Any],
    results: list[ArmResult],
    files: list[Path],
    out_dir: Path,
) -> list[str]:
    """Log every run of every arm to W&B; returns the run names.

    Args:
        section: the project (required), entity, group and mode.
        experiment: the resolved experiment (the runs' config).
        results: the arms and their runs.
        files: written outputs to attach (``report.html``, ``results.json``).
        out_dir: the experiment's output directory (offline runs go to its ``wandb/``).

    Raises:
        ConfigError: if wandb is not installed, or no project is given.
    """
    if not section.project:
        raise ConfigError("W&B tracking needs a project (--wandb PROJECT)")
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "--wandb needs the wandb package: pip install 'sessionroute[wandb]'"
        ) from None
    mode = resolve_mode(section)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    group = section.group or f"{experiment.get('name', 'experiment')}-{stamp}"
    names: list[str] = []
    for arm in results:
        for run in arm.runs:
            name = run_name(arm.name, run.seed if len(arm.runs) > 1 else None)
            wb = wandb.init(
                project=section.project,
                entity=section.entity,
                group=group,
                name=name,
                job_type="compare",
                mode=mode,
                dir=str(out_dir),
                config={
                    "arm": arm.name,
                    "policy": arm.policy,
                    "policy_options": arm.policy_options,
                    "seed": run.seed,
                    "experiment": dict(experiment),
                },
                reinit="create_new",
            )
            try:
                wb.define_metric("rl_step")
                wb.define_metric("*", step_metric="rl_step")
                for row in history_rows(run):
                    wb.log(row)
                wb.summary.update(flatten(run.metrics))
                art = wandb.Artifact(f"{run_name(arm.name)}-outputs", type="experiment-outputs")
                for f in files:
                    if f.is_file():
                        art.add_file(str(f))
                wb.log_artifact(art)
            finally:
                wb.finish()
            names.append(name)
    return names
