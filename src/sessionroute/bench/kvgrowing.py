"""``kv_aware``'s decision as the live router makes it, hashing included (``bench policies
--prompt-tokens N``).

Model (the swe-rl workload's shape, ``sessionroute.workloads.swe_rl_config``): every prompt
starts with a 6,500-token system prompt shared by all sessions; ``sessions`` conversations are
placed first with an ``N``-token prompt each (untimed; their blocks are stored in the policy's
index as the replica's ``BlockStored`` would announce them). Each timed sample picks a random
conversation, appends one turn's new tokens to its prompt (an output of lognormal p50 250 / p90
1,000 tokens, cap 8,000, plus an observation of lognormal p50 300 / p90 2,000, cap 8,000: the
swe-rl defaults), and times, from the prompt's token ids (packed, as the router's tokenizer
output is packed for the memo) to the decision:

1. its vLLM sha256 block hashes through the router's incremental memo
   (:class:`~sessionroute.router.kv.prefixmemo.PrefixMemo`, 16-token blocks: only the blocks
   past the previous turn's prompt are hashed);
2. the request (no session id: ``kv_aware`` finds the conversation by content);
3. ``route`` + ``complete``.

Untimed after each sample: the chosen worker's ``BlockStored`` of the prompt's blocks. Prompts
grow as turns accumulate (``mean_prompt_tokens``). Tokenizing the text and packing the ids
(``pack_us``: ``array("I", ids)`` of an ``N``-token list) are not in ``p50_us``; they are
reported. ``cold_ms``: the memo's cost for a new conversation's first ``N``-token prompt that
shares only the system prompt; ``vllm_hash_ms``: hashing ``N`` tokens from scratch.
"""

from __future__ import annotations

import gc
import random
import time
from array import array
from typing import Any

import numpy as np

from sessionroute.router.core import RoutingCore
from sessionroute.router.kv.hashing import BlockHasher
from sessionroute.router.kv.index import KvIndex
from sessionroute.router.kv.prefixmemo import PrefixMemo, pack_token_ids
from sessionroute.router.requests import BYTES_PER_TOKEN, estimate_prompt_tokens
from sessionroute.types import RouteRequest

__all__ = ["bench_kv_growing"]

_BLOCK = 16
_SYSTEM_TOKENS = 6500
_VOCAB = 150_000
_Z90 = 1.2815515655446004  # standard normal quantile of 0.9


def _lognormal(rng: random.Random, p50: float, p90: float, cap: int) -> int:
    sigma = float(np.log(p90 / p50)) / _Z90
    return max(1, min(cap, round(rng.lognormvariate(float(np.log(p50)), sigma))))


def _new_tokens(rng: random.Random) -> int:
    """One swe-rl turn's tokens added to the prompt: the reply plus the tool observation."""
    return _lognormal(rng, 250, 1000, 8000) + _lognormal(rng, 300, 2000, 8000)


def _ids(rng: random.Random, n: int) -> array[int]:
    return array("I", [rng.randrange(_VOCAB) for _ in range(n)])


def _median_ms(times_ns: list[int]) -> float:
    return round(float(np.median(np.asarray(times_ns))) / 1e6, 3)


