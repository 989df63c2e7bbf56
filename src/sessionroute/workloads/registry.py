"""Workload kinds -> validated configs, and each kind's default replicas.

The one place where workload names meet classes (``docs/workloads.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from sessionroute.errors import ConfigError
from sessionroute.workloads.base import WorkloadConfig

__all__ = ["WORKLOAD_KINDS", "canonical_kind", "default_replicas", "workload_config"]

WORKLOAD_KINDS: tuple[str, ...] = ("swe-rl", "toy", "trace:weka", "trace:mooncake")
"""Built-in workload kinds. A trace file is accepted too: ``trace:PATH`` or a plain ``PATH``
ending in ``.jsonl`` (or ``.jsonl.gz``) replays a Mooncake trace; ``trace:PATH`` with any other
name, or a plain path ending in ``.csv`` (or ``.csv.gz``), replays a Weka-format CSV."""

_DEFAULT_REPLICAS: dict[str, dict[str, Any]] = {
    # 256-token simulated blocks: ~12x faster than 16 on swe-rl, fleet hit rate within 0.005
    # (docs/workloads.md); capacity stays in tokens.
    "swe-rl": {"count": 3, "profile": "glm45air-h200-tp8", "block_size": 256},
    "toy": {"count": 3, "profile": "toy-8b-h100-tp1", "kv_capacity_tokens": 65536},
    # Claude Code calls reach 895k tokens (30 % exceed 131k): a 1M-token context keeps every
    # session in the replay (KV capacity stays the profile's).
    "trace:weka": {
        "count": 3,
        "profile": "glm45air-h200-tp8",
        "block_size": 256,
        "max_model_len": 1_048_576,
    },
    # the trace's own granularity: 512-token hash blocks
    "trace:mooncake": {"count": 3, "profile": "glm45air-h200-tp8", "block_size": 512},
}


def _canonical(kind: str) -> tuple[str, dict[str, Any]]:
    if kind in WORKLOAD_KINDS:
        return kind, {}
    path = kind.removeprefix("trace:")
    if path.endswith((".jsonl", ".jsonl.gz")):
        return "trace:mooncake", {"path": path}
    if path.endswith((".csv", ".csv.gz")) or (kind.startswith("trace:") and path):
        return "trace:weka", {"path": path}
    raise ConfigError(
        f"unknown workload kind {kind!r}: expected one of {', '.join(WORKLOAD_KINDS)} "
        "or a trace file: trace:PATH, or a PATH ending in .csv (Weka) or .jsonl (Mooncake), "
        "optionally gzipped (.gz)"
    )


def canonical_kind(kind: str) -> str:
    """The built-in kind a workload kind or trace path replays (``trace:weka`` for
    ``/data/x.csv``).

    Raises:
        ConfigError: for an unknown kind.
    """
    return _canonical(kind)[0]


def default_replicas(kind: str) -> dict[str, Any]:
    """Default replica settings of a workload kind (``count``, ``profile``, ...).

    Raises:
        ConfigError: for an unknown kind.
    """
    return dict(_DEFAULT_REPLICAS[_canonical(kind)[0]])


def workload_config(
    kind: str, steps: int | None = None, options: Mapping[str, Any] | None = None
) -> WorkloadConfig:
    """Validate a workload's options into its config.

    Args:
        kind: a kind of :data:`WORKLOAD_KINDS` or a trace path.
        steps: RL steps (``swe-rl`` only; overrides ``options["steps"]``).
        options: the workload's options.

    Raises:
        ConfigError: for an unknown kind, or naming each unknown or invalid option.
    """
    name, implied = _canonical(kind)
    data: dict[str, Any] = {**implied, **dict(options or {})}
    data.pop("kind", None)
    cls: Any
    if name == "swe-rl":
        from sessionroute.workloads.swe_rl_config import SweRlConfig

        cls = SweRlConfig
        if steps is not None:
            data["steps"] = steps
    elif name == "toy":
        from sessionroute.workloads.toy import ToyConfig

        cls = ToyConfig
    elif name == "trace:weka":
        from sessionroute.workloads.weka_replay import WekaReplayConfig

        cls = WekaReplayConfig
    else:
        from sessionroute.workloads.mooncake_replay import MooncakeReplayConfig

        cls = MooncakeReplayConfig
    try:
        config: WorkloadConfig = cls.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            (
                f"unknown option {'.'.join(str(p) for p in e['loc'])!r}"
                if e["type"] == "extra_forbidden"
                else f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            )
            for e in err.errors()
        )
        raise ConfigError(f"workload {name!r}: {problems}") from None
    return config
