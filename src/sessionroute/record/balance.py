"""Balance and cache-thrash measures of an arm that do not saturate under load.

Busy time saturates: every replica of a loaded fleet is busy all the time whether it runs 30
requests or 200, so busy-time CoV reads ~0 for a badly balanced fleet. These measures compare
what the replicas carry instead (running requests, output tokens, KV usage), and find the
replica-intervals whose prefix-cache hit rate collapsed (a thrashing replica: its working set
no longer fits, the failure mode of consistent hashing under skew; see ``shared/POLICIES.md``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sessionroute.record.recorder import cov

__all__ = ["THRASH_FRACTION", "HitDips", "cov_of", "hit_dips"]

THRASH_FRACTION = 0.5
"""A replica-interval thrashes when its hit rate is below this fraction of the fleet's."""

_MIN_QUERY_SHARE = 0.1
"""Intervals in which a replica queried under this share of the fleet's mean per-replica tokens
are too thin to judge (a hit rate over a handful of tokens)."""


def cov_of(values: Sequence[float | int | None]) -> float | None:
    """CoV (population std / mean) of ``values``; None when any is None, there are none, or
    all are 0 (the CoV is undefined then: e.g. no live scrape saw a running request, which
    is not "perfectly balanced")."""
    if not values or any(v is None for v in values):
        return None
    nums = [float(v) for v in values if v is not None]
    if not any(nums):
        return None
    return cov(nums)


@dataclass(frozen=True, slots=True)
class HitDips:
    """Per-interval prefix-cache hit rates against the fleet's in the same interval.

    Attributes:
        worst_window_hit_rate: lowest hit rate of any replica in any sample interval (None
            without samples).
        thrash_replica_seconds: replica-seconds whose hit rate was below
            :data:`THRASH_FRACTION` of the fleet's hit rate in that interval.
        thrash_share: those seconds over all sampled replica-seconds (0..1).
    """

    worst_window_hit_rate: float | None
    thrash_replica_seconds: float
    thrash_share: float


def hit_dips(rows: Sequence[dict[str, Any]]) -> HitDips:
    """Hit-rate dips from time-series rows.

    Each row needs ``t``, ``hit_rate`` (None without queries), ``prefix_cache_queries``
    (tokens queried over the interval) and ``interval_s``; rows without them are ignored (a
    driver that samples no hit rates gets ``HitDips(None, 0.0, 0.0)``).
    """
    by_t: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("prefix_cache_queries") is not None and r.get("interval_s"):
            by_t[float(r["t"])].append(r)
    worst: float | None = None
    thrash = 0.0
    total = 0.0
    for group in by_t.values():
        q = [float(r["prefix_cache_queries"]) for r in group]
        hits = sum(float(r["hit_rate"]) * qi for r, qi in zip(group, q, strict=True) if qi > 0)
        total_q = sum(q)
        for r in group:
            total += float(r["interval_s"])
        if total_q <= 0:
            continue
        fleet = hits / total_q
        floor = _MIN_QUERY_SHARE * total_q / len(group)
        for r, qi in zip(group, q, strict=True):
            if qi <= 0 or qi < floor:
                continue
            h = float(r["hit_rate"])
            worst = h if worst is None else min(worst, h)
            if h < THRASH_FRACTION * fleet:
                thrash += float(r["interval_s"])
    return HitDips(worst, thrash, thrash / total if total > 0 else 0.0)
