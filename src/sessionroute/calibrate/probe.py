"""Runs a probe plan against one vLLM server and records what each phase measured.

Requests go to ``POST /v1/completions`` with token-id prompts (exact lengths, no tokenizer),
``temperature: 0``, ``ignore_eos: true`` and ``max_tokens: N`` (exact output lengths). The
server's own histograms and counters are scraped before and after each phase; the phase's
means come from their deltas.
"""

from __future__ import annotations

import asyncio
import json
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

__all__ = [
    "PhaseRun",
    "ProbeClient",
    "Progress",
    "RequestRecord",
    "Round",
    "prompt_ids",
    "reset_prefix_cache",
    "run_plan",
]

_FALLBACK_IDS = range(100, 356)
"""Prompt token ids when ``/tokenize`` does not answer: clear of the low special ids of common
vocabularies, inside the smallest vocabulary we serve."""
_WORDS = (
    "the quick brown fox jumps over lazy dog while agents edit code and run tests request "
    "session cache block token prefix decode prefill batch step server model alpha beta gamma "
    "delta river mountain paper stone light north south east west"
)
_POOL_TEXT = " ".join(f"{w}{i}" if i % 3 else w for i, w in enumerate(_WORDS.split(" ") * 4))
"""Text whose tokens are the prompt alphabet (``/tokenize``): ids the model surely has."""
Progress = Callable[[int, int, str], None]
"""Progress callback: (rounds done, rounds in all, label of the phase just measured)."""
_SETTLE_S = 10.0
"""How long to wait for the server's histograms to count every request of a phase."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One answered probe request (lengths from its ``usage``; times at the client, as a
    streaming client such as ``sessionroute compare --live`` sees them).

    Attributes:
        prompt_tokens: prompt tokens.
        cached_tokens: prompt tokens served from the prefix cache.
        output_tokens: generated tokens.
        latency_s: from sending to the end of the answer, seconds.
        ttft_s: from sending to the first token, seconds (None: not streamed).
        decode_s: from the first token to the last, seconds (0 for one token; None: not
            streamed).
    """

    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    latency_s: float
    ttft_s: float | None
    decode_s: float | None


@dataclass(frozen=True, slots=True)
class Round:
    """One round of a phase: its requests, sent together (up to the phase's concurrency), and
    the server's histogram deltas over them.

    Attributes:
        records: one per request.
        wall_s: from the first request sent to the last answer, seconds.
        means: mean of each of :data:`~sessionroute.calibrate.server.HISTOGRAMS` over the
            round (seconds; tokens for ``vllm:iteration_tokens_total``), None if it got none.
        steps: engine steps in the round (``vllm:iteration_tokens_total`` count delta).
        preemptions: ``vllm:num_preemptions`` delta.
    """

    records: tuple[RequestRecord, ...]
    wall_s: float
    means: dict[str, float | None]
    steps: float
    preemptions: float


@dataclass(frozen=True, slots=True)
class PhaseRun:
    """What one phase measured on one server.

    Attributes:
        phase: the phase.
        server: the server's URL.
        rounds: one per round of the phase (:attr:`Phase.rounds`).
    """

    phase: Phase
    server: str
    rounds: tuple[Round, ...]

    @property
    def records(self) -> tuple[RequestRecord, ...]:
        """Every request of every round."""
        return tuple(r for rnd in self.rounds for r in rnd.records)

    @property
    def preemptions(self) -> float:
        """Preemptions over the phase."""
        return sum(rnd.preemptions for rnd in self.rounds)


