"""``sessionroute bench chaos``: faults while loaded (issue 39, first step).

What it runs, all on 127.0.0.1 on free ports, every process stopped by its PID at the end:
one ``redis-server`` (no persistence), ``--replicas`` emulated replicas (``sessionroute
emulate``, one process each, ``--time-scale`` times faster than the modelled GPU) and two
``sessionroute serve`` routers (``sticky_least_loaded``, ``--state-url`` on that Redis,
``--expose-worker-header``, health checks every 2 s). Multi-turn sessions, half of them
streamed, arrive at ``--rate`` per second (at most ``--concurrency`` live) for ``--duration``
seconds; every request goes to one of the two routers (:mod:`sessionroute.bench.chaos_load`).
Meanwhile the fault schedule runs, one fault at a time, each at its planned time and at least
:data:`SETTLE_S` after the previous one ended (faults are judged one at a time: a router
killed while Redis is away loses the releases it holds for replay, a case docs/router.md
leaves open):

- ``replica_crash``: replica 0 gets SIGKILL and is started again on the same port 3 s later;
- ``replica_freeze``: replica 1 gets SIGSTOP, and SIGCONT 5 s later;
- ``replica_slow``: the last replica runs 10x slower for 10 s (``POST /fault/slowdown`` of
  the emulator, started with ``--fault-routes``: it keeps answering, slowly; its ``/health``
  stays quick, as a throttled or noisy-neighboured GPU's would);
- ``redis_restart``: Redis gets SIGKILL (its data is gone) and is started again 3 s later;
- ``router_restart``: router 1 gets SIGKILL while streams are open and is started again.

``--schedule short`` runs each fault once; ``long`` runs the cycle five times over at least
30 minutes (the issue's soak; ``--duration`` defaults to 1800 there).

Checked at the end (:mod:`sessionroute.bench.chaos_report`): every session completed or
aborted with a retryable error (0 lost), every failed attempt explained by a fault, no
unexplained move of a session between workers and no flap back (two workers answering one
session), every session released by ``/finish_session`` as it ended (half through each
router; a failed try is retried on the other and explained like a turn) and the shared table
empty afterwards (Redis pins == live sessions == 0), router RSS sampled at start, after
warm-up (10 % of the run), at the end of the load and after the release: router 0's (never
restarted) at the end of the load within 10 % of its value after warm-up. Exit status 1 when
a check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

import aiohttp

from sessionroute.bench.chaos_fleet import Child, Fleet, rss_mib
from sessionroute.bench.chaos_load import Attempt, LoadConfig, SessionLog, drive, release
from sessionroute.bench.chaos_report import account
from sessionroute.bench.chaos_report import print_table as _print_table
from sessionroute.bench.chaos_watch import Unavailable, watch
from sessionroute.bench.options import at_least, positive_float

__all__ = ["add_arguments", "exit_status", "print_table", "run", "schedule"]

_CYCLE = ("replica_crash", "replica_freeze", "replica_slow", "redis_restart", "router_restart")
_TARGET = {"replica_crash": 0, "replica_freeze": 1, "redis_restart": 0, "router_restart": 1}
_HOLD_S = {"replica_crash": 3.0, "replica_freeze": 5.0, "replica_slow": 10.0, "redis_restart": 3.0}
RSS_GROWTH_MAX = 1.10
"""Router 0's RSS at the end of the load over its value after warm-up, at most."""
SETTLE_S = 3.0
"""Seconds from a fault's end to the next fault's start, at least: the routers reconnect to
Redis every second and replay what they hold, so the fleet has recovered when the next fault
comes (without it the short schedule at 40 s killed router 1 within a millisecond of Redis'
return, before it had replayed the releases it held)."""
RESUBSCRIBE_S = 5.0
"""Seconds after Redis is back within which a router may not hear releases yet (it
reconnects, and subscribes to released sessions again, every second)."""
SLOWDOWN = 10.0
"""Factor on every engine step of the slowed replica."""
_LONG_MIN_S = 1800.0
_RSS_POINTS = ("start", "after_warmup", "end_of_load", "after_release")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``sessionroute bench chaos``."""
    a = parser.add_argument
    a(
        "--schedule",
        choices=["short", "long"],
        default="short",
        help="short: each of the 5 faults once; long: the cycle 5 times over >= 30 minutes",
    )
    a(
        "--duration",
        type=positive_float,
        default=None,
        help="seconds of load (default 60 short, 1800 long; long needs >= 1800)",
    )
    a("--rate", type=positive_float, default=2.0, help="new sessions per second (2)")
    a("--concurrency", type=at_least(1), default=16, help="live sessions at most (16)")
    a("--replicas", type=at_least(2), default=3, help="emulated replicas (3)")
    a("--turns", type=at_least(2), default=5, help="turns per session at most (5)")
    a("--attempts", type=at_least(1), default=4, help="tries per turn, retries included (4)")
    a(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="emulator speed-up over the modelled GPU (1: a 64-token answer takes about 0.5 s, "
        "so faults find requests open; the emulator costs little CPU at any scale)",
    )
    a("--max-tokens", type=at_least(1), default=64, help="tokens per answer (64)")
    a("--seed", type=int, default=0, help="seed of arrivals and turns (0)")
    a("--drain", type=positive_float, default=180.0, help="seconds the last sessions get (180)")
    a(
        "--vllm-router-breaker",
        action="store_true",
        help="run the routers without --cb-half-open-on-recovery: a circuit one router "
        "opened during a crash then stays open for its 60 s timeout while the other router "
        "uses the replica again, and sessions move between them",
    )
    a("--out", default=None, metavar="FILE", help="also write the JSON result to FILE")
    a(
        "--trace",
        action="store_true",
        help="put every attempt in the JSON (session, turn, router, start, end, worker, error)",
    )


def schedule(kind: str, duration_s: float) -> list[tuple[float, str]]:
    """(seconds after the load starts, fault) of a schedule, evenly spaced after a warm-up of
    15 % of the run and ending 20 % before its end (the last sessions finish untroubled). The
    planned times are the earliest: a fault also waits :data:`SETTLE_S` after the previous
    one ended, so on a short run long holds push the last faults later (``--duration 40``:
    the router restart at about 38-40 s instead of 32, within the load's drain)."""
    cycles = 1 if kind == "short" else 5
    faults = [f for _ in range(cycles) for f in _CYCLE]
    first, last = 0.15 * duration_s, 0.8 * duration_s
    step = (last - first) / max(1, len(faults) - 1)
    return [(first + i * step, f) for i, f in enumerate(faults)]


async def _when_open(open_now: Counter[str], key: str, t0: float) -> tuple[float, int]:
    """Wait up to 10 s for a request open on ``key``; (seconds since t0, requests open)."""
    deadline = time.monotonic() + 10.0
    while open_now[key] <= 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return time.monotonic() - t0, open_now[key]


async def _slow(child: Child, factor: float) -> None:
    """Set the emulated replica's slowdown (its ``/fault/slowdown`` route)."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.post(child.url + "/fault/slowdown", json={"factor": factor}) as resp,
    ):
        resp.raise_for_status()


async def _fault(fleet: Fleet, kind: str, t0: float, open_now: Counter[str]) -> dict[str, Any]:
    target = _TARGET.get(kind, len(fleet.replicas) - 1)
    start = time.monotonic() - t0
    hold = _HOLD_S.get(kind, 0.0)
    note = ""
    if kind == "replica_crash":
        child = fleet.replicas[target]
        start, opened = await _when_open(open_now, child.url, t0)
        child.kill()
        await asyncio.sleep(hold)
        await child.start()
        note = f"{opened} requests open; SIGKILL, restarted on port {child.port} after {hold:g} s"
    elif kind == "replica_freeze":
        child = fleet.replicas[target]
        child.send(signal.SIGSTOP)
        await asyncio.sleep(hold)
        child.send(signal.SIGCONT)
        note = f"SIGSTOP, SIGCONT after {hold:g} s"
    elif kind == "replica_slow":
        child = fleet.replicas[target]
        await _slow(child, SLOWDOWN)
        await asyncio.sleep(hold)
        await _slow(child, 1.0)
        note = f"every step {SLOWDOWN:g}x slower for {hold:g} s, then full speed"
    elif kind == "redis_restart":
        fleet.redis.kill()
        await asyncio.sleep(hold)
        await fleet.redis.start()
        note = f"SIGKILL (data lost), restarted after {hold:g} s"
    else:
        child = fleet.routers[target]
        start, opened = await _when_open(open_now, f"router{target}", t0)
        note = f"{opened} requests open; "
        child.kill()
        await child.start()
        note += "SIGKILL, restarted at once"
    end = time.monotonic() - t0
    return {"kind": kind, "target": target, "start_s": start, "end_s": end, "note": note}


async def _run_faults(
    fleet: Fleet,
    plan: list[tuple[float, str]],
    t0: float,
    out: list[dict[str, Any]],
    open_now: Counter[str],
) -> None:
    for at, kind in plan:
        ready = t0 + out[-1]["end_s"] + SETTLE_S if out else t0
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic(), ready - time.monotonic()))
        out.append(await _fault(fleet, kind, t0, open_now))


def _rss(fleet: Fleet) -> dict[str, float | None]:
    return {
        r.name: None if r.pid is None else round(rss_mib(r.pid) or 0.0, 1) for r in fleet.routers
    }


async def _finish(fleet: Fleet, logs: list[SessionLog], t0: float) -> dict[str, Any]:
    """Release the sessions the load left unreleased (cut by the drain, or whose release
    failed every try), then count the releases: ``ok_per_router``, ``after_run`` (released
    here), ``failed`` (never released), ``failed_tries`` (tries that failed, retried)."""
    urls = [r.url for r in fleet.routers]
    left = [s for s in logs if s.released_via is None]
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:

        async def one(log: SessionLog) -> None:
            async with sem:
                await release(log, urls, http, t0, 2)

        await asyncio.gather(*(one(s) for s in left))
    ok = [0] * len(urls)
    for s in logs:
        if s.released_via is not None:
            ok[s.released_via] += 1
    return {
        "ok_per_router": ok,
        "after_run": sum(s.released_via is not None for s in left),
        "failed": sum(s.released_via is None for s in logs),
        "failed_tries": sum(not a.ok for s in logs for a in s.releases),
    }


async def _redis_counts(fleet: Fleet) -> tuple[dict[str, Any], list[str]]:
    """The shared table's sizes, and the ids of the sessions it still pins."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(fleet.redis.url, decode_responses=True)
    try:
        tag = "{" + f"chaos-{os.getpid()}" + "}:"
        pins = {str(k): str(v) for k, v in (await client.hgetall(tag + "pins")).items()}
        counts = {str(k): int(v) for k, v in (await client.hgetall(tag + "counts")).items()}
        return {
            "pins": len(pins),
            "last": int(await client.zcard(tag + "last")),
            "counted": sum(counts.values()),
            "pins_per_worker": dict(Counter(pins.values())),
            "counts_per_worker": counts,
            "keys": int(await client.dbsize()),
        }, list(pins)
    finally:
        await client.aclose()


def _restored(pinned: list[str], logs: list[SessionLog], faults: list[dict[str, Any]]) -> int:
    """Pinned sessions released while Redis was away (until ``RESUBSCRIBE_S`` after it came
    back): the likely way a router writes back a released pin from its cache (one that
    missed the release message) when Redis comes back without its data. Redis refuses such
    a write-back (it remembers releases; ``serve.state.RELEASE_MEMORY_S``), so any is a
    failure; this says where to look."""
    windows = [
        (f["start_s"], f["end_s"] + RESUBSCRIBE_S) for f in faults if f["kind"] == "redis_restart"
    ]
    released = {s.sid: s.releases[-1].end for s in logs if s.released_via is not None}
    return sum(
        1
        for sid in pinned
        if sid in released and any(lo <= released[sid] <= hi for lo, hi in windows)
    )


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from sessionroute.errors import ConfigError

    duration = args.duration or (60.0 if args.schedule == "short" else _LONG_MIN_S)
    if args.schedule == "long" and duration < _LONG_MIN_S:
        raise ConfigError(f"--schedule long needs --duration >= {_LONG_MIN_S:g}, got {duration}")
    cfg = LoadConfig(
        rate=args.rate,
        concurrency=args.concurrency,
        turns=args.turns,
        attempts=args.attempts,
        attempt_timeout_s=90.0,
        think_s=0.2,
        max_tokens=args.max_tokens,
        seed=args.seed,
    )
    plan = schedule(args.schedule, duration)
    router_flags = [] if args.vllm_router_breaker else ["--cb-half-open-on-recovery"]
    fleet = Fleet.build(args.replicas, 2, args.time_scale, args.max_tokens, router_flags)
    faults: list[dict[str, Any]] = []
    unavailable: Unavailable = {}
    rss: dict[str, dict[str, float | None]] = {r.name: {} for r in fleet.routers}

    def sample(point: str) -> None:
        for name, v in _rss(fleet).items():
            rss[name][point] = v

    tasks: list[asyncio.Task[Any]] = []
    me = asyncio.current_task()
    if me is not None:  # SIGTERM (timeout, kill): stop everything as Ctrl-C does
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, me.cancel)
    try:
        await fleet.start_all()
        sample("start")
        t0 = time.monotonic()
        urls = [r.url for r in fleet.routers]
        open_now: Counter[str] = Counter()
        load = asyncio.create_task(drive(cfg, urls, duration, args.drain, t0, open_now))
        chaos = asyncio.create_task(_run_faults(fleet, plan, t0, faults, open_now))
        watcher = asyncio.create_task(watch(urls, t0, unavailable))
        tasks += [load, chaos, watcher]
        await asyncio.sleep(0.1 * duration)
        sample("after_warmup")
        logs, skipped = await load
        await chaos  # the plan ends at 80 % of the run; holds and SETTLE_S can push it later
        sample("end_of_load")
        finish = await _finish(fleet, logs, t0)
        await asyncio.sleep(1.0)
        redis_after, pinned = await _redis_counts(fleet)
        sample("after_release")
        restarts = {c.name: c.starts - 1 for c in fleet.children}
        stderr = {c.name: c.tail() for c in fleet.routers}
        worker_urls = [r.url for r in fleet.replicas]
    finally:
        for task in tasks:  # on an error: nothing may signal a child after the stop
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        fleet.stop_all()
    down = {(r, fleet.worker_index(w)): spans for (r, w), spans in unavailable.items()}
    acc = account(logs, faults, fleet.worker_index, down=down)
    live = 0  # every session was released above
    redis_after["live"] = live
    redis_after["pinned_ids"] = sorted(pinned)[:50]
    redis_after["restored_after_release"] = _restored(pinned, logs, faults)
    problems = []
    if acc["lost"]:
        problems.append(f"{acc['lost']} sessions lost")
    if acc["unexplained_errors"]:
        problems.append(f"{acc['unexplained_errors']} failed attempts no fault explains")
    if acc["ok_without_worker_header"]:
        problems.append(f"{acc['ok_without_worker_header']} answers without a known worker")
    if acc["unexplained_moves"]:
        problems.append(f"{acc['unexplained_moves']} session moves no fault explains")
    if acc["pins_not_restored"]:
        problems.append(f"{acc['pins_not_restored']} sessions lost their pin over Redis' restart")
    if acc["unexplained_flaps"]:
        problems.append(f"{acc['unexplained_flaps']} sessions flapped between workers")
    if finish["failed"]:
        problems.append(f"{finish['failed']} sessions never released by /finish_session")
    warm, end = rss["router0"].get("after_warmup"), rss["router0"].get("end_of_load")
    if warm and end and end > RSS_GROWTH_MAX * warm:
        problems.append(f"router0 RSS grew from {warm} MiB after warm-up to {end} MiB")
    stale = redis_after["pins"] - live
    if stale:
        near = redis_after["restored_after_release"]
        problems.append(
            f"Redis holds {stale} pins for {live} live sessions ({near} of them released "
            "around the Redis outage)"
        )
    if len(faults) != len(plan):
        problems.append(f"{len(faults)} of {len(plan)} faults ran")
    return {
        "benchmark": "chaos",
        "schedule": args.schedule,
        "duration_s": duration,
        "rate": args.rate,
        "concurrency": args.concurrency,
        "replicas": args.replicas,
        "time_scale": args.time_scale,
        "seed": args.seed,
        "workers": worker_urls,
        "router_flags": router_flags,
        "faults": faults,
        "restarts": restarts,
        "arrivals_skipped_at_concurrency": skipped,
        "accounting": acc,
        "finish": finish,
        "redis_after": redis_after,
        "rss_points": list(_RSS_POINTS),
        "rss_mib": rss,
        "rss_note": "router1 is restarted by the schedule: its later samples are a new process",
        "unavailable_spans": {f"router{r}:replica{w}": v for (r, w), v in sorted(down.items())},
        "router_stderr_tail": stderr,
        "problems": problems,
        "ok": not problems,
        **({"trace": _trace(logs, fleet)} if args.trace else {}),
    }


def _who(a: Attempt, fleet: Fleet) -> tuple[int | None, str | None]:
    return fleet.worker_index(a.worker), a.error


def _trace(logs: list[SessionLog], fleet: Fleet) -> list[list[Any]]:
    return [
        [s.sid, a.turn, a.router, round(a.start, 3), round(a.end, 3), *_who(a, fleet)]
        for s in logs
        for a in s.attempts
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the chaos bench (module docstring); returns the result document (also written to
    ``--out`` when given)."""
    try:
        result = asyncio.run(_run(args))
    except asyncio.CancelledError:
        print(
            "sessionroute bench chaos: stopped (SIGTERM); its processes were stopped",
            file=sys.stderr,
        )
        raise SystemExit(143) from None
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def exit_status(result: dict[str, Any]) -> int:
    """1 when a check failed (``problems`` says which)."""
    return 0 if result["ok"] else 1


def print_table(result: dict[str, Any]) -> None:
    """Print the faults, the accounting and the verdict."""
    _print_table(result)
