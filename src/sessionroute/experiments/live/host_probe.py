"""Measuring how the servers of one host slow each other (``compare --fidelity``).

:func:`probe_host_share` runs rounds of ``streams`` decodes of ``tokens`` tokens each
(``/v1/completions``, streamed, ``ignore_eos``) on the first server alone and on every server at
once, alternating, and reads vLLM's own mean inter-token latency of each round from the
servers' ``/metrics`` (``vllm:inter_token_latency_seconds`` sum and count): the servers' pace,
not the client's. :func:`sessionroute.calibrate.hostshare.fit_host_share` fits the ratio.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from sessionroute.calibrate.hostshare import HostShareFit, fit_host_share
from sessionroute.experiments.live.scrape import scrape_all, served_model_info

__all__ = ["probe_host_share"]


async def _decode(client: httpx.AsyncClient, url: str, model: str, tokens: int, k: int) -> None:
    body = {
        "model": model,
        "prompt": f"probe {k}: the servers of one host",
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for _ in r.aiter_bytes():
            pass


async def _round(
    client: httpx.AsyncClient, urls: Sequence[str], model: str, streams: int, tokens: int
) -> float | None:
    """vLLM's mean inter-token latency over one round on ``urls`` (None: not exported)."""
    before = await scrape_all(client, urls)
    await asyncio.gather(
        *(_decode(client, u, model, tokens, k) for u in urls for k in range(streams))
    )
    after = await scrape_all(client, urls)
    total = count = 0.0
    for a, b in zip(after, before, strict=True):
        d = a.delta(b)
        total += d.get("itl_sum_s", 0.0)
        count += d.get("itl_count", 0.0)
    return total / count if count > 0 else None


async def probe_host_share(
    urls: Sequence[str], *, streams: int = 4, tokens: int = 64, rounds: int = 3
) -> HostShareFit | None:
    """Decode rounds alone and together (module docstring) and the fitted ``host_share``;
    None when the servers export no inter-token latency or there is one server.

    Raises:
        httpx.HTTPError: a server did not answer.
    """
    if len(urls) < 2:
        return None
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        model, _ = await served_model_info(client, urls[0])
        await _round(client, urls, model, 1, 8)  # warm every server
        alone: list[float] = []
        together: list[float] = []
        for _ in range(rounds):
            a = await _round(client, urls[:1], model, streams, tokens)
            t = await _round(client, urls, model, streams, tokens)
            if a is not None and t is not None:
                alone.append(a)
                together.append(t)
    if not alone:
        return None
    return fit_host_share(alone, together, len(urls))
