"""Experiment files: TOML validated with pydantic, arms matched except for the policy.

An experiment runs the same workload with the same seeds under several routing policies
("arms"). Each arm may carry ``overrides`` (a partial experiment deep-merged over the shared
settings); any resulting difference between arms other than the policy and the run
identifiers is refused with the difference shown, unless listed in ``allow_differences``.

Example::

    name = "default"
    [workload]
    kind = "swe-rl"
    steps = 20
    [replicas]
    count = 3
    profile = "glm45air-h200-tp8"
    [[arms]]
    policy = "consistent_hash"
    [[arms]]
    policy = "sticky_least_loaded"
"""

from __future__ import annotations

import copy
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionroute.errors import ConfigError
from sessionroute.experiments.live_section import LiveSection, expand_experiment_env
from sessionroute.experiments.objective import Objective, ObjectiveSection, resolve_objective
from sessionroute.router.policies.registry import make_config, policy_class
from sessionroute.sim import (
    FaultSection,
    ReplicaSection,
    RouterSection,
    SimOptions,
    SimSpec,
    WorkloadSection,
    replica_config,
)
from sessionroute.workloads.registry import workload_config

__all__ = [
    "ArmSpec",
    "ExperimentSpec",
    "ResolvedArm",
    "RunSpec",
    "WandbSection",
    "arm_differences",
    "load_experiment",
    "parse_experiment",
    "resolve_arms",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSpec(_Strict):
    """Seeds and repeats.

    Attributes:
        seed: base seed; repeat ``k`` uses ``seed + k`` in every arm.
        repeats: runs per arm (>= 1); with 2 or more, tables show mean and 95 % interval.
    """

    seed: int = 0
    repeats: int = Field(default=1, ge=1, le=100)


class WandbSection(_Strict):
    """Weights & Biases tracking (``[wandb]``; ``--wandb PROJECT`` sets ``project``).

    Attributes:
        project: W&B project; None: no tracking.
        entity: W&B team or user (None: the account's default).
        group: run group (None: ``<experiment name>-<time>``, one per experiment).
        mode: ``online``, ``offline`` or None: online when an API key is configured
            (``WANDB_API_KEY`` or a ``wandb login`` entry in ``~/.netrc``), else offline.
    """

    project: str | None = None
    entity: str | None = None
    group: str | None = None
    mode: Literal["online", "offline"] | None = None


class ArmSpec(_Strict):
    """One arm: a routing policy plus optional overrides.

    Attributes:
        name: display name (defaults to the policy name).
        policy: registry name or ``module:Class``.
        policy_options: options of the policy's Config.
        overrides: partial experiment (workload/replicas/router/faults keys) merged over the
            shared one; differences must be declared in ``allow_differences``.
    """

    name: str | None = None
    policy: str
    policy_options: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, Any] = Field(default_factory=dict)


class ExperimentSpec(_Strict):
    """A whole experiment file.

    Attributes:
        name: experiment name (used in the output directory).
        description: free text.
        workload, replicas, router, faults, sim: shared settings, the sections of
            :class:`sessionroute.sim.spec.SimSpec` (see docs/simulator.md).
        run: seeds and repeats.
        faults: replica faults applied in every arm.
        live: how ``compare --live`` gets replicas and routers (``docs/live.md``); ignored by
            the simulator.
        arms: at least one arm.
        allow_differences: dotted keys (e.g. ``router.finish_sessions``) arms may differ in.
        wandb: experiment tracking (:class:`WandbSection`).
        objective: what the verdict judges arms on (``docs/objectives.md``); the workload
            kind's default where not declared (:meth:`resolved_objective`).
    """

    name: str = "experiment"
    description: str = ""
    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    replicas: ReplicaSection = Field(default_factory=ReplicaSection)
    router: RouterSection = Field(default_factory=RouterSection)
    run: RunSpec = Field(default_factory=RunSpec)
    faults: list[FaultSection] = Field(default_factory=list)
    sim: SimOptions = Field(default_factory=SimOptions)
    live: LiveSection = Field(default_factory=LiveSection)
    arms: list[ArmSpec] = Field(min_length=1)
    allow_differences: list[str] = Field(default_factory=list)
    wandb: WandbSection = Field(default_factory=WandbSection)
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection)

    def resolved_objective(self) -> Objective:
        """The objective: ``[objective]`` over the workload kind's default (the group-latency
        bound of the RL default is the workload's ``rollout_timeout_s``).

        Raises:
            ConfigError: for a bad metric path or constraint.
        """
        timeout = self.workload.options.get("rollout_timeout_s", 3600.0)
        return resolve_objective(
            self.objective,
            self.workload.kind,
            rollout_timeout_s=float(timeout) if isinstance(timeout, int | float) else 3600.0,
        )


class ResolvedArm(BaseModel):
    """An arm with every setting merged in (what actually runs).

    Attributes:
        name: unique display name.
        policy: registry name or ``module:Class``.
        policy_options: validated options, the objective's among them.
        objective_options: those of ``policy_options`` that come from the policy's options for
            the experiment's kind of objective (``Policy.objective_options``), not written.
        settings: the merged ``workload``/``replicas``/``router``/``run``/``faults`` dict.
    """

    model_config = ConfigDict(frozen=True)
    name: str
    policy: str
    policy_options: dict[str, Any]
    settings: dict[str, Any]
    objective_options: dict[str, Any] = Field(default_factory=dict)


