"""What one simulation runs: :class:`SimSpec` (pydantic, unknown keys refused).

The sections mirror an experiment file's shared settings (``workload``, ``replicas``, ``router``,
``faults``) so an experiment arm maps onto a spec with :meth:`SimSpec.from_settings`; the
``sim`` section holds simulator-only knobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sessionroute.errors import ConfigError
from sessionroute.router.config import RouterConfig

__all__ = [
    "FaultSection",
    "ReplicaSection",
    "RouterSection",
    "SimOptions",
    "SimSpec",
    "WorkloadSection",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadSection(_Strict):
    """Which workload runs.

    Attributes:
        kind: ``swe-rl`` (default), ``toy``, ``trace:weka``, ``trace:mooncake``, or a path to a
            Weka ``.csv`` or Mooncake ``.jsonl`` trace.
        steps: RL steps (``swe-rl``; overrides ``options.steps``); ignored by other kinds.
        options: the workload's own options (``docs/workloads.md``); unknown ones are refused.
    """

    kind: str = "swe-rl"
    steps: int | None = Field(default=None, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)


class ReplicaSection(_Strict):
    """The simulated replicas (``sessionroute.replica``). None means the workload's default.

    Attributes:
        count: replicas at start.
        profile: step-time profile name (``sessionroute.replica.PROFILES``) or one defined in
            ``profiles_file``.
        profiles_file: TOML/JSON with user profiles (``sessionroute.replica.load_profiles``).
        block_size: KV block size in tokens (16 like vLLM; coarser is a speed knob, capacity
            stays in tokens).
        kv_capacity_tokens, max_num_batched_tokens, max_num_seqs, max_model_len: overrides of
            the profile's values.
        urls: worker ids given to the router (default ``http://127.0.0.1:18001`` ...); they
            decide hash placements, as the URL strings do in vllm-router.
    """

    count: int | None = Field(default=None, ge=1, le=1024)
    profile: str | None = None
    profiles_file: str | None = None
    block_size: int | None = Field(default=None, ge=1)
    kv_capacity_tokens: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=2)
    urls: list[str] | None = None


class RouterSection(RouterConfig):
    """The ``[router]`` table: the router's settings (:class:`RouterConfig`, the same that
    ``sessionroute serve`` takes from its flags) plus what the simulated clients do.

    Attributes:
        network_delay_s: one-way client -> router -> replica delay; a response reaches the
            client this long after the replica finished it (seconds).
        send_session_header: False simulates clients that send no session header (every turn
            placed independently).
        finish_sessions: clients release a session (``/finish_session``) when it ends;
            otherwise sessions stay until the TTL.
        client_retry_backoff_s, client_retry_max_backoff_s: when the router answers 502 or 503
            (it gave up, or no worker is available) the client sends the turn again after
            ``min(max, backoff * 2**(n-1))`` seconds, without limit (the OpenAI Python SDK's
            schedule: 0.5 s doubling to 8 s; a rollout's own timeout still applies).
    """

    network_delay_s: float = Field(default=0.0, ge=0)
    send_session_header: bool = True
    finish_sessions: bool = True
    client_retry_backoff_s: float = Field(default=0.5, ge=0)
    client_retry_max_backoff_s: float = Field(default=8.0, ge=0)


class FaultSection(_Strict):
    """A replica fault at a simulated time.

    Attributes:
        at_s: simulated time in seconds.
        replica: replica index (0-based); ignored by ``add`` (the new one gets the next index).
        kind: ``down`` (fails its in-flight requests, loses its cache), ``up`` (back, empty
            cache, or un-drained), ``slow`` (step times x ``factor``), ``drain`` (removed from
            the router; in-flight requests finish), ``add`` (a new replica joins), ``hang``
            (accepts requests and answers none until the router's health checks give it up;
            ``up`` restarts it).
        factor: slowdown factor for ``slow`` (1.0 restores full speed).
    """

    at_s: float = Field(ge=0)
    replica: int = Field(default=0, ge=0)
    kind: Literal["down", "up", "slow", "drain", "add", "hang"]
    factor: float = Field(default=1.0, gt=0)


class SimOptions(_Strict):
    """Simulator-only knobs.

    Attributes:
        sample_interval_s: time-series sampling period (simulated seconds).
        max_simulated_s: hard stop (simulated seconds); None for none.
        fast_engine: use the engine's fast (jumping) implementation.
        routers: routers in front of the replicas, each with its own instance of the policy;
            requests are spread over them (:mod:`sessionroute.sim.routers`).
        router_state: with several routers, ``"shared"`` (one session table and every
            router's in-flight counts, as ``serve --state-url``) or ``"local"`` (each router
            its own, as separate ``serve`` processes without it).
    """

    sample_interval_s: float = Field(default=10.0, gt=0)
    max_simulated_s: float | None = Field(default=None, gt=0)
    fast_engine: bool = True
    routers: int = Field(default=1, ge=1, le=64)
    router_state: Literal["local", "shared"] = "shared"


class SimSpec(_Strict):
    """One simulation: workload, replicas, router, faults, simulator options."""

    workload: WorkloadSection = Field(default_factory=WorkloadSection)
    replicas: ReplicaSection = Field(default_factory=ReplicaSection)
    router: RouterSection = Field(default_factory=RouterSection)
    faults: list[FaultSection] = Field(default_factory=list)
    sim: SimOptions = Field(default_factory=SimOptions)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> SimSpec:
        """Build from an experiment arm's merged settings (``run`` and ``live`` are ignored).

        Raises:
            ConfigError: naming every invalid or unknown key.
        """
        data = {k: v for k, v in settings.items() if k not in ("run", "live")}
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
            )
            raise ConfigError(f"invalid simulation settings: {problems}") from None
