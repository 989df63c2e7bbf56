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
import statistics
import time
from collections.abc import Callable, Sequence
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
    "DECODE_HISTOGRAM",
    "LAG_RATIO",
    "PhaseRun",
    "ProbeClient",
    "Progress",
    "RequestRecord",
    "Round",
    "probe_session",
    "prompt_ids",
    "reset_prefix_cache",
    "run_plan",
    "run_plan_together",
    "run_round",
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
_RETRIES = 2
"""Times a probe request whose connection broke before any answer is sent again."""
_KEEPALIVE_S = 2.0
"""Seconds an idle probe connection is kept (under uvicorn's default keep-alive of 5 s)."""
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


DECODE_HISTOGRAM = "vllm:request_decode_time_seconds"
"""vLLM's own histogram of a request's first-to-last-token time."""

LAG_RATIO = 0.5
"""A streamed round whose tokens the client saw in under this share of vLLM's own decode time
is lagged (:attr:`Round.lagged`)."""


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

    @property
    def lagged(self) -> bool:
        """Whether the client saw the round's tokens, first to last, in under
        :data:`LAG_RATIO` of the time the server took to make them
        (``vllm:request_decode_time_seconds``): it got the stream late and in bursts (a client
        or a server frontend short of CPU), so its first-to-last-token times are not step
        times."""
        server = self.means.get(DECODE_HISTOGRAM)
        if not server or not self.records:
            return False
        return statistics.fmean(r.decode_s or 0.0 for r in self.records) < LAG_RATIO * server

    def mean_decode_s(self) -> float | None:
        """Mean first-to-last-token time of the round's requests, seconds: at the client, or
        vLLM's own (``vllm:request_decode_time_seconds``) where the round is :attr:`lagged`
        or was not streamed; None when neither is known."""
        if self.lagged or any(r.decode_s is None for r in self.records) or not self.records:
            return self.means.get(DECODE_HISTOGRAM)
        return statistics.fmean(r.decode_s or 0.0 for r in self.records)


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
        """Send one completion (streaming unless ``stream`` is False); its record.

        A request whose connection broke before any answer came (the server closed an idle
        keep-alive connection just as it was reused: ``Can not write request body``, ``Server
        disconnected``) is sent again, up to :data:`_RETRIES` times: the server never saw it.
        """
        for attempt in range(_RETRIES + 1):
            try:
                return await self._complete_once(prompt, max_tokens, stream)
            except _Unanswered as exc:
                if attempt == _RETRIES:
                    raise CalibrationError(str(exc)) from exc.__cause__
        raise AssertionError("unreachable")

    async def _complete_once(
        self, prompt: list[int], max_tokens: int, stream: bool
    ) -> RequestRecord:
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
        answered = False
        try:
            async with self.session.post(url, json=body) as resp:
                answered = True
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
        except aiohttp.ClientConnectionError as exc:
            if not answered:
                raise _Unanswered(f"{url}: {exc or type(exc).__name__}") from exc
            raise CalibrationError(f"{url}: {exc or type(exc).__name__}") from exc
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


class _Unanswered(Exception):
    """A request's connection broke before the server answered (safe to send again)."""


def probe_session(timeout_s: float) -> aiohttp.ClientSession:
    """An HTTP session for probing: ``timeout_s`` per request, and idle keep-alive connections
    closed after :data:`_KEEPALIVE_S`, before a server's own keep-alive timeout (uvicorn's 5 s,
    vLLM's frontend) can close one just as it is reused."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        connector=aiohttp.TCPConnector(keepalive_timeout=_KEEPALIVE_S),
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


async def run_round(
    client: ProbeClient, prompts: list[tuple[list[int], int]], concurrency: int, stream: bool
) -> Round:
    """Send ``prompts`` (token ids, output tokens) to one server, up to ``concurrency`` at a
    time, scraping its ``/metrics`` before and after (until its e2e histogram counted them).

    Raises:
        CalibrationError: the server did not answer.
    """
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


def _prepare_round(
    client: ProbeClient, phase: Phase, prefix: list[int], rng: random.Random
) -> list[tuple[list[int], int]]:
    """The prompts and output lengths of one round of ``phase`` (token ids from ``rng``)."""
    ids = client.ids
    prompts: list[tuple[list[int], int]] = []
    for _ in range(phase.requests):
        fresh = rng.randint(phase.fresh_min, phase.fresh_tokens)
        out = rng.randint(phase.output_min, phase.output_tokens)
        prompts.append(([*prefix, *_tokens(rng, ids, fresh)], out))
    return prompts


async def _reset_and_warm(client: ProbeClient, prefix: list[int], rng: random.Random) -> None:
    """Reset the cache (when allowed) and warm ``prefix`` so that a round's requests hit it."""
    if client.info.can_reset_cache:
        await reset_prefix_cache(client.session, client.info.url)
    if prefix:
        await client.complete([*prefix, *_tokens(rng, client.ids, 1)], 1)


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
    """Run every phase of ``plan`` against one server (:func:`run_plan_together` of one).

    Returns:
        One :class:`PhaseRun` per phase, in the plan's order.

    Raises:
        CalibrationError: a request failed or the server stopped answering.
    """
    return await run_plan_together(session, [info], plan, progress)


