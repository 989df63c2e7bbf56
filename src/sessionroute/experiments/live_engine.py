"""The engine settings of a ``[live]`` file's real servers, for simulating that file.

``sessionroute compare FILE`` on a file whose ``[live]`` section names real servers
(``replicas = "urls"`` or ``"command"``) simulates replicas with the servers' KV capacity, batch
limits, context limit and block size, never the workload's defaults (an 8B-on-H100 profile's
447k-token cache for the tiny CPU model's 32k would show no eviction where the servers evict).
Where they come from, first match wins:

1. ``[replicas]``: ``kv_capacity_tokens`` and ``max_num_seqs`` set explicitly (the file's word);
2. a profile file (``[replicas] profile = "path.toml"``, e.g. written by
   ``sessionroute calibrate``): the server's values recorded in it;
3. ``replicas = "urls"``: the running servers, read as ``sessionroute calibrate`` reads them
   (``/metrics`` ``vllm:cache_config_info``, ``/v1/models``, ``/server_info``, else
   ``[live] max_num_seqs``);
4. ``replicas = "command"`` with ``preset = "vllm-cpu"``: derived from the model directory's
   ``config.json`` and ``[live] kv_cache_bytes`` as vLLM sizes its cache (blocks of
   ``block_size`` tokens, ``2 * layers * kv_heads * head_dim * dtype bytes`` per token), with
   ``[live]``'s ``max_num_seqs`` and ``max_model_len``, the flags the preset starts them with,
   and vllm-cpu's default ``max_num_batched_tokens`` (:data:`VLLM_CPU_BATCHED_TOKENS`).

Otherwise :func:`live_engine_settings` refuses with what to add. Emulated replicas (the
default ``[live]``) run the simulator's own replica settings: nothing to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.experiments.live_section import LiveSection
from sessionroute.replica.profiles import is_profile_path, load_profile_file

__all__ = [
    "VLLM_CPU_BATCHED_TOKENS",
    "EngineSettings",
    "apply_engine_settings",
    "engine_from_servers",
    "live_engine_settings",
    "profile_note",
    "vllm_kv_tokens",
]

VLLM_CPU_BATCHED_TOKENS = 2048
"""``max_num_batched_tokens`` of the vllm-cpu preset's servers (vllm-cpu 0.32.0's default, read
from their ``/server_info`` with ``--max-model-len 2048``; the preset does not set it)."""

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1}


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What the simulated replicas must match of the live servers.

    Attributes:
        kv_capacity_tokens: KV cache per server, tokens (None: keep the file's).
        max_num_seqs: running requests per server at most (None: keep the file's).
        max_model_len: prompt + output tokens at most (None: keep the file's).
        block_size: KV block size, tokens (None: keep the file's).
        max_num_batched_tokens: tokens per engine step at most (None: keep the file's).
        source: one line saying where the values come from (printed by ``compare``).
    """

    kv_capacity_tokens: int | None
    max_num_seqs: int | None
    max_model_len: int | None
    block_size: int | None
    max_num_batched_tokens: int | None
    source: str

    def replicas_overrides(self) -> dict[str, int]:
        """The ``[replicas]`` keys to set (those that are not None)."""
        values = {
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }
        return {k: v for k, v in values.items() if v is not None}


def vllm_kv_tokens(model_dir: str | Path, kv_cache_bytes: int, block_size: int) -> int:
    """KV cache tokens vLLM makes of ``--kv-cache-memory-bytes kv_cache_bytes`` for a model.

    ``floor(bytes / (block_size * per_token)) * block_size`` with ``per_token = 2 (K and V) *
    num_hidden_layers * num_key_value_heads * head_dim * dtype bytes`` from ``config.json``
    (``head_dim`` defaults to ``hidden_size / num_attention_heads``, the dtype to
    ``torch_dtype``). The tiny model (2 layers, 2 heads of 64, float32) holds 32,768 tokens in
    64 MiB.

    Raises:
        ConfigError: no readable ``config.json``, or it lacks a field named above.
    """
    path = Path(model_dir) / "config.json"
    try:
        cfg: Any = json.loads(path.read_text(encoding="utf-8"))
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot size the servers' KV cache from {str(path)!r}: {exc!r}; give [replicas] "
            "kv_capacity_tokens, or a calibrated profile ([replicas] profile = 'profile.toml' "
            "from sessionroute calibrate)"
        ) from exc
    per_token = 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 4)
    return kv_cache_bytes // (block_size * per_token) * block_size


