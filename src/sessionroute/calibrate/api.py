"""``calibrate(urls)``: read running vLLM servers, probe them, fit the step-time model."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

import aiohttp

from sessionroute.calibrate.fit import Row, fit_rows, phase_row
from sessionroute.calibrate.plan import DECODE_TOKENS, ProbePlan, default_plan
from sessionroute.calibrate.probe import (
    PhaseRun,
    Progress,
    probe_session,
    reset_prefix_cache,
    run_plan,
    run_plan_together,
)
from sessionroute.calibrate.result import CalibrationResult, build_profile
from sessionroute.calibrate.server import CalibrationError, ServerInfo, read_server_info

__all__ = ["PROBE_MODES", "calibrate", "calibrate_async", "inspect_servers", "plan_for"]

PROBE_MODES: tuple[str, ...] = ("all", "together", "first")
"""How :func:`calibrate_async` probes several servers: ``all`` one after the other (the
others idle), ``together`` all at once in lockstep, ``first`` only the first."""

P = ParamSpec("P")
T = TypeVar("T")


def _blocking(fn: Callable[P, Coroutine[Any, Any, T]], name: str, doc: str) -> Callable[P, T]:
    """``fn`` run to completion with :func:`asyncio.run`, named ``name``."""

    @functools.wraps(fn)  # (help() and inspect.signature show fn's arguments)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return asyncio.run(fn(*args, **kwargs))

    run.__name__ = run.__qualname__ = name
    run.__doc__ = doc
    return run


def _check_same(servers: Sequence[ServerInfo]) -> None:
    first = servers[0]
    for s in servers[1:]:
        if (s.model, s.block_size) != (first.model, first.block_size):
            raise CalibrationError(
                f"{s.url} serves {s.model!r} with block size {s.block_size}, {first.url} "
                f"{first.model!r} with {first.block_size}: calibrate one kind of server at a time"
            )


async def inspect_servers(
    session: aiohttp.ClientSession,
    urls: Sequence[str],
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> tuple[ServerInfo, ...]:
    """What each server says of itself (:func:`~sessionroute.calibrate.server.read_server_info`).

    Raises:
        CalibrationError: as ``read_server_info``; servers of different models or block sizes.
    """
    if not urls:
        raise CalibrationError("no server URL given")
    servers = [
        await read_server_info(
            session, u, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        )
        for u in urls
    ]
    _check_same(servers)
    return tuple(servers)


def plan_for(
    servers: Sequence[ServerInfo],
    *,
    reps: int = 7,
    decode_tokens: int = DECODE_TOKENS,
    stream: bool = True,
) -> ProbePlan:
    """The default probe plan for the smallest of ``servers`` (``plan.default_plan``)."""
    smallest = min(servers, key=lambda s: (s.kv_capacity_tokens, s.max_num_seqs))
    return default_plan(smallest, reps=reps, decode_tokens=decode_tokens, stream=stream)


async def calibrate_async(
    urls: Sequence[str],
    *,
    plan: ProbePlan | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    probe: str = "all",
    name: str | None = None,
    timeout_s: float = 120.0,
    progress: Progress | None = None,
    stream: bool = True,
) -> CalibrationResult:
    """Read running OpenAI-compatible vLLM servers, probe them and fit the step-time model
    (:func:`calibrate` runs it on an event loop of its own, for callers without one).

    Args:
        urls: base URLs of the servers (same model and block size), e.g.
            ``["http://127.0.0.1:8001"]``.
        plan: the probe plan (default: :func:`plan_for` the servers).
        max_num_seqs, max_num_batched_tokens: the servers' batch limits when they do not expose
            them (``/server_info`` answers only with ``VLLM_SERVER_DEV_MODE=1``).
        probe: ``"all"`` probes every server in turn, the others idle (one fit over all);
            ``"together"`` probes every server at once, the same round sent to each at the
            same moment (:func:`~sessionroute.calibrate.probe.run_plan_together`; one fit over
            all): the servers load each other, and the client that drives them, as when a
            router spreads one workload over them; ``"first"`` probes the first and only reads
            the others.
        name: the profile's name (default ``calibrated-<model>``).
        timeout_s: per HTTP request, seconds.
        progress: called after each probe round on each server with (rounds done, rounds in
            all over the probed servers, phase label).
        stream: probe with streaming requests and fit client-side times (match a live run
            with ``stream = true``); False: plain requests, fit vLLM's own histograms. Used
            when ``plan`` is None (else ``plan.stream``).

    Returns:
        The fitted profile, the servers, every phase's measurements and the fit's errors; write
        it with :func:`~sessionroute.calibrate.write_profile`.

    Raises:
        CalibrationError: a server is unreachable, is not vLLM, lacks what the fit needs, or
            failed a probe request.
        ValueError: ``probe`` is not one of :data:`PROBE_MODES`.
    """
    if probe not in PROBE_MODES:
        raise ValueError(f"probe must be one of {', '.join(PROBE_MODES)}, got {probe!r}")
    t0 = time.monotonic()
    async with probe_session(timeout_s) as session:
        servers = await inspect_servers(
            session, urls, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        )
        the_plan = plan if plan is not None else plan_for(servers, stream=stream)
        probed: list[ServerInfo] = []
        for info in servers if probe != "first" else servers[:1]:
            can_reset = await reset_prefix_cache(session, info.url)
            probed.append(dataclasses.replace(info, can_reset_cache=can_reset))
        runs: list[PhaseRun] = []
        if probe == "together":
            runs = await run_plan_together(session, probed, the_plan, progress)
        else:
            done = 0
            total = sum(p.rounds for p in the_plan.phases) * len(probed)

            def on_round(_done: int, _total: int, label: str) -> None:
                nonlocal done
                done += 1
                if progress is not None:
                    progress(done, total, label)

            for info in probed:
                runs += await run_plan(session, info, the_plan, on_round)
        servers = tuple(probed) + servers[len(probed) :]
    rows: list[Row] = [r for r in (phase_row(run) for run in runs) if r is not None]
    if not rows:
        raise CalibrationError("the servers' histograms recorded none of the probe requests")
    fit = fit_rows(rows)
    profile = build_profile(fit.values, servers, name)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return CalibrationResult(
        profile=profile,
        block_size=servers[0].block_size,
        servers=servers,
        plan=the_plan,
        runs=tuple(runs),
        fit=fit,
        date=date,
        wall_s=time.monotonic() - t0,
        probe=probe if len(probed) > 1 else "first",
    )


calibrate = _blocking(
    calibrate_async,
    "calibrate",
    """Read running OpenAI-compatible vLLM servers, probe them and fit the step-time model:
    :func:`calibrate_async` (its arguments, result and errors) run on an event loop of its own,
    for callers without one.""",
)
