"""Objectives: the metric an experiment is judged on, its direction, and constraints.

An objective is declared in the experiment's ``[objective]`` section or with ``--objective``
on ``compare`` and ``sweep``; without either, the workload kind's default applies
(:func:`default_objective`, reasons in ``docs/objectives.md``):

* RL (``swe-rl``): minimise the mean RL step time (``step_time_s.mean``), subject to rollouts
  timed out <= 1 % of those started and GRPO group latency p90 <= the rollout timeout.
* serving (trace replays, ``toy``): maximise the SLO goodput (``slo_goodput``: share of turns
  with TTFT <= 2 s and mean inter-token gap <= 0.2 s, the MLPerf Inference Llama-2-70B server
  scenario's limits), with the completion time reported.

TOML::

    [objective]
    metric = "step_time_s.mean"          # a results.json metric path
    direction = "min"                    # optional for the metrics of METRICS
    constraints = ["rollouts_timed_out_share <= 0.01", "ttft_s.p99 <= 60"]
    slo_ttft_s = 2.0                     # the SLO slo_goodput counts against
    slo_itl_s = 0.2

The same on the command line: ``--objective "min step_time_s.mean; ttft_s.p99 <= 60"``, or a
preset, ``--objective rl`` / ``--objective serving``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sessionroute.errors import ConfigError

__all__ = [
    "DEFAULT_SLO_ITL_S",
    "DEFAULT_SLO_TTFT_S",
    "METRICS",
    "Constraint",
    "Objective",
    "ObjectiveKind",
    "ObjectiveSection",
    "default_objective",
    "metric_label",
    "objective_from_text",
    "objective_kind",
    "parse_constraint",
    "resolve_objective",
]

DEFAULT_SLO_TTFT_S = 2.0
"""TTFT limit of the default serving SLO (s): MLPerf Inference's Llama-2-70B server scenario
(``llama2-70b.Server.ttft_latency = 2000`` ms in mlcommons/inference ``loadgen/mlperf.conf``,
applied there at p99)."""

DEFAULT_SLO_ITL_S = 0.2
"""Inter-token (time per output token) limit of the default serving SLO (s): the same
scenario's ``tpot_latency = 200`` ms."""

ObjectiveKind = Literal["rl", "serving"]
"""The two kinds of objective a policy may take options for (:attr:`Objective.kind`)."""

_RL_HEADS = frozenset(
    {"step_time_s", "group_latency_s", "rollouts_timed_out", "rollouts_timed_out_share"}
)
_SERVING_HEADS = frozenset(
    {"slo_goodput", "slo_goodput_per_s", "ttft_s", "itl_s", "turn_latency_s"}
)


def objective_kind(metric: str) -> ObjectiveKind | None:
    """``"rl"`` for an RL step or rollout metric path, ``"serving"`` for SLO goodput or a
    per-turn latency (TTFT, ITL, turn latency), None for any other (throughput, hit rate...)."""
    head = metric.split(".", 1)[0]
    if head in _RL_HEADS:
        return "rl"
    if head in _SERVING_HEADS:
        return "serving"
    return None


RL_TIMED_OUT_MAX = 0.01
"""Default RL constraint: at most 1 % of started rollouts time out (their tokens are wasted
and their GRPO groups scored short)."""

# metric path -> (label, better direction: -1 lower, +1 higher)
METRICS: dict[str, tuple[str, int]] = {
    "step_time_s.mean": ("mean RL step time", -1),
    "step_time_s.p50": ("RL step time p50", -1),
    "step_time_s.max": ("RL step time max", -1),
    "group_latency_s.p50": ("group latency p50", -1),
    "group_latency_s.p90": ("group latency p90", -1),
    "group_latency_s.max": ("group latency max", -1),
    "rollouts_timed_out_share": ("timed-out share", -1),
    "rollouts_timed_out": ("rollouts timed out", -1),
    "slo_goodput": ("SLO goodput", +1),
    "slo_goodput_per_s": ("SLO goodput (turns/s)", +1),
    "output_tokens_per_s": ("output tok/s", +1),
    "sessions_per_s": ("sessions/s", +1),
    "sessions_completed": ("sessions completed", +1),
    "prefix_cache_hit_rate": ("hit rate", +1),
    "worst_window_hit_rate": ("worst 10 s hit", +1),
    "thrash_share": ("thrash share", -1),
    "preemptions": ("preemptions", -1),
    "ttft_s.p50": ("TTFT p50", -1),
    "ttft_s.p90": ("TTFT p90", -1),
    "ttft_s.p99": ("TTFT p99", -1),
    "itl_s.p50": ("ITL p50", -1),
    "itl_s.p99": ("ITL p99", -1),
    "turn_latency_s.p50": ("turn latency p50", -1),
    "turn_latency_s.p99": ("turn latency p99", -1),
    "session_latency_s.p50": ("session latency p50", -1),
    "session_latency_s.p90": ("session latency p90", -1),
    "simulated_seconds": ("completion time", -1),
}
"""Metrics an objective or constraint may name, with a label and their better direction. Other
``results.json`` paths are accepted with an explicit ``direction``."""

