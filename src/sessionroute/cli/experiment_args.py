"""The experiment a command line asks for: FILE (or the built-in default) with the changes of
``--workload``, ``--policies``, ``--steps``, ``--seed``, ``--repeats``, ``--objective`` and
``--wandb`` applied. Shared by ``compare``, ``sweep`` and ``tune``."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from typing import Any

__all__ = ["experiment_from_args", "policy_arms_from_text"]


def experiment_from_args(args: argparse.Namespace) -> Any:
    """The experiment of FILE (or the built-in default) with the command line's changes
    (``--workload``, ``--policies``, ``--steps``, ``--seed``, ``--repeats``) applied."""
    import tomllib

    from sessionroute.experiments.spec import load_experiment, parse_experiment

    policy_arms: list[dict[str, Any]] | None = None
    if args.policies is not None:
        policy_arms = policy_arms_from_text(args.policies)
    if args.file:
        spec = load_experiment(args.file, arms=policy_arms)
    else:
        text = resources.files("sessionroute").joinpath("data/default.toml").read_text("utf-8")
        spec = parse_experiment(tomllib.loads(text), source="<built-in default>")
    data = spec.model_dump()
    changed: list[str] = []
    if args.workload:
        _replace_workload(data, args.workload)
        changed.append(f"--workload {args.workload}")
    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats)):
        if value is not None and value < 1:  # named as typed, not as the TOML field it sets
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.steps is not None:
        if data["workload"]["kind"] != "swe-rl":
            raise ValueError(
                f"--steps applies to the swe-rl workload only; this experiment's workload is "
                f"{data['workload']['kind']!r} (its length is set by its own options)"
            )
        data["workload"]["steps"] = args.steps
        changed.append(f"--steps {args.steps}")
    if args.seed is not None:
        data["run"]["seed"] = args.seed
    if args.repeats is not None:
        data["run"]["repeats"] = args.repeats
    if getattr(args, "objective", None):
        from sessionroute.experiments.objective import objective_from_text

        data["objective"] = objective_from_text(args.objective, data.get("objective"))
    if getattr(args, "wandb", None):
        data["wandb"] = {**data.get("wandb", {}), "project": args.wandb}
    if policy_arms is not None:  # a file's own arms were replaced as it was read
        _note_dropped_options(_file_arms(args.file) if args.file else data["arms"], policy_arms)
        data["arms"] = policy_arms
        changed.append(f"--policies {args.policies}")
        if not args.file:  # the built-in description lists its five arms: say these instead
            names = [a.get("name", a["policy"]) for a in policy_arms]
            data["description"] = names[0] + (" vs " + ", ".join(names[1:]) if names[1:] else "")
    if changed and data.get("description"):
        data["description"] += f" (changed on the command line: {', '.join(changed)})"
    return parse_experiment(data, source=args.file or "<built-in default>")


def policy_arms_from_text(text: str) -> list[dict[str, Any]]:
    """``--policies`` as experiment arms: ``name``, ``name(key=value, ...)`` or ``@FILE`` (a
    policy file, e.g. one ``sessionroute tune`` wrote), comma-separated
    (:mod:`sessionroute.router.policies.options`). An arm with options is named as written, so
    one policy may run with several settings.

    Raises:
        ValueError: for a list with no policy. ConfigError: for an unreadable entry or policy
            file (named).
    """
    from sessionroute.router.policies.options import (
        format_policy,
        load_policy_file,
        parse_policy,
        split_policies,
    )

    if not text.replace(",", "").strip():
        raise ValueError("--policies needs at least one policy name")
    arms: list[dict[str, Any]] = []
    for entry in split_policies(text):
        if entry.startswith("@"):
            name, options = load_policy_file(entry[1:])
        else:
            name, options = parse_policy(entry)
        arm: dict[str, Any] = {"policy": name}
        if options:
            arm["policy_options"] = options
            arm["name"] = format_policy(name, options)
        arms.append(arm)
    return arms


def _replace_workload(data: dict[str, Any], kind: str) -> None:
    """Set ``data``'s workload to ``kind`` with its default options. A ``[replicas]`` field
    that holds the old workload's default (the built-in experiment's 3 x glm45air-h200-tp8 for
    swe-rl) is cleared so that the new workload's default applies (3 x toy-8b-h100-tp1 for
    toy); a field set to anything else is the file's choice and kept.

    Raises:
        ConfigError: for an unknown workload kind.
    """
    from sessionroute.workloads.registry import canonical_kind, default_replicas

    old = data["workload"]["kind"]
    if canonical_kind(kind) != canonical_kind(old):
        cleared = []
        new_defaults = default_replicas(kind)
        for field, value in default_replicas(old).items():
            if data["replicas"].get(field) == value and new_defaults.get(field) != value:
                data["replicas"][field] = None
                cleared.append(f"{field} = {value!r}")
        if cleared:
            print(
                f"note: --workload {kind}: the experiment's [replicas] {', '.join(cleared)} "
                f"(the {old} defaults) give way to {kind}'s defaults",
                file=sys.stderr,
            )
    steps = data["workload"].get("steps") if kind == "swe-rl" else None
    data["workload"] = {"kind": kind, "steps": steps, "options": {}}


def _file_arms(path: str) -> list[dict[str, Any]]:
    """The ``[[arms]]`` of the experiment file ``path`` as written (it was read and validated
    already: here only what ``--policies`` replaced)."""
    import tomllib

    with open(path, "rb") as fh:
        arms = tomllib.load(fh).get("arms", [])
    return [a for a in arms if isinstance(a, dict) and "policy" in a]


def _note_dropped_options(
    file_arms: list[dict[str, Any]], policy_arms: list[dict[str, Any]]
) -> None:
    """Say on stderr which of the replaced arms' policy options ``--policies`` does not keep
    (its arms run each policy with its defaults)."""
    named = {a["policy"] for a in policy_arms if not a.get("policy_options")}
    for arm in file_arms:
        options = arm.get("policy_options") or {}
        if arm["policy"] in named and options:
            shown = ", ".join(f"{k} = {v!r}" for k, v in options.items())
            print(
                f"note: --policies replaces the experiment's arms: {arm['policy']} runs with its "
                f"default options, not the file's arm {arm.get('name') or arm['policy']!r} "
                f"({shown}); write the options in an experiment file to keep them",
                file=sys.stderr,
            )
