"""The decode-pace probe around each live arm run of ``compare --fidelity``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from sessionroute.calibrate import inspect_servers
from sessionroute.calibrate.server import ServerInfo
from sessionroute.experiments.live.pace import PacedRunner, calibrated_pace_s, decode_pace
from sessionroute.experiments.results import RunOutput

from .fake_vllm import FakeVllm, serving


def _infos(urls: list[str]) -> tuple[ServerInfo, ...]:
    async def read() -> tuple[ServerInfo, ...]:
        async with aiohttp.ClientSession() as session:
            return await inspect_servers(session, urls)

    return asyncio.run(read())


def test_decode_pace_is_each_servers_time_per_streamed_token() -> None:
    slow, fast = FakeVllm(token_delay_s=0.02), FakeVllm(token_delay_s=0.002)
    with serving(slow.app()) as a, serving(fast.app()) as b:
        pace = decode_pace(_infos([a, b]), tokens=12)
    assert 0.018 < pace[0] < 0.08, pace
    assert pace[1] < 0.015, pace
    assert slow.posts.count("/v1/completions") == 1


def test_a_reply_held_back_and_sent_at_once_is_paced_by_the_servers_decode_time() -> None:
    # uncapped on a 2-core host the server's frontend can send a whole reply in one burst;
    # timed at the client that read 0 ms per token
    held = FakeVllm(token_delay_s=0.01, burst=True)
    with serving(held.app()) as url:
        (pace,) = decode_pace(_infos([url]), tokens=12)
    assert held.decode_sum_s > 0.09
    assert pace == pytest.approx(held.decode_sum_s / 11, rel=0.05), pace


def test_the_paced_runner_probes_before_and_after_every_run() -> None:
    fake = FakeVllm(token_delay_s=0.001)
    order: list[str] = []

    def runner(arm: Any, seed: int, progress: Callable[[float], None]) -> RunOutput:
        order.append(f"run {arm.name} {seed} after {len(fake.posts)} posts")
        return RunOutput(seed, {}, [], [], {})

    class Arm:
        name = "a"

    with serving(fake.app()) as url:
        paced = PacedRunner(runner, _infos([url]))
        posts_before = fake.posts.count("/v1/completions")
        paced(Arm(), 7, lambda _f: None)  # type: ignore[arg-type]
    assert fake.posts.count("/v1/completions") == posts_before + 2
    assert order and order[0].startswith("run a 7")
    (rec,) = paced.records
    assert rec["arm"] == "a" and len(rec["before_s"]) == len(rec["after_s"]) == 1
    line = paced.describe(0.0115)
    assert line.startswith(
        "decode pace, ms per token at 1 request: calibration 11.5; before/after: a "
    )


def test_calibrated_pace_is_the_median_decode_b1_phase_per_token() -> None:
    phases = [
        {"phase": "decode B=1 H=64", "measured_s": 0.47},
        {"phase": "decode B=1 H=256", "measured_s": 0.94},
        {"phase": "decode B=1 H=64", "measured_s": 0.47},
        {"phase": "decode B=14 H=64", "measured_s": 5.0},
        {"phase": "prefill L=11", "measured_s": 1.0},
    ]
    assert calibrated_pace_s({"phases": phases}) == pytest.approx(0.01)
    assert calibrated_pace_s({}) is None


def test_a_server_that_does_not_answer_the_pace_probe_does_not_stop_the_run() -> None:
    with serving(FakeVllm().app()) as url:
        infos = _infos([url])
    ran: list[int] = []

    def runner(arm: Any, seed: int, progress: Callable[[float], None]) -> RunOutput:
        ran.append(seed)
        return RunOutput(seed, {}, [], [], {})

    class Arm:
        name = "a"

    paced = PacedRunner(runner, infos)
    paced(Arm(), 3, lambda _f: None)  # type: ignore[arg-type]
    assert ran == [3]
    assert paced.records == [{"arm": "a", "before_s": [], "after_s": [], "host_cpu": None}]
    assert paced.describe(None).endswith("calibration -; before/after: a -/-")
