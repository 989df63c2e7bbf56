"""The session header reaches a real server on every turn: httpx and OpenAI, sync and async."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.chat import ChatCompletionMessageParam
from test_client_fakes import FakeRouter, fake_router

from sessionroute.client import (
    SessionIds,
    new_session_id,
    router_root,
    session_async_httpx_client,
    session_async_openai,
    session_httpx_client,
    session_openai,
    with_session,
)
from sessionroute.errors import ConfigError

CHAT = "/v1/chat/completions"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


async def test_async_httpx_tags_every_turn_and_follows_rotation() -> None:
    ids = SessionIds(prefix="r-")
    async with fake_router() as router:
        async with session_async_httpx_client(ids, base_url=router.url) as client:
            first = ids.current
            for _ in range(3):
                response = await client.post("/echo", json={})
                assert response.json() == {"session": first}
            second = ids.rotate()
            await client.get("/echo")
            await client.get("/echo", headers={"x-session-id": "by-hand"})
        assert router.sessions("/echo") == [first, first, first, second, "by-hand"]
        assert first.startswith("r-") and second != first
        assert ids.all == (first, second, "by-hand")


async def test_sync_httpx_tags_every_turn() -> None:
    sid = new_session_id()

    def rollout(router: FakeRouter) -> None:
        with session_httpx_client(sid, base_url=router.url) as client:
            for _ in range(3):
                client.post("/echo", json={})

    async with fake_router() as router:
        await asyncio.to_thread(rollout, router)
        assert router.sessions("/echo") == [sid, sid, sid]


async def test_user_event_hooks_still_run() -> None:
    called: list[str] = []

    async def mine(request: httpx.Request) -> None:
        called.append(request.url.path)

    async with fake_router() as router:
        hooks = {"request": [mine]}
        async with session_async_httpx_client("s-1", base_url=router.url, event_hooks=hooks) as c:
            await c.get("/echo")
        assert called == ["/echo"]
        assert router.sessions("/echo") == ["s-1"]


async def test_async_openai_tags_plain_and_streaming_chat() -> None:
    sid = new_session_id()
    async with fake_router() as router:
        client = session_async_openai(router.url, sid, max_retries=0)
        async with client:
            for _ in range(2):
                reply = await client.chat.completions.create(model="m", messages=MESSAGES)
                assert reply.choices[0].message.content == "Hello"
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
            assert text == "Hello"
        assert router.sessions(CHAT) == [sid, sid, sid]
        assert [s.body.get("stream") for s in router.seen] == [None, None, True]


async def test_sync_openai_tags_plain_and_streaming_chat() -> None:
    sid = new_session_id()

    def rollout(router: FakeRouter) -> str:
        with session_openai(router.url + "/v1/", sid, max_retries=0) as client:
            client.chat.completions.create(model="m", messages=MESSAGES)
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            return "".join(chunk.choices[0].delta.content or "" for chunk in stream)

    async with fake_router() as router:
        assert await asyncio.to_thread(rollout, router) == "Hello"
        assert router.sessions(CHAT) == [sid, sid]


async def test_with_session_copies_share_a_client_without_mixing_ids() -> None:
    async with fake_router() as router:
        shared = AsyncOpenAI(
            base_url=f"{router.url}/v1",
            api_key="EMPTY",
            max_retries=0,
            default_headers={"x-team": "t1"},
        )
        async with shared:
            a, b = with_session(shared, "sess-a"), with_session(shared, "sess-b")
            await asyncio.gather(
                a.chat.completions.create(model="m", messages=MESSAGES),
                b.chat.completions.create(model="m", messages=MESSAGES),
            )
            await shared.chat.completions.create(model="m", messages=MESSAGES)
        assert sorted(router.sessions(CHAT)[:2], key=str) == ["sess-a", "sess-b"]
        assert router.sessions(CHAT)[2] is None
        assert {s.headers.get("x-team") for s in router.seen} == {"t1"}


async def test_sdk_retry_of_a_turn_keeps_the_id() -> None:
    sid = new_session_id()
    async with fake_router() as router:
        router.chat_failures = 1
        async with session_async_openai(router.url, sid, max_retries=1) as client:
            await client.chat.completions.create(model="m", messages=MESSAGES)
        assert router.sessions(CHAT) == [sid, sid]


def test_sync_openai_type_is_openai() -> None:
    client = session_openai("http://127.0.0.1:1", "x")
    try:
        assert isinstance(client, OpenAI)
        assert str(client.base_url) == "http://127.0.0.1:1/v1/"
    finally:
        client.close()


@pytest.mark.parametrize("bad", ["", " lead", "trail ", "new\nline", "tab\t", "é"])
def test_invalid_session_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ConfigError, match="session_id"):
        SessionIds(bad)


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://h:30000", "http://h:30000"),
        ("http://h:30000/", "http://h:30000"),
        ("https://h/v1/", "https://h"),
    ],
)
def test_router_root(url: str, root: str) -> None:
    assert router_root(url) == root


def test_router_root_rejects_other_schemes() -> None:
    with pytest.raises(ConfigError, match="ftp://h"):
        router_root("ftp://h")
