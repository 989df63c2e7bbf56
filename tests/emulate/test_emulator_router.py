"""The OpenAI SDK through the real router (``sessionroute.serve``) in front of emulators."""

from __future__ import annotations

from typing import Any

import openai
from test_emulator_support import MODEL, running, user, words

from sessionroute.serve import RouterSettings, start_router


async def _turns(client: openai.AsyncOpenAI, session: str, n: int) -> list[int]:
    """``n`` turns of one session, alternating streaming and not; cached tokens per turn."""
    msgs: list[Any] = [{"role": "system", "content": words(120, session)}, user("go")]
    headers = {"x-session-id": session}
    cached: list[int] = []
    for turn in range(n):
        if turn % 2:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=msgs,
                max_tokens=20,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers=headers,
            )
            parts: list[str] = []
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
                parts += [c.delta.content or "" for c in chunk.choices]
            text = "".join(parts)
        else:
            r = await client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=20, extra_headers=headers
            )
            text, usage = r.choices[0].message.content or "", r.usage
        assert usage is not None and usage.completion_tokens == 20
        details = usage.prompt_tokens_details
        cached.append((details.cached_tokens or 0) if details is not None else -1)
        msgs += [{"role": "assistant", "content": text}, user(words(25, f"{session}{turn}"))]
    return cached


async def test_openai_sdk_through_the_router_sticks_and_hits() -> None:
    async with running(2) as handles:
        settings = RouterSettings.build(
            port=0,
            worker_urls=tuple(h.url for h in handles),
            policy="sticky_least_loaded",
            health_check_interval_secs=3600.0,
            shutdown_timeout_secs=1.0,
        )
        router = await start_router(settings)
        try:
            client = openai.AsyncOpenAI(
                base_url=router.url + "/v1", api_key="unused", max_retries=0
            )
            a = await _turns(client, "alpha", 4)
            b = await _turns(client, "beta", 4)
            models = await client.models.list()
        finally:
            await router.stop()
        finished = sorted(h.counters().requests_finished for h in handles)
    assert [m.id for m in models.data] == [MODEL]
    # Each session stayed on one replica, and the two sessions were spread over both.
    assert finished == [4, 4]
    for cached in (a, b):
        assert cached[0] == 0
        assert all(x > y for x, y in zip(cached[1:], cached, strict=False))
