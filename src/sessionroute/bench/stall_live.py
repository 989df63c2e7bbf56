"""``sessionroute bench stall --live``: latency of concurrent requests through a real router
while bulk session work runs on its event loop (issue 19, item 7: p99 under 10 ms while 100k
sessions expire or a worker with 50k sessions is removed).

What it does: two zero-delay backends (:mod:`sessionroute.bench.backend`) and one router
(``--policy``, ``sticky_least_loaded`` by default; the same
:func:`~sessionroute.serve.runner.start_router` that
``sessionroute serve`` runs, with uvloop) run as their own processes. A closed-loop aiohttp
client keeps ``--concurrency`` requests in flight, each client its own session, and records
every request's send time and latency. Meanwhile the router process, told over its stdin,
does the bulk work on its event loop and answers with the monotonic times it began and ended
(``time.monotonic`` is one clock for every process of the machine):

1. ``expire_chunked``: ``--sessions`` sessions are pinned, the router's clock jumps past their
   TTL, and the router's background sweep function
   (:meth:`~sessionroute.serve.router.Router.sweep_in_chunks`) expires them;
2. ``expire_one_pass``: the same with one :meth:`~sessionroute.router.RoutingCore.sweep` call,
   as before issue 19 (for contrast);
3. ``remove_worker``: ``--removed`` sessions are pinned to the second backend, which is then
   removed (``Router.remove_worker``, as ``POST /remove_worker`` does); the load's sessions on
   it move on their next turn.

Reported per event: its duration, and the latency (p50, p99, max, in milliseconds) of the
requests in flight at any moment of it, next to the same for the 2 s before it (baseline) and
the 1 s after it (``after``: the removed worker's sessions of the load move then).
Wall-clock figures: run it on an idle machine, and read the baseline row for the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from typing import Any

import aiohttp
import numpy as np

from sessionroute.bench.backend import chat_body, free_port

__all__ = ["router_main", "run_live"]

_TTL_S = 3600.0
_EVENTS = ("expire_chunked", "expire_one_pass", "remove_worker")


class _ShiftClock:
    """``time.monotonic()`` plus a shift that only grows (the bench jumps past the TTL)."""

    __slots__ = ("shift",)

    def __init__(self) -> None:
        self.shift = 0.0

    def now(self) -> float:
        return time.monotonic() + self.shift


def router_main(port: int, workers: list[str], policy: str = "sticky_least_loaded") -> None:
    """The router process: serve on ``port`` and run the bulk work told on stdin (one JSON
    command a line: ``{"op": "fill", "n": N, "prefix": P, "only": URL | null}``, ``{"op":
    "expire", "chunked": bool}``, ``{"op": "remove", "url": URL}``), answering each with one
    JSON line on stdout (``t0``/``t1``: monotonic seconds of the work)."""
    import uvloop

    uvloop.run(_router(port, workers, policy))


async def _router(port: int, workers: list[str], policy: str) -> None:
    from sessionroute.serve.config import RouterSettings
    from sessionroute.serve.runner import start_router
    from sessionroute.types import RouteRequest

    settings = RouterSettings.build(
        host="127.0.0.1",
        port=port,
        worker_urls=tuple(workers),
        policy=policy,
        session_ttl_secs=_TTL_S,
        session_sweep_interval_secs=_TTL_S,  # the bench sweeps when it says so
        log_level="warning",
    )
    clock = _ShiftClock()
    running = await start_router(settings, clock=clock)
    router = running.router
    core = router.core
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)
        loop.call_soon_threadsafe(lines.put_nowait, "")

    threading.Thread(target=read_stdin, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    try:
        while line := await lines.get():
            cmd = json.loads(line)
            out: dict[str, Any] = {"op": cmd["op"]}
            if cmd["op"] == "fill":  # setup, not measured: in slices, the load keeps going
                others = [w for w in workers if w != cmd["only"]] if cmd["only"] else []
                for i in range(0, cmd["n"], 2000):
                    for w in others:
                        core.set_health(w, False)
                    for j in range(i, min(cmd["n"], i + 2000)):
                        req = RouteRequest(session_id=f"{cmd['prefix']}{j}", prompt_tokens=100)
                        core.complete(core.route(req))
                    for w in others:
                        core.set_health(w, True)
                    await asyncio.sleep(0)
                out["sessions"] = len(core.policy.table)  # type: ignore[attr-defined]
            elif cmd["op"] == "expire":
                clock.shift += _TTL_S + 1.0  # every pinned session is now past its TTL
                out["t0"] = time.monotonic()
                if cmd["chunked"]:
                    out["n"] = await router.sweep_in_chunks()
                else:
                    out["n"] = core.sweep(clock.now())
                out["t1"] = time.monotonic()
            elif cmd["op"] == "remove":
                out["t0"] = time.monotonic()
                router.remove_worker(cmd["url"])
                out["t1"] = time.monotonic()
            print(json.dumps(out), flush=True)
    finally:
        await running.stop()


async def _start_backend(port: int, procs: list[subprocess.Popen[bytes]]) -> str:
    from sessionroute.bench.proxy import _start

    url = f"http://127.0.0.1:{port}"
    code = f"from sessionroute.bench.backend import backend_main; backend_main({port})"
    await _start([sys.executable, "-c", code], url, port, procs)
    return url


class _Control:
    """The router process's stdin/stdout, one JSON line each way."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 300)
        if not line:
            raise RuntimeError("the router process exited")
        result: dict[str, Any] = json.loads(line)
        return result

    async def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await self.read()


