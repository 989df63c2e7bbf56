"""A simulated replica: the engine model plus what the simulator tracks around it.

An engine that goes down is discarded (its cache is lost) and a fresh one is built when it
comes back; counters of every incarnation are summed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sessionroute.replica import Replica, ReplicaConfig, ReplicaCounters

__all__ = ["COUNTER_FIELDS", "SimReplica"]

COUNTER_FIELDS: tuple[str, ...] = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_preemptions",
    "prompt_tokens",
    "generation_tokens",
    "iteration_tokens",
    "steps",
    "busy_time_s",
    "requests_finished",
)
"""Cumulative engine counters summed over a replica's incarnations."""


class SimReplica:
    """One replica slot of the simulated cluster.

    Args:
        index: position in the cluster (0-based).
        url: the worker id the router knows it by.
        config: engine configuration.
        fast: use the engine's fast implementation.

    Attributes:
        engine: the live engine, or None while the replica is down.
        drained: removed from the router (its in-flight requests still finish).
        inflight: engine request id -> the simulator's request record.
        wake_t: time of the pending wake-up event, or None.
        wake_token: id of the valid wake-up event (older ones are stale).
        host_factor: the factor on its step terms from the host it shares with the other
            replicas (``StepTimeProfile.host_factor``; set by the simulation as they turn busy
            or idle), on top of ``config.slowdown`` (a ``slow`` fault's).
        requests, prompt_tokens, output_tokens: finished requests and their tokens.
        samples: number of time-series samples taken, and the sums of running, waiting and
            KV usage over them (for means).
    """

    __slots__ = (
        "_base",
        "config",
        "drained",
        "engine",
        "fast",
        "frozen",
        "host_factor",
        "index",
        "inflight",
        "kv_sum",
        "on_engine",
        "output_tokens",
        "prompt_tokens",
        "requests",
        "running_sum",
        "samples",
        "url",
        "waiting_sum",
        "wake_t",
        "wake_token",
    )

    def __init__(self, index: int, url: str, config: ReplicaConfig, *, fast: bool = True) -> None:
        self.index = index
        self.url = url
        self.config = config
        self.fast = fast
        self.host_factor = config.profile.host_factor(0)
        self.engine: Replica | None = self._new_engine()
        self.on_engine: Callable[[SimReplica, bool], None] | None = None
        """Called with ``(self, True)`` when a new engine starts (restart) and ``(self,
        False)`` when it is lost (the simulator's KV event feed listens here)."""
        self.drained = False
        self.frozen: Replica | None = None
        """The engine of a hung replica (:meth:`freeze`), kept aside: it runs no step."""
        self.inflight: dict[str, Any] = {}
        self.wake_t: float | None = None
        self.wake_token = 0
        self._base = dict.fromkeys(COUNTER_FIELDS, 0.0)
        self.requests = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.samples = 0
        self.running_sum = 0.0
        self.waiting_sum = 0.0
        self.kv_sum = 0.0

    def _new_engine(self) -> Replica:
        config = self.config
        if self.host_factor != 1.0:
            config = dataclasses.replace(config, slowdown=config.slowdown * self.host_factor)
        return Replica(config, fast=self.fast)

    @property
    def up(self) -> bool:
        """True while the engine exists (not failed)."""
        return self.engine is not None

    def counters(self) -> dict[str, float]:
        """Cumulative counters over every incarnation (names of :data:`COUNTER_FIELDS`)."""
        out = dict(self._base)
        if self.engine is not None:
            c: ReplicaCounters = self.engine.counters()
            for name in COUNTER_FIELDS:
                out[name] += getattr(c, name)
        return out

    def fail(self) -> None:
        """Discard the engine (down): its counters are kept, its state and cache are lost."""
        if self.engine is None:
            return
        self._base = self.counters()
        self.engine = None
        if self.on_engine is not None:
            self.on_engine(self, False)
        self.inflight = {}
        self.wake_t = None
        self.wake_token += 1

    @property
    def hung(self) -> bool:
        """True while the replica hangs (:meth:`freeze`)."""
        return self.frozen is not None

    def freeze(self) -> None:
        """Hang: the engine stops (kept aside, so nothing advances it) while the replica still
        accepts requests, which wait in ``inflight``."""
        if self.engine is not None:
            self.frozen = self.engine
            self.engine = None
            self.wake_t = None
            self.wake_token += 1

    def unfreeze(self) -> None:
        """Put a hung replica's engine back where it was (to be failed or run again)."""
        if self.frozen is not None:
            self.engine = self.frozen
            self.frozen = None

    def restart(self) -> None:
        """A fresh engine with an empty cache (no-op if up)."""
        if self.engine is None:
            self.engine = self._new_engine()
            if self.on_engine is not None:
                self.on_engine(self, True)

    def set_slowdown(self, factor: float, now: float) -> None:
        """Multiply every step starting from ``now`` by ``factor`` (1.0: full speed); a
        replica restarted later keeps the factor."""
        self.config = dataclasses.replace(self.config, slowdown=factor)
        if self.engine is not None:
            self.engine.set_slowdown(factor * self.host_factor, now)

    def set_host_factor(self, factor: float, now: float) -> None:
        """The host's factor on every step starting from ``now`` (``host_factor``)."""
        self.host_factor = factor
        if self.engine is not None:
            self.engine.set_slowdown(self.config.slowdown * factor, now)

    def gauges(self) -> tuple[int, int, float]:
        """``(running, waiting, kv usage)`` now; zeros while down."""
        e = self.engine
        if e is None:
            return 0, 0, 0.0
        return e.gauges()
