"""One emulated replica without HTTP: tokenizer, engine, real-time driver and metrics, and the
turning of an OpenAI request into an :class:`EngineRequest` plus its generated text."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sessionroute.emulate.driver import RealTimeEngine
from sessionroute.emulate.kvevents import BlockTokens, KvEventPublisher
from sessionroute.emulate.metrics import EmulatorMetrics
from sessionroute.emulate.protocol import EmulatorRequestError
from sessionroute.emulate.settings import EmulatorSettings
from sessionroute.emulate.tokenizer import ChatEncoder, HashTokenizer, filler_pieces
from sessionroute.replica import EngineRequest, Replica, RequestResult, chain_block_keys
from sessionroute.router.kv.prefixmemo import PrefixMemo, pack_token_ids

__all__ = ["EmulatedReplica", "Generation", "output_seed"]

_MAX_ID = 1 << 32


def output_seed(prompt_ids: Sequence[int], nonce: bytes) -> bytes:
    """Seed of a request's generated text: BLAKE2b-256 of the prompt ids (big-endian uint32)
    and ``nonce``.

    The emulator's nonce is ``b"greedy"`` for ``temperature == 0`` (same prompt, same output,
    like greedy decoding), ``b"seed:<seed>"`` when the request has a ``seed``, else
    ``b"n:<replica index>:<request count>"`` (a fresh sample per request).
    """
    h = hashlib.blake2b(digest_size=32)
    h.update(np.asarray(prompt_ids, dtype=">u4").tobytes())
    h.update(b"|")
    h.update(nonce)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Generation:
    """A validated request ready for the engine.

    Attributes:
        request_id: the OpenAI response id (``chatcmpl-...`` / ``cmpl-...``), also the engine id.
        prompt_ids: prompt token ids.
        pieces: generated text, one piece per output token.
        engine_request: what the engine schedules (block keys cover prompt + output).
    """

    request_id: str
    prompt_ids: list[int]
    pieces: list[str]
    engine_request: EngineRequest

    @property
    def text(self) -> str:
        """The whole generated text."""
        return "".join(self.pieces)


class EmulatedReplica:
    """The state of one emulated vLLM server.

    Args:
        settings: engine, model and timing settings.
        index: the replica's index among its siblings (part of the sampling nonce).
    """

    def __init__(self, settings: EmulatorSettings, index: int = 0) -> None:
        self.settings = settings
        self.index = index
        self.model = settings.served_model
        self.tokenizer = HashTokenizer()
        self.chat = ChatEncoder(self.tokenizer)
        self.replica = Replica(settings.replica_config())
        cfg = self.replica.config
        self.block_size = cfg.block_size
        self.max_model_len = min(cfg.model_len, self.replica.num_gpu_blocks * cfg.block_size)
        self.driver = RealTimeEngine(
            self.replica,
            settings.time_scale,
            stream_interval_s=settings.stream_interval_s,
            on_finish=self._finished,
        )
        self.metrics = EmulatorMetrics(self.replica, self.model, poll=self.driver.poll)
        self._count = 0
        self.kv_publisher: KvEventPublisher | None = None
        self._memo: PrefixMemo | None = None
        self._block_tokens: BlockTokens | None = None
        kv = settings.kv_events
        if kv is not None and kv.publishing:
            # block keys are vLLM's block hashes, so the published events match a router's
            self._memo = PrefixMemo(
                self.block_size,
                settings.prefix_caching_hash_algo,
                os.environ.get("PYTHONHASHSEED"),
            )
            self._block_tokens = BlockTokens(2 * self.replica.num_gpu_blocks)
            self.kv_publisher = KvEventPublisher(kv, index, self.block_size, self._block_tokens.get)
            self.replica.set_kv_listener(self.kv_publisher.on_cache_change)

    def _finished(self, res: RequestResult) -> None:
        self.metrics.observe(res)

    def _block_keys(self, tokens: list[int], cache_salt: str | None) -> list[int]:
        """The engine's block keys of ``tokens``: vLLM's block hashes when publishing KV events
        (incrementally: a conversation's next turn hashes only its new blocks), else the
        model's cheap chained keys."""
        memo = self._memo
        if memo is None:
            return chain_block_keys(tokens, self.block_size)
        keys = memo.hashes(pack_token_ids(tokens), cache_salt)
        if self._block_tokens is not None:
            self._block_tokens.add(keys, tokens, self.block_size)
        return keys

    def check_model(self, name: str | None) -> str:
        """The served model name for a request's ``model`` (None: the served one).

        Raises:
            EmulatorRequestError: 404 for another name (vLLM's message).
        """
        if name is not None and name != self.model:
            raise EmulatorRequestError(404, f"The model `{name}` does not exist.", "model")
        return self.model

    def prepare(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int | None,
        kind: str,
        temperature: float | None = None,
        seed: int | None = None,
        cache_salt: str | None = None,
        n: int = 1,
    ) -> Generation:
        """Validate lengths and sampling fields and build the engine request.

        Args:
            prompt_ids: prompt token ids.
            max_tokens: tokens to generate; None: ``default_max_tokens`` capped at the room left.
            kind: ``"chat"`` or ``"completion"`` (response id prefix).
            temperature: 0 makes the output a function of the prompt only.
            seed: fixes the output for a prompt.
            cache_salt: prefix-cache namespace (must be non-empty if given).
            n: choices per request; only 1 is supported.

        Raises:
            EmulatorRequestError: 400 for an empty prompt, an out-of-range token id,
                ``max_tokens < 1``, prompt (+ output) over ``max_model_len``, ``n != 1`` or an
                empty ``cache_salt``.
        """
        p = len(prompt_ids)
        limit = self.max_model_len
        if p == 0:
            raise EmulatorRequestError(400, "The decoder prompt cannot be empty", "prompt")
        if n != 1:
            raise EmulatorRequestError(400, f"n must be 1 in the emulator, got {n}", "n")
        if cache_salt is not None and not cache_salt:
            raise EmulatorRequestError(
                400, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt"
            )
        if max_tokens is not None and max_tokens < 1:
            raise EmulatorRequestError(
                400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens"
            )
        if p >= limit:
            raise EmulatorRequestError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {p} input tokens. Please reduce the length of the input messages.",
                "messages" if kind == "chat" else "prompt",
            )
        if max_tokens is None:
            out = min(self.settings.default_max_tokens, limit - p)
        elif p + max_tokens > limit:
            raise EmulatorRequestError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This "
                f"model's maximum context length is {limit} tokens and your request has {p} "
                f"input tokens ({max_tokens} > {limit} - {p}).",
                "max_tokens",
            )
        else:
            out = max_tokens
        if min(prompt_ids) < 0 or max(prompt_ids) >= _MAX_ID:
            bad = next(t for t in prompt_ids if not 0 <= t < _MAX_ID)
            raise EmulatorRequestError(400, f"Token id {bad} is out of vocabulary", "prompt")
        self._count += 1
        if temperature == 0:
            nonce = b"greedy"
        elif seed is not None:
            nonce = b"seed:%d" % seed
        else:
            nonce = b"n:%d:%d" % (self.index, self._count)
        pieces = filler_pieces(output_seed(prompt_ids, nonce), out)
        tokens = prompt_ids + self.tokenizer.ids(pieces)
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        req = EngineRequest(
            request_id=rid,
            prompt_len=p,
            output_len=out,
            block_keys=self._block_keys(tokens, cache_salt),
            cache_salt=cache_salt,
        )
        return Generation(rid, prompt_ids, pieces, req)
