"""Rollout lifecycle against a real fake router: tagged turns, one release of every id at exit.

Time bounds use a short configured release budget (0.5 s) and a generous margin; they check
that the bound holds, not how fast anything is.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from test_client_fakes import FakeRouter, closed_port_url, fake_router

from sessionroute.client import (
    ReleasePolicy,
    Rollout,
    RolloutClosedError,
    SessionReleaser,
    SyncRollout,
    SyncSessionReleaser,
)
from sessionroute.errors import ConfigError

CHAT = "/v1/chat/completions"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
BUDGET_S = 0.5
MARGIN_S = 1.5
FAST = ReleasePolicy(
    attempt_timeout_s=0.2, total_timeout_s=BUDGET_S, max_attempts=1000, initial_backoff_s=0.01
)


class EnvError(Exception):
    """The rollout's own failure (an environment step blowing up)."""


async def _turn(rollout: Rollout) -> None:
    await rollout.openai.chat.completions.create(model="m", messages=MESSAGES)


async def test_success_tags_every_turn_and_releases_once() -> None:
    async with fake_router() as router:
        async with Rollout(router.url, api_key="k", openai_kwargs={"max_retries": 0}) as rollout:
            sid = rollout.session_id
            await _turn(rollout)
            stream = await rollout.openai.chat.completions.create(
                model="m", messages=MESSAGES, stream=True
            )
            assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "Hello"
            await rollout.httpx.post("/echo", json={})
            assert router.finishes == []
        assert rollout.closed
        assert router.sessions(CHAT) == [sid, sid]
        assert router.sessions("/echo") == [sid]
        assert router.finishes == [sid]
        assert {s.headers.get("authorization") for s in router.seen} == {"Bearer k"}


async def test_error_releases_once_and_propagates_unchanged() -> None:
    async with fake_router() as router:
        with pytest.raises(EnvError, match="env step"):
            async with Rollout(router.url) as rollout:
                await _turn(rollout)
                raise EnvError("env step")
        assert router.finishes == [rollout.session_id]


async def test_cancellation_releases_once() -> None:
    async with fake_router() as router:
        router.chat_hang = True
        rollout = Rollout(router.url)

        async def run() -> None:
            async with rollout:
                await _turn(rollout)

        task = asyncio.create_task(run())
        await router.chat_started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert router.finishes == [rollout.session_id]


async def test_timeout_releases_once() -> None:
    async with fake_router() as router:
        router.chat_hang = True
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2), Rollout(router.url) as rollout:
                await _turn(rollout)  # never answers
        assert router.finishes == [rollout.session_id]


async def test_repeated_and_concurrent_close_release_once() -> None:
    async with fake_router() as router:
        async with Rollout(router.url) as rollout:
            await asyncio.gather(rollout.aclose(), rollout.aclose())
            await rollout.aclose()
        assert router.finishes == [rollout.session_id]
        with pytest.raises(RolloutClosedError):
            _ = rollout.openai
        with pytest.raises(RolloutClosedError):
            rollout.new_session_id()


async def test_discarded_retries_are_all_released() -> None:
    async with fake_router() as router:
        async with Rollout(router.url, prefix="job7-") as rollout:
            first = rollout.session_id
            await _turn(rollout)
            second = rollout.new_session_id()
            await _turn(rollout)
            await rollout.httpx.get("/echo")
            third = rollout.new_session_id()
            await _turn(rollout)
            await rollout.httpx.get("/echo")
        assert len({first, second, third}) == 3
        assert rollout.session_ids == (first, second, third)
        assert router.sessions(CHAT) == [first, second, third]
        assert router.sessions("/echo") == [second, third]
        assert sorted(router.finishes) == sorted([first, second, third])


async def test_custom_header_is_the_only_session_header() -> None:
    async with fake_router() as router:
        async with Rollout(router.url, header="x-user-id") as rollout:
            first = rollout.session_id
            await _turn(rollout)
            second = rollout.new_session_id()
            await _turn(rollout)
            await rollout.httpx.get("/echo")
            assert rollout.headers == {"x-user-id": second}
        sent = [
            (s.headers.get("x-user-id"), s.session)
            for s in router.seen
            if s.path != "/finish_session"
        ]
        assert sent == [(first, None), (second, None), (second, None)]
        assert sorted(router.finishes) == sorted([first, second])


