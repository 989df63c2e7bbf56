"""A Prometheus histogram kept as plain counts on the event loop.

The router's per-request histograms are updated from protocol callbacks, where a
prometheus-client ``Histogram`` (a lock and a method call per observation, 3-5 microseconds)
costs more than the work measured. :class:`Histogram` is a list of bucket counts and a sum
(about 0.5 microseconds per observation), exported at scrape time by a custom collector in
the same format as prometheus-client's own type (without ``_created`` series).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from typing import cast

from prometheus_client.utils import floatToGoString as _go_float

__all__ = ["Histogram"]

_le = cast(Callable[[float], str], _go_float)  # the "le" label text prometheus-client writes


class Histogram:
    """Bucket counts and sum of observations (cumulated at scrape time).

    Args:
        bounds: the buckets' upper bounds, increasing (``+Inf`` is implied).

    Attributes:
        bounds: as given.
        counts: observations per bucket (not cumulative; the last one is ``+Inf``).
        total: the sum of observations.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation (a bucket's bound is inclusive, Prometheus' ``le``)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, as ``HistogramMetricFamily`` takes them."""
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            acc += n
            out.append((_le(bound), acc))
        return out
