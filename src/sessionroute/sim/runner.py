"""The simulator's entry point: :func:`run_simulation` runs one arm once.

Deterministic: the same spec, policy, options and seed give identical metrics, time series and
steps (the wall-clock measurements excepted; inject ``wall_clock`` to pin them too).
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sessionroute.clock import Clock, MonotonicClock
from sessionroute.errors import ConfigError
from sessionroute.record import Recorder
from sessionroute.replica import (
    PROFILES,
    ReplicaConfig,
    StepTimeProfile,
    is_profile_path,
    load_profile_file,
    load_profiles,
)
from sessionroute.router.build import build_router, policy_choice
from sessionroute.router.policies.base import Policy
from sessionroute.router.policies.capabilities import ReadsKvEvents
from sessionroute.sim.events import PRIO_FAULT, EventQueue, VirtualClock
from sessionroute.sim.faults import apply_fault
from sessionroute.sim.kvview import KvEventFeed, SaltedIndexView
from sessionroute.sim.replicas import SimReplica
from sessionroute.sim.report import build_metrics
from sessionroute.sim.sampling import Sampler, Scraper
from sessionroute.sim.simulation import Simulation
from sessionroute.sim.spec import SimSpec
from sessionroute.workloads.registry import default_replicas, workload_config

__all__ = ["SimResult", "default_url", "replica_config", "run_simulation"]

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default KV block size (tokens), used when neither the spec nor the workload sets one."""

ROUTER_SEED_SALT = 0x5E55_1011
"""Mixed into the seed of the router core's own generator (retry jitter), so that it draws
independently of the policy's ``random.Random(seed)``."""

GC_THRESHOLDS = (100_000, 20, 100)
"""Python's cyclic-GC thresholds while a simulation runs (the default is ``(700, 10, 10)``)."""


@contextmanager
def _fewer_gc_passes() -> Iterator[None]:
    """Raise the cyclic GC's thresholds to :data:`GC_THRESHOLDS` for the block; restore after.

    A run allocates millions of short-lived objects and holds large long-lived ones (engine
    caches, the ideal-hit key sets, the recorder's lists), so with the default thresholds the
    collector keeps traversing live objects: ~3.5 % of a default run's instructions. Cycles
    are still collected, less often (memory held by cyclic garbage grows by at most one
    threshold's worth of objects). Thresholds already higher, or a disabled collector, are
    left as they are. Results do not depend on when the collector runs.
    """
    old = gc.get_threshold()
    if old[0] == 0:
        yield
        return
    gc.set_threshold(*(max(a, b) for a, b in zip(old, GC_THRESHOLDS, strict=False)))
    try:
        yield
    finally:
        gc.set_threshold(*old)


def default_url(index: int) -> str:
    """Worker id of replica ``index``: ``http://127.0.0.1:<18001 + index>`` (as in ROUTER.md)."""
    return f"http://127.0.0.1:{18001 + index}"


@dataclass(slots=True)
class SimResult:
    """What one simulation produced.

    Attributes:
        metrics: JSON-serializable metrics (``docs/simulator.md`` lists every key).
        timeseries: per replica per sample interval rows (see
            :class:`~sessionroute.sim.sampling.Sampler`).
        steps: per RL step rows ``{"step", "t", "step_time_s"}``.
        samples: raw distributions for plots (``ttft_s``, ``turn_latency_s``, ...), seconds.
        resolved: the resolved settings that ran (spec, workload options, replica config).
    """

    metrics: dict[str, Any]
    timeseries: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    resolved: dict[str, Any] = field(default_factory=dict)


def _profile(name: str, profiles_file: str | None) -> StepTimeProfile:
    profiles = dict(PROFILES)
    if profiles_file:
        profiles.update(load_profiles(profiles_file))
    try:
        return profiles[name]
    except KeyError:
        raise ConfigError(
            f"unknown replica profile {name!r}; known: {', '.join(sorted(profiles))}"
        ) from None


def replica_config(spec: SimSpec) -> tuple[int, ReplicaConfig]:
    """The replica count and engine configuration of ``spec`` (workload defaults filled in).

    Raises:
        ConfigError: for an unknown profile or invalid engine settings.
    """
    r = spec.replicas
    d = default_replicas(spec.workload.kind)

    def pick(name: str) -> Any:
        v = getattr(r, name)
        return v if v is not None else d.get(name)

    name = str(pick("profile"))
    if r.profile is not None and is_profile_path(r.profile):
        # a profile file (``sessionroute calibrate``): the server's KV capacity, batch limits,
        # max_model_len and block size come from it; only [replicas] keys set explicitly
        # override them, never the workload's defaults
        pf = load_profile_file(r.profile)
        cfg = ReplicaConfig(
            profile=pf.profile,
            block_size=int(r.block_size or pf.block_size or DEFAULT_BLOCK_SIZE),
            kv_capacity_tokens=r.kv_capacity_tokens,
            max_num_batched_tokens=r.max_num_batched_tokens,
            max_num_seqs=r.max_num_seqs,
            max_model_len=r.max_model_len,
        )
        return int(pick("count") or 1), cfg
    profile = _profile(name, r.profiles_file)
    cfg = ReplicaConfig(
        profile=profile,
        block_size=int(pick("block_size") or DEFAULT_BLOCK_SIZE),
        kv_capacity_tokens=pick("kv_capacity_tokens"),
        max_num_batched_tokens=pick("max_num_batched_tokens"),
        max_num_seqs=pick("max_num_seqs"),
        max_model_len=pick("max_model_len"),
    )
    return int(pick("count") or 1), cfg


