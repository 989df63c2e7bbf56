"""Length and latency distributions given by quantiles (WORKLOADS.md states them that way).

* :class:`LogNormal` - a lognormal fixed by its median and 90th percentile, capped;
  ``sigma = ln(p90 / median) / z_0.9`` with ``z_0.9 = 1.2815515655446004``.
* :class:`QuantileTable` - a piecewise log-linear inverse CDF through given ``(q, value)``
  points, for distributions stated as "median 29, p90 56, p99 85, max 100".

Both sample from an injected ``numpy.random.Generator``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from sessionroute.errors import ConfigError

__all__ = ["Z90", "LogNormal", "QuantileTable"]

Z90: Final = 1.2815515655446004
"""The standard normal's 0.9 quantile."""


class LogNormal:
    """Lognormal with the given median and p90, clipped to ``[floor, cap]``.

    Args:
        median: the median (> 0).
        p90: the 90th percentile (>= median; equal gives a constant).
        cap: upper clip (>= floor).
        floor: lower clip.

    Raises:
        ConfigError: if the parameters are not ordered as above.
    """

    __slots__ = ("cap", "floor", "mu", "sigma")

    def __init__(self, median: float, p90: float, cap: float, floor: float = 0.0) -> None:
        if not median > 0:
            raise ConfigError(f"median must be > 0, got {median!r}")
        if p90 < median:
            raise ConfigError(f"p90 ({p90!r}) must be >= median ({median!r})")
        if cap < floor:
            raise ConfigError(f"cap ({cap!r}) must be >= floor ({floor!r})")
        self.mu = math.log(median)
        self.sigma = math.log(p90 / median) / Z90
        self.cap = float(cap)
        self.floor = float(floor)

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """``n`` draws as a float array: ``clip(rng.lognormal(mu, sigma, n), floor, cap)`` (a
        constant when ``sigma`` is 0)."""
        if self.sigma > 0:
            x = rng.lognormal(self.mu, self.sigma, n)
        else:
            x = np.full(n, math.exp(self.mu))
        return np.minimum(np.maximum(x, self.floor), self.cap)

    def sample_list(self, rng: np.random.Generator, n: int) -> list[float]:
        """``n`` draws as a Python list (the values of :meth:`sample`)."""
        return self.sample(rng, n).tolist()  # type: ignore[no-any-return]

    def sample_int(self, rng: np.random.Generator, n: int) -> list[int]:
        """``n`` draws rounded to ints (at least ``max(1, floor)``), as a Python list:
        ``maximum(rint(sample(rng, n)), max(1, ceil(floor)))`` (half to even)."""
        low = max(1, math.ceil(self.floor))
        x = np.maximum(np.rint(self.sample(rng, n)), low).astype(np.int64)
        return x.tolist()  # type: ignore[no-any-return]


class QuantileTable:
    """Inverse CDF through ``(quantile, value)`` points, log-linear between them.

    Args:
        points: ``(q, value)`` pairs with q strictly increasing from 0.0 to 1.0 and values
            positive and non-decreasing.

    Raises:
        ConfigError: if the points are not as above.
    """

    __slots__ = ("_logv", "_q")

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        pts = list(points)
        if len(pts) < 2 or pts[0][0] != 0.0 or pts[-1][0] != 1.0:
            raise ConfigError(f"quantile points must run from q=0 to q=1, got {pts!r}")
        for (q0, v0), (q1, v1) in itertools.pairwise(pts):
            if not q1 > q0 or v1 < v0:
                raise ConfigError(f"quantile points must increase, got {pts!r}")
        if pts[0][1] <= 0:
            raise ConfigError(f"quantile values must be > 0, got {pts!r}")
        self._q = np.array([q for q, _ in pts], dtype=np.float64)
        self._logv = np.log(np.array([v for _, v in pts], dtype=np.float64))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """``n`` draws as a float array."""
        u = rng.random(n)
        return np.exp(np.interp(u, self._q, self._logv))

    def sample_int(self, rng: np.random.Generator, n: int) -> list[int]:
        """``n`` draws rounded to ints (at least 1), as a Python list."""
        x = np.maximum(np.rint(self.sample(rng, n)).astype(np.int64), 1)
        return x.tolist()  # type: ignore[no-any-return]