def bench_kv_growing(
    core: RoutingCore, index: KvIndex, sessions: int, turns: int, prompt_tokens: int, seed: int
) -> dict[str, Any]:
    """Measure ``core``'s KV policy on growing conversations (module docstring).

    Returns:
        The ``bench policies`` row (``policy``, ``workers``, ``sessions``, ``prompt_tokens``,
        ``p50_us``, ``p99_us``, ``new_session_us``: the cold first turn, hashing included) plus
        ``cpu_p50_us`` (the same samples in this thread's CPU time: time spent preempted by
        other processes left out, so less sensitive to machine load),
        ``hash_p50_us`` (the memo's share of each sample), ``decide_p50_us`` (the rest: request,
        ``route``, ``complete``), ``new_blocks_p50`` (blocks hashed per sample),
        ``mean_prompt_tokens``,
        ``mean_new_tokens``, ``pack_us``, ``cold_ms`` and ``vllm_hash_ms``.
    """
    rng = random.Random(seed)
    memo = PrefixMemo(_BLOCK)
    workers = core.cluster.workers()
    system = _ids(rng, _SYSTEM_TOKENS)
    prompts: list[array[int]] = []
    for i in range(sessions):
        ids = system + _ids(rng, max(0, prompt_tokens - _SYSTEM_TOKENS))
        prompts.append(ids)
        blocks = memo.hashes(ids.tobytes())
        res = core.route(_request(blocks, len(ids), f"p{i}"))
        index.store(res.worker, blocks)
        core.complete(res)
    sample = [rng.randrange(sessions) for _ in range(turns)]
    grow = [_new_tokens(rng) for _ in range(turns)]
    extra = [_ids(rng, g) for g in grow]
    gc.collect()
    gc.freeze()
    total_ns: list[int] = []
    hash_ns: list[int] = []
    lengths = 0
    new_blocks: list[int] = []
    cpu_ns: list[int] = []
    try:
        for k, i in enumerate(sample):
            ids = prompts[i]
            ids.extend(extra[k])
            data = ids.tobytes()  # the tokenizer's output, packed (untimed, see pack_us)
            lengths += len(ids)
            hashed = memo.hashed
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            blocks = memo.hashes(data)
            t1 = time.perf_counter_ns()
            new_blocks.append(memo.hashed - hashed)
            res = core.route(_request(blocks, len(ids), f"t{k}"))
            core.complete(res)
            t2 = time.perf_counter_ns()
            cpu_ns.append(time.thread_time_ns() - c0)
            total_ns.append(t2 - t0)
            hash_ns.append(t1 - t0)
            index.store(res.worker, blocks)  # the replica's BlockStored
        cold_ns: list[int] = []
        for j in range(20):
            ids = system + _ids(rng, max(0, prompt_tokens - _SYSTEM_TOKENS))
            data = ids.tobytes()
            t0 = time.perf_counter_ns()
            blocks = memo.hashes(data)
            res = core.route(_request(blocks, len(ids), f"n{j}"))
            core.complete(res)
            cold_ns.append(time.perf_counter_ns() - t0)
    finally:
        gc.unfreeze()
    as_list = list(prompts[0][:prompt_tokens])
    pack_ns = []
    for _ in range(20):
        t0 = time.perf_counter_ns()
        pack_token_ids(as_list)
        pack_ns.append(time.perf_counter_ns() - t0)
    hasher = BlockHasher(_BLOCK)
    scratch_ns = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        hasher.hashes(as_list)
        scratch_ns.append(time.perf_counter_ns() - t0)
    p50, p99 = np.percentile(np.asarray(total_ns, dtype=np.float64) / 1000.0, [50, 99])
    return {
        "policy": core.policy.name,
        "workers": len(workers),
        "sessions": sessions,
        "prompt_tokens": prompt_tokens,
        "p50_us": round(float(p50), 2),
        "p99_us": round(float(p99), 2),
        "new_session_us": round(float(np.median(np.asarray(cold_ns))) / 1000.0, 2),
        "cpu_p50_us": round(float(np.median(np.asarray(cpu_ns))) / 1000.0, 2),
        "hash_p50_us": round(float(np.median(np.asarray(hash_ns))) / 1000.0, 2),
        "decide_p50_us": round(
            float(np.median(np.asarray(total_ns) - np.asarray(hash_ns))) / 1000.0, 2
        ),
        "new_blocks_p50": float(np.median(np.asarray(new_blocks))),
        "mean_prompt_tokens": round(lengths / max(1, turns)),
        "mean_new_tokens": round(sum(grow) / max(1, turns)),
        "pack_us": round(float(np.median(np.asarray(pack_ns))) / 1000.0, 2),
        "cold_ms": _median_ms(cold_ns),
        "vllm_hash_ms": _median_ms(scratch_ns),
    }


def _request(blocks: list[int], tokens: int, rid: str) -> RouteRequest:
    """The request the live router builds for a chat body of ``tokens`` tokens with the KV
    tokenizer (no session id)."""
    return RouteRequest(
        session_id=None,
        prompt_tokens=estimate_prompt_tokens(tokens * BYTES_PER_TOKEN),
        blocks=blocks,
        request_id=rid,
    )
