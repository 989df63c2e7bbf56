"""examples/rollout_openai.py through the real router (``start_router``) over fake replicas."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_client_fakes import FakeRouter, closed_port_url, fake_router

from sessionroute.serve import RouterSettings, RunningRouter, start_router

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollout_openai.py"
CHAT = "/v1/chat/completions"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_openai_example", EXAMPLE)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {EXAMPLE}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


example = _load_example()


@asynccontextmanager
async def serve(replicas: int) -> AsyncIterator[tuple[RunningRouter, list[FakeRouter]]]:
    """The real router (sticky_least_loaded) in front of ``replicas`` fake replicas."""
    async with AsyncExitStack() as stack:
        backends = [await stack.enter_async_context(fake_router()) for _ in range(replicas)]
        settings = RouterSettings.build(
            port=0,
            worker_urls=tuple(b.url for b in backends),
            policy="sticky_least_loaded",
            health_check_interval_secs=3600.0,
            shutdown_timeout_secs=1.0,
        )
        running = await start_router(settings)
        try:
            yield running, backends
        finally:
            await running.stop()


async def _metrics(router: RunningRouter) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{router.url}/metrics")).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"|{v}" for v in sample.labels.values())
            out[key] = sample.value
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_rollouts_stay_on_one_replica_and_are_released(stream: bool) -> None:
    async with serve(2) as (router, backends):
        argv = ["--router", router.url, "--turns", "3", "--rollouts", "4"]
        turns = await example.run(example.parse_args(argv + (["--stream"] if stream else [])))
        metrics = await _metrics(router)
    ids = {t.session_id for t in turns}
    assert len(ids) == 4 and len(turns) == 12
    for sid in ids:
        holders = [b for b in backends if sid in b.sessions(CHAT)]
        assert len(holders) == 1, f"session {sid} moved between replicas"
        assert holders[0].sessions(CHAT).count(sid) == 3
    # sticky_least_loaded spreads four concurrent new sessions 2/2.
    assert sorted(len(set(b.sessions(CHAT))) for b in backends) == [2, 2]
    assert metrics["sessionroute_sessions_released_total"] == 4
    assert [v for k, v in metrics.items() if k.startswith("sessionroute_active_sessions|")] == [
        0,
        0,
    ]


async def test_main_prints_one_line_per_turn(capsys: pytest.CaptureFixture[str]) -> None:
    async with serve(1) as (router, backends):
        status = await asyncio.to_thread(
            example.main, ["--router", router.url, "--turns", "2", "--model", "m"]
        )
    assert status == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["rollout", "session_id", "turn", "prompt", "cached", "s"]
    assert [line.split()[2] for line in lines[1:]] == ["1", "2"]
    assert backends[0].sessions("/v1/models") == []  # --model skips discovery


def test_dead_router_exits_1_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--router", closed_port_url(), "--model", "m", "--max-retries", "0", "--no-release"]
    assert example.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: http://127.0.0.1:") and "Connection error" in err


def test_bad_turns_exit_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        example.parse_args(["--turns", "0"])
    assert exit_info.value.code == 2
    assert "--turns must be >= 1, got 0" in capsys.readouterr().err
