"""A request's state inside the replica model, and its lifecycle states."""

from __future__ import annotations

from typing import Final

from sessionroute.replica.api import RequestResult
from sessionroute.replica.blocks import Holder

__all__ = ["ABORTED", "FINISHED", "RUNNING", "WAITING", "Req"]


RUNNING: Final = 0
WAITING: Final = 1
FINISHED: Final = 2
ABORTED: Final = 3


class Req(Holder):
    """Mutable state of one request inside the engine (token counts in tokens, times in s);
    the pool's part (keys, cache, blocks) is :class:`~sessionroute.replica.blocks.Holder`'s.

    Args:
        rid: the request id.
        prompt_len: prompt tokens.
        output_len: tokens to generate.
        keys: chained block keys of prompt + output.
        nkeys: usable keys, ``min(len(keys), (prompt_len + output_len) // block_size)``.
        cache: the cache dict of the request's ``cache_salt``.
        arrival: arrival time, seconds.

    Attributes:
        nc: tokens computed, or scheduled in the step in flight (vLLM ``num_computed_tokens``).
        num_output: tokens generated so far (for a lazy decoder: as of step ``sync``).
        status: ``RUNNING``, ``WAITING``, ``FINISHED`` or ``ABORTED``.
        order: admission order (ascending along the scheduler's ``running`` list).
        lazy: a lazy decoder of the fast path (:mod:`sessionroute.replica.lazy`): its token
            counters and times are as of step ``sync``.
        blazy: a lazy decoder whose blocks are kept lazily too
            (:mod:`sessionroute.replica.decodeblocks`).
        sync: for a lazy decoder, the step index its counters refer to.
        phase: for a lazy decoder, ``(nc - sync) % block_size``: it starts a block in steps
            ``g`` with ``(phase + g) % block_size == 0``.
    """

    __slots__ = (
        "arrival",
        "blazy",
        "cached_tokens",
        "first_sched",
        "first_token",
        "itl_max",
        "itl_sum",
        "last_token",
        "lazy",
        "nc",
        "num_output",
        "order",
        "output_len",
        "phase",
        "preemptions",
        "prompt_len",
        "rid",
        "status",
        "sync",
    )

    def __init__(
        self,
        rid: str,
        prompt_len: int,
        output_len: int,
        keys: list[int],
        nkeys: int,
        cache: dict[int, int],
        arrival: float,
    ) -> None:
        Holder.__init__(self, keys, nkeys, cache)
        self.rid = rid
        self.prompt_len = prompt_len
        self.output_len = output_len
        self.arrival = arrival
        self.num_output = 0
        self.nc = 0
        self.status = WAITING
        self.first_sched = -1.0
        self.first_token = -1.0
        self.last_token = -1.0
        self.itl_sum = 0.0
        self.itl_max = 0.0
        self.cached_tokens = -1
        self.preemptions = 0
        self.lazy = False
        self.blazy = False
        self.sync = 0
        self.phase = 0
        self.order = 0

    def result(self, finish: float) -> RequestResult:
        """The finished request's :class:`RequestResult` (``finish`` in seconds)."""
        gaps = self.output_len - 1
        return RequestResult(
            request_id=self.rid,
            arrival_s=self.arrival,
            first_scheduled_s=self.first_sched,
            first_token_s=self.first_token,
            finish_s=finish,
            prompt_tokens=self.prompt_len,
            output_tokens=self.output_len,
            cached_tokens=self.cached_tokens,
            preemptions=self.preemptions,
            queue_time_s=self.first_sched - self.arrival,
            itl_mean_s=self.itl_sum / gaps if gaps else 0.0,
            itl_max_s=self.itl_max,
        )
