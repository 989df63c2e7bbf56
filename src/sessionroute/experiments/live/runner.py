"""The live arm runner: one experiment arm through real HTTP (``sessionroute compare --live``).

Per arm: (replicas: shared processes started once, or fresh in-process emulators) ->
``/reset_prefix_cache`` on every replica -> the served model, its context limit and the chat
template's token overhead -> recording taps (optional) -> the arm's router -> ``/metrics``
before -> the workload, built from the same config and seed as in the simulator, driven by
:class:`~sessionroute.experiments.live.host.LiveHost` while a sampler scrapes ``/metrics``
-> ``/metrics`` after -> router session counters -> everything of the arm stopped. Arms run
one after another.

Usage::

    with LiveArmRunner(spec) as runner:
        output = run_experiment(spec, runner, reporter, jobs=1)
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import numpy as np

from sessionroute.errors import ConfigError
from sessionroute.experiments.live.host import LiveHost
from sessionroute.experiments.live.looplag import LoopLag
from sessionroute.experiments.live.metrics import Sampler, build_live_metrics
from sessionroute.experiments.live.procs import ProcessSet
from sessionroute.experiments.live.replicas import ReplicaFleet
from sessionroute.experiments.live.routers import router_session_metrics, start_arm_router
from sessionroute.experiments.live.scrape import (
    MetricsSnapshot,
    probe_overhead,
    reset_prefix_caches,
    scrape_all,
    served_model_info,
    server_latency_means,
)
from sessionroute.experiments.live.tap import Tap, start_taps
from sessionroute.experiments.live_section import LiveSection
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import ExperimentSpec, ResolvedArm, resolve_arms
from sessionroute.router.kv.emutokens import EMULATOR_TOKENIZER
from sessionroute.router.policies.registry import choose_policy
from sessionroute.sim import RouterSection, SimSpec
from sessionroute.workloads.registry import workload_config

__all__ = ["LiveArmRunner", "run_live_experiment"]

T = TypeVar("T")

# [live] keys that may differ between arms sharing replica processes (per-arm choices).
_PER_ARM_KEYS = frozenset(
    (
        "router",
        "router_command",
        "router_health_path",
        "stream",
        "placements",
        "scrape_interval_s",
        "request_timeout_s",
    )
)


class LiveArmRunner:
    """Runs arms live; a context manager owning the replica processes of the experiment.

    Args:
        spec: the experiment (its ``live`` section and the arms' settings).

    Raises:
        ConfigError: arms that share replica processes but differ in replica settings, or an
            invalid ``live`` section.
        LiveStartError: on entering, a replica did not start.
    """

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec
        self.arms = resolve_arms(spec)
        self._procs = ProcessSet()
        first = self.arms[0].settings
        live = LiveSection.model_validate(first["live"])
        shared = not (live.replicas == "emulate" and live.emulate_mode == "in-process")
        if shared:
            for arm in self.arms[1:]:
                a, b = self._replica_key(first), self._replica_key(arm.settings)
                if a != b:
                    raise ConfigError(
                        f"arms {self.arms[0].name!r} and {arm.name!r} share replica processes "
                        "but differ in [replicas] or replica keys of [live]"
                    )
        kv_events = any(
            choose_policy(arm.policy, arm.policy_options).cls.reads_kv_events for arm in self.arms
        )
        self.fleet = ReplicaFleet(live, first, self._procs, kv_events=kv_events)
        self.log_dir: Path = self.fleet.work_dir

    @staticmethod
    def _replica_key(settings: dict[str, Any]) -> Any:
        live = {k: v for k, v in settings["live"].items() if k not in _PER_ARM_KEYS}
        return (settings["replicas"], live)

    def __enter__(self) -> LiveArmRunner:
        self._procs.__enter__()
        try:
            self.fleet.start()
        except BaseException:
            self.fleet.close()
            self._procs.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.fleet.close()
        finally:
            self._procs.__exit__(exc_type, exc, tb)

    def __call__(self, arm: ResolvedArm, seed: int, progress: Callable[[float], None]) -> RunOutput:
        """Run ``arm`` once with ``seed`` (its own event loop).

        Raises:
            KeyboardInterrupt: Ctrl-C (SIGINT) arrived during the run.
        """
        return asyncio.run(_interruptible(self.run_arm(arm, seed, progress)))

    async def run_arm(
        self, arm: ResolvedArm, seed: int, progress: Callable[[float], None] | None = None
    ) -> RunOutput:
        """Run ``arm`` once in the running event loop (see the module docstring).

        Raises:
            ConfigError: bad settings or policy options for a live router.
            LiveStartError: the router did not start.
        """
        settings = arm.settings
        live = LiveSection.model_validate(settings["live"])
        router = RouterSection.model_validate(settings["router"])
        spec = SimSpec.from_settings(settings)
        wl = spec.workload
        wcfg = workload_config(wl.kind, wl.steps, wl.options)
        fleet = self.fleet
        t_wall = time.monotonic()
        ports = fleet.worker_ports
        fleet.check_ports_free(live.host)
        policy_cls = choose_policy(arm.policy, arm.policy_options).cls
        reads_kv = policy_cls.reads_kv_events
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client,
            fleet.arm_replicas(None if live.placements else ports, kv_events=reads_kv) as urls,
        ):
            await reset_prefix_caches(client, urls)
            served, limit = await served_model_info(client, urls[0])
            model = live.served_model or served
            overhead = await probe_overhead(client, urls[0], model)
            taps: list[Tap] | None = None
            last: dict[str, int] | None = None
            workers = urls
            if live.placements:
                taps, last = await start_taps(urls, router.session_headers[0], live.host, ports)
                workers = [t.url for t in taps]
            try:
                kv_flags: list[str] = []
                if reads_kv:
                    kv_flags = [
                        "--kv-tokenizer", EMULATOR_TOKENIZER,
                        "--kv-block-size", str(fleet.block_size),
                    ]  # fmt: skip
                    for stream in fleet.kv_streams(workers):
                        kv_flags += ["--kv-events", stream]
                if live.record_turns and live.router in ("sessionroute", "sessionroute-inprocess"):
                    kv_flags.append("--expose-worker-header")
                async with start_arm_router(
                    live.router, live, arm.policy, arm.policy_options, router, workers,
                    self._procs, self.log_dir, extra_flags=kv_flags,
                ) as info:  # fmt: skip
                    host = LiveHost(
                        router_url=info.url,
                        model=model,
                        block_size=fleet.block_size,
                        max_model_len=limit or fleet.config.model_len,
                        router=router,
                        replica_urls=urls,
                        time_scale=fleet.time_scale,
                        overhead=overhead,
                        stream=live.stream,
                        request_timeout_s=live.request_timeout_s,
                        last_replica=last,
                        record_turns=live.record_turns,
                    )
                    workload = wcfg.build(np.random.default_rng(seed))
                    before = await scrape_all(client, urls)
                    sampler = Sampler(
                        host, urls, live.scrape_interval_s, workload.progress, progress
                    )
                    t0 = time.monotonic()
                    sampling = asyncio.ensure_future(sampler.run(client, before))
                    lag = LoopLag()
                    lagging = asyncio.ensure_future(lag.run())
                    try:
                        await host.run(workload, spec.sim.max_simulated_s)
                    finally:
                        sampling.cancel()
                        lagging.cancel()
                        await asyncio.gather(sampling, lagging, return_exceptions=True)
                    wall = time.monotonic() - t0
                    after = await _settled(client, urls, before, host.rec.requests_completed)
                    router_stats = await router_session_metrics(client, info)
            finally:
                for tap in taps or ():
                    await tap.stop()
        if progress is not None:
            progress(1.0)
        described = {
            "replicas": live.replicas,
            "router": live.router,
            "time_scale": fleet.time_scale,
            "model": model,
            "template_overhead": [overhead.first, overhead.per_turn],
            "setup_seconds": t0 - t_wall,
            "server_means": server_latency_means(before, after),
            "client_loop": lag.summary(),
        }
        metrics = build_live_metrics(
            host, before, after, urls, sampler=sampler, taps=taps, router=router_stats,
            workload=workload.summary(), wall_s=wall, live=described,
            finish_sessions=router.finish_sessions,
            keeps_sessions=policy_cls.keeps_sessions,
        )  # fmt: skip
        rec = host.rec
        return RunOutput(seed, metrics, sampler.rows, list(rec.steps), rec.samples(), host.turns)


async def _settled(
    client: httpx.AsyncClient,
    urls: list[str],
    before: list[MetricsSnapshot],
    completed: int,
    timeout_s: float = 5.0,
) -> list[MetricsSnapshot]:
    """``/metrics`` after the run, once the replicas count every request the clients saw
    finish (servers may update counters just after answering); at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        after = await scrape_all(client, urls)
        seen = sum(a.delta(b).get("requests", 0.0) for a, b in zip(after, before, strict=True))
        has = all(a.ok and "requests" in a.counters for a in after)
        if not has or seen >= completed or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.05)


def run_live_experiment(spec: ExperimentSpec, reporter: Any = None) -> Any:
    """Run every arm of ``spec`` live, one after another; returns the
    :class:`~sessionroute.experiments.runner.ExperimentOutput`.

    Raises:
        ConfigError, LiveStartError: see :class:`LiveArmRunner`.
    """
    from sessionroute.experiments.runner import run_experiment

    with LiveArmRunner(spec) as runner:
        return run_experiment(spec, runner, reporter, jobs=1)


async def _interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro``; SIGINT cancels it and always ends in ``KeyboardInterrupt``.

    ``asyncio.run``'s own handler only cancels the main task, and a run whose cancellation was
    absorbed on the way (a library's cleanup, say) then returned normally: Ctrl-C became a
    silent, shortened run with exit status 0.

    Raises:
        KeyboardInterrupt: SIGINT arrived while ``coro`` ran.
    """
    task = asyncio.current_task()
    if threading.current_thread() is not threading.main_thread() or task is None:
        return await coro
    loop = asyncio.get_running_loop()
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        result = await coro
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if interrupted:
        raise KeyboardInterrupt
    return result
