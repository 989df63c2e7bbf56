"""What the scheduler hands to the clock: one engine step, or a run of steps planned together
(fast path)."""

from __future__ import annotations

from typing import Final

from sessionroute.replica.request import Req

__all__ = ["Step"]

_NO_INTS: Final[list[int]] = []
_NO_FLOATS: Final[list[float]] = []


class Step:
    """A step (``k == 0``: ``sched`` lists ``(request, tokens)``) or a run of ``k`` steps.

    A decode run's step ``j`` lasts ``a + c * j`` seconds (context grows by ``D`` tokens a step)
    and every lazy decoder decodes one token in each. A prefill run (``pre``) is ``k`` steps in
    which the lazy decoders decode and ``req`` prefills ``chunks[j]`` tokens in step ``j``, which
    lasts ``dts[j]`` and ends at ``ts[j]``; lazy decoders finish at the end of the steps listed in
    ``ev``; its first ``j`` steps are applied, and step ``j`` has started unless not ``begun``.
    """

    __slots__ = (
        "a",
        "begun",
        "c",
        "chunks",
        "dts",
        "end",
        "ev",
        "j",
        "k",
        "lazy",
        "pre",
        "req",
        "sched",
        "start",
        "ts",
    )

    def __init__(self, start: float, end: float, sched: list[tuple[Req, int]]) -> None:
        self.start = start
        self.end = end
        self.sched = sched
        self.k = 0
        self.lazy = False  # fast path: lazy decoders decode in this step too
        self.a = 0.0
        self.c = 0.0
        self.pre = False
        self.req: Req | None = None
        # A prefill run assigns its own lists; every other step shares these empty ones (never
        # mutated), so an ordinary step allocates none.
        self.chunks: list[int] = _NO_INTS
        self.ev: list[int] = _NO_INTS
        self.j = 0
        self.begun = True  # step j has started (False: it starts exactly where step j-1 ended)
        self.ts: list[float] = _NO_FLOATS
        self.dts: list[float] = _NO_FLOATS