async def test_release_false_never_calls_finish_session() -> None:
    async with fake_router() as router:
        async with Rollout(router.url, release=False) as rollout:
            await _turn(rollout)
        assert router.finishes == []
        assert router.sessions(CHAT) == [rollout.session_id]


async def test_dead_router_release_never_fails_the_rollout() -> None:
    async with fake_router() as upstream:
        shared = AsyncOpenAI(base_url=f"{upstream.url}/v1", api_key="EMPTY", max_retries=0)
        async with shared:
            rollout = Rollout(closed_port_url(), openai_client=shared, release_policy=FAST)
            async with rollout:
                await _turn(rollout)
                start = time.monotonic()
            elapsed = time.monotonic() - start
            # the shared client is the caller's: still open after the rollout
            await shared.chat.completions.create(model="m", messages=MESSAGES)
        assert upstream.sessions(CHAT) == [rollout.session_id, None]
    assert elapsed < BUDGET_S + MARGIN_S


async def test_dead_router_keeps_the_rollouts_own_error() -> None:
    start = time.monotonic()
    with pytest.raises(EnvError):
        async with Rollout(closed_port_url(), release_policy=FAST):
            raise EnvError("boom")
    assert time.monotonic() - start < BUDGET_S + MARGIN_S


async def test_hanging_router_delays_exit_by_at_most_the_bound() -> None:
    async with fake_router() as router:
        router.finish_hang = True
        async with Rollout(router.url, release_policy=FAST) as rollout:
            await _turn(rollout)
            start = time.monotonic()
        elapsed = time.monotonic() - start
        assert router.finishes[0] == rollout.session_id
    assert elapsed < BUDGET_S + MARGIN_S


async def test_second_cancel_stops_the_wait_not_the_release() -> None:
    async with fake_router() as router:
        router.chat_hang = True
        router.finish_hang = True
        releaser = SessionReleaser(router.url)
        rollout = Rollout(router.url, releaser=releaser)

        async def run() -> None:
            async with rollout:
                await _turn(rollout)

        task = asyncio.create_task(run())
        await router.chat_started.wait()
        task.cancel()
        await router.finish_started.wait()  # exiting, waiting on the release
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        router.unblock.set()
        await releaser.aclose()
        assert (releaser.succeeded, releaser.failed) == (1, 0)
        assert router.finishes == [rollout.session_id]


async def test_shared_releaser_serves_many_rollouts() -> None:
    async with fake_router() as router, SessionReleaser(router.url) as releaser:

        async def one() -> str:
            async with Rollout(router.url, releaser=releaser) as rollout:
                await rollout.httpx.get("/echo")
                return rollout.session_id

        ids = await asyncio.gather(*(one() for _ in range(5)))
        assert sorted(router.finishes) == sorted(ids)
        assert releaser.succeeded == 5


def test_releaser_and_release_policy_are_exclusive() -> None:
    with (
        SyncSessionReleaser("http://127.0.0.1:1") as releaser,
        pytest.raises(ConfigError, match="release_policy"),
    ):
        SyncRollout("http://127.0.0.1:1", releaser=releaser, release_policy=FAST)


async def test_sync_rollout_success_error_and_close_once() -> None:
    def run(router: FakeRouter) -> tuple[str, str]:
        with SyncRollout(router.url, openai_kwargs={"max_retries": 0}) as ok:
            ok.openai.chat.completions.create(model="m", messages=MESSAGES)
            ok.httpx.get("/echo")
        ok.close()
        with pytest.raises(EnvError), SyncRollout(router.url) as bad:
            bad.openai.chat.completions.create(model="m", messages=MESSAGES)
            raise EnvError("boom")
        return ok.session_id, bad.session_id

    async with fake_router() as router:
        ok_id, bad_id = await asyncio.to_thread(run, router)
        assert router.sessions(CHAT) == [ok_id, bad_id]
        assert router.sessions("/echo") == [ok_id]
        assert router.finishes == [ok_id, bad_id]
