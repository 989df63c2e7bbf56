"""A held-out check of a fitted profile: one probe-like workload live and through the model.

Requests with Poisson arrivals, a shared prefix per "family" (so that some of each prompt is
cached) plus fresh tokens, and varied output lengths go to the server as streaming completions
(client-side time to first token and inter-token gaps); the same requests, at the same arrival
offsets, go through the replica model (:class:`sessionroute.replica.Replica`) with the profile.
The workload is not one the fit saw: it mixes arrivals, prefill and decode in one run.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from sessionroute.calibrate.probe import (
    ProbeClient,
    RequestRecord,
    probe_session,
    reset_prefix_cache,
)
from sessionroute.calibrate.server import ServerInfo, scrape
from sessionroute.replica import EngineRequest, Replica, ReplicaConfig, StepTimeProfile
from sessionroute.replica import chain_block_keys as block_keys

__all__ = ["CheckResult", "CheckWorkload", "check_profile"]


@dataclass(frozen=True, slots=True)
class CheckWorkload:
    """The check's workload.

    Attributes:
        requests: requests sent.
        rate_per_s: Poisson arrival rate, requests per second.
        families: shared prefixes (each ``prefix_tokens`` long); a request draws one.
        prefix_tokens: tokens of a family prefix.
        fresh: (min, max) fresh prompt tokens after the prefix.
        output: (min, max) output tokens.
        seed: seed of arrivals, lengths and token ids.
    """

    requests: int = 48
    rate_per_s: float = 6.0
    families: int = 3
    prefix_tokens: int = 256
    fresh: tuple[int, int] = (16, 384)
    output: tuple[int, int] = (16, 64)
    seed: int = 1


@dataclass(frozen=True, slots=True)
class CheckResult:
    """Live vs model on the check workload.

    Attributes:
        live: ``{"ttft_p50_s", "ttft_mean_s", "itl_p50_s", "itl_mean_s", "tok_per_s"}``
            measured at the client.
        sim: the same, from the replica model.
        requests: requests compared.
        server: vLLM's own means over the run (``ttft_mean_s``, ``itl_mean_s`` from its
            histograms): against ``live``, how much of the client's time is the server's.
    """

    live: dict[str, float]
    sim: dict[str, float]
    requests: int
    server: dict[str, float] = field(default_factory=dict)

    def errors(self) -> dict[str, float]:
        """``sim / live - 1`` per metric."""
        return {k: self.sim[k] / self.live[k] - 1.0 for k in self.live if self.live[k] > 0}


@dataclass(frozen=True, slots=True)
class _Req:
    at_s: float
    prompt: list[int]
    output: int


def _requests(w: CheckWorkload, ids: list[int]) -> list[_Req]:
    rng = random.Random(w.seed)
    fams = [[rng.choice(ids) for _ in range(w.prefix_tokens)] for _ in range(w.families)]
    t = 0.0
    out = []
    for _ in range(w.requests):
        t += rng.expovariate(w.rate_per_s)
        fresh = [rng.choice(ids) for _ in range(rng.randint(*w.fresh))]
        out.append(_Req(t, [*rng.choice(fams), *fresh], rng.randint(*w.output)))
    return out


def _summary(ttft: list[float], itl: list[float], tokens: int, span: float) -> dict[str, float]:
    return {
        "ttft_p50_s": statistics.median(ttft),
        "ttft_mean_s": statistics.fmean(ttft),
        "itl_p50_s": statistics.median(itl),
        "itl_mean_s": statistics.fmean(itl),
        "tok_per_s": tokens / span,
    }


async def _live(
    client: ProbeClient, reqs: list[_Req]
) -> tuple[list[tuple[float, RequestRecord]], dict[str, float]]:
    """Send ``reqs`` at their arrival offsets; (sent offset, record) per request, and vLLM's
    own TTFT and ITL means over the run."""
    await reset_prefix_cache(client.session, client.info.url)
    before = await scrape(client.session, client.info.url, client.info.model)
    t0 = time.perf_counter()

    async def one(req: _Req) -> tuple[float, RequestRecord]:
        delay = t0 + req.at_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter() - t0
        return sent, await client.complete(req.prompt, req.output)

    out = list(await asyncio.gather(*(one(r) for r in reqs)))
    after = await scrape(client.session, client.info.url, client.info.model)
    server = {}
    for key, hist in (
        ("ttft_mean_s", "vllm:time_to_first_token_seconds"),
        ("itl_mean_s", "vllm:inter_token_latency_seconds"),
    ):
        mean = after.mean_delta(before, hist)
        if mean is not None:
            server[key] = mean
    return out, server


def _simulate(
    profile: StepTimeProfile, block_size: int, reqs: list[_Req], sent: list[float]
) -> list[tuple[float, float, float]]:
    rep = Replica(ReplicaConfig(profile, block_size=block_size))
    order = sorted(range(len(reqs)), key=lambda i: sent[i])
    done: dict[str, Any] = {}
    for i in order:
        at = sent[i]
        while (t := rep.next_event_time()) is not None and t < at:
            done.update((r.request_id, r) for r in rep.advance(t))
        done.update((r.request_id, r) for r in rep.advance(at))
        r = reqs[i]
        rep.add_request(
            EngineRequest(str(i), len(r.prompt), r.output, block_keys(r.prompt, block_size)), at
        )
    while (t := rep.next_event_time()) is not None:
        done.update((r.request_id, r) for r in rep.advance(t))
    return [
        (done[str(i)].first_token_s, done[str(i)].finish_s, done[str(i)].itl_mean_s)
        for i in range(len(reqs))
    ]


async def check_profile(
    info: ServerInfo,
    profile: StepTimeProfile,
    block_size: int,
    workload: CheckWorkload | None = None,
    ids: list[int] | None = None,
) -> CheckResult:
    """Run the check workload live on ``info`` and through the model with ``profile``.

    Args:
        info: the server (as read by ``read_server_info``).
        profile: the profile to check (e.g. the one just fitted).
        block_size: the server's KV block size, tokens.
        workload: the workload (default :class:`CheckWorkload`).
        ids: token ids prompts are drawn from (default: the server's, ``prompt_ids``).

    Raises:
        CalibrationError: a request failed.
    """
    w = workload or CheckWorkload()
    async with probe_session(300.0) as session:
        client = ProbeClient(session, info)
        if ids is None:
            await client.load_ids()
            ids = client.ids
        reqs = _requests(w, ids)
        live, server = await _live(client, reqs)
    sent = [s for s, _ in live]
    sim = _simulate(profile, block_size, reqs, sent)
    tokens = sum(r.output for r in reqs)
    live_ttft = [rec.ttft_s or 0.0 for _, rec in live]
    # mean gap over the request's tokens (stream chunks may carry several when the client lags)
    live_itl = [
        (rec.decode_s or 0.0) / (rec.output_tokens - 1) for _, rec in live if rec.output_tokens > 1
    ]
    sim_ttft = [ft - s for (ft, _, _), s in zip(sim, sent, strict=True)]
    sim_itl = [itl for (_, _, itl), r in zip(sim, reqs, strict=True) if r.output > 1]
    return CheckResult(
        live=_summary(live_ttft, live_itl, tokens, max(s + r.latency_s for s, r in live) - sent[0]),
        sim=_summary(sim_ttft, sim_itl, tokens, max(f for _, f, _ in sim) - sent[0]),
        requests=len(reqs),
        server=server,
    )