def run_simulation(
    spec: SimSpec,
    policy: str,
    policy_options: Mapping[str, Any] | None = None,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    *,
    wall_clock: Clock | None = None,
    policy_seed: int | None = None,
) -> SimResult:
    """Simulate ``spec`` with one routing policy.

    Args:
        spec: workload, replicas, router, faults and simulator options.
        policy: registry name or ``module:Class``.
        policy_options: options of the policy's config (``session_ttl_s`` defaults to
            ``spec.router.session_ttl_s`` when the policy has it).
        seed: seeds the workload (``numpy.random.default_rng(seed)``) and the policy
            (``random.Random(seed)``); arms with the same seed see the same workload.
        progress: called with the fraction done (0..1) every sample interval and at the end.
        policy_seed: seeds the policy and the router core instead of ``seed`` (None: ``seed``):
            the same workload under other placement draws (``compare --fidelity`` measures the
            simulator's spread over them).
        wall_clock: measures ``wall_seconds`` (default :class:`~sessionroute.clock.MonotonicClock`;
            pass a :class:`~sessionroute.clock.ManualClock` for byte-identical metrics).

    Returns:
        The :class:`SimResult`.

    Raises:
        ConfigError: for an unknown workload, profile or policy, or invalid options.
    """
    wall = wall_clock if wall_clock is not None else MonotonicClock()
    t_wall = wall.now()
    wl = spec.workload
    wcfg = workload_config(wl.kind, wl.steps, wl.options)
    count, rcfg = replica_config(spec)
    urls = list(spec.replicas.urls or [])

    def url_for(i: int) -> str:
        return urls[i] if i < len(urls) else default_url(i)

    clock = VirtualClock()
    queue = EventQueue(clock)
    choice = policy_choice(spec.router, policy, policy_options)
    options = choice.options()
    pseed = seed if policy_seed is None else policy_seed
    wrap = None
    if spec.sim.routers > 1:
        from sessionroute.sim.routers import build_fleet

        def wrap(first: Policy) -> Policy:
            return build_fleet(
                lambda k: (
                    first if k == 0 else choice.build(clock=clock, rng=random.Random(pseed + k))
                ),
                spec.sim.routers,
                spec.sim.router_state,
                clock,
            )

    replicas = [SimReplica(i, url_for(i), rcfg, fast=spec.sim.fast_engine) for i in range(count)]
    core = build_router(
        spec.router,
        clock,
        random.Random(pseed ^ ROUTER_SEED_SALT),
        choice=choice,
        workers=[r.url for r in replicas],
        policy_rng=random.Random(pseed),
        wrap=wrap,
    )
    pol = core.policy
    rec = Recorder()
    sim = Simulation(
        queue, core, replicas, spec.router, rec, url_for, rcfg, fast=spec.sim.fast_engine
    )
    if isinstance(pol, ReadsKvEvents):
        # kv_aware and its kin: the replicas' KV events feed the policy's own index
        KvEventFeed(pol.index, rcfg.block_size, spec.router.content_block_tokens).watch(
            sim.replicas
        )
        pol.use_prefix_cache(SaltedIndexView(pol.index))
    workload = wcfg.build(np.random.default_rng(seed))
    n = count
    for f in sorted(spec.faults, key=lambda f: f.at_s):
        if f.kind == "add":
            n += 1
        elif f.replica >= n:
            raise ConfigError(
                f"fault {f.kind!r} at {f.at_s} s names replica {f.replica}, but only {n} "
                "exist then (indices start at 0)"
            )
        queue.push(f.at_s, PRIO_FAULT, _fault_cb(sim, f.kind, f.replica, f.factor))
    sampler = Sampler(sim, spec.sim.sample_interval_s, progress, workload.progress)
    sampler.start()
    if spec.router.scrape_interval_s is not None:
        Scraper(sim, spec.router.scrape_interval_s).start()
    sim.timers.start()  # the router's health checks and session sweeps
    workload.start(sim)
    limit = spec.sim.max_simulated_s if spec.sim.max_simulated_s is not None else float("inf")
    with _fewer_gc_passes():
        queue.run_until(limit)
    sampler.sample()
    if progress is not None:
        progress(1.0)
    wall_s = max(0.0, wall.now() - t_wall)
    metrics = build_metrics(
        sim, workload.summary(), wall_s, events=queue.events_run, timeseries=sampler.rows
    )
    resolved = {
        "spec": spec.model_dump(),
        "workload": wcfg.model_dump(),
        "replica": {
            "count": count,
            "profile": rcfg.profile.name,
            "block_size": rcfg.block_size,
            "kv_capacity_tokens": rcfg.capacity_tokens,
            "max_num_batched_tokens": rcfg.batched_tokens,
            "max_num_seqs": rcfg.seqs,
            "max_model_len": rcfg.model_len,
        },
        "policy": policy,
        "policy_options": options,
        "seed": seed,
    }
    return SimResult(metrics, sampler.rows, list(rec.steps), rec.samples(), resolved)


def _fault_cb(sim: Simulation, kind: str, index: int, factor: float) -> Callable[[Any], None]:
    def apply(_: Any) -> None:
        apply_fault(sim, kind, index, factor)

    return apply
