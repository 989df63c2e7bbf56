"""The public replica model: one vLLM V1 replica driven by explicit times."""

from __future__ import annotations

import dataclasses
import heapq

from sessionroute.engine.api import (
    EngineRequest,
    EngineRequestError,
    ReplicaConfig,
    ReplicaCounters,
    RequestResult,
)
from sessionroute.engine.core import ABORTED, RUNNING, WAITING, Core, Req
from sessionroute.engine.fast import FastCore
from sessionroute.errors import ConfigError

__all__ = ["Replica"]


class Replica:
    """A pure, synchronous model of one vLLM V1 replica (``shared/ENGINE.md``).

    Time only comes from the arguments. Steps run back to back while there is work; an idle
    engine starts its next step at the arrival time of new work. A step's batch is fixed when
    it starts, so a request joins the first step that starts at or after its ``now``.

    Args:
        config: profile and engine limits.
        fast: jump over runs of identical decode steps in closed form (default); ``False`` runs
            the one-step-per-iteration reference. Both give the same results.
    """

    def __init__(self, config: ReplicaConfig, *, fast: bool = True) -> None:
        self.config = config
        self.fast = fast
        self._core: Core = FastCore(config) if fast else Core(config)
        self._time = float("-inf")

    # ------------------------------------------------------------------ driving

    @property
    def time(self) -> float:
        """Engine clock, seconds: the latest ``t`` given to :meth:`advance` (-inf before)."""
        return self._time

    def add_request(self, req: EngineRequest, now: float) -> None:
        """Queue a request that arrives at ``now`` (seconds).

        Raises:
            EngineRequestError: ``prompt_len < 1``, ``output_len < 1``, prompt + output above
                ``max_model_len`` or above the KV capacity, too few ``block_keys`` for the
                prompt's full blocks, or a ``request_id`` still live on this replica.
        """
        core = self._core
        cfg = self.config
        bs = core.bs
        if req.prompt_len < 1:
            raise EngineRequestError(
                f"{req.request_id}: prompt_len must be >= 1, got {req.prompt_len}"
            )
        if req.output_len < 1:
            raise EngineRequestError(
                f"{req.request_id}: output_len must be >= 1, got {req.output_len}"
            )
        total = req.prompt_len + req.output_len
        if total > cfg.model_len:
            raise EngineRequestError(
                f"{req.request_id}: prompt_len + output_len = {total} exceeds max_model_len "
                f"{cfg.model_len}"
            )
        if -(-total // bs) > core.pool.num_blocks:
            raise EngineRequestError(
                f"{req.request_id}: prompt_len + output_len = {total} exceeds the KV capacity "
                f"of {core.pool.num_blocks} blocks of {bs} tokens"
            )
        nkeys = len(req.block_keys)
        if nkeys < req.prompt_len // bs:
            raise EngineRequestError(
                f"{req.request_id}: {nkeys} block_keys for {req.prompt_len // bs} full prompt "
                f"blocks of {bs} tokens"
            )
        if req.request_id in core.reqs:
            raise EngineRequestError(f"duplicate live request_id {req.request_id!r}")
        keys = req.block_keys
        if not isinstance(keys, list | tuple):
            keys = list(keys)
        r = Req(
            req.request_id,
            req.prompt_len,
            req.output_len,
            keys,
            min(nkeys, total // bs),
            core.pool.cache_for(req.cache_salt),
            now,
        )
        if isinstance(core, FastCore):
            core.split(now, arrival=True)
        core.reqs[r.rid] = r
        core.seq += 1
        heapq.heappush(core.pending, (now, core.seq, r))

    def advance(self, t: float) -> list[RequestResult]:
        """Run the engine to time ``t`` (seconds).

        Steps that start before ``t`` run; a step in progress at ``t`` stays in progress.

        Returns:
            The requests that finished at or before ``t``, in finish order.
        """
        core = self._core
        core.run_until(t)
        if t > self._time:
            self._time = t
        done = core.done
        out: list[RequestResult] = []
        while done and done[0].finish_s <= t:
            out.append(done.popleft())
        return out

    def next_event_time(self) -> float | None:
        """Time of the replica's next internal event, seconds; None when idle.

        The end of the step (or run of steps) in progress, or of a prefill run's next step in
        which a request finishes, else the next known arrival. Every finish happens at such a
        time, so this is a lower bound on the earliest finish if nothing new arrives (exact when
        the run ends with a completion); a caller advances to it and may get no results, then
        asks again. A step due to start exactly at :attr:`time` is started by this call.
        """
        return self._core.next_event(self._time)

    def abort(self, request_id: str, now: float) -> bool:
        """Cancel a pending, waiting or running request at ``now``; its blocks are freed.

        Returns:
            True if the request was live; False if unknown or already finished.
        """
        core = self._core
        r = core.reqs.get(request_id)
        if r is None:
            return False
        core.run_until(now)
        if r.status not in (RUNNING, WAITING):
            return False
        if isinstance(core, FastCore):
            core.split(now)
        if r.status == RUNNING:
            core.drop(r)
        elif r in core.waiting:
            core.waiting.remove(r)
        else:
            core.pending = [p for p in core.pending if p[2] is not r]
            heapq.heapify(core.pending)
        r.status = ABORTED
        del core.reqs[request_id]
        return True

    def set_slowdown(self, factor: float, now: float) -> None:
        """Multiply the duration of every step starting at or after ``now`` by ``factor``.

        A slow-replica fault (``ReplicaConfig.slowdown`` at run time); the step in progress
        keeps its duration. ``factor`` 1.0 restores full speed.

        Raises:
            ConfigError: if ``factor`` is not > 0.
        """
        if not factor > 0:
            raise ConfigError(f"slowdown must be > 0, got {factor}")
        core = self._core
        core.run_until(now)
        if isinstance(core, FastCore):
            core.split(now)
        core.slowdown = factor
        self.config = dataclasses.replace(self.config, slowdown=factor)

    def reset_prefix_cache(self) -> int:
        """Uncache every idle cached block (vLLM ``reset_prefix_cache``); returns how many."""
        self._sync()
        return self._core.pool.reset_prefix_cache()

    # ------------------------------------------------------------------ gauges and counters

    def _sync(self) -> None:
        core = self._core
        if isinstance(core, FastCore):
            core.split(self._time)

    @property
    def num_running(self) -> int:
        """``vllm:num_requests_running``."""
        self._sync()
        return len(self._core.running)

    @property
    def num_waiting(self) -> int:
        """``vllm:num_requests_waiting`` (queued plus arrived but not yet seen by a step)."""
        self._sync()
        return len(self._core.waiting) + len(self._core.pending)

    @property
    def kv_cache_usage(self) -> float:
        """``vllm:kv_cache_usage_perc`` in [0, 1]: blocks in use (idle cached blocks excluded)."""
        self._sync()
        return self._core.pool.usage

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks (``vllm:cache_config_info{num_gpu_blocks}``)."""
        return self._core.pool.num_blocks

    def counters(self) -> ReplicaCounters:
        """Cumulative counters (vLLM names in :class:`ReplicaCounters`)."""
        self._sync()
        c = self._core
        return ReplicaCounters(
            prefix_cache_queries=c.n_queries,
            prefix_cache_hits=c.n_hits,
            num_preemptions=c.n_preemptions,
            prompt_tokens=c.n_prompt,
            generation_tokens=c.n_generation,
            iteration_tokens=c.n_iteration,
            steps=c.n_steps,
            busy_time_s=c.busy,
            requests_finished=c.n_finished,
            num_gpu_blocks=c.pool.num_blocks,
            block_size=c.bs,
        )
