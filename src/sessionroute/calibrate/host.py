"""Servers that share a host: how much each one's steps slow down while the others are busy.

Servers on one CPU host take turns on its cores with each other and with everything on the
request path (each server's frontend, the router and the clients, all of which handle every
streamed token). ``sessionroute calibrate`` times the step terms straight at the servers; the
arms' requests take the whole path. ``compare --fidelity``'s path probe
(:mod:`sessionroute.experiments.live.path_probe`) replays each of its requests at its send time
into the simulator's engine (no sharing) and sets the request's live time per output token
(first to last token, over its output tokens less one) beside the replayed one. On the 2-core
CPU tier (2 servers, 14 recorded ``compare --fidelity`` outputs, 3,468 requests, 2026-12-07)
that ratio was 0.88 (median) while the other server was idle through a request's decode and
1.32-1.40 while it was busy, in every arm of every run.

:func:`fit_host` takes the median ratio of the requests that decoded with the other servers
idle (``busy_others`` under 0.25 on average: ``c0``, the profile's ``path_step_factor``) and of
those that decoded with them busy (over 0.75: ``c0 * (1 + k * b)``, ``b`` their mean
``busy_others``), and ``k`` (the profile's ``peer_busy_slowdown``; see
``StepTimeProfile.host_factor``) from the two. Two medians, not a line through bins: the ratio
of one probe request scatters by tens of percent, and the probe's requests pile up at the two
ends. Where the busy median is not above the idle one by 2 standard errors (at least 1 % of the
idle median each), or either group
has fewer than :data:`_MIN_GROUP` requests, ``k`` is 0 and ``c0`` the median of every ratio.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["HostFit", "HostSample", "fit_host"]

_BIN = 12
"""Requests per bin of :attr:`HostFit.bins` (the last, short one joins its neighbour)."""

_MIN_GROUP = 8
"""Requests at least in each of the idle and the busy group."""


@dataclass(frozen=True, slots=True)
class HostSample:
    """One probe request.

    Attributes:
        busy_others: other servers busy on average over its decode (0 to servers - 1).
        ratio: its live time per output token over the replayed one (no sharing), > 0.
    """

    busy_others: float
    ratio: float


@dataclass(frozen=True, slots=True)
class HostFit:
    """``ratio = path_step_factor * (1 + peer_busy_slowdown * busy_others)``.

    Attributes:
        path_step_factor: the step terms' factor with no other server busy (> 0).
        peer_busy_slowdown: growth per other server busy, a fraction (>= 0; 0 when the
            slope was not measurably above 0).
        shared: whether the busy requests' median was measurably above the idle ones'.
        samples: probe requests used.
        bins: ``(busy_others, requests, median ratio)`` per bin, ``busy_others`` the bin's
            mean.
        servers: how many servers the probe ran on (0: not given). A profile fitted on 2
            says nothing of how 32 replicas on one host would slow each other.
    """

    path_step_factor: float
    peer_busy_slowdown: float
    shared: bool
    samples: int
    bins: tuple[tuple[float, int, float], ...]
    servers: int = 0

    def as_dict(self) -> dict[str, Any]:
        """For the profile file's ``[calibration.host]`` and ``fidelity.json``."""
        return {
            "model": "step terms x path_step_factor * (1 + peer_busy_slowdown * busy others)",
            "path_step_factor": round(self.path_step_factor, 4),
            "peer_busy_slowdown": round(self.peer_busy_slowdown, 4),
            "shared": self.shared,
            "samples": self.samples,
            "servers": self.servers,
            "bins": [
                {"busy_others": round(b, 3), "requests": c, "median_ratio": round(m, 4)}
                for b, c, m in self.bins
            ],
        }


def _bins(samples: Sequence[HostSample]) -> list[tuple[float, int, float]]:
    ordered = sorted(samples, key=lambda s: s.busy_others)
    groups = [list(ordered[i : i + _BIN]) for i in range(0, len(ordered), _BIN)]
    if len(groups) > 1 and len(groups[-1]) < _BIN:
        tail = groups.pop()
        groups[-1] += tail
    return [
        (statistics.fmean(s.busy_others for s in g), len(g), statistics.median(s.ratio for s in g))
        for g in groups
    ]


def fit_host(samples: Sequence[HostSample], servers: int = 0) -> HostFit:
    """Fit the probe's requests (module docstring), made on ``servers`` servers.

    Raises:
        ValueError: no samples, or a ratio that is not > 0.
    """
    if not samples:
        raise ValueError("no path probe requests to fit the host's sharing on")
    if any(not s.ratio > 0 for s in samples):
        raise ValueError("a time-per-token ratio must be > 0")
    bins = tuple(_bins(samples))
    idle = [s.ratio for s in samples if s.busy_others < 0.25]
    busy = [s for s in samples if s.busy_others > 0.75]
    c0 = statistics.median(s.ratio for s in samples)
    if len(idle) >= _MIN_GROUP and len(busy) >= _MIN_GROUP:
        r0 = statistics.median(idle)
        r1 = statistics.median(s.ratio for s in busy)
        b = statistics.fmean(s.busy_others for s in busy)
        # a floor of 1 % of the idle median: ratios mostly equal (a MAD of 0) prove nothing
        se = max(math.hypot(_median_se(idle), _median_se([s.ratio for s in busy])), 0.01 * r0)
        if r1 - r0 > 2 * se:
            return HostFit(r0, (r1 / r0 - 1) / b, True, len(samples), bins, servers)
    return HostFit(c0, 0.0, False, len(samples), bins, servers)


def _median_se(values: Sequence[float]) -> float:
    """Standard error of a median: ``1.2533 * sigma / sqrt(n)``, ``sigma`` from the median
    absolute deviation (``1.4826 * MAD``: a few requests stalled behind the host's other work
    do not inflate it, as they would a standard deviation)."""
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(values))
