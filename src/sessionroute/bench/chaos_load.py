"""The client side of ``sessionroute bench chaos``: multi-turn sessions through two routers.

New sessions arrive at ``rate`` per second (Poisson, seeded) while fewer than ``concurrency``
are live; each sends its turns one after another (the conversation grows by each answer),
streamed or not (half of the sessions each). Turn ``t`` of session ``k`` goes to router
``(k + t) mod R`` and each retry of it to the next router, as a client behind an L4 balancer
would see. A failed attempt (a status other than 200, a connection error, a 200 stream without
its ``[DONE]``, a timeout) is retried up to ``attempts`` times in all, with backoff; a turn
whose attempts all failed ends its session (``aborted``). Every attempt is recorded with its
router, its monotonic start and end and, when it succeeded, the worker that served it (the
router's ``x-sessionroute-worker`` header). A session that ended (completed or aborted) is
released with ``POST /finish_session`` through router ``k mod R`` (retried on the next
router like a turn), as an RL orchestrator does when a rollout ends, so the routers' session
counts are live sessions and the shared table shrinks back as sessions end.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

__all__ = ["Attempt", "LoadConfig", "SessionLog", "drive", "release"]

WORKER_HEADER = "x-sessionroute-worker"


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """The load: ``rate`` new sessions per second, at most ``concurrency`` live, ``turns``
    turns each (2..turns, seeded), ``attempts`` tries per turn, ``attempt_timeout_s`` each."""

    rate: float
    concurrency: int
    turns: int
    attempts: int
    attempt_timeout_s: float
    think_s: float
    max_tokens: int
    seed: int


@dataclass(slots=True)
class Attempt:
    """One HTTP attempt of a turn: seconds since the run's start, router index, outcome."""

    turn: int
    router: int
    start: float
    end: float
    ok: bool
    worker: str | None = None
    error: str | None = None


@dataclass(slots=True)
class SessionLog:
    """One session: ``state`` is ``running``, ``completed`` or ``aborted``."""

    sid: str
    index: int
    stream: bool
    turns: int
    state: str = "running"
    done_turns: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    releases: list[Attempt] = field(default_factory=list)
    """``/finish_session`` attempts (``turn`` -1); the last one ok: released through its
    router."""

    @property
    def released_via(self) -> int | None:
        """The router whose ``/finish_session`` released the session, or None."""
        last = self.releases[-1] if self.releases else None
        return last.router if last is not None and last.ok else None


async def _attempt(
    http: aiohttp.ClientSession, url: str, sid: str, body: dict[str, Any], stream: bool
) -> tuple[bool, str | None, str | None, str]:
    """(ok, worker, error, answer text) of one POST."""
    headers = {"x-session-id": sid}
    try:
        async with http.post(url, json=body, headers=headers) as r:
            raw = await r.read()
            worker = r.headers.get(WORKER_HEADER)
            if r.status != 200:
                try:
                    code = json.loads(raw)["error"].get("code")
                except (ValueError, KeyError, TypeError, AttributeError):
                    code = None
                return False, worker, f"http {r.status} {code or ''}".strip(), ""
    except TimeoutError:
        return False, None, "client timeout", ""
    except aiohttp.ClientError as exc:
        return False, None, type(exc).__name__, ""
    if stream:
        if b"data: [DONE]" not in raw:
            return False, worker, "stream truncated", ""
        return True, worker, None, "ok"
    try:
        text = str(json.loads(raw)["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        return False, worker, "malformed 200 body", ""
    return True, worker, None, text


async def _session(
    log: SessionLog,
    cfg: LoadConfig,
    routers: list[str],
    http: aiohttp.ClientSession,
    t0: float,
    open_now: Counter[str],
) -> None:
    messages: list[dict[str, str]] = []
    last: str | None = None  # the worker of the last answer
    for t in range(log.turns):
        messages.append({"role": "user", "content": f"{log.sid} turn {t}: go on"})
        body = {"messages": messages, "max_tokens": cfg.max_tokens, "stream": log.stream}
        for a in range(cfg.attempts):
            r = (log.index + t + a) % len(routers)
            start = time.monotonic() - t0
            keys = [f"router{r}", *([last] if last else [])]
            open_now.update(keys)
            try:
                ok, worker, error, text = await _attempt(
                    http, routers[r] + "/v1/chat/completions", log.sid, body, log.stream
                )
            finally:
                open_now.subtract(keys)
            log.attempts.append(Attempt(t, r, start, time.monotonic() - t0, ok, worker, error))
            if ok:
                last = worker
                messages.append({"role": "assistant", "content": text[:200]})
                log.done_turns += 1
                break
            await asyncio.sleep(min(8.0, 0.5 * 2**a))
        else:
            log.state = "aborted"
            break
        await asyncio.sleep(cfg.think_s)
    else:
        log.state = "completed"
    await release(log, routers, http, t0, cfg.attempts)


async def release(
    log: SessionLog, routers: list[str], http: aiohttp.ClientSession, t0: float, attempts: int
) -> None:
    """``POST /finish_session`` of ``log``'s session through router ``index mod R``, retried
    on the next routers (``attempts`` tries in all); every try goes to ``log.releases``."""
    for a in range(attempts):
        r = (log.index + a) % len(routers)
        start = time.monotonic() - t0
        error: str | None = None
        try:
            url = routers[r] + "/finish_session"
            async with http.post(url, params={"session_id": log.sid}) as resp:
                await resp.read()
                if resp.status != 200:
                    error = f"http {resp.status}"
        except TimeoutError:
            error = "client timeout"
        except aiohttp.ClientError as exc:
            error = type(exc).__name__
        log.releases.append(
            Attempt(-1, r, start, time.monotonic() - t0, error is None, None, error)
        )
        if error is None:
            return
        await asyncio.sleep(min(8.0, 0.5 * 2**a))


async def drive(
    cfg: LoadConfig,
    routers: list[str],
    duration_s: float,
    drain_s: float,
    t0: float,
    open_now: Counter[str],
    prefix: str = "chaos",
) -> tuple[list[SessionLog], int]:
    """Start sessions for ``duration_s`` seconds, then wait up to ``drain_s`` for the live ones
    (``open_now``: requests open now through ``router<r>``, and on each worker URL as far
    as the client knows: that of the session's last answer).

    Returns:
        every session's log (those still running after the drain were cancelled: ``running``)
        and the number of arrivals skipped because ``concurrency`` sessions were live.
    """
    rng = random.Random(cfg.seed)
    logs: list[SessionLog] = []
    tasks: set[asyncio.Task[None]] = set()
    skipped = 0
    timeout = aiohttp.ClientTimeout(total=cfg.attempt_timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        end = t0 + duration_s
        due = time.monotonic()  # arrival times are absolute: event-loop lag does not add up
        while True:
            due += rng.expovariate(cfg.rate)
            if due >= end:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            if len(tasks) >= cfg.concurrency:
                skipped += 1
                continue
            k = len(logs)
            log = SessionLog(f"{prefix}-{k}", k, k % 2 == 1, rng.randint(2, max(2, cfg.turns)))
            logs.append(log)
            task = asyncio.create_task(_session(log, cfg, routers, http, t0, open_now))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    return logs, skipped
