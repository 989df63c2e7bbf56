"""Options of the ``swe-rl`` workload (``shared/WORKLOADS.md`` section 1), every one overridable."""

from __future__ import annotations

import itertools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["SweRlConfig"]


class SweRlConfig(BaseModel):
    """Asynchronous RL with multi-turn SWE-agent rollouts.

    Token counts are in tokens, times in seconds. Sources of the defaults are in
    ``shared/WORKLOADS.md``; the two calibrated ones (``async_level``, ``trainer_step_s``) are
    explained in ``docs/workloads.md``.

    Attributes:
        kind: always ``"swe-rl"``.
        steps: trainer steps to run; the run ends after the last one.
        batch_size: rollouts consumed per trainer step (prime-rl SWE config: 256).
        group_size: rollouts per task (GRPO group), admitted together (16).
        async_level: the orchestrator keeps ``round(batch_size * (1 + async_level))``
            rollouts admitted and not yet consumed by the trainer, admitting whole groups
            (prime-rl's integer ``async_level``; fractions allowed here). Calibrated default
            1.125 (544 rollouts at batch 256), see ``docs/workloads.md``.
        inflight_rollouts: overrides ``batch_size * (1 + async_level)`` as the bound on
            rollouts admitted and not yet consumed (None: use that product).
        max_off_policy_steps: in-flight rollouts started more than this many policy versions
            ago are cancelled (32).
        trainer_step_s: trainer time per step once a batch is ready (assumption: 120 s).
        turns_p50, turns_p90, turns_p99, turns_max: turns per rollout (NeMo RL coding-agent
            replay pool: 29 / 56 / 85 / 100); sampled log-linearly between these quantiles and
            ``turns_min`` at q = 0.
        system_prompt_tokens: prompt shared by every rollout (system + tools, 6.5k).
        task_tokens_p50, task_tokens_p90: task statement shared by a group (~1k).
        output_p50, output_p90, output_cap: output tokens per turn (lognormal 250 / 1000,
            cap 8192).
        observation_p50, observation_p90, observation_cap: tool observation tokens appended
            per turn (lognormal 300 / 2000, cap 8000).
        tool_p50_s, tool_p90_s, tool_cap_s: tool latency per turn (lognormal 2 / 15 s, cap
            180 s, the tool timeout).
        context_limit: a rollout ends when its next prompt would exceed this (131072; also
            capped by the replicas' ``max_model_len``).
        rollout_timeout_s: a rollout still running after this long is cancelled (3600 s).
        reply_reuse: fraction of each output that the next prompt repeats token for token
            (1.0, the default: all of it; 0 for a chat template that drops reasoning from the
            history). The rest is re-sent as as many other tokens, which miss every cache
            (:func:`~sessionroute.workloads.content.reply_in_history`).
        cache: after each trainer step: ``"salt"`` - new rollouts use the new policy version as
            ``cache_salt`` (prime-rl); ``"reset"`` - ``reset_prefix_cache`` on every replica
            (SkyRL / torchtitan); ``"keep"`` - nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["swe-rl"] = "swe-rl"
    steps: int = Field(default=20, ge=1)
    batch_size: int = Field(default=256, ge=1)
    group_size: int = Field(default=16, ge=1)
    async_level: float = Field(default=1.125, ge=0)
    inflight_rollouts: int | None = Field(default=None, ge=1)
    max_off_policy_steps: int = Field(default=32, ge=0)
    trainer_step_s: float = Field(default=120.0, ge=0)
    turns_min: int = Field(default=3, ge=1)
    turns_p50: float = Field(default=29, gt=0)
    turns_p90: float = Field(default=56, gt=0)
    turns_p99: float = Field(default=85, gt=0)
    turns_max: int = Field(default=100, ge=1)
    system_prompt_tokens: int = Field(default=6500, ge=0)
    task_tokens_p50: float = Field(default=1000, gt=0)
    task_tokens_p90: float = Field(default=1400, gt=0)
    output_p50: float = Field(default=250, gt=0)
    output_p90: float = Field(default=1000, gt=0)
    output_cap: int = Field(default=8192, ge=1)
    observation_p50: float = Field(default=300, gt=0)
    observation_p90: float = Field(default=2000, gt=0)
    observation_cap: int = Field(default=8000, ge=1)
    tool_p50_s: float = Field(default=2.0, gt=0)
    tool_p90_s: float = Field(default=15.0, gt=0)
    tool_cap_s: float = Field(default=180.0, gt=0)
    context_limit: int = Field(default=131072, ge=2)
    rollout_timeout_s: float = Field(default=3600.0, gt=0)
    reply_reuse: float = Field(default=1.0, ge=0, le=1)
    cache: Literal["salt", "reset", "keep"] = "salt"

    @model_validator(mode="after")
    def _ordered(self) -> SweRlConfig:
        q = (self.turns_min, self.turns_p50, self.turns_p90, self.turns_p99, self.turns_max)
        if any(b < a for a, b in itertools.pairwise(q)):
            raise ValueError(
                "turn quantiles must be non-decreasing: turns_min <= turns_p50 <= turns_p90 "
                f"<= turns_p99 <= turns_max, got {q}"
            )
        for name in ("task_tokens", "output", "observation"):
            if getattr(self, f"{name}_p90") < getattr(self, f"{name}_p50"):
                raise ValueError(f"{name}_p90 must be >= {name}_p50")
        if self.tool_p90_s < self.tool_p50_s:
            raise ValueError("tool_p90_s must be >= tool_p50_s")
        return self

    def build(self, rng: Any) -> Any:
        """A fresh :class:`~sessionroute.workloads.swe_rl.SweRlWorkload` using ``rng``."""
        from sessionroute.workloads.swe_rl import SweRlWorkload

        return SweRlWorkload(self, rng)
