"""Every built-in policy serves through HTTP; cache_aware gets the prompt text."""

from __future__ import annotations

import aiohttp
import pytest

from sessionroute.router.policies import policy_names

from .backend import FakeBackend
from .conftest import JSON, MakeRouter, post_chat


@pytest.mark.parametrize("policy", policy_names())
async def test_builtin_policy_serves(
    policy: str,
    backends: list[FakeBackend],
    make_router: MakeRouter,
    client: aiohttp.ClientSession,
) -> None:
    router = await make_router([b.url for b in backends], policy=policy)
    for i in range(6):
        assert (await post_chat(client, router, f"p-{i % 3}"))[0] == 200
        assert (await post_chat(client, router, None))[0] == 200
    assert sum(len(b.seen) for b in backends) == 12
    assert all(router.router.core.cluster.in_flight(b.url) == 0 for b in backends)


async def test_cache_aware_routes_by_prompt_and_rejects_bad_json(
    backends: list[FakeBackend], make_router: MakeRouter, client: aiohttp.ClientSession
) -> None:
    router = await make_router([b.url for b in backends], policy="cache_aware", cache_threshold=0.5)
    assert router.router.core.requests.needs_content
    prefix = "You are a careful coding agent. " * 20
    for turn in range(5):
        status, _ = await post_chat(client, router, None, content=prefix + f"turn {turn}")
        assert status == 200
    assert sorted(len(b.seen) for b in backends) == [0, 0, 5]  # one shared prefix, one worker
    async with client.post(
        router.url + "/v1/chat/completions", data=b'{"messages": [', headers=JSON
    ) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "malformed_json"
