"""How closely an emulated replica keeps to the modelled time, under load.

Starts ``sessionroute emulate`` in a subprocess per time scale, fires ``C`` concurrent chat
requests (distinct prompts of ``W`` words, ``N`` output tokens, streaming or not) from an aiohttp
client in this process, and compares what the client saw with what the model says, both in wall
seconds: the client's mean end-to-end latency and mean time to the first streamed token against
the emulator's ``vllm:e2e_request_latency_seconds`` and ``vllm:time_to_first_token_seconds``
means (deltas over the run, simulated seconds) divided by the time scale. The gap is emulator
and client overhead (HTTP, JSON, tokenizing, Python scheduling on a shared machine).

Follows the bench-target interface (``add_arguments``, ``run``, ``print_table``); run it with
``python -m sessionroute.emulate.fidelity [--scales 1,10,100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["add_arguments", "print_table", "run"]

_LOADS = ((1, 64, 200, True), (32, 256, 500, False), (32, 256, 500, True), (64, 512, 2000, True))
"""Default (concurrency, output tokens, prompt words, stream) rows."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options: ``--scales`` (comma-separated time scales), ``--profile``."""
    parser.add_argument("--scales", default="1,10,100", help="time scales (default 1,10,100)")
    parser.add_argument("--profile", default="toy-8b-h100-tp1", help="step-time profile")


async def _scrape(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    async with s.get(url + "/metrics") as r:
        for fam in text_string_to_metric_families(await r.text()):
            for smp in fam.samples:
                if "le" not in smp.labels:
                    out[smp.name] = smp.value
    return out


async def _load(
    url: str, scale: float, conc: int, out: int, words: int, stream: bool
) -> dict[str, Any]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        before = await _scrape(s, url)
        e2e: list[float] = []
        ttft: list[float] = []

        async def one(i: int) -> None:
            content = " ".join(f"q{i}z{j}" for j in range(words))
            body = {
                "messages": [{"role": "user", "content": content}],
                "max_tokens": out,
                "stream": stream,
                "seed": i,
            }
            t0 = time.perf_counter()
            first = None
            async with s.post(url + "/v1/chat/completions", json=body) as r:
                if stream:
                    async for line in r.content:
                        if first is None and b'"content":" ' in line:
                            first = time.perf_counter() - t0
                else:
                    await r.read()
            e2e.append(time.perf_counter() - t0)
            if first is not None:
                ttft.append(first)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(conc)))
        wall = time.perf_counter() - t0
        after = await _scrape(s, url)

    def mean(name: str) -> float:
        d_sum = after[name + "_sum"] - before.get(name + "_sum", 0.0)
        return d_sum / (after[name + "_count"] - before.get(name + "_count", 0.0))

    return {
        "time_scale": scale,
        "concurrency": conc,
        "output_tokens": out,
        "prompt_words": words,
        "stream": stream,
        "batch_wall_s": wall,
        "client_e2e_ms": 1000 * statistics.mean(e2e),
        "model_e2e_ms": 1000 * mean("vllm:e2e_request_latency_seconds") / scale,
        "client_ttft_ms": 1000 * statistics.mean(ttft) if ttft else None,
        "model_ttft_ms": 1000 * mean("vllm:time_to_first_token_seconds") / scale,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every load at every time scale; returns ``{"rows": [...]}`` (ms and s)."""
    rows: list[dict[str, Any]] = []
    for scale in (float(x) for x in str(args.scales).split(",")):
        cmd = [sys.executable, "-m", "sessionroute.cli", "emulate", "--port", "0"]
        cmd += ["--time-scale", str(scale), "--profile", args.profile, "--log-level", "warning"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            if proc.stdout is None:
                raise RuntimeError("no stdout from sessionroute emulate")
            url = proc.stdout.readline().strip()
            if not url:
                raise RuntimeError("sessionroute emulate did not print a URL")
            for load in _LOADS:
                rows.append(asyncio.run(_load(url, scale, *load)))
        finally:
            proc.terminate()
            proc.wait()
    return {"profile": args.profile, "rows": rows}


def print_table(result: dict[str, Any]) -> None:
    """One line per row: client vs modelled latencies in wall milliseconds."""
    print(f"profile {result['profile']}; client / model, wall ms")
    for r in result["rows"]:
        line = (
            f"scale {r['time_scale']:>5g} C={r['concurrency']:<3} out={r['output_tokens']:<4} "
            f"prompt={r['prompt_words']}w {'stream' if r['stream'] else 'plain '} | "
            f"e2e {r['client_e2e_ms']:8.1f} / {r['model_e2e_ms']:8.1f}"
        )
        if r["client_ttft_ms"] is not None:
            line += f" | ttft {r['client_ttft_ms']:7.1f} / {r['model_ttft_ms']:7.1f}"
        print(line)


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(parser)
    print_table(run(parser.parse_args()))
