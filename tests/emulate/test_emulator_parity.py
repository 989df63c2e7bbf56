"""The emulator's counters equal the bare replica model's for the same request sequence.

Multi-turn chats are sent one request at a time to an emulator whose KV cache is small enough to
evict; the same requests, rebuilt independently from the text (chat template, tokenizer, the
returned replies tokenized back), are replayed through a bare :class:`Replica` in virtual time.
With one request in flight at a time, timing cannot change hits, so every counter must match.
"""

from __future__ import annotations

import random
from typing import Any

import httpx
from test_emulator_support import metrics, running, words

from sessionroute.emulate import HashTokenizer, render_chat
from sessionroute.replica import PROFILES, EngineRequest, Replica, ReplicaConfig, chain_block_keys

BS = 16
KV = 1024  # 64 blocks: three conversations of ~400-700 tokens do not fit together


def _replay(requests: list[EngineRequest]) -> tuple[Replica, list[int]]:
    rep = Replica(ReplicaConfig(PROFILES["toy-8b-h100-tp1"], block_size=BS, kv_capacity_tokens=KV))
    t = 0.0
    cached: list[int] = []
    for req in requests:
        rep.add_request(req, t)
        while True:
            nxt = rep.next_event_time()
            if nxt is None:
                raise AssertionError(f"{req.request_id} never finished")
            done = rep.advance(nxt)
            if done:
                cached += [d.cached_tokens for d in done]
                t = nxt + 1.0
                break
    return rep, cached


async def test_counters_equal_the_replica_model() -> None:
    tok = HashTokenizer()
    rng = random.Random(7)
    convs: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": words(200 + 40 * i, f"sys{i}")}] for i in range(3)
    ]
    order = [i for _ in range(4) for i in rng.sample(range(3), 3)]
    sent: list[EngineRequest] = []
    usage_cached: list[int] = []
    async with running(kv_capacity_tokens=KV, block_size=BS) as (h,):
        async with httpx.AsyncClient(base_url=h.url) as http:
            for n, i in enumerate(order):
                msgs = convs[i]
                msgs.append({"role": "user", "content": words(rng.randint(20, 60), f"u{n}")})
                out_len = rng.randint(10, 40)
                resp = await http.post(
                    "/v1/chat/completions", json={"messages": msgs, "max_tokens": out_len}
                )
                body = resp.json()
                reply = body["choices"][0]["message"]["content"]
                msgs.append({"role": "assistant", "content": reply})
                usage_cached.append(body["usage"]["prompt_tokens_details"]["cached_tokens"])
                prompt = tok.encode(render_chat([(m["role"], m["content"]) for m in msgs[:-1]]))
                output = tok.encode(reply)
                assert len(output) == out_len
                assert body["usage"]["prompt_tokens"] == len(prompt)
                sent.append(
                    EngineRequest(
                        f"r{n}", len(prompt), out_len, chain_block_keys(prompt + output, BS)
                    )
                )
        emulated = h.counters()
        scraped = await metrics(h.url)
    model, model_cached = _replay(sent)
    c = model.counters()
    assert usage_cached == model_cached
    assert sum(model_cached) > 0  # later turns hit ...
    assert c.prefix_cache_hits < sum(r.prompt_len for r in sent[3:])  # ... but not everything
    for field in (
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "prompt_tokens",
        "generation_tokens",
        "iteration_tokens",
        "steps",
        "requests_finished",
    ):
        assert getattr(emulated, field) == getattr(c, field), field
    assert scraped["vllm:prefix_cache_queries_total"] == c.prefix_cache_queries
    assert scraped["vllm:prefix_cache_hits_total"] == c.prefix_cache_hits
    assert scraped["vllm:prompt_tokens_total"] == c.prompt_tokens
    assert scraped["vllm:generation_tokens_total"] == c.generation_tokens
    assert scraped["vllm:num_preemptions_total"] == c.num_preemptions
