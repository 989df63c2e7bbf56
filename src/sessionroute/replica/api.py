"""Value types of the replica model: configuration, requests, results, counters.

:class:`RequestResult` (one per finished request) has ``Final`` fields and a plain
``__init__``; ``dataclass(init=False)`` adds comparison, hashing and ``repr``. (A frozen
dataclass would set each field through ``object.__setattr__`` on the hot path.)
:class:`EngineRequest` is a ``NamedTuple`` (the simulator passes its fields to
``Replica.arrive`` instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from sessionroute.errors import ConfigError, SessionRouteError
from sessionroute.replica.profiles import StepTimeProfile

__all__ = [
    "EngineRequest",
    "EngineRequestError",
    "ReplicaConfig",
    "ReplicaCounters",
    "RequestResult",
    "chain_block_keys",
    "key_list",
]

_ROOT_KEY: Final = 0x5E55_10A0_7E00_0001


class EngineRequestError(SessionRouteError, ValueError):
    """A request handed to :meth:`Replica.add_request` is invalid; the message has the value."""


def key_list(keys: Sequence[int]) -> list[int]:
    """``keys`` as the list the replica model keeps (see :class:`EngineRequest`'s
    ``block_keys``): a list itself, any other sequence copied once (the model indexes the keys
    as a ``list[int]``)."""
    return keys if isinstance(keys, list) else list(keys)


def chain_block_keys(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained keys of the full blocks of a token-id sequence.

    Key ``i`` hashes key ``i - 1`` with the token ids of block ``i`` (vLLM's block hash chain,
    ``v1/core/kv_cache_utils.py``), so equal keys at ``i`` mean equal content up to the end of
    block ``i``. Python's tuple hash of ints is deterministic across runs (no hash seed).

    Args:
        tokens: token ids.
        block_size: tokens per block, >= 1.

    Returns:
        ``len(tokens) // block_size`` keys (the partial last block has none).

    Raises:
        ConfigError: if ``block_size < 1``.
    """
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    keys: list[int] = []
    parent = _ROOT_KEY
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, *tokens[start : start + block_size]))
        keys.append(parent)
    return keys


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """One replica: a step-time profile plus vLLM engine arguments that override it.

    Attributes:
        profile: step-time constants and default limits.
        block_size: tokens per KV block (vLLM ``--block-size``, default 16). Coarser blocks
            (256, 512) speed the model up; capacity stays counted in tokens.
        kv_capacity_tokens: KV capacity in tokens; ``None`` takes the profile's. The replica
            has ``kv_capacity_tokens // block_size`` blocks.
        max_num_batched_tokens: token budget per step; ``None`` takes the profile's.
        max_num_seqs: running requests at most; ``None`` takes the profile's.
        max_model_len: prompt + output tokens at most; ``None`` takes the profile's.
        slowdown: factor on every step time (a slow-replica fault), > 0.
    """

    profile: StepTimeProfile
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    slowdown: float = 1.0

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")
        for name in ("kv_capacity_tokens", "max_num_batched_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not self.slowdown > 0:
            raise ConfigError(f"slowdown must be > 0, got {self.slowdown}")
        if self.capacity_tokens < self.block_size:
            raise ConfigError(
                f"kv_capacity_tokens {self.capacity_tokens} is below one block ({self.block_size})"
            )

    @property
    def capacity_tokens(self) -> int:
        """Effective KV capacity, tokens."""
        return (
            self.kv_capacity_tokens
            if self.kv_capacity_tokens is not None
            else self.profile.kv_capacity_tokens
        )

    @property
    def num_blocks(self) -> int:
        """KV blocks of the replica (vLLM ``num_gpu_blocks``)."""
        return self.capacity_tokens // self.block_size

    @property
    def batched_tokens(self) -> int:
        """Effective ``max_num_batched_tokens``."""
        v = self.max_num_batched_tokens
        return v if v is not None else self.profile.max_num_batched_tokens

    @property
    def seqs(self) -> int:
        """Effective ``max_num_seqs``."""
        return self.max_num_seqs if self.max_num_seqs is not None else self.profile.max_num_seqs

    @property
    def model_len(self) -> int:
        """Effective ``max_model_len``."""
        return self.max_model_len if self.max_model_len is not None else self.profile.max_model_len


class EngineRequest(NamedTuple):
    """A request as the replica sees it (content reduced to chained block keys).

    Attributes:
        request_id: unique per replica while the request is live.
        prompt_len: prompt tokens, >= 1.
        output_len: tokens to generate (forced, like ``ignore_eos``), >= 1.
        block_keys: chained keys of the full blocks of prompt + output at the replica's
            block size (key ``i`` identifies blocks ``0..i``, like Mooncake ``hash_ids``). At
            least ``prompt_len // block_size`` keys; keys for output blocks (up to
            ``(prompt_len + output_len) // block_size``) let those blocks be cached as they
            fill; blocks without a key are not cacheable. The replica keeps a list as it is
            (other sequences are copied) while it caches the request's blocks, after the
            request finished too: its keys must not change, and it must not grow while the
            request is live; it may be extended at its end afterwards (a session's next turn
            growing the same list is fine: the request only reads its own keys).
        cache_salt: cache namespace; requests with different salts never share blocks.
    """

    request_id: str
    prompt_len: int
    output_len: int
    block_keys: Sequence[int]
    cache_salt: str | None = None


@dataclass(init=False, slots=True, unsafe_hash=True)
class RequestResult:
    """What happened to one finished request; times in seconds on the engine clock.

    Immutable (``Final`` fields, checked by mypy; in the compiled build assignment raises
    ``AttributeError``); compared and hashed by value.

    Attributes:
        request_id: the request.
        arrival_s: ``now`` given to ``add_request``.
        first_scheduled_s: start of the first step that scheduled it.
        first_token_s: end of the step that produced its first token.
        finish_s: end of the step that produced its last token.
        prompt_tokens: prompt length.
        output_tokens: generated tokens.
        cached_tokens: prefix-cache hit tokens at its first admission.
        preemptions: times it was preempted (recompute).
        queue_time_s: ``first_scheduled_s - arrival_s`` (``vllm:request_queue_time_seconds``).
        itl_mean_s: mean gap between consecutive tokens (0 when ``output_tokens == 1``).
        itl_max_s: largest such gap (0 when ``output_tokens == 1``).
    """

    request_id: Final[str]
    arrival_s: Final[float]
    first_scheduled_s: Final[float]
    first_token_s: Final[float]
    finish_s: Final[float]
    prompt_tokens: Final[int]
    output_tokens: Final[int]
    cached_tokens: Final[int]
    preemptions: Final[int]
    queue_time_s: Final[float]
    itl_mean_s: Final[float]
    itl_max_s: Final[float]

    def __init__(
        self,
        request_id: str,
        arrival_s: float,
        first_scheduled_s: float,
        first_token_s: float,
        finish_s: float,
        prompt_tokens: int,
        output_tokens: int,
        cached_tokens: int,
        preemptions: int,
        queue_time_s: float,
        itl_mean_s: float,
        itl_max_s: float,
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.first_scheduled_s = first_scheduled_s
        self.first_token_s = first_token_s
        self.finish_s = finish_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.cached_tokens = cached_tokens
        self.preemptions = preemptions
        self.queue_time_s = queue_time_s
        self.itl_mean_s = itl_mean_s
        self.itl_max_s = itl_max_s

    @property
    def ttft_s(self) -> float:
        """``first_token_s - arrival_s`` (``vllm:time_to_first_token_seconds``)."""
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        """``finish_s - arrival_s`` (``vllm:e2e_request_latency_seconds``)."""
        return self.finish_s - self.arrival_s


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """Cumulative per-replica counters (vLLM metric names; ``_total`` on the wire).

    Attributes:
        prefix_cache_queries: ``vllm:prefix_cache_queries``, tokens looked up, counted once
            per admission (vLLM also counts retries of a blocked queue head).
        prefix_cache_hits: ``vllm:prefix_cache_hits``, tokens found in the cache.
        num_preemptions: ``vllm:num_preemptions``.
        prompt_tokens: ``vllm:prompt_tokens``, prompt tokens of requests that got a first
            token.
        generation_tokens: ``vllm:generation_tokens``, tokens sampled.
        iteration_tokens: ``vllm:iteration_tokens_total`` summed, tokens scheduled over all
            steps (prefill + decode, recomputation included).
        steps: engine steps run.
        busy_time_s: seconds spent in steps up to the time advanced to (a step in flight
            counts up to that time only), so it never exceeds the time elapsed.
        requests_finished: ``vllm:request_success``, requests that produced every token.
        num_gpu_blocks: ``vllm:cache_config_info{num_gpu_blocks}``.
        block_size: ``vllm:cache_config_info{block_size}``.
    """

    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    iteration_tokens: int
    steps: int
    busy_time_s: float
    requests_finished: int
    num_gpu_blocks: int
    block_size: int
