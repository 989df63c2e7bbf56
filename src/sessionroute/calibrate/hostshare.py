"""Replicas that share one host's cores: how much a step stretches with the other busy ones.

On the CPU tier three vLLM servers share 2 cores: a server decodes slower while the others are
busy (ITL p50 1.8-2.4 ms with one server busy, 3.4-4.4 with two, 5.3-7.4 with three, on the
held-back pressure workload; docs/simulator.md "How far to trust it"). The calibration fits the
step terms with every server probed at once (``--probe together``), so its steps are those of
all ``m`` servers busy. ``compare --fidelity`` then measures vLLM's own mean inter-token latency
with decodes on one server alone and on all ``m`` at once
(:mod:`sessionroute.experiments.live.host_probe`), and :func:`fit_host_share` turns the ratio
into the profile's ``host_share``: a step takes ``1 + host_share * (k - 1)`` times its alone
time with ``k`` busy, so ``r = 1 + host_share * (m - 1)``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["HostShareFit", "fit_host_share"]


@dataclass(frozen=True, slots=True)
class HostShareFit:
    """``host_share`` fitted from decodes alone and together.

    Attributes:
        share: per other busy replica, the step's growth relative to alone (>= 0).
        replicas: how many replicas were busy together (``m``).
        itl_alone_s, itl_all_s: median over rounds of vLLM's mean inter-token latency, one
            replica busy and all ``m`` busy, seconds.
        rounds: rounds per setting.
    """

    share: float
    replicas: int
    itl_alone_s: float
    itl_all_s: float
    rounds: int

    def table(self) -> dict[str, Any]:
        """The ``[calibration.host]`` table of a profile file."""
        return {
            "model": "step * (1 + host_share * (busy - 1)) / (1 + host_share * (replicas - 1))",
            "host_share": self.share,
            "host_share_replicas": self.replicas,
            "itl_alone_s": self.itl_alone_s,
            "itl_all_s": self.itl_all_s,
            "rounds": self.rounds,
        }


def fit_host_share(
    itl_alone_s: Sequence[float], itl_all_s: Sequence[float], replicas: int
) -> HostShareFit:
    """``host_share = (median(itl_all) / median(itl_alone) - 1) / (replicas - 1)``, at least 0
    (0 for one replica: nothing to share).

    Raises:
        ValueError: no rounds on either side, a latency not > 0, or ``replicas`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if not itl_alone_s or not itl_all_s:
        raise ValueError("host share: no measured round alone or together")
    if min(*itl_alone_s, *itl_all_s) <= 0:
        raise ValueError("host share: inter-token latencies must be > 0")
    alone = statistics.median(itl_alone_s)
    together = statistics.median(itl_all_s)
    share = 0.0 if replicas == 1 else max(0.0, (together / alone - 1.0) / (replicas - 1))
    return HostShareFit(share, replicas, alone, together, min(len(itl_alone_s), len(itl_all_s)))
