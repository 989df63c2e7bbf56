"""The public replica model: one vLLM V1 replica driven by explicit times."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from heapq import heapify, heappush

from sessionroute.errors import ConfigError
from sessionroute.replica.api import (
    EngineRequest,
    EngineRequestError,
    ReplicaConfig,
    ReplicaCounters,
    RequestResult,
    key_list,
)
from sessionroute.replica.blocks import KVListener
from sessionroute.replica.core import Core
from sessionroute.replica.fast import FastCore
from sessionroute.replica.request import ABORTED, RUNNING, WAITING, Req

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
        self._fast_core: FastCore | None = self._core if isinstance(self._core, FastCore) else None
        self._time = float("-inf")
        self._model_len = config.model_len
        self._num_blocks = self._core.pool.num_blocks

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
        self._add(
            req.request_id, req.prompt_len, req.output_len, req.block_keys, req.cache_salt, now
        )

    def arrive(
        self,
        request_id: str,
        prompt_len: int,
        output_len: int,
        block_keys: Sequence[int],
        cache_salt: str | None,
        now: float,
    ) -> tuple[list[RequestResult], float | None]:
        """:meth:`advance` to ``now``, :meth:`add_request` and :meth:`next_event_time` in one call.

        The request's fields are passed as they are (no :class:`EngineRequest`); it is checked
        before anything runs, so a refused request changes nothing.

        Returns:
            ``(finished, next_t)``: what ``advance(now)`` returns, and ``next_event_time()``
            after the request was queued.

        Raises:
            EngineRequestError: as :meth:`add_request`.
        """
        keys = self._check(request_id, prompt_len, output_len, block_keys)
        out = self.advance(now)
        self._queue(request_id, prompt_len, output_len, keys, cache_salt, now)
        return out, self._core.next_event(self._time)

    def _check(
        self, rid: str, prompt_len: int, output_len: int, block_keys: Sequence[int]
    ) -> list[int]:
        """Validate a request (see :meth:`add_request`); returns its keys as a list
        (:func:`~sessionroute.replica.api.key_list`)."""
        core = self._core
        bs = core.bs
        total = prompt_len + output_len
        nkeys = len(block_keys)
        if (
            prompt_len < 1
            or output_len < 1
            or total > self._model_len
            or -(-total // bs) > self._num_blocks
            or nkeys < prompt_len // bs
            or rid in core.reqs
        ):
            self._refuse(rid, prompt_len, output_len, nkeys)
        return key_list(block_keys)

    def _refuse(self, rid: str, prompt_len: int, output_len: int, nkeys: int) -> None:
        """Raise the :class:`EngineRequestError` of a request that :meth:`_check` refused."""
        bs = self._core.bs
        total = prompt_len + output_len
        if prompt_len < 1:
            raise EngineRequestError(f"{rid}: prompt_len must be >= 1, got {prompt_len}")
        if output_len < 1:
            raise EngineRequestError(f"{rid}: output_len must be >= 1, got {output_len}")
        if total > self._model_len:
            raise EngineRequestError(
                f"{rid}: prompt_len + output_len = {total} exceeds max_model_len {self._model_len}"
            )
        if -(-total // bs) > self._num_blocks:
            raise EngineRequestError(
                f"{rid}: prompt_len + output_len = {total} exceeds the KV capacity "
                f"of {self._num_blocks} blocks of {bs} tokens"
            )
        if nkeys < prompt_len // bs:
            raise EngineRequestError(
                f"{rid}: {nkeys} block_keys for {prompt_len // bs} full prompt blocks of "
                f"{bs} tokens"
            )
        raise EngineRequestError(f"duplicate live request_id {rid!r}")

    def _add(
        self,
        rid: str,
        prompt_len: int,
        output_len: int,
        block_keys: Sequence[int],
        cache_salt: str | None,
        now: float,
    ) -> None:
        keys = self._check(rid, prompt_len, output_len, block_keys)
        self._queue(rid, prompt_len, output_len, keys, cache_salt, now)

    def _queue(
        self,
        rid: str,
        prompt_len: int,
        output_len: int,
        keys: list[int],
        cache_salt: str | None,
        now: float,
    ) -> None:
        """Put a checked request in the engine's arrivals (a heap by time, then order)."""
        core = self._core
        nkeys = len(keys)
        full = (prompt_len + output_len) // core.bs
        r = Req(
            rid,
            prompt_len,
            output_len,
            keys,
            nkeys if nkeys < full else full,
            core.pool.cache_for(cache_salt),
            now,
        )
        if self._fast_core is not None:
            self._fast_core.split(now, arrival=True)
        core.reqs[rid] = r
        core.seq += 1
        heappush(core.pending, (now, core.seq, r))

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

    def wake(
        self, t: float, until: float, inclusive: bool = False
    ) -> tuple[list[RequestResult], float | None, int]:
        """:meth:`advance` to ``t``, then on through the replica's own event times while
        nothing has finished and the next one is before ``until`` (or equal, ``inclusive``).

        One call for what a driver would do in a loop of :meth:`advance` and
        :meth:`next_event_time` calls while it has nothing else to do before ``until``: the
        same steps run in the same order. :attr:`time` is the last time advanced to.

        Like :meth:`next_event_time`, computing ``next_t`` starts a step due at the last time
        advanced to. A driver that answers a finish with a new request *at the finish time*
        (a closed loop with no delay) and wants it in that step must use :meth:`advance`,
        :meth:`add_request`, then :meth:`next_event_time` instead (``bench engine`` does).

        Returns:
            ``(finished, next_t, moves)``: the requests that finished at the last time advanced
            to (in finish order), :meth:`next_event_time` after it, and how many times the
            replica moved on to its next event time past ``t``.
        """
        core = self._core
        done = core.done
        moves = 0
        while True:
            core.run_until(t)
            if t > self._time:
                self._time = t
            if done and done[0].finish_s <= t:
                out: list[RequestResult] = []
                while done and done[0].finish_s <= t:
                    out.append(done.popleft())
                return out, core.next_event(self._time), moves
            nt = core.next_event(self._time)
            if nt is None:
                return [], None, moves
            if nt < t:
                nt = t
            if nt < until or (inclusive and nt == until):
                t = nt
                moves += 1
                continue
            return [], nt, moves

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
            heapify(core.pending)
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

    def set_kv_listener(self, listener: KVListener | None) -> None:
        """Report every change of the prefix cache to ``listener`` (None: stop, the default).

        ``listener(stored, keys, salt)`` is called synchronously as the engine caches blocks
        (``stored`` True: vLLM ``BlockStored``, the newly cached blocks' keys in chain order;
        blocks whose content was cached already are not re-announced) and evicts or uncaches
        them (``stored`` False: ``BlockRemoved``), under the request's ``cache_salt``. A block
        being decoded is announced when the engine next brings its blocks up to date (at the
        latest when the request finishes), as vLLM announces a block when it fills.
        Without a listener the engine does one attribute test per cache change.
        """
        self._core.pool.kv_listener = listener

    def cached_prefix_blocks(self, keys: Sequence[int], salt: str | None = None) -> int:
        """How many leading blocks of the chained ``keys`` the prefix cache holds now (vLLM
        ``find_longest_cache_hit``, no limit), without changing the engine's state: what a
        lossless, instant KV-event index of this replica answers (the simulator's ``kv_aware``
        reads such an index, fed by :meth:`set_kv_listener`; this is the direct answer)."""
        if not keys:
            return 0
        pool = self._core.pool
        hit: int = pool.lookup(pool.cache_for(salt), key_list(keys), len(keys))[0]
        return hit

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

    def gauges(self) -> tuple[int, int, float]:
        """``(num_running, num_waiting, kv_cache_usage)`` read at once (one sync, not three)."""
        self._sync()
        core = self._core
        return len(core.running), len(core.waiting) + len(core.pending), core.pool.usage

    @property
    def num_gpu_blocks(self) -> int:
        """KV blocks (``vllm:cache_config_info{num_gpu_blocks}``)."""
        return self._core.pool.num_blocks

    def counters(self) -> ReplicaCounters:
        """Cumulative counters (vLLM names in :class:`ReplicaCounters`)."""
        self._sync()
        c = self._core
        # A step's duration is counted when it is planned (at its start); the part of the step
        # in flight after the time advanced to has not been spent yet.
        busy = c.busy
        st = c.inflight
        if st is not None and not st.k and st.end > self._time:
            busy -= st.end - max(st.start, self._time)
        return ReplicaCounters(
            prefix_cache_queries=c.n_queries,
            prefix_cache_hits=c.n_hits,
            num_preemptions=c.n_preemptions,
            prompt_tokens=c.n_prompt,
            generation_tokens=c.n_generation,
            iteration_tokens=c.n_iteration,
            steps=c.n_steps,
            busy_time_s=busy,
            requests_finished=c.n_finished,
            num_gpu_blocks=c.pool.num_blocks,
            block_size=c.bs,
        )