_SUMMARY_STATS = ("p50", "p90", "p99", "max", "mean")
_PATH = re.compile(r"^[a-z_][a-z0-9_]*(\.(p50|p90|p99|max|mean))?$")


def metric_label(path: str) -> str:
    """A short human name of a metric path (the path itself when unknown)."""
    return METRICS[path][0] if path in METRICS else path


class ObjectiveSection(BaseModel):
    """The ``[objective]`` section (every field optional: the workload's default fills in).

    Attributes:
        preset: ``rl`` or ``serving``: start from that default instead of the workload's.
        metric: the ``results.json`` metric path to optimise (e.g. ``step_time_s.mean``).
        direction: ``min`` or ``max`` (needed only for a metric outside :data:`METRICS`).
        constraints: ``"<metric> <= <number>"`` or ``">="``; an arm that breaks one is not
            eligible for best. Replaces the default's constraints when given.
        slo_ttft_s, slo_itl_s: the SLO ``slo_goodput`` counts against (seconds).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    preset: Literal["rl", "serving"] | None = None
    metric: str | None = None
    direction: Literal["min", "max"] | None = None
    constraints: list[str] | None = None
    slo_ttft_s: float = Field(default=DEFAULT_SLO_TTFT_S, gt=0)
    slo_itl_s: float = Field(default=DEFAULT_SLO_ITL_S, gt=0)


@dataclass(frozen=True, slots=True)
class Constraint:
    """``metric op bound``: ``op`` is ``<=`` or ``>=``."""

    metric: str
    op: Literal["<=", ">="]
    bound: float

    def holds(self, value: float) -> bool:
        """Whether ``value`` meets the constraint."""
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def __str__(self) -> str:
        return f"{metric_label(self.metric)} {self.op} {self.bound:g}"


@dataclass(frozen=True, slots=True)
class Objective:
    """A resolved objective.

    Attributes:
        metric: the metric path optimised.
        direction: -1 lower is better, +1 higher is better.
        constraints: an arm must meet every one to be eligible for best.
        slo_ttft_s, slo_itl_s: the SLO of ``slo_goodput`` (seconds).
        origin: where it came from, in words (``"default for swe-rl"``, ``"declared"``).
        report: metrics shown beside the objective (the completion time of a serving run).
    """

    metric: str
    direction: int
    constraints: tuple[Constraint, ...] = ()
    slo_ttft_s: float = DEFAULT_SLO_TTFT_S
    slo_itl_s: float = DEFAULT_SLO_ITL_S
    origin: str = "declared"
    report: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The metric's name in words."""
        return metric_label(self.metric)

    @property
    def kind(self) -> ObjectiveKind | None:
        """:func:`objective_kind` of the metric: the kind whose options a policy runs with
        (:attr:`~sessionroute.router.policies.Policy.objective_options`)."""
        return objective_kind(self.metric)

    def describe(self) -> str:
        """One line: ``"minimise mean RL step time subject to timed-out share <= 0.01"``."""
        verb = "minimise" if self.direction < 0 else "maximise"
        text = f"{verb} {self.label}"
        if self.metric == "slo_goodput":
            text += f" (TTFT <= {self.slo_ttft_s:g} s and ITL <= {self.slo_itl_s:g} s)"
        if self.constraints:
            text += " subject to " + ", ".join(str(c) for c in self.constraints)
        return text + f" [{self.origin}]"

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``results.json`` ``"objective"``)."""
        return {
            "metric": self.metric,
            "direction": "min" if self.direction < 0 else "max",
            "constraints": [
                {"metric": c.metric, "op": c.op, "bound": c.bound} for c in self.constraints
            ],
            "slo": {"ttft_s": self.slo_ttft_s, "itl_s": self.slo_itl_s},
            "origin": self.origin,
            "description": self.describe(),
        }


def _check_path(path: str, where: str) -> str:
    if not _PATH.match(path):
        raise ConfigError(
            f"{where}: {path!r} is not a metric path (e.g. step_time_s.mean, ttft_s.p99, "
            f"slo_goodput; summaries take .{', .'.join(_SUMMARY_STATS)})"
        )
    return path


def parse_constraint(text: str, where: str = "objective") -> Constraint:
    """``"ttft_s.p99 <= 60"`` -> :class:`Constraint`.

    Raises:
        ConfigError: naming ``where`` for anything but ``<metric> <= <number>`` / ``>=``.
    """
    m = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*", text)
    if not m:
        raise ConfigError(
            f"{where}: constraint {text!r} is not '<metric> <= <number>' or '<metric> >= "
            "<number>' (e.g. 'rollouts_timed_out_share <= 0.01')"
        )
    try:
        bound = float(m.group(3))
    except ValueError:
        raise ConfigError(f"{where}: constraint {text!r}: {m.group(3)!r} is no number") from None
    op: Literal["<=", ">="] = "<=" if m.group(2) == "<=" else ">="
    return Constraint(_check_path(m.group(1), where), op, bound)


def default_objective(
    kind: str, *, rollout_timeout_s: float = 3600.0, preset: str | None = None
) -> Objective:
    """The default objective of a workload kind (or of ``preset``: ``rl`` / ``serving``).

    Args:
        kind: workload kind (``swe-rl`` is RL; trace replays and ``toy`` are serving).
        rollout_timeout_s: the RL workload's rollout timeout, the bound of group latency p90.
        preset: overrides the kind.
    """
    rl = preset == "rl" if preset else kind == "swe-rl"
    if rl:
        return Objective(
            "step_time_s.mean",
            -1,
            (
                Constraint("rollouts_timed_out_share", "<=", RL_TIMED_OUT_MAX),
                Constraint("group_latency_s.p90", "<=", rollout_timeout_s),
            ),
            origin=f"default for {'RL' if preset else kind}",
            report=("output_tokens_per_s", "ttft_s.p99"),
        )
    return Objective(
        "slo_goodput",
        +1,
        origin=f"default for {'serving' if preset else kind}",
        report=("simulated_seconds", "ttft_s.p99"),
    )


def resolve_objective(
    section: ObjectiveSection | None,
    kind: str,
    *,
    rollout_timeout_s: float = 3600.0,
    where: str = "[objective]",
) -> Objective:
    """The objective of an experiment: ``section`` over the workload kind's default.

    Raises:
        ConfigError: naming ``where`` for a bad metric path or constraint, or a metric outside
            :data:`METRICS` without ``direction``.
    """
    sec = section or ObjectiveSection()
    from sessionroute.workloads.registry import canonical_kind

    base = default_objective(
        canonical_kind(kind), rollout_timeout_s=rollout_timeout_s, preset=sec.preset
    )
    declared = sec.metric is not None or sec.constraints is not None or sec.direction is not None
    metric, direction = base.metric, base.direction
    if sec.metric is not None:
        metric = _check_path(sec.metric, f"{where} metric")
        if sec.direction is None and metric not in METRICS:
            raise ConfigError(
                f'{where} metric {metric!r}: give direction = "min" or "max" (known '
                f"directions: {', '.join(sorted(METRICS))})"
            )
        direction = METRICS[metric][1] if metric in METRICS else direction
    if sec.direction is not None:
        direction = -1 if sec.direction == "min" else +1
    constraints = base.constraints
    if sec.constraints is not None:
        constraints = tuple(
            parse_constraint(c, f"{where} constraints[{i}]") for i, c in enumerate(sec.constraints)
        )
    slo_changed = (sec.slo_ttft_s, sec.slo_itl_s) != (DEFAULT_SLO_TTFT_S, DEFAULT_SLO_ITL_S)
    return Objective(
        metric,
        direction,
        constraints,
        sec.slo_ttft_s,
        sec.slo_itl_s,
        origin="declared" if declared or slo_changed else base.origin,
        report=base.report,
    )


def objective_from_text(text: str, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``--objective`` text -> an ``[objective]`` dict (over ``base``, the file's section).

    ``rl`` or ``serving`` selects a preset; otherwise clauses separated by ``;``: an optional
    first ``min METRIC`` / ``max METRIC``, then constraints ``METRIC <= N`` / ``>= N``
    (``--objective "min step_time_s.mean; ttft_s.p99 <= 60"``). Constraints given replace the
    file's; none given keeps them.

    Raises:
        ConfigError: naming ``--objective`` for a clause it cannot read.
    """
    out: dict[str, Any] = dict(base or {})
    text = text.strip()
    if text in ("rl", "serving"):
        return {k: v for k, v in out.items() if k.startswith("slo_")} | {"preset": text}
    constraints: list[str] = []
    for i, clause in enumerate(c.strip() for c in text.split(";")):
        if not clause:
            continue
        words = clause.split()
        if i == 0 and words[0] in ("min", "max") and len(words) == 2:
            out["metric"] = _check_path(words[1], "--objective")
            out["direction"] = words[0]
            continue
        try:
            parse_constraint(clause, "--objective")
        except ConfigError as err:
            raise ConfigError(
                f"{err}; --objective takes 'rl', 'serving', or 'min|max METRIC' and/or "
                "constraints 'METRIC <= N' separated by ';'"
            ) from None
        constraints.append(clause)
    if constraints:
        out["constraints"] = constraints
    if not constraints and "metric" not in out:
        raise ConfigError(
            f"--objective {text!r}: expected 'rl', 'serving', or 'min|max METRIC' and/or "
            "constraints 'METRIC <= N' separated by ';'"
        )
    return out
