"""``sessionroute bench soak``: does the router's memory stay flat under sessions that are never
released (issue 19)?

What it does: the bench's zero-delay backend and ``sessionroute serve`` run as their own
processes; a closed-loop aiohttp client sends ``--concurrency`` requests at a time, each with a
new ``x-session-id`` that is never released (``/finish_session`` is never called), for
``--duration`` seconds. The router expires idle sessions after ``--session-ttl-secs`` and caps
its table at ``max_sessions``, so after one TTL its memory should stop growing. Every
``--sample-secs`` the router's resident set size (``VmRSS`` of ``/proc/<pid>/status``) and its
live session count are sampled.

Reported: the samples, errors, and the RSS growth over the second half of the run (MiB and
percent); ``flat`` when that growth is under 5 % (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from typing import Any

import aiohttp

from sessionroute.bench.backend import chat_body, free_port
from sessionroute.bench.proxy import _start

__all__ = ["add_arguments", "exit_status", "print_table", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``soak`` options."""
    a = parser.add_argument
    a("--duration", type=float, default=600.0, help="seconds of load (600)")
    a("--concurrency", type=int, default=16, help="requests in flight (16)")
    a("--sample-secs", type=float, default=10.0, help="seconds between RSS samples (10)")
    a("--session-ttl-secs", type=float, default=60.0, help="the router's session TTL (60)")
    a("--policy", default="sticky_least_loaded", help="the router's policy")


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def _sessions(client: aiohttp.ClientSession, url: str) -> int | None:
    with contextlib.suppress(aiohttp.ClientError, ValueError):
        async with client.get(url + "/metrics") as r:
            lines = (await r.text()).splitlines()
            return sum(
                int(float(line.split()[-1]))
                for line in lines
                if line.startswith("sessionroute_active_sessions{")
            )
    return None


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        bport, rport = free_port(), free_port()
        backend = f"http://127.0.0.1:{bport}"
        code = f"from sessionroute.bench.backend import backend_main; backend_main({bport})"
        await _start([sys.executable, "-c", code], backend, bport, procs)
        router = f"http://127.0.0.1:{rport}"
        cmd = [sys.executable, "-m", "sessionroute.cli", "serve", "--port", str(rport)]
        cmd += ["--worker-urls", backend, "--policy", args.policy, "--log-level", "warning"]
        cmd += ["--session-ttl-secs", repr(args.session_ttl_secs)]
        cmd += ["--session-sweep-interval-secs", repr(max(1.0, args.session_ttl_secs / 10))]
        pid = await _start(cmd, router, rport, procs)
        body = chat_body(2048)
        samples: list[dict[str, Any]] = []
        sent = errors = 0
        t0 = time.monotonic()
        end = t0 + args.duration
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=args.concurrency)
        ) as client:

            async def worker(k: int) -> None:
                nonlocal sent, errors
                n = 0
                while time.monotonic() < end:
                    n += 1
                    headers = {"Content-Type": "application/json", "x-session-id": f"s{k}-{n}"}
                    try:
                        async with client.post(
                            router + "/v1/chat/completions", data=body, headers=headers
                        ) as r:
                            await r.read()
                            errors += r.status != 200
                    except aiohttp.ClientError:
                        errors += 1
                    sent += 1

            async def sampler(probe: aiohttp.ClientSession) -> None:
                while True:  # its own connection: the load's pool is always busy
                    now = time.monotonic()
                    row: dict[str, Any] = {"t_s": round(now - t0, 1), "requests": sent}
                    row["rss_mib"] = round(_rss_mib(pid), 1)
                    row["sessions"] = await _sessions(probe, router)
                    samples.append(row)
                    if now >= end:
                        return
                    await asyncio.sleep(min(args.sample_secs, max(0.0, end - now)))

            async with aiohttp.ClientSession() as probe:
                await asyncio.gather(sampler(probe), *(worker(k) for k in range(args.concurrency)))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
    half = [s for s in samples if s["t_s"] >= args.duration / 2] or samples[-1:]
    growth = half[-1]["rss_mib"] - half[0]["rss_mib"]
    return {
        "benchmark": "soak",
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "session_ttl_s": args.session_ttl_secs,
        "requests": sent,
        "errors": errors,
        "samples": samples,
        "second_half_growth_mib": round(growth, 1),
        "second_half_growth_pct": round(100.0 * growth / half[0]["rss_mib"], 2),
        "flat": growth < 0.05 * half[0]["rss_mib"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak (module docstring); returns the result document."""
    return asyncio.run(_run(args))


def exit_status(result: dict[str, Any]) -> int:
    """1 when the memory grew over the second half, or a request failed."""
    return 0 if result["flat"] and not result["errors"] else 1


def print_table(result: dict[str, Any]) -> None:
    """Print the samples and the verdict."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"soak: {result['duration_s']:g} s, never-released sessions, "
        f"TTL {result['session_ttl_s']:g} s"
    )
    for col in ("t (s)", "RSS (MiB)", "live sessions", "requests"):
        table.add_column(col, justify="right")
    for s in result["samples"]:
        table.add_row(str(s["t_s"]), str(s["rss_mib"]), str(s["sessions"]), str(s["requests"]))
    console = Console()
    console.print(table)
    console.print(
        f"errors {result['errors']}; RSS growth over the second half "
        f"{result['second_half_growth_mib']} MiB ({result['second_half_growth_pct']} %): "
        + ("flat" if result["flat"] else "GROWING")
    )