async def run_plan_together(
    session: aiohttp.ClientSession,
    infos: Sequence[ServerInfo],
    plan: ProbePlan,
    progress: Progress | None = None,
) -> list[PhaseRun]:
    """Run every phase of ``plan`` against every server of ``infos`` at once, in lockstep.

    Each round goes to every server at the same moment: all servers reset their prefix cache
    (``POST /reset_prefix_cache``, when ``info.can_reset_cache``) and warm the phase's shared
    prefix, then every server's requests of the round are sent together, and the next round
    starts when every server has answered and its histograms have counted the round. So each
    server is measured while the others run the same load, as when a router spreads one
    workload over them: what they share (a host's cores or memory bandwidth, the client that
    drives them) shows in every phase alike instead of in whichever phase happened to overlap
    another server's heavy one. With one server this is a plain sequential probe.

    Rounds are interleaved: the first round of every phase, then the second of every phase,
    and so on, so that a burst of load from elsewhere on the machine spreads over the phases
    instead of spoiling one (the fit takes each phase's median round). Prompts are random
    token ids, so nothing but a phase's warmed prefix can hit. A few unmeasured requests go
    first (:func:`_warm_up`, every server at once).

    Args:
        session: an open aiohttp session.
        infos: the servers (one or more).
        plan: the phases, the same for every server.
        progress: called after each round on each server with (rounds done, rounds in all
            over the servers, phase label).

    Returns:
        One :class:`PhaseRun` per server and phase: the servers in ``infos`` order, each
        server's phases in the plan's order.

    Raises:
        CalibrationError: a request failed or a server stopped answering.
    """
    clients = [ProbeClient(session, info) for info in infos]
    await asyncio.gather(*(c.load_ids() for c in clients))
    rngs = [random.Random(f"{plan.seed}:{c.info.url}") for c in clients]
    await asyncio.gather(*(_warm_up(c, rng, plan) for c, rng in zip(clients, rngs, strict=True)))
    prefixes = [
        [_tokens(rng, c.ids, p.prefix_tokens) for p in plan.phases]
        for c, rng in zip(clients, rngs, strict=True)
    ]
    rounds: list[list[list[Round]]] = [[[] for _ in plan.phases] for _ in clients]
    total = sum(p.rounds for p in plan.phases) * len(clients)
    done = 0
    for r in range(max((p.rounds for p in plan.phases), default=0)):
        for i, phase in enumerate(plan.phases):
            if r >= phase.rounds:
                continue
            k = range(len(clients))
            await asyncio.gather(*(_reset_and_warm(clients[j], prefixes[j][i], rngs[j]) for j in k))
            prompts = [_prepare_round(clients[j], phase, prefixes[j][i], rngs[j]) for j in k]
            measured = await asyncio.gather(
                *(run_round(clients[j], prompts[j], phase.concurrency, plan.stream) for j in k)
            )
            for j, rnd in enumerate(measured):
                rounds[j][i].append(rnd)
                done += 1
                if progress is not None:
                    progress(done, total, phase.label)
    return [
        PhaseRun(phase=p, server=c.info.url, rounds=tuple(rs))
        for c, per_phase in zip(clients, rounds, strict=True)
        for p, rs in zip(plan.phases, per_phase, strict=True)
    ]