def _format_validation(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid experiment:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  unknown key {loc!r}")
        else:
            lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


def parse_experiment(
    data: Mapping[str, Any], *, source: str = "<experiment>", env: Mapping[str, str] | None = None
) -> ExperimentSpec:
    """Validate a parsed experiment document (after ``${VAR}`` expansion).

    Raises:
        ConfigError: with every problem listed (unknown keys named, bad values explained).
    """
    expanded = expand_experiment_env(dict(data), os.environ if env is None else env)
    try:
        spec = ExperimentSpec.model_validate(expanded)
    except ValidationError as err:
        raise ConfigError(_format_validation(err, source)) from None
    try:  # refuse unmatched arms, bad policies and bad workloads early
        resolve_arms(spec)
        spec.resolved_objective()
    except ConfigError as err:
        raise type(err)(f"{source}: {err}") from None
    return spec


def load_experiment(
    path: str | Path,
    env: Mapping[str, str] | None = None,
    *,
    arms: list[dict[str, Any]] | None = None,
) -> ExperimentSpec:
    """Read and validate a TOML experiment file.

    Args:
        path: the file.
        env: variables for ``${VAR}`` expansion (the process environment when omitted).
        arms: when given, they replace the file's ``[[arms]]`` (which may then be absent).

    Raises:
        ConfigError: if the file is missing, not TOML, or invalid (message names the file).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read experiment file {str(p)!r}: {exc.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    if arms is not None:
        data["arms"] = arms
    return parse_experiment(data, source=str(p), env=env)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def _shown(value: Any) -> str:
    """A setting's value in the arms-differ message (TOML has no null: None means unset)."""
    return "(unset: default)" if value is None else repr(value)


def arm_differences(a: ResolvedArm, b: ResolvedArm) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two arms' settings: key -> (a, b)."""
    fa, fb = _flatten(a.settings), _flatten(b.settings)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}


def _allowed(key: str, allowed: list[str]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


_SHARED_KEYS = ("workload", "replicas", "router", "run", "faults", "sim", "live")


def resolve_arms(spec: ExperimentSpec) -> list[ResolvedArm]:
    """Merge each arm's overrides, validate policies, and refuse unmatched arms. A policy's
    options for the kind of the experiment's objective (``Policy.objective_options``) go under
    the arm's own.

    Raises:
        ConfigError: for an unknown policy or option, an unknown workload kind or option,
            an unknown replica profile or invalid engine settings, duplicate arm names, an
            override of an unknown section, or arms that differ in anything but the policy
            (the differences are listed) unless declared in ``allow_differences``.
    """
    base = spec.model_dump(include=set(_SHARED_KEYS))
    kind = spec.resolved_objective().kind
    arms: list[ResolvedArm] = []
    seen: set[str] = set()
    for i, arm in enumerate(spec.arms):
        unknown = sorted(set(arm.overrides) - set(_SHARED_KEYS))
        if unknown:
            raise ConfigError(
                f"arms[{i}].overrides: unknown section(s) {unknown}; allowed: {list(_SHARED_KEYS)}"
            )
        merged = _deep_merge(base, arm.overrides)
        try:  # validate the merged settings with the same models
            checked = ExperimentSpec.model_validate({**merged, "arms": [{"policy": arm.policy}]})
        except ValidationError as err:
            raise ConfigError(_format_validation(err, f"arms[{i}].overrides")) from None
        # the workload's kind and options, checked here rather than in each run's process
        workload_config(checked.workload.kind, checked.workload.steps, checked.workload.options)
        settings = checked.model_dump(include=set(_SHARED_KEYS))
        replica_config(SimSpec.from_settings(settings))  # the replica profile and engine
        cls = policy_class(arm.policy)
        preset = {
            k: v
            for k, v in (cls.objective_options.get(kind, {}) if kind else {}).items()
            if k not in arm.policy_options
        }
        make_config(cls, {**preset, **arm.policy_options})
        name = arm.name or arm.policy
        if name in seen:
            raise ConfigError(f"duplicate arm name {name!r}: give each arm a distinct 'name'")
        seen.add(name)
        arms.append(
            ResolvedArm(
                name=name,
                policy=arm.policy,
                policy_options={**preset, **arm.policy_options},
                settings=settings,
                objective_options=preset,
            )
        )
    first = arms[0]
    for other in arms[1:]:
        diffs = {
            k: v
            for k, v in arm_differences(first, other).items()
            if not _allowed(k, spec.allow_differences)
        }
        if diffs:
            shown = "\n".join(
                f"  {k}: {first.name}={_shown(a)} vs {other.name}={_shown(b)}"
                for k, (a, b) in diffs.items()
            )
            raise ConfigError(
                f"arms {first.name!r} and {other.name!r} differ in more than the policy:\n{shown}\n"
                'declare intended differences with allow_differences = ["<key>", ...]'
            )
    return arms
