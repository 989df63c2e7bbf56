"""Seed spreads and ranking stability measured on reference workloads
(``data/seed_spread.json``), which a one-repeat verdict cites and a short run is warned with.

The file holds, per reference workload, the settings it matches, the seeds and the command
that measured it, the relative seed spread of each metric (the largest over the arms of
``(max - min) / mean`` over the seeds) and ``stable_ranking_steps`` (RL steps after which the
ranking of the arms on the objective stopped changing in every seed). ``docs/objectives.md``
says how they were measured.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["Reference", "reference_for", "references", "short_run_warning"]


@dataclass(frozen=True, slots=True)
class Reference:
    """One reference workload's measurement.

    Attributes:
        name: short name (``default``).
        match: settings it applies to: dotted key of an arm's settings -> the values
            accepted (a list; None stands for the workload's default).
        seeds: the seeds measured.
        command: the command that measured it.
        relative_spread: metric path -> seed spread as a fraction of the value.
        stable_ranking_steps: RL steps after which the ranking stopped changing in every seed
            (None: not measured).
        stable_best_steps: RL steps after which the best arm stopped changing in every seed.
    """

    name: str
    match: dict[str, Any]
    seeds: tuple[int, ...]
    command: str
    relative_spread: dict[str, float]
    stable_ranking_steps: int | None
    stable_best_steps: int | None = None

    @property
    def source(self) -> str:
        """Where the numbers come from, in words."""
        seeds = f"seeds {self.seeds[0]}-{self.seeds[-1]}" if self.seeds else "no seeds"
        return f"{self.name}, {seeds}"


@cache
def references() -> tuple[Reference, ...]:
    """Every reference in ``data/seed_spread.json``."""
    text = resources.files("sessionroute").joinpath("data/seed_spread.json").read_text("utf-8")
    doc = json.loads(text)
    return tuple(
        Reference(
            name=str(r["name"]),
            match=dict(r["match"]),
            seeds=tuple(int(s) for s in r["seeds"]),
            command=str(r["command"]),
            relative_spread={str(k): float(v) for k, v in r["relative_spread"].items()},
            stable_ranking_steps=r.get("stable_ranking_steps"),
            stable_best_steps=r.get("stable_best_steps"),
        )
        for r in doc["references"]
    )


def _get(settings: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = settings
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def reference_for(settings: Mapping[str, Any], *, ignore: tuple[str, ...] = ()) -> Reference | None:
    """The reference whose ``match`` the arm ``settings`` meet, or None.

    Args:
        settings: an arm's merged settings (``ResolvedArm.settings``).
        ignore: dotted keys not compared (``workload.steps`` to find the workload of a short
            run, for its stable-ranking steps).
    """
    for ref in references():
        ok = True
        for key, want in ref.match.items():
            if key in ignore:
                continue
            if _get(settings, key) not in want:
                ok = False
                break
        if ok:
            return ref
    return None


def short_run_warning(settings: Mapping[str, Any]) -> str | None:
    """A warning when an RL run has fewer steps than the ranking needed to settle on the
    reference workload of its kind (its load and fleet size aside), else None.

    Args:
        settings: an arm's merged settings.
    """
    workload = settings.get("workload") or {}
    if workload.get("kind") != "swe-rl":
        return None
    ref = reference_for(settings, ignore=("workload.steps", "workload.options", "replicas.count"))
    need = ref.stable_ranking_steps if ref else None
    steps = workload.get("steps")
    if ref is None or need is None or not isinstance(steps, int) or steps >= need:
        return None
    best = f" (the best arm after {ref.stable_best_steps})" if ref.stable_best_steps else ""
    return (
        f"this run has {steps} RL steps: on the {ref.name} workload the ranking of the arms on "
        f"mean RL step time stopped changing only after {need} steps in every seed{best} "
        f"(seeds {ref.seeds[0]}-{ref.seeds[-1]}; docs/objectives.md), so a ranking from fewer "
        f"steps may not hold; run "
        f"--steps {need} or more before choosing a policy"
    )
