"""cache_aware on short prompts, against vllm-router 0.1.17 (issue 40): a prompt shorter than
one content block, repeated, stays on one worker (vllm-router matches characters and keeps a
repeated 25-byte prompt 12/0 on two workers; ours matched 16-token blocks only and alternated
6/6)."""

from __future__ import annotations

from collections import Counter

import aiohttp

from sessionroute.router.requests import text_block_keys

from .backend import start_backends
from .conftest import JSON, MakeRouter
from .vllm_router_017 import running_vllm_router

PROMPT = "what is the capital of it"  # 25 bytes


async def _placements(client: aiohttp.ClientSession, url: str, prompts: list[str]) -> list[str]:
    out = []
    for p in prompts:
        body = {"model": "m", "messages": [{"role": "user", "content": p}]}
        async with client.post(url + "/v1/chat/completions", json=body, headers=JSON) as r:
            assert r.status == 200, await r.text()
            out.append(str((await r.json())["choices"][0]["message"]["content"]).split()[-1])
    return out


def test_a_tail_key_only_for_a_partial_block() -> None:
    assert text_block_keys(PROMPT, 64) == []
    (only,) = text_block_keys(PROMPT, 64, tail=True)
    assert text_block_keys(PROMPT, 64, tail=True) == [only]  # the same prompt, the same key
    assert text_block_keys(PROMPT + "?", 64, tail=True) != [only]
    assert text_block_keys("x" * 128, 64, tail=True) == text_block_keys("x" * 128, 64)
    assert text_block_keys("x" * 130, 64, tail=True)[:2] == text_block_keys("x" * 128, 64)


async def test_a_repeated_short_prompt_stays_on_one_worker_as_with_vllm_router(
    make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    backends = await start_backends(2)
    try:
        workers = [b.url for b in backends]
        prompts = [PROMPT] * 12
        shorts = [f"question number {i}" for i in range(6)]  # distinct, each asked twice
        ours_router = await make_router(workers, policy="cache_aware")
        ours = await _placements(client, ours_router.url, prompts)
        ours_pairs = await _placements(client, ours_router.url, shorts + shorts)
        assert sorted(Counter(ours).values()) == [12]
        assert ours_pairs[:6] == ours_pairs[6:]  # each short prompt's repeat on its worker
        async with running_vllm_router(client, workers, "--policy", "cache_aware") as theirs:
            vr = await _placements(client, theirs, prompts)
            vr_pairs = await _placements(client, theirs, shorts + shorts)
        assert sorted(Counter(vr).values()) == [12]  # what vllm-router does
        assert vr_pairs[:6] == vr_pairs[6:]
    finally:
        for b in backends:
            await b.kill()