class ProbeClient:
    """Sends probe requests to one server (streaming completions of token-id prompts).

    Args:
        session: an open aiohttp session.
        info: the server.

    Attributes:
        ids: token ids prompts are drawn from (:meth:`load_ids`; 100-355 until then).
    """

    def __init__(self, session: aiohttp.ClientSession, info: ServerInfo) -> None:
        self.session = session
        self.info = info
        self.ids: list[int] = list(_FALLBACK_IDS)

    async def load_ids(self) -> None:
        """Take the prompt alphabet from the server's tokenizer (``POST /tokenize``)."""
        body = {"model": self.info.model, "prompt": _POOL_TEXT, "add_special_tokens": False}
        try:
            async with self.session.post(f"{self.info.url}/tokenize", json=body) as resp:
                data: Any = await resp.json(content_type=None) if resp.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if isinstance(tokens, list):
            ids = sorted({t for t in tokens if isinstance(t, int) and t >= 0})
            if len(ids) >= 32:
                self.ids = ids

    async def complete(
        self, prompt: list[int], max_tokens: int, stream: bool = True
    ) -> RequestRecord:
        """Send one completion (streaming unless ``stream`` is False); its record."""
        body: dict[str, Any] = {
            "model": self.info.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        first = last = 0.0
        usage: dict[str, Any] = {}
        url = f"{self.info.url}/v1/completions"
        try:
            async with self.session.post(url, json=body) as resp:
                if resp.status != 200:
                    text = await resp.text()
                    raise CalibrationError(f"{url} answered {resp.status}: {text[:300]}")
                if not stream:
                    data: Any = await resp.json(content_type=None)
                    usage = data.get("usage") or {}
                    first = last = time.perf_counter()
                else:
                    async for raw in resp.content:
                        line = raw.decode(errors="replace").strip()
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        event: Any = json.loads(line[5:])
                        if event.get("usage"):
                            usage = event["usage"]
                        if event.get("choices"):
                            last = time.perf_counter()
                            first = first or last
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise CalibrationError(f"{url}: {exc or type(exc).__name__}") from exc
        end = time.perf_counter()
        details = usage.get("prompt_tokens_details") or {}
        first = first or end
        return RequestRecord(
            prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
            cached_tokens=int(details.get("cached_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens", max_tokens)),
            latency_s=end - t0,
            ttft_s=first - t0 if stream else None,
            decode_s=(last or first) - first if stream else None,
        )


async def prompt_ids(session: aiohttp.ClientSession, info: ServerInfo) -> list[int]:
    """Token ids the server's model surely has, for random prompts: the tokens of a fixed
    text (``POST /tokenize``), or ids 100-355 when that does not answer."""
    client = ProbeClient(session, info)
    await client.load_ids()
    return client.ids


async def reset_prefix_cache(session: aiohttp.ClientSession, url: str) -> bool:
    """``POST url/reset_prefix_cache``; whether the server did it (200: vLLM with
    ``VLLM_SERVER_DEV_MODE=1``)."""
    try:
        async with session.post(f"{url}/reset_prefix_cache") as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _tokens(rng: random.Random, ids: list[int], n: int) -> list[int]:
    return [ids[rng.randrange(len(ids))] for _ in range(n)]


async def _settled(
    client: ProbeClient, before: MetricsSnapshot, n: int, deadline: float
) -> MetricsSnapshot:
    """Scrape until the e2e histogram counted ``n`` more requests (or the deadline passed)."""
    while True:
        after = await scrape(client.session, client.info.url, client.info.model)
        done = after.delta(before, "vllm:e2e_request_latency_seconds_count")
        if done >= n or time.monotonic() >= deadline:
            return after
        await asyncio.sleep(0.05)


async def _run_round(
    client: ProbeClient, prompts: list[tuple[list[int], int]], concurrency: int, stream: bool
) -> Round:
    before = await scrape(client.session, client.info.url, client.info.model)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: list[int], out: int) -> RequestRecord:
        async with gate:
            return await client.complete(prompt, out, stream)

    t0 = time.perf_counter()
    records = await asyncio.gather(*(one(p, o) for p, o in prompts))
    wall = time.perf_counter() - t0
    after = await _settled(client, before, len(prompts), time.monotonic() + _SETTLE_S)
    return Round(
        records=tuple(records),
        wall_s=wall,
        means={h: after.mean_delta(before, h) for h in HISTOGRAMS},
        steps=after.delta(before, "vllm:iteration_tokens_total_count"),
        preemptions=after.delta(before, "vllm:num_preemptions_total"),
    )


async def _run_phase_round(
    client: ProbeClient, phase: Phase, prefix: list[int], rng: random.Random, stream: bool
) -> Round:
    """One round of ``phase``: reset the cache (when allowed), warm the phase's prefix so that
    its requests hit it, send the round."""
    if client.info.can_reset_cache:
        await reset_prefix_cache(client.session, client.info.url)
    ids = client.ids
    if prefix:
        await client.complete([*prefix, *_tokens(rng, ids, 1)], 1)
    prompts: list[tuple[list[int], int]] = []
    for _ in range(phase.requests):
        fresh = rng.randint(phase.fresh_min, phase.fresh_tokens)
        out = rng.randint(phase.output_min, phase.output_tokens)
        prompts.append(([*prefix, *_tokens(rng, ids, fresh)], out))
    return await _run_round(client, prompts, phase.concurrency, stream)


async def _warm_up(client: ProbeClient, rng: random.Random, plan: ProbePlan) -> None:
    """Unmeasured requests first: a fresh server's first steps are slower (allocation, lazy
    initialisation), and they must not enter the fit."""
    longest = max((p.prefix_tokens + p.fresh_tokens for p in plan.phases), default=64)
    for n in (16, longest):
        await client.complete(_tokens(rng, client.ids, n), 4)
    batch = max((p.concurrency for p in plan.phases), default=1)
    await asyncio.gather(*(client.complete(_tokens(rng, client.ids, 16), 8) for _ in range(batch)))


async def run_plan(
    session: aiohttp.ClientSession,
    info: ServerInfo,
    plan: ProbePlan,
    progress: Progress | None = None,
) -> list[PhaseRun]:
    """Run every phase of ``plan`` against one server.

    Rounds are interleaved: the first round of every phase, then the second of every phase,
    and so on, so that a burst of load from elsewhere on the machine spreads over the phases
    instead of spoiling one (the fit takes each phase's median round). Before each round the
    server's prefix cache is reset (``POST /reset_prefix_cache``) when ``info.can_reset_cache``
    and the phase's shared prefix is warmed; prompts are random token ids either way, so
    nothing but that prefix can hit. A few unmeasured requests go first (:func:`_warm_up`).

    Args:
        session: an open aiohttp session.
        info: the server.
        plan: the phases.
        progress: called after each round with (rounds done, rounds in all, phase label).

    Returns:
        One :class:`PhaseRun` per phase, in the plan's order.

    Raises:
        CalibrationError: a request failed or the server stopped answering.
    """
    client = ProbeClient(session, info)
    await client.load_ids()
    rng = random.Random(f"{plan.seed}:{info.url}")
    await _warm_up(client, rng, plan)
    prefixes = [_tokens(rng, client.ids, p.prefix_tokens) for p in plan.phases]
    rounds: list[list[Round]] = [[] for _ in plan.phases]
    total = sum(p.rounds for p in plan.phases)
    done = 0
    for r in range(max((p.rounds for p in plan.phases), default=0)):
        for i, phase in enumerate(plan.phases):
            if r >= phase.rounds:
                continue
            rnd = await _run_phase_round(client, phase, prefixes[i], rng, plan.stream)
            rounds[i].append(rnd)
            done += 1
            if progress is not None:
                progress(done, total, phase.label)
    return [
        PhaseRun(phase=p, server=info.url, rounds=tuple(rs))
        for p, rs in zip(plan.phases, rounds, strict=True)
    ]