def live_engine_settings(settings: dict[str, Any]) -> EngineSettings | None:
    """The engine settings to simulate an arm of a ``[live]`` file with (module docstring).

    Args:
        settings: one resolved arm's settings (``ResolvedArm.settings``).

    Returns:
        None for emulated replicas (the simulator's own settings run there).

    Raises:
        ConfigError: servers whose KV size cannot be known without starting them (a command
            other than the vllm-cpu preset), with what to add to the file.
        CalibrationError: ``replicas = "urls"`` and a server cannot be read.
    """
    live = LiveSection.model_validate(settings.get("live") or {})
    if live.replicas == "emulate":
        return None
    replicas = settings.get("replicas") or {}
    if replicas.get("kv_capacity_tokens") and replicas.get("max_num_seqs"):
        return EngineSettings(None, None, None, None, None, "from [replicas]")
    profile = replicas.get("profile")
    if isinstance(profile, str) and is_profile_path(profile):
        pf = load_profile_file(profile)
        what = "calibrated profile" if pf.calibration else "profile file"
        return EngineSettings(None, None, None, None, None, f"from the {what} {profile}")
    if live.replicas == "urls":
        return _from_servers(live)
    if live.preset == "vllm-cpu" and live.model:
        block = int(replicas.get("block_size") or 32)
        tokens = vllm_kv_tokens(live.model, live.kv_cache_bytes, block)
        return EngineSettings(
            kv_capacity_tokens=tokens,
            max_num_seqs=live.max_num_seqs,
            max_model_len=live.max_model_len,
            block_size=block,
            max_num_batched_tokens=VLLM_CPU_BATCHED_TOKENS,
            source=(
                f"derived from {live.model}/config.json and [live] kv_cache_bytes = "
                f"{live.kv_cache_bytes} ({tokens} tokens per server), max_num_seqs = "
                f"{live.max_num_seqs}, max_model_len = {live.max_model_len}, "
                f"max_num_batched_tokens = {VLLM_CPU_BATCHED_TOKENS} (vllm-cpu's default)"
            ),
        )
    raise ConfigError(
        '[live] replicas = "command" without the vllm-cpu preset: the simulator cannot know the '
        "servers' KV size and batch limits; give [replicas] kv_capacity_tokens and max_num_seqs, "
        "or a calibrated profile ([replicas] profile = 'profile.toml' from sessionroute "
        "calibrate --url ...)"
    )


def _from_servers(live: LiveSection) -> EngineSettings:
    import asyncio

    import aiohttp

    from sessionroute.calibrate import inspect_servers

    async def read() -> Any:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            return await inspect_servers(session, live.urls, max_num_seqs=live.max_num_seqs,
                                         max_num_batched_tokens=None)  # fmt: skip

    servers = asyncio.run(read())
    return engine_from_servers(servers)


def engine_from_servers(servers: Any) -> EngineSettings:
    """:class:`EngineSettings` of servers read by :func:`sessionroute.calibrate.inspect_servers`
    (the smallest KV cache among them)."""
    smallest = min(servers, key=lambda s: s.kv_capacity_tokens)
    return EngineSettings(
        kv_capacity_tokens=smallest.kv_capacity_tokens,
        max_num_seqs=smallest.max_num_seqs,
        max_model_len=smallest.max_model_len,
        block_size=smallest.block_size,
        max_num_batched_tokens=smallest.max_num_batched_tokens,
        source=(
            f"read from the servers ({smallest.kv_capacity_tokens} KV tokens, max_num_seqs "
            f"{smallest.max_num_seqs}, max_model_len {smallest.max_model_len}, block size "
            f"{smallest.block_size}; batch limits from {smallest.limits_from})"
        ),
    )


def apply_engine_settings(data: dict[str, Any], engine: EngineSettings) -> None:
    """Set ``engine``'s values in an experiment document's ``[replicas]`` (in place)."""
    data.setdefault("replicas", {}).update(engine.replicas_overrides())


def profile_note(settings: dict[str, Any]) -> str:
    """One line for ``compare``'s output: whether the arm's step-time profile was fitted to a
    server (a profile file with a ``[calibration]`` table, ``sessionroute calibrate``) and, if
    not, that throughput and latency differences under its measured error are not evidence.

    Raises:
        ConfigError: a profile file that cannot be read.
    """
    from sessionroute.sim import SimSpec, replica_config

    replicas = settings.get("replicas") or {}
    profile = replicas.get("profile")
    if isinstance(profile, str) and is_profile_path(profile):
        pf = load_profile_file(profile)
        if pf.calibration:
            c = pf.calibration
            servers = c.get("servers") or [{}]
            model = servers[0].get("model") if isinstance(servers[0], dict) else None
            fitted = ", ".join(f"{x}" for x in (model, c.get("date")) if x is not None)
            return (
                f"profile {pf.profile.name}: calibrated ({profile}{'; ' + fitted if fitted else ''}"
                "); its measured error: docs/simulator.md, 'How far to trust it'"
            )
    _, rcfg = replica_config(SimSpec.from_settings(settings))
    return (
        f"profile {rcfg.profile.name}: NOT calibrated (datasheet figures, not fitted to your "
        "servers): differences in throughput and latency smaller than its measured error "
        "(uncalibrated: output tok/s 5-13 %, turn latency 61-94 %, ITL up to +180 % on real "
        "vLLM) are not evidence; fit one with sessionroute calibrate"
    )
