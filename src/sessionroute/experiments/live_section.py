"""The ``[live]`` section of an experiment file: how ``sessionroute compare --live`` gets its
replicas and routers.

Part of the experiment file's schema (:mod:`sessionroute.experiments.spec` validates it with the
rest), so it lives beside it; :mod:`sessionroute.experiments.live` reads it.

Example (three emulated replicas, the default)::

    [live]
    replicas = "emulate"
    time_scale = 10

Real vLLM on this machine (``docs/live.md``)::

    [live]
    replicas = "command"
    preset = "vllm-cpu"
    model = "/tmp/tiny-model"
    python = "${VLLM_PYTHON}"     # the vLLM venv's interpreter

An arm picks its router with ``overrides = { live = { router = "vllm-router" } }`` (declare
``allow_differences = ["live.router"]``). ``replica_command`` and ``router_command`` are
templates: their ``${VAR}`` are expanded per process (``${PORT}``, ``${INDEX}``, ``${MODEL}``, ...;
see :data:`REPLICA_VARS` and :data:`ROUTER_VARS`), not when the file is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionroute.experiments.envexpand import expand_env

__all__ = [
    "REPLICA_VARS",
    "ROUTER_VARS",
    "TEMPLATE_KEYS",
    "LiveSection",
    "expand_experiment_env",
]

TEMPLATE_KEYS: tuple[str, ...] = ("replica_command", "router_command")
"""Keys of a ``live`` table whose ``${VAR}`` are expanded per process, not at load time."""

REPLICA_VARS: tuple[str, ...] = (
    "PORT",
    "INDEX",
    "HOST",
    "MODEL",
    "SERVED_MODEL",
    "PYTHON",
    "CACHE_DIR",
    "BLOCK_SIZE",
    "MAX_MODEL_LEN",
    "KV_CACHE_BYTES",
    "MAX_NUM_SEQS",
)
"""Variables of ``replica_command`` (besides the environment): the replica's port and index
(0-based), listen host, ``live.model``, ``live.served_model``, ``live.python``, the replica's own
compile-cache directory, and the engine settings of ``[replicas]``/``[live]``."""

ROUTER_VARS: tuple[str, ...] = (
    "PORT",
    "HOST",
    "POLICY",
    "WORKER_URLS",
    "SESSION_TTL_S",
    "METRICS_PORT",
)
"""Variables of ``router_command``: its port, host, the arm's policy, the worker URLs
(space-separated: each becomes its own argument), the session TTL in seconds and a free port
for a separate metrics listener."""


class LiveSection(BaseModel):
    """How a live run gets its replicas and routers (ignored by the simulator).

    Attributes:
        replicas: ``emulate`` (emulated vLLM replicas of ``[replicas]``'s profile), ``urls``
            (already running servers), or ``command`` (one process per replica from
            ``replica_command`` or ``preset``).
        emulate_mode: ``in-process`` (started in the driver's event loop, fresh per arm) or
            ``process`` (one ``sessionroute emulate`` subprocess for the whole run).
        time_scale: emulated seconds per wall second (emulate only). The workload is paced in
            emulated time and latencies are reported in emulated seconds, so results compare
            with the simulator's; real servers always run at 1.
        urls: replica base URLs for ``replicas = "urls"``.
        preset: ``vllm-cpu``: the command, environment and flags of ``shared/REAL_VLLM.md``.
        replica_command: command template of one replica (``${VAR}``: :data:`REPLICA_VARS`
            and the environment); split like a shell line (``shlex``), never run by a shell.
        env: extra environment of replica processes (after the preset's).
        model: ``${MODEL}`` (a model directory for vLLM).
        served_model: model name sent in requests; None: the first replica's ``/v1/models``.
        python: ``${PYTHON}``, the interpreter of replica processes (default: ``python3``).
        host: listen address of started replicas and routers.
        base_port: replica ``i`` listens on ``base_port + i``; 0 picks free ports.
        kv_cache_bytes: ``${KV_CACHE_BYTES}`` (vllm-cpu: ``--kv-cache-memory-bytes``).
        max_num_seqs: ``${MAX_NUM_SEQS}`` (vllm-cpu: ``--max-num-seqs``).
        max_model_len: ``${MAX_MODEL_LEN}``; the driver's context limit is read from
            ``/v1/models`` when the server reports it.
        cache_root: node-local root under which each run makes its own directory of logs and
            per-replica compile caches (``TRITON_CACHE_DIR``, ``VLLM_CACHE_ROOT``); None: the
            system temp dir.
        keep_cache: keep the run's directory (logs, caches) after the run.
        stagger_s: wall seconds between starting one replica process and the next.
        replica_cpus: cores each started replica may use (a cgroup CPU quota, so that its
            pace does not move with the others' load, as on a machine of its own; see
            :mod:`sessionroute.experiments.live.cpuslice`); 0 (default): no cap; ``"auto"``: for
            the ``vllm-cpu`` preset, the host's cores less 0.5 shared among the replicas when
            that is under 1.5 each, else none, and none for other commands.
        start_timeout_s: wall seconds every replica (and router) gets to answer its health check.
        router: ``sessionroute`` (a ``sessionroute serve`` subprocess), ``sessionroute-inprocess``
            (the router in the driver's event loop), ``vllm-router`` (PyPI vllm-router's binary)
            or ``command`` (``router_command``).
        router_command: router command template (``${VAR}``: :data:`ROUTER_VARS`).
        router_health_path: path polled until the router answers 200 (None: ``/readiness`` for
            ours, ``/liveness`` for others).
        stream: stream responses (measures TTFT and inter-token latency; costs CPU per token).
        placements: put a recording pass-through in front of each replica to learn which
            replica served each turn (per-replica session counts, session moves). Adds one
            local hop; turn it off for remote replicas.
        record_turns: keep a record of every answered turn (send time, replica, prompt, block
            keys, cached tokens: ``RunOutput.turns``), for ``compare --fidelity``'s replay of
            the live requests; with ``router = "sessionroute"`` the router names each request's
            worker (``--expose-worker-header``), so the replica is known without
            ``placements``.
        scrape_interval_s: replica ``/metrics`` sampling period for the time series (seconds of
            the run's clock, emulated seconds when emulating).
        request_timeout_s: wall seconds one turn may take before it counts as failed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: Literal["emulate", "urls", "command"] = "emulate"
    emulate_mode: Literal["in-process", "process"] = "in-process"
    time_scale: float = Field(default=5.0, gt=0)
    urls: list[str] = Field(default_factory=list)
    preset: Literal["vllm-cpu"] | None = None
    replica_command: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    model: str | None = None
    served_model: str | None = None
    python: str | None = None
    host: str = "127.0.0.1"
    base_port: int = Field(default=0, ge=0, le=65535)
    kv_cache_bytes: int = Field(default=64 * 2**20, ge=1)
    max_num_seqs: int = Field(default=16, ge=1)
    max_model_len: int = Field(default=2048, ge=2)
    cache_root: str | None = None
    keep_cache: bool = False
    stagger_s: float = Field(default=0.0, ge=0)
    replica_cpus: float | Literal["auto"] = 0.0
    start_timeout_s: float = Field(default=600.0, gt=0)
    router: Literal["sessionroute", "sessionroute-inprocess", "vllm-router", "command"] = (
        "sessionroute"
    )
    router_command: str | None = None
    router_health_path: str | None = None
    stream: bool = False
    placements: bool = True
    record_turns: bool = False
    scrape_interval_s: float = Field(default=2.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)

    @field_validator("replica_cpus")
    @classmethod
    def _cpus_not_negative(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and value < 0:
            raise ValueError(f"must be >= 0 cores, or 'auto' (got {value})")
        return value


def _held(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` without the template keys of its ``live`` table(s), and those keys."""
    out = dict(data)
    held: dict[str, Any] = {}
    live = out.get("live")
    if isinstance(live, Mapping):
        held["live"] = {k: live[k] for k in TEMPLATE_KEYS if k in live}
        out["live"] = {k: v for k, v in live.items() if k not in TEMPLATE_KEYS}
    arms = out.get("arms")
    if isinstance(arms, list):
        new_arms: list[Any] = []
        for i, arm in enumerate(arms):
            over = arm.get("overrides") if isinstance(arm, Mapping) else None
            olive = over.get("live") if isinstance(over, Mapping) else None
            if (
                isinstance(arm, Mapping)
                and isinstance(over, Mapping)
                and isinstance(olive, Mapping)
            ):
                held[f"arms.{i}"] = {k: olive[k] for k in TEMPLATE_KEYS if k in olive}
                stripped = {k: v for k, v in olive.items() if k not in TEMPLATE_KEYS}
                arm = {**arm, "overrides": {**over, "live": stripped}}
            new_arms.append(arm)
        out["arms"] = new_arms
    return out, held


def expand_experiment_env(data: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """:func:`~sessionroute.experiments.envexpand.expand_env` over an experiment document,
    except the command templates of ``live`` tables (:data:`TEMPLATE_KEYS`), which are kept
    verbatim for per-process expansion.

    Raises:
        ConfigError: naming the key and the variable when a variable is unset without default.
    """
    stripped, held = _held(data)
    out: dict[str, Any] = expand_env(stripped, env)
    if held.get("live"):
        out["live"] = {**out["live"], **held["live"]}
    for key, templates in held.items():
        if key.startswith("arms.") and templates:
            i = int(key.split(".", 1)[1])
            arm = out["arms"][i]
            over = arm["overrides"]
            out["arms"][i] = {**arm, "overrides": {**over, "live": {**over["live"], **templates}}}
    return out
