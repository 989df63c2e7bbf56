"""``sessionroute bench scale``: one router in front of many workers holding many live sessions
(issue 39, the scale run).

What it runs, all on 127.0.0.1 on free ports, every process stopped by its PID at the end:
``--workers`` zero-delay backends (:func:`sessionroute.bench.backend.backend_main`, several
ports per process, ``--backend-procs`` processes: each answers a one-token chat completion at
once) and, per ``--state`` mode, one ``sessionroute serve`` (``--policy``, default
``sticky_least_loaded``) with its session table in process (``local``) or on a
``redis-server`` child (``redis``, ``--state-url``). A closed-loop aiohttp client
(``--concurrency`` requests in flight) then:

1. opens sessions up to each level of ``--sessions`` (first turns, each with a new
   ``x-session-id``; none is released, so every one stays live: the TTL is 2 hours);
2. at each level, for ``--measure-secs``, sends later turns of sessions drawn at random among
   the live ones, and measures them;
3. after the last level, releases sessions (``/finish_session``) back down to the first level
   and measures again, so the first level is measured before and after the largest.

Before each window the same client measures the backends directly for as long (a random worker
per request): the latency the router adds is its p50/p99 minus that window's. Per measured
window: requests per second, p50/p99 latency, router CPU per request (``utime + stime`` of the
router process from ``/proc/<pid>/stat`` over the window, all its threads, background work such
as health checks and lease renewals included), router RSS, and with Redis, from ``INFO
commandstats`` over the window (background lease renewals included): ``EVALSHA`` calls per
request (the round trips of the router's scripts) and commands per request (the scripts' own
``redis.call`` included), and the router's own count of request-path round trips
(``sessionroute_state_round_trips_total``). The summary gives each mode's CPU per request at
the largest level over the first (a flat request path is ~1) and the RSS per session (the RSS
growth from the first level to the largest over the sessions added).

Bounded: each window is ``--measure-secs`` and the fill is ``--sessions`` requests; the
default run (64 workers; 1,000 and 10,000 sessions; both modes) takes about two minutes on
two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import time
from typing import Any

import aiohttp
import numpy as np

from sessionroute.bench.backend import chat_body, free_port
from sessionroute.bench.chaos_fleet import Child, rss_mib
from sessionroute.bench.options import at_least, positive_float
from sessionroute.bench.proxy import _cpu_seconds

__all__ = ["add_arguments", "exit_status", "print_table", "run"]

_BODY = chat_body(0)
_HEADERS = {"content-type": "application/json"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``sessionroute bench scale``."""
    a = parser.add_argument
    a("--workers", type=at_least(1), default=64, help="zero-delay backends (64)")
    a(
        "--sessions",
        type=at_least(1),
        nargs="+",
        default=[1000, 10000],
        help="live-session levels measured, ascending (1000 10000)",
    )
    a(
        "--state",
        nargs="+",
        choices=["local", "redis"],
        default=["local", "redis"],
        help="session table in the router (local) or on a redis-server child (redis)",
    )
    a("--policy", default="sticky_least_loaded", help="the router's policy")
    a("--concurrency", type=at_least(1), default=16, help="requests in flight (16)")
    a("--measure-secs", type=positive_float, default=5.0, help="seconds per window (5)")
    a("--backend-procs", type=at_least(1), default=2, help="processes serving the workers (2)")
    a("--seed", type=int, default=0, help="seed of the session draws (0)")


def _sid(k: int) -> str:
    """Session ``k``'s id: 36 characters, like a UUID."""
    return f"{k:08d}-0000-4000-8000-000000000000"


class _Load:
    """The closed-loop client: ``concurrency`` requests in flight."""

    def __init__(
        self, http: aiohttp.ClientSession, concurrency: int, seed: int, workers: list[str]
    ) -> None:
        self.http = http
        self.direct = [w + "/v1/chat/completions" for w in workers]
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.errors = 0

    async def _post(self, url: str, sid: str | None) -> float:
        headers = _HEADERS if sid is None else {**_HEADERS, "x-session-id": sid}
        t = time.perf_counter()
        try:
            async with self.http.post(url, data=_BODY, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    self.errors += 1
        except (TimeoutError, aiohttp.ClientError):
            self.errors += 1
        return time.perf_counter() - t

    async def each(self, url: str, sids: range) -> None:
        """One request per session of ``sids`` (first turns), ``concurrency`` at a time."""
        it = iter(sids)

        async def worker() -> None:
            for k in it:
                await self._post(url, _sid(k))

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    async def release(self, url: str, sids: range) -> None:
        """``/finish_session`` of each session of ``sids``."""
        it = iter(sids)

        async def worker() -> None:
            for k in it:
                async with self.http.post(url, params={"session_id": _sid(k)}) as r:
                    await r.read()
                    self.errors += r.status != 200

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))

    async def window(self, urls: list[str], live: int, secs: float) -> list[float]:
        """Later turns of random live sessions (to a random one of ``urls``) for ``secs``;
        the latency of each, seconds."""
        out: list[float] = []
        end = time.monotonic() + secs
        rng = self.rng

        async def worker() -> None:
            while time.monotonic() < end:
                url = urls[rng.randrange(len(urls))]
                out.append(await self._post(url, _sid(rng.randrange(live))))

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))
        return out


