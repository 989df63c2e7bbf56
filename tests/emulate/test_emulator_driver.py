"""Real-time driving: scaled clock, streaming progress, aborts, shutdown, batching."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from test_emulator_support import metrics, running, until, user

from sessionroute.emulate import EmulatorRequestError, RealTimeEngine, tokens_generated
from sessionroute.replica import (
    PROFILES,
    EngineRequest,
    Replica,
    ReplicaConfig,
    RequestResult,
    chain_block_keys,
)

CFG = ReplicaConfig(PROFILES["toy-8b-h100-tp1"])


class FakeClock:
    """A wall clock the test sets."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _request(rid: str, prompt: int, output: int) -> EngineRequest:
    return EngineRequest(rid, prompt, output, chain_block_keys(list(range(prompt + output)), 16))


def _reference(req: EngineRequest, arrival: float) -> RequestResult:
    rep = Replica(CFG)
    rep.add_request(req, arrival)
    while True:
        nxt = rep.next_event_time()
        if nxt is None:
            raise AssertionError("reference replica went idle")
        done = rep.advance(nxt)
        if done:
            return done[0]


async def test_simulated_time_is_scaled_wall_time() -> None:
    clock = FakeClock(100.0)
    driver = RealTimeEngine(Replica(CFG), 10.0, clock=clock)
    driver.start()
    try:
        clock.t = 101.0  # one wall second later: simulated t = 10 s
        req = _request("a", 300, 40)
        ticket = driver.submit(req, stream=False)
        ref = _reference(req, 10.0)
        clock.t = 100.0 + (ref.finish_s - 1e-6) / 10.0
        driver.poll()
        assert not ticket.done
        clock.t = 100.0 + (ref.finish_s + 1e-6) / 10.0
        driver.poll()
        res = await ticket.wait()
    finally:
        await driver.stop()
    assert res.arrival_s == 10.0
    assert res.first_token_s == pytest.approx(ref.first_token_s, abs=1e-9)
    assert res.finish_s == pytest.approx(ref.finish_s, abs=1e-9)
    assert (res.output_tokens, res.cached_tokens) == (40, 0)


@pytest.mark.parametrize("others", [0, 3])
async def test_streaming_progress_matches_the_reference_engine(others: int) -> None:
    # The driver's engine runs the fast path (lazy decoders, closed-form decode runs); the
    # token count it streams mid-decode must equal the one-step reference engine's.
    clock = FakeClock(0.0)
    driver = RealTimeEngine(Replica(CFG), 1.0, clock=clock, stream_interval_s=0.001)
    ref = Replica(CFG, fast=False)
    driver.start()
    try:
        reqs = [_request("s", 200, 50)] + [_request(f"o{i}", 100 + i, 80) for i in range(others)]
        ticket = driver.submit(reqs[0], stream=True)
        for r in reqs[1:]:
            driver.submit(r, stream=False)
        for r in reqs:
            ref.add_request(r, 0.0)
        res = _reference(reqs[0], 0.0)
        mid = res.first_token_s + 0.6 * (res.finish_s - res.first_token_s)
        ref.advance(mid)
        expected = tokens_generated(ref, "s")
        assert expected is not None and 1 < expected < 50
        clock.t = mid
        while ticket.produced < expected:
            await asyncio.wait_for(ticket.changed(), 5)
        assert ticket.produced == expected and ticket.result is None
        clock.t = res.finish_s + 10.0
        done = await asyncio.wait_for(ticket.wait(), 5)
        assert done.output_tokens == ticket.produced == 50
    finally:
        await driver.stop()


async def test_stop_fails_live_requests_with_503() -> None:
    clock = FakeClock(0.0)
    driver = RealTimeEngine(Replica(CFG), 1.0, clock=clock)
    driver.start()
    ticket = driver.submit(_request("x", 50, 10), stream=False)
    await driver.stop()
    with pytest.raises(EmulatorRequestError) as info:
        await ticket.wait()
    assert info.value.status == 503
    with pytest.raises(EmulatorRequestError):
        driver.submit(_request("y", 50, 10), stream=False)


async def test_stream_disconnect_aborts_the_engine_request() -> None:
    async with running(time_scale=1.0) as (h,):
        body = {"messages": [user("long")], "max_tokens": 2000, "stream": True}
        async with (
            httpx.AsyncClient() as http,
            http.stream("POST", h.url + "/v1/chat/completions", json=body) as resp,
        ):
            async for line in resp.aiter_lines():
                if '"content":" ' in line:  # the first generated token
                    break
            # ~15 s of modelled decoding are left: the request is still live in the engine.
            assert h.emulator.driver.live == 1
        await until(lambda: h.emulator.driver.live == 0)
        c = h.counters()
        assert h.emulator.replica.num_running == 0
        assert c.requests_finished == 0 and 0 < c.generation_tokens < 2000


async def test_non_streaming_disconnect_aborts_the_engine_request() -> None:
    async with running(time_scale=1.0) as (h,):
        body = {"messages": [user("long")], "max_tokens": 2000}
        async with httpx.AsyncClient() as http:
            task = asyncio.create_task(http.post(h.url + "/v1/chat/completions", json=body))
            await until(lambda: h.emulator.driver.live == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await until(lambda: h.emulator.driver.live == 0)
        assert h.emulator.replica.num_running == 0
        assert (await metrics(h.url))["vllm:request_success_total"] == 0


async def test_concurrent_requests_share_engine_steps() -> None:
    async with running(time_scale=1.0) as (h,), httpx.AsyncClient(timeout=30) as http:
        body = {"messages": [user("batch")], "max_tokens": 30}
        replies = await asyncio.gather(
            *(http.post(h.url + "/v1/chat/completions", json=body) for _ in range(8))
        )
        c = h.counters()
    assert [r.status_code for r in replies] == [200] * 8
    assert c.requests_finished == 8 and c.generation_tokens == 240
    assert c.steps < 8 * 30  # decoded together, not one request after another


def test_driver_rejects_bad_time_scale() -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="time_scale"):
            RealTimeEngine(Replica(CFG), bad)


def test_settings_reject_bad_values() -> None:
    from sessionroute.emulate import EmulatorSettings
    from sessionroute.errors import ConfigError

    with pytest.raises(ConfigError, match="nope"):
        EmulatorSettings(profile="nope")
    with pytest.raises(ConfigError, match="time_scale"):
        EmulatorSettings(time_scale=0)
    with pytest.raises(ConfigError, match="block_size"):
        EmulatorSettings(block_size=0)
    s = dataclasses.replace(EmulatorSettings(), model="m", kv_capacity_tokens=1000)
    assert s.served_model == "m" and s.replica_config().num_blocks == 62
