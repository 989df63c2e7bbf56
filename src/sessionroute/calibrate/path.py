"""The request path's delay: what a request sees outside the engine's queue and prefill.

``compare --fidelity`` sends probe requests of its own the way the arms send them (its live
client, through the arm's router, streamed chat completions; never the compared runs) and
replays each one at its send time into the simulator's engine with the profile just fitted
(:mod:`sessionroute.experiments.live.path_probe`). A request's *path delay* is its time to first
token at the client minus the replayed one: the client, the router, HTTP, the chat template and
the server's frontend, beyond what the step terms already hold (the calibration's own probes
time ``/v1/completions`` at the client, so its direct path's share is in ``b_req_s``).

:func:`fit_path_delay` fits ``d0 + d1 * n`` to those delays, ``n`` the other requests in flight
when a request was sent (the count the simulator knows), on the median delay of bins of
adjacent ``n`` (the fidelity bounds are on medians; a few requests stalled behind the host's
other work do not move it). Where the slope is not measurably above 0 (under 2 standard
errors) the delay is a constant, the median of every delay. A delay below 0 (the model slower
than the path) is fitted as 0: the profile holds no negative delay.

Where the slope counts, the fit also keeps the bins' medians as a curve (made non-decreasing
by weighted isotonic regression, pool-adjacent-violators, weights the bins' requests), which
the simulator interpolates instead of the line: on a test-bed whose host saturates, the delay
grows faster past a few requests in flight than before, and a line through both overstated it
where the arms run (the CI tier's light file, 2026-12-07: 14.7 ms per request where the bins
said 8 ms at 1 and 19 ms at 2).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessionroute.calibrate.host import HostFit
from sessionroute.replica.profiles import path_delay_at

__all__ = ["PathFit", "PathSample", "curve_from_bins", "fit_path_delay", "isotonic"]

_MIN_BIN = 12
"""Requests per bin: adjacent in-flight counts are pooled until a bin holds this many (a median
of fewer moved by tens of milliseconds between neighbouring counts on the CPU tier)."""


@dataclass(frozen=True, slots=True)
class PathSample:
    """One probe request.

    Attributes:
        in_flight: other requests in flight (sent, not yet answered) when it was sent.
        delay_s: client TTFT minus the replayed engine TTFT, seconds (may be negative).
    """

    in_flight: int
    delay_s: float


@dataclass(frozen=True, slots=True)
class PathFit:
    """``delay = d0_s + d1_s * in_flight``, fitted to probe requests.

    Attributes:
        d0_s: the delay with no other request in flight, seconds (>= 0).
        d1_s: its growth per other request in flight, seconds (>= 0; 0 when constant).
        d0_err, d1_err: relative standard errors (None: undetermined or at 0).
        load_dependent: whether the slope was measurably above 0 (else ``d1_s`` is 0).
        samples: probe requests used.
        bins: ``(in_flight, requests, median delay_s)`` per bin of adjacent in-flight counts
            (``in_flight`` the bin's mean count).
        rms_error: RMS of the fit's error on the bins' medians, seconds.
        extra: anything the prober adds (vLLM's own split of the probe's TTFT, the runs).
        curve: ``(in_flight, delay_s)`` points, in_flight increasing and delay_s
            non-decreasing and >= 0, that :meth:`delay_s` interpolates; empty when the delay
            does not grow measurably with the requests in flight (then the line holds).
    """

    d0_s: float
    d1_s: float
    d0_err: float | None
    d1_err: float | None
    load_dependent: bool
    samples: int
    bins: tuple[tuple[float, int, float], ...]
    rms_error: float
    extra: dict[str, Any]
    curve: tuple[tuple[float, float], ...] = ()
    host: HostFit | None = None
    """How the servers' steps slow down on the probe's path and while the others are busy
    (:mod:`sessionroute.calibrate.host`), fitted before the delay and replayed with it; None:
    not fitted (the step terms as calibrated)."""

    def delay_s(self, in_flight: int) -> float:
        """The fitted delay with ``in_flight`` other requests in flight, seconds."""
        return path_delay_at(self.curve, self.d0_s, self.d1_s, in_flight)

    def table(self) -> dict[str, Any]:
        """The ``[calibration.path]`` table of a profile file."""
        curve = {"curve": [[round(n, 2), round(d, 6)] for n, d in self.curve]} if self.curve else {}
        host = {"host": self.host.as_dict()} if self.host is not None else {}
        return {
            **curve,
            **host,
            "model": (
                "path_delay_curve interpolated by other requests in flight"
                if self.curve
                else "path_delay_s + path_delay_per_request_s * (other requests in flight)"
            ),
            "path_delay_s": self.d0_s,
            "path_delay_per_request_s": self.d1_s,
            "fit_error": {
                "path_delay_s": -1.0 if self.d0_err is None else round(self.d0_err, 4),
                "path_delay_per_request_s": -1.0 if self.d1_err is None else round(self.d1_err, 4),
            },
            "load_dependent": self.load_dependent,
            "samples": self.samples,
            "rms_error_s": round(self.rms_error, 6),
            "bins": [
                {"in_flight": round(n, 2), "requests": c, "median_delay_s": round(m, 6)}
                for n, c, m in self.bins
            ],
            **self.extra,
        }


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares
    (pool-adjacent-violators: a value below the one before is pooled with it into their
    weighted mean, as often as needed)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return [m for m, _, c in blocks for _ in range(int(c))]


def curve_from_bins(
    bins: Sequence[tuple[float, int, float]],
) -> tuple[tuple[float, float], ...]:
    """The path delay's curve from ``(in_flight, requests, median delay_s)`` bins: the medians
    made non-decreasing (:func:`isotonic`, weights the requests) and >= 0."""
    fitted = isotonic([m for _, _, m in bins], [float(c) for _, c, _ in bins])
    return tuple((n, max(0.0, y)) for (n, _, _), y in zip(bins, fitted, strict=True))


def _median_se(values: Sequence[float]) -> float:
    """Standard error of a median (normal approximation: 1.2533 * sd / sqrt(n))."""
    if len(values) < 2:
        return math.inf
    return 1.2533 * statistics.stdev(values) / math.sqrt(len(values))


def _pool(by_n: dict[int, list[float]]) -> list[tuple[float, list[float]]]:
    """Adjacent in-flight counts pooled into bins of at least :data:`_MIN_BIN` requests (the
    last, short one joins its neighbour): ``(mean count, delays)`` each, by count."""
    groups: list[list[tuple[int, float]]] = []
    cur: list[tuple[int, float]] = []
    for n in sorted(by_n):
        cur += [(n, d) for d in by_n[n]]
        if len(cur) >= _MIN_BIN:
            groups.append(cur)
            cur = []
    if cur:
        if groups:
            groups[-1] += cur
        else:
            groups.append(cur)
    return [(sum(n for n, _ in g) / len(g), [d for _, d in g]) for g in groups]


def fit_path_delay(samples: Sequence[PathSample], extra: dict[str, Any] | None = None) -> PathFit:
    """Fit ``d0 + d1 * in_flight`` to probe requests (module docstring).

    Bins of adjacent in-flight counts of at least 12 requests each; a weighted least-squares
    line (weights: the counts) through the other bins' medians and anchored at the median of
    the first (the requests sent with the fewest others in flight: ``d0`` is what a request
    alone sees, ``d1`` the growth beyond it; an unanchored line through a delay that jumps at
    two or three in flight and then flattens put ``d0`` at 2-4 times the idle requests' median
    on the CPU tier). The slope counts when it is above 0 by more than 2 standard errors, else
    the delay is the median of all delays.

    Raises:
        ValueError: no samples.
    """
    if not samples:
        raise ValueError("no path probe requests to fit")
    by_n: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        by_n[max(0, s.in_flight)].append(s.delay_s)
    pooled = _pool(by_n)
    bins = tuple((n, len(d), statistics.median(d)) for n, d in pooled)
    every = [s.delay_s for s in samples]
    d0 = statistics.median(every)
    d0_se = _median_se(every)
    d1 = 0.0
    d1_se: float | None = None
    load = False
    if len(bins) >= 3:
        # the line goes through the first bin's median (the requests sent with the fewest
        # others in flight): d0 is the delay of a request alone, d1 its growth beyond it
        x0, _, y0 = bins[0]
        rest = bins[1:]
        w = [float(c) for _, c, _ in rest]
        dx = [n - x0 for n, _, _ in rest]
        dy = [m - y0 for _, _, m in rest]
        sxx = sum(wi * xi * xi for wi, xi in zip(w, dx, strict=True))
        if sxx > 0:
            slope = sum(wi * xi * yi for wi, xi, yi in zip(w, dx, dy, strict=True)) / sxx
            resid = sum(wi * (yi - slope * xi) ** 2 for wi, xi, yi in zip(w, dx, dy, strict=True))
            s2 = resid / (len(rest) - 1)  # variance per unit weight (a bin of one request)
            se_slope = math.sqrt(s2 / sxx)
            if slope > 0 and slope > 2 * se_slope:
                load = True
                d1, d1_se = slope, se_slope
                d0 = y0 - slope * x0
                d0_se = _median_se(pooled[0][1])
    d0_clamped = max(0.0, d0)
    curve = curve_from_bins(bins) if load else ()
    rms = math.sqrt(
        sum(c * (m - d0_clamped - d1 * n) ** 2 for n, c, m in bins) / sum(c for _, c, _ in bins)
    ) if bins else 0.0  # fmt: skip
    return PathFit(
        d0_s=d0_clamped,
        d1_s=d1,
        d0_err=None if d0_clamped <= 0 or not math.isfinite(d0_se) else d0_se / d0_clamped,
        d1_err=None if d1_se is None or d1 <= 0 else d1_se / d1,
        load_dependent=load,
        samples=len(samples),
        bins=bins,
        rms_error=rms,
        extra=dict(extra or {}),
        curve=curve,
    )