async def _redis_stats(url: str) -> tuple[int, int, int]:
    """(commands Redis ran so far, the scripts' own ``redis.call`` included and ``INFO``
    excluded; ``EVALSHA`` calls so far, one per script round trip; ``used_memory`` bytes)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        memory = await client.info("memory")
    finally:
        await client.aclose()
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    evalsha = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return calls, evalsha, int(memory["used_memory"])


async def _round_trips(http: aiohttp.ClientSession, router: str) -> float:
    async with http.get(router + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("sessionroute_state_round_trips_total "):
            return float(line.split()[1])
    return 0.0


def _latency(lat: list[float]) -> dict[str, float]:
    ms = np.asarray(lat) * 1000.0
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99))}


async def _measure(
    load: _Load, router: Child, redis: Child | None, live: int, secs: float, phase: str
) -> dict[str, Any]:
    """One measured window through ``router`` at ``live`` live sessions."""
    assert router.pid is not None
    pid = router.pid
    direct = _latency(await load.window(load.direct, 1, secs))  # just before: same machine load
    before = await _redis_stats(redis.url) if redis else None
    trips0 = await _round_trips(load.http, router.url) if redis else 0.0
    cpu0 = sum(_cpu_seconds(pid))
    t0 = time.monotonic()
    lat = await load.window([router.url + "/v1/chat/completions"], live, secs)
    wall = time.monotonic() - t0
    cpu1 = sum(_cpu_seconds(pid))
    n = len(lat)
    row: dict[str, Any] = {
        "phase": phase,
        "live_sessions": live,
        "requests": n,
        "rps": n / wall,
        **_latency(lat),
        "direct_p50_ms": direct["p50_ms"],
        "direct_p99_ms": direct["p99_ms"],
        "router_cpu_us_per_req": (cpu1 - cpu0) * 1e6 / n,
        "router_rss_mib": rss_mib(pid),
    }
    if redis is not None and before is not None:
        trips1 = await _round_trips(load.http, router.url)
        after = await _redis_stats(redis.url)
        row["redis_commands_per_req"] = (after[0] - before[0]) / n
        row["redis_evalsha_per_req"] = (after[1] - before[1]) / n
        row["router_round_trips_per_req"] = (trips1 - trips0) / n
        row["redis_used_memory_mib"] = after[2] / 2**20
    return row


def _router(policy: str, workers: list[str], state_url: str | None) -> Child:
    port = free_port()
    cmd = [sys.executable, "-m", "sessionroute.cli", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--policy", policy, "--log-level", "warning"]
    cmd += ["--worker-urls", *workers]
    if state_url is not None:
        cmd += ["--state-url", state_url, "--state-key-prefix", "scale"]
    return Child("router", "router", cmd, port)


def _redis() -> Child:
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--state redis needs redis-server (apt-get install -y redis-server)")
    port = free_port()
    cmd = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    cmd += ["--appendonly", "no", "--protected-mode", "no"]
    return Child("redis", "redis", cmd, port)


async def _mode(
    args: argparse.Namespace, load: _Load, workers: list[str], mode: str
) -> list[dict[str, Any]]:
    """Every level through a fresh router (and Redis) in ``mode``."""
    redis = _redis() if mode == "redis" else None
    router = _router(args.policy, workers, redis.url if redis else None)
    rows: list[dict[str, Any]] = []
    try:
        if redis is not None:
            await redis.start()
        await router.start()
        levels = sorted(set(args.sessions))
        live = 0
        url = router.url + "/v1/chat/completions"
        for level in levels:
            await load.each(url, range(live, level))
            if not live:  # unmeasured: the router's first requests (connections, caches)
                await load.window([url], level, 1.0)
            live = level
            rows.append(await _measure(load, router, redis, live, args.measure_secs, f"{live}"))
        if len(levels) > 1:
            await load.release(router.url + "/finish_session", range(levels[0], live))
            live = levels[0]
            phase = f"{live} again"
            rows.append(await _measure(load, router, redis, live, args.measure_secs, phase))
    finally:
        router.stop()
        if redis is not None:
            redis.stop()
    for row in rows:
        row["mode"] = mode
        row["added_p50_ms"] = row["p50_ms"] - row["direct_p50_ms"]
        row["added_p99_ms"] = row["p99_ms"] - row["direct_p99_ms"]
    return rows


def _summary(rows: list[dict[str, Any]], levels: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lo, hi = str(min(levels)), str(max(levels))
    for mode in sorted({r["mode"] for r in rows}):
        by = {r["phase"]: r for r in rows if r["mode"] == mode}
        if lo not in by or hi not in by or lo == hi:
            continue
        cpu = by[hi]["router_cpu_us_per_req"] / by[lo]["router_cpu_us_per_req"]
        again = by.get(f"{lo} again")
        grown = (by[hi]["router_rss_mib"] - by[lo]["router_rss_mib"]) * 2**20
        out[mode] = {
            "cpu_per_req_largest_over_first": cpu,
            "cpu_per_req_largest_over_first_again": (
                by[hi]["router_cpu_us_per_req"] / again["router_cpu_us_per_req"] if again else None
            ),
            "rss_bytes_per_session": grown / (int(hi) - int(lo)),
        }
        if "redis_used_memory_mib" in by[hi]:
            used = by[hi]["redis_used_memory_mib"] - by[lo]["redis_used_memory_mib"]
            out[mode]["redis_bytes_per_session"] = used * 2**20 / (int(hi) - int(lo))
    return out


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    ports = [free_port() for _ in range(args.workers)]
    workers = [f"http://127.0.0.1:{p}" for p in ports]
    procs = min(args.backend_procs, args.workers)
    backends = []
    for i in range(procs):
        mine = ports[i::procs]
        code = f"from sessionroute.bench.backend import backend_main; backend_main(*{mine!r})"
        backends.append(Child(f"backends{i}", "replica", [sys.executable, "-c", code], mine[0]))
    me = asyncio.current_task()
    if me is not None:  # SIGTERM: stop every child as Ctrl-C does
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
    rows: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        await asyncio.gather(*(b.start() for b in backends))
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
            load = _Load(http, args.concurrency, args.seed, workers)
            for mode in args.state:
                rows += await _mode(args, load, workers, mode)
            errors = load.errors
    finally:
        for b in backends:
            b.stop()
            b.log.close()
    levels = sorted(set(args.sessions))
    return {
        "benchmark": "scale",
        "workers": args.workers,
        "sessions": levels,
        "policy": args.policy,
        "concurrency": args.concurrency,
        "measure_secs": args.measure_secs,
        "rows": rows,
        "summary": _summary(rows, levels),
        "errors": errors,
        "ok": errors == 0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the scale bench (module docstring); returns the result document."""
    try:
        return asyncio.run(_run(args))
    except asyncio.CancelledError:
        print("sessionroute bench scale: stopped; its processes were stopped", file=sys.stderr)
        raise SystemExit(143) from None


