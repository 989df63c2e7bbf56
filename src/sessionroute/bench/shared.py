"""``sessionroute bench shared-state``: do sessions stay on their worker across routers?

Starts ``--workers`` zero-delay backends (each names itself in an ``x-worker`` response
header) and ``--routers`` ``sessionroute serve`` processes that share one Redis
(``--state-url``; ``auto`` starts a redis-server child on a free loopback port; ``none`` gives
each router its own in-process state, to show what sharing buys). Then ``--sessions``
sessions each send ``--turns`` turns, turn ``t`` of a session through router
``(k + t) mod R``, so consecutive turns of a session go through different routers. With
``--restart`` router 0 is killed (SIGKILL) and started again after every session's first turn.

Reported: failed requests; mismatches (later turns not on the worker of the session's first
turn); sessions re-placed (sessions with at least one mismatch); sessions per worker. The
exit status is 1 when any request failed or any turn mismatched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import aiohttp

from sessionroute.bench.backend import free_port
from sessionroute.bench.proxy import _start_redis, _wait_listening

__all__ = ["add_arguments", "exit_status", "print_table", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``sessionroute bench shared-state``."""
    parser.add_argument("--sessions", type=int, default=1000, help="sessions (1000)")
    parser.add_argument("--turns", type=int, default=3, help="turns per session (3)")
    parser.add_argument("--routers", type=int, default=2, help="routers (2)")
    parser.add_argument("--workers", type=int, default=3, help="backends (3)")
    parser.add_argument("--policy", default="sticky_least_loaded", help="policy of the routers")
    parser.add_argument(
        "--state-url",
        default="auto",
        help="Redis URL the routers share, 'auto' (a redis-server child) or 'none' (each "
        "router keeps its own state)",
    )
    parser.add_argument(
        "--restart", action="store_true", help="kill and restart router 0 after the first turns"
    )
    parser.add_argument(
        "--concurrency", type=int, default=32, help="requests in flight at once (32)"
    )


def _backend_app(name: str) -> Any:
    from aiohttp import web

    body = b'{"id":"x","object":"chat.completion","choices":[]}'

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json", headers={"x-worker": name})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_get("/health", health)
    return app


def _router_cmd(
    args: argparse.Namespace, port: int, workers: list[str], url: str | None
) -> list[str]:
    cmd = [sys.executable, "-m", "sessionroute.cli", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--policy", args.policy, "--worker-urls", *workers]
    cmd += ["--log-level", "warning", "--scrape-interval-secs", "0"]
    if url is not None:
        cmd += ["--state-url", url, "--state-key-prefix", f"bench-shared-{os.getpid()}"]
    return cmd


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import web

    if min(args.sessions, args.turns, args.routers, args.workers, args.concurrency) < 1:
        from sessionroute.errors import ConfigError

        raise ConfigError("--sessions, --turns, --routers, --workers, --concurrency must be >= 1")
    procs: list[subprocess.Popen[bytes]] = []
    runners: list[web.AppRunner] = []
    routers: list[subprocess.Popen[bytes] | None] = []
    try:
        workers = []
        for i in range(args.workers):
            runner = web.AppRunner(_backend_app(f"w{i}"))
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
            workers.append(f"http://127.0.0.1:{port}")
        state_url = None if args.state_url == "none" else args.state_url
        if state_url == "auto":
            state_url = _start_redis(procs)
        ports = [free_port() for _ in range(args.routers)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]

        async def start(i: int) -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(
                _router_cmd(args, ports[i], workers, state_url),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await _wait_listening(urls[i], proc, 60)
            return proc

        for i in range(args.routers):
            routers.append(await start(i))
        first: dict[int, str] = {}
        mismatches = 0
        failed = 0
        moved: set[int] = set()
        sem = asyncio.Semaphore(args.concurrency)
        t0 = time.perf_counter()
        async with aiohttp.ClientSession() as client:

            async def turn(k: int, t: int) -> None:
                nonlocal mismatches, failed
                url = urls[(k + t) % args.routers] + "/v1/chat/completions"
                body = {"model": "m", "messages": [{"role": "user", "content": f"turn {t}"}]}
                async with sem:
                    try:
                        async with client.post(
                            url, json=body, headers={"x-session-id": f"bench-{k}"}
                        ) as r:
                            await r.read()
                            worker = r.headers.get("x-worker")
                            ok = r.status == 200 and worker is not None
                    except aiohttp.ClientError:
                        ok, worker = False, None
                if not ok or worker is None:
                    failed += 1
                elif t == 0:
                    first[k] = worker
                elif first.get(k) != worker:
                    mismatches += 1
                    moved.add(k)

            for t in range(args.turns):
                if t == 1 and args.restart:
                    old = routers[0]
                    if old is not None:
                        old.send_signal(signal.SIGKILL)
                        old.wait(10)
                    routers[0] = await start(0)
                await asyncio.gather(*(turn(k, t) for k in range(args.sessions)))
        wall = time.perf_counter() - t0
    finally:
        for p in [*procs, *(r for r in routers if r is not None)]:
            if p.poll() is None:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(20)
        for runner in runners:
            await runner.cleanup()
    split = Counter(first.values())
    return {
        "benchmark": "shared-state",
        "sessions": args.sessions,
        "turns": args.turns,
        "routers": args.routers,
        "workers": args.workers,
        "policy": args.policy,
        "state": "none" if state_url is None else "redis",
        "restart": args.restart,
        "requests": args.sessions * args.turns,
        "failed": failed,
        "mismatches": mismatches,
        "sessions_replaced": len(moved),
        "sessions_per_worker": [split.get(f"w{i}", 0) for i in range(args.workers)],
        "wall_s": wall,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the check (module docstring); returns the result document."""
    return asyncio.run(_run(args))


def exit_status(result: dict[str, Any]) -> int:
    """1 when a request failed or a later turn left its session's worker."""
    return 1 if result["failed"] or result["mismatches"] else 0


def print_table(result: dict[str, Any]) -> None:
    """Print the result."""
    r = result
    print(
        f"{r['sessions']} sessions x {r['turns']} turns over {r['routers']} routers, "
        f"{r['workers']} workers, {r['policy']}, state {r['state']}"
        f"{', router 0 restarted after the first turns' if r['restart'] else ''}:"
    )
    print(f"  requests {r['requests']}, failed {r['failed']}, wall {r['wall_s']:.1f} s")
    print(f"  mismatches {r['mismatches']}, sessions re-placed {r['sessions_replaced']}")
    print(f"  sessions per worker {r['sessions_per_worker']}")
