"""Settings of an emulated replica (``sessionroute emulate`` flags, ``start_emulators``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sessionroute.emulate.kvevents import KvEventsConfig
from sessionroute.errors import ConfigError
from sessionroute.replica import PROFILES, ReplicaConfig, StepTimeProfile

__all__ = ["DEFAULT_PROFILE", "EmulatorSettings"]

DEFAULT_PROFILE = "toy-8b-h100-tp1"


@dataclass(frozen=True, slots=True)
class EmulatorSettings:
    """One emulated vLLM replica (several share the settings and differ in port).

    Attributes:
        profile: a built-in profile name (``sessionroute.replica.PROFILES``) or a
            :class:`StepTimeProfile`.
        model: served model name (vLLM ``--served-model-name``); None: the profile's name.
        time_scale: simulated seconds per wall second, > 0 (10: ten times faster than the
            modelled GPU; 1: real speed).
        host: listen address.
        port: first port; replica ``i`` listens on ``port + i`` (0: a free port each).
        block_size: tokens per KV block (vLLM ``--block-size``).
        kv_capacity_tokens: KV capacity in tokens; None: the profile's.
        max_num_batched_tokens: vLLM ``--max-num-batched-tokens``; None: the profile's.
        max_num_seqs: vLLM ``--max-num-seqs``; None: the profile's.
        max_model_len: vLLM ``--max-model-len``; None: the profile's. The served limit is also
            capped at the KV capacity (vLLM refuses to start otherwise).
        slowdown: factor on every step time (a slow replica), > 0.
        default_max_tokens: tokens generated when a request gives no ``max_tokens`` (capped at
            the room left under ``max_model_len``), >= 1.
        stream_interval_s: wall seconds between token progress reads while streaming, > 0.
        shutdown_timeout_s: wall seconds in-flight requests get on shutdown, >= 0.
        kv_events: vLLM's ``--kv-events-config`` (:mod:`sessionroute.emulate.kvevents`); None
            or not publishing: no events, and block keys are the model's cheap chained keys.
        prefix_caching_hash_algo: vLLM's ``--prefix-caching-hash-algo`` of the published
            block hashes (``NONE_HASH`` seeded by ``PYTHONHASHSEED`` when set, as vLLM's).
        fault_routes: also serve ``POST /fault/slowdown`` (fault injection for benches and
            tests: slow the running replica down without a restart); off by default.

    Raises:
        ConfigError: on an unknown profile name or an out-of-range value (message names it).
    """

    profile: str | StepTimeProfile = DEFAULT_PROFILE
    model: str | None = None
    time_scale: float = 1.0
    host: str = "127.0.0.1"
    port: int = 8100
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    slowdown: float = 1.0
    default_max_tokens: int = 16
    stream_interval_s: float = 0.005
    shutdown_timeout_s: float = 1.0
    kv_events: KvEventsConfig | None = None
    prefix_caching_hash_algo: str = "sha256"
    fault_routes: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.profile, str) and self.profile not in PROFILES:
            raise ConfigError(
                f"unknown profile {self.profile!r}; built in: {', '.join(sorted(PROFILES))}"
            )
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ConfigError(f"time_scale must be a positive number, got {self.time_scale!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port!r}")
        if self.default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens must be >= 1, got {self.default_max_tokens!r}")
        if not self.stream_interval_s > 0:
            raise ConfigError(f"stream_interval_s must be > 0, got {self.stream_interval_s!r}")
        if not self.shutdown_timeout_s >= 0:
            raise ConfigError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s!r}")
        if self.model is not None and not self.model:
            raise ConfigError("model name must not be empty")
        self.replica_config()  # validates the engine arguments
        from sessionroute.router.kv.hashing import hash_function

        hash_function(self.prefix_caching_hash_algo)  # validates the name

    @property
    def publishes_kv_events(self) -> bool:
        """Whether the replicas publish KV cache events."""
        return self.kv_events is not None and self.kv_events.publishing

    @property
    def step_profile(self) -> StepTimeProfile:
        """The resolved step-time profile."""
        p = self.profile
        return PROFILES[p] if isinstance(p, str) else p

    @property
    def served_model(self) -> str:
        """The model name clients must use (or omit)."""
        return self.model if self.model is not None else self.step_profile.name

    def replica_config(self) -> ReplicaConfig:
        """The engine configuration.

        Raises:
            ConfigError: on an invalid engine argument.
        """
        return ReplicaConfig(
            profile=self.step_profile,
            block_size=self.block_size,
            kv_capacity_tokens=self.kv_capacity_tokens,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            slowdown=self.slowdown,
        )