def exit_status(result: dict[str, Any]) -> int:
    """1 when a request failed."""
    return 0 if result["ok"] else 1


def print_table(result: dict[str, Any]) -> None:
    """One row per measured window, then the summary."""
    from rich.console import Console
    from rich.table import Table

    r = result
    console = Console(width=max(Console().width, 140))
    t = Table(
        title=f"scale: {r['workers']} workers, {r['policy']}, {r['concurrency']} in flight, "
        f"{r['measure_secs']:g} s windows (latency in ms, CPU in us per request)"
    )
    cols = ("state", "sessions", "req/s", "p50", "p99", "+p50", "+p99", "CPU us", "RSS MiB")
    # +p50/+p99: over the backends measured directly in the window just before
    for col in (*cols, "EVALSHA/req", "cmds/req", "trips/req"):
        t.add_column(col, justify="left" if col == "state" else "right")

    def f(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for row in r["rows"]:
        t.add_row(
            row["mode"], row["phase"], f(row["rps"], ".0f"), f(row["p50_ms"], ".2f"),
            f(row["p99_ms"], ".2f"), f(row["added_p50_ms"], "+.2f"),
            f(row["added_p99_ms"], "+.2f"), f(row["router_cpu_us_per_req"], ".0f"),
            f(row["router_rss_mib"], ".1f"), f(row.get("redis_evalsha_per_req"), ".2f"),
            f(row.get("redis_commands_per_req"), ".1f"),
            f(row.get("router_round_trips_per_req"), ".2f"),
        )  # fmt: skip
    console.print(t)
    for mode, s in r["summary"].items():
        again = s["cpu_per_req_largest_over_first_again"]
        line = (
            f"{mode}: router CPU per request at {max(r['sessions'])} sessions over "
            f"{min(r['sessions'])}: {s['cpu_per_req_largest_over_first']:.2f}"
            + ("" if again is None else f" (over the first level again: {again:.2f})")
            + f"; router RSS per session {s['rss_bytes_per_session']:.0f} bytes"
        )
        if "redis_bytes_per_session" in s:
            line += f"; Redis memory per session {s['redis_bytes_per_session']:.0f} bytes"
        console.print(line)
    console.print(("OK" if r["ok"] else "FAILED") + f": {r['errors']} requests failed")
