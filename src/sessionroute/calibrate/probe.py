"""Runs a probe plan against one vLLM server and records what each phase measured.

Requests go to ``POST /v1/completions`` with token-id prompts (exact lengths, no tokenizer),
``temperature: 0``, ``ignore_eos: true`` and ``max_tokens: N`` (exact output lengths). The
server's own histograms and counters are scraped before and after each phase; the phase's
means come from their deltas.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from sessionroute.calibrate.plan import Phase, ProbePlan
from sessionroute.calibrate.server import (
    HISTOGRAMS,
    CalibrationError,
    MetricsSnapshot,
    ServerInfo,
    scrape,
)

__all__ = ["PhaseRun", "RequestRecord", "reset_prefix_cache", "run_plan"]

_TOKEN_LO = 100
"""Prompt token ids are drawn from ``[_TOKEN_LO, _TOKEN_LO + _TOKEN_SPAN)``: clear of the low
special ids of common vocabularies and inside the smallest vocabulary we serve (2048)."""
_TOKEN_SPAN = 1000
_SETTLE_S = 10.0
"""How long to wait for the server's histograms to count every request of a phase."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One answered probe request (from its ``usage``).

    Attributes:
        prompt_tokens: prompt tokens.
        cached_tokens: prompt tokens served from the prefix cache.
        output_tokens: generated tokens.
        latency_s: client-side request latency, seconds.
    """

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    latency_s: float


@dataclass(frozen=True, slots=True)
class PhaseRun:
    """What one phase measured on one server.

    Attributes:
        phase: the phase.
        server: the server's URL.
        records: one per request.
        wall_s: from the first request sent to the last answer, seconds.
        means: mean of each of :data:`~sessionroute.calibrate.server.HISTOGRAMS` over the
            phase (seconds; tokens for ``vllm:iteration_tokens_total``), None if it got none.
        steps: engine steps in the phase (``vllm:iteration_tokens_total`` count delta).
        preemptions: ``vllm:num_preemptions`` delta.
    """

    phase: Phase
    server: str
    records: tuple[RequestRecord, ...]
    wall_s: float
    means: dict[str, float | None]
    steps: float
    preemptions: float


class _Client:
    def __init__(self, session: aiohttp.ClientSession, info: ServerInfo) -> None:
        self.session = session
        self.info = info

    async def complete(self, prompt: list[int], max_tokens: int) -> RequestRecord:
        body = {
            "model": self.info.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        t0 = time.perf_counter()
        url = f"{self.info.url}/v1/completions"
        try:
            async with self.session.post(url, json=body) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise CalibrationError(f"{url} answered {resp.status}: {text[:300]}")
                data: Any = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CalibrationError(f"{url}: {exc or type(exc).__name__}") from exc
        latency = time.perf_counter() - t0
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return RequestRecord(
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
            cached_tokens=int(details.get("cached_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens", max_tokens)),
            latency_s=latency,
        )


async def reset_prefix_cache(session: aiohttp.ClientSession, url: str) -> bool:
    """``POST url/reset_prefix_cache``; whether the server did it (200: vLLM with
    ``VLLM_SERVER_DEV_MODE=1``)."""
    try:
        async with session.post(f"{url}/reset_prefix_cache") as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [_TOKEN_LO + rng.randrange(_TOKEN_SPAN) for _ in range(n)]


async def _settled(
    client: _Client, before: MetricsSnapshot, n: int, deadline: float
) -> MetricsSnapshot:
    """Scrape until the e2e histogram counted ``n`` more requests (or the deadline passed)."""
    while True:
        after = await scrape(client.session, client.info.url, client.info.model)
        done = after.delta(before, "vllm:e2e_request_latency_seconds_count")
        if done >= n or time.monotonic() >= deadline:
            return after
        await asyncio.sleep(0.05)


async def _run_phase(client: _Client, phase: Phase, rng: random.Random) -> PhaseRun:
    if client.info.can_reset_cache:
        await reset_prefix_cache(client.session, client.info.url)
    prefix = _tokens(rng, phase.prefix_tokens)
    if prefix:  # warm the shared prefix so that the phase's requests hit it
        await client.complete([*prefix, *_tokens(rng, 1)], 1)
    prompts: list[tuple[list[int], int]] = []
    for _ in range(phase.requests):
        fresh = rng.randint(phase.fresh_min, phase.fresh_tokens)
        out = rng.randint(phase.output_min, phase.output_tokens)
        prompts.append(([*prefix, *_tokens(rng, fresh)], out))
    before = await scrape(client.session, client.info.url, client.info.model)
    gate = asyncio.Semaphore(phase.concurrency)

    async def one(prompt: list[int], out: int) -> RequestRecord:
        async with gate:
            return await client.complete(prompt, out)

    t0 = time.perf_counter()
    records = await asyncio.gather(*(one(p, o) for p, o in prompts))
    wall = time.perf_counter() - t0
    after = await _settled(client, before, len(prompts), time.monotonic() + _SETTLE_S)
    return PhaseRun(
        phase=phase,
        server=client.info.url,
        records=tuple(records),
        wall_s=wall,
        means={h: after.mean_delta(before, h) for h in HISTOGRAMS},
        steps=after.delta(before, "vllm:iteration_tokens_total_count"),
        preemptions=after.delta(before, "vllm:num_preemptions_total"),
    )


async def run_plan(
    session: aiohttp.ClientSession,
    info: ServerInfo,
    plan: ProbePlan,
    on_phase: Callable[[PhaseRun], None] | None = None,
) -> list[PhaseRun]:
    """Run every phase of ``plan`` against one server, in order.

    Before each phase the server's prefix cache is reset (``POST /reset_prefix_cache``) when
    ``info.can_reset_cache``; prompts start with fresh random token ids either way, so nothing
    but a phase's own warmed prefix can hit.

    Args:
        session: an open aiohttp session.
        info: the server.
        plan: the phases.
        on_phase: called after each phase (progress).

    Raises:
        CalibrationError: a request failed or the server stopped answering.
    """
    client = _Client(session, info)
    rng = random.Random(f"{plan.seed}:{info.url}")
    runs = []
    for phase in plan.phases:
        run = await _run_phase(client, phase, rng)
        runs.append(run)
        if on_phase is not None:
            on_phase(run)
    return runs