def _stats(lat_ms: list[float]) -> dict[str, float | int]:
    if not lat_ms:
        return {"requests": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    a = np.asarray(lat_ms)
    return {
        "requests": len(lat_ms),
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
        "max_ms": round(float(a.max()), 2),
    }


async def _live(args: argparse.Namespace) -> dict[str, Any]:
    backend_procs: list[subprocess.Popen[bytes]] = []
    router: asyncio.subprocess.Process | None = None
    try:
        a = await _start_backend(free_port(), backend_procs)
        b = await _start_backend(free_port(), backend_procs)
        rport = free_port()
        code = (
            "from sessionroute.bench.stall_live import router_main; "
            f"router_main({rport}, {[a, b]!r}, {args.policy!r})"
        )
        router = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        ctl = _Control(router)
        await ctl.read()  # ready
        url = f"http://127.0.0.1:{rport}/v1/chat/completions"
        body = chat_body(0)
        done: list[tuple[float, float]] = []  # (send, end) monotonic seconds
        errors = 0
        stop = asyncio.Event()

        async def client(k: int, http: aiohttp.ClientSession) -> None:
            nonlocal errors
            headers = {"Content-Type": "application/json", "x-session-id": f"load{k}"}
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    async with http.post(url, data=body, headers=headers) as r:
                        await r.read()
                        errors += r.status != 200
                except aiohttp.ClientError:
                    errors += 1
                done.append((t0, time.monotonic()))

        events: dict[str, dict[str, Any]] = {}
        conn = aiohttp.TCPConnector(limit=args.concurrency)
        async with aiohttp.ClientSession(connector=conn) as http:
            tasks = [asyncio.create_task(client(k, http)) for k in range(args.concurrency)]
            try:
                for name in _EVENTS:
                    if name == "remove_worker":
                        await ctl.ask(op="fill", n=args.removed, prefix="r", only=b)
                    else:
                        await ctl.ask(op="fill", n=args.sessions, prefix=name, only=None)
                    await asyncio.sleep(2.5)  # the baseline window
                    if name == "remove_worker":
                        ev = await ctl.ask(op="remove", url=b)
                    else:
                        ev = await ctl.ask(op="expire", chunked=name == "expire_chunked")
                    await asyncio.sleep(1.0)
                    events[name] = ev
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
        rows: dict[str, Any] = {}
        for name, ev in events.items():
            t0, t1 = ev["t0"], ev["t1"]
            during = [(e - s) * 1000.0 for s, e in done if s <= t1 and e >= t0]
            before = [(e - s) * 1000.0 for s, e in done if t0 - 2.0 <= s and e < t0]
            after = [(e - s) * 1000.0 for s, e in done if t1 < s <= t1 + 1.0]
            rows[name] = {
                "work_ms": round((t1 - t0) * 1000.0, 2),
                "sessions": ev.get("n"),
                "during": _stats(during),
                "baseline": _stats(before),
                "after": _stats(after),
            }
        return {"errors": errors, "requests": len(done), "events": rows}
    finally:
        if router is not None:
            if router.stdin is not None:
                router.stdin.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(router.wait(), 15)
            if router.returncode is None:
                router.terminate()
                await router.wait()
        for p in backend_procs:
            p.terminate()
        for p in backend_procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


def run_live(args: argparse.Namespace) -> dict[str, Any]:
    """Run the live measurement (module docstring); returns its part of the result."""
    return asyncio.run(_live(args))
