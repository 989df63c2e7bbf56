"""The servers' decode pace just before and just after each live arm run (``compare --fidelity``).

The calibration fits the step-time profile minutes before the arms run; if the servers' pace
drifts meanwhile (a shared or capped host: docs/simulator.md, "Each server its own share of the
host"), the simulator's times are off by the drift and nothing else says so. Around every live
run :class:`PacedRunner` sends one streamed decode to every server at once (a 32-token prompt,
:data:`PACE_TOKENS` output tokens, as the calibration's ``decode B=1`` phase does) and records
the time per output token, and where the host's CPU went during the run itself
(:mod:`sessionroute.experiments.live.hostcpu`). Measurement only: the simulator does not use
it, and the probe's requests come before the arm's prefix caches are reset and after its
metrics are read.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sessionroute.calibrate.plan import DECODE_TOKENS
from sessionroute.calibrate.probe import ProbeClient, probe_session, prompt_ids, run_round
from sessionroute.calibrate.server import CalibrationError, ServerInfo
from sessionroute.experiments.live.hostcpu import HostCpu
from sessionroute.experiments.results import RunOutput
from sessionroute.experiments.spec import ResolvedArm

__all__ = ["PACE_TOKENS", "PacedRunner", "calibrated_pace_s", "decode_pace"]

PACE_TOKENS = DECODE_TOKENS
"""Output tokens of a pace probe: those of the calibration's default ``decode`` phases."""


async def _pace(servers: Sequence[ServerInfo], tokens: int) -> list[float]:
    async with probe_session(120.0) as session:
        ids = await prompt_ids(session, servers[0])
        prompt = [ids[i % len(ids)] for i in range(32)]
        clients = [ProbeClient(session, s) for s in servers]
        rounds = await asyncio.gather(*(run_round(c, [(prompt, tokens)], 1, True) for c in clients))
    paces = []
    for rnd in rounds:
        made = max(1, rnd.records[0].output_tokens - 1) if rnd.records else 1
        paces.append((rnd.mean_decode_s() or 0.0) / made)
    return paces


def decode_pace(servers: Sequence[ServerInfo], tokens: int = PACE_TOKENS) -> list[float]:
    """Seconds per output token of one streamed decode on each server, all at once: first to
    last token at the client, or vLLM's own decode time where the client got the tokens in a
    burst (:attr:`~sessionroute.calibrate.probe.Round.lagged`, as the calibration decides it:
    on a host short of CPU the server's frontend can hold the whole reply back and send it at
    once, which timed at the client reads as 0 ms per token); 0.0 where neither is known
    (:meth:`PacedRunner.describe` leaves those out).

    Raises:
        CalibrationError: a server did not answer.
    """
    return asyncio.run(_pace(servers, tokens))


def calibrated_pace_s(calibration: Mapping[str, Any]) -> float | None:
    """The calibration's own measured time per token of its ``decode B=1`` phases (median over
    its rounds and contexts; client first-to-last token over ``tokens - 1``, with ``calibrate``'s
    default of :data:`PACE_TOKENS` decode tokens, which ``compare --fidelity`` uses), or None."""
    per_token = []
    for phase in calibration.get("phases") or []:
        name = str(phase.get("phase", ""))
        if name.startswith("decode B=1 ") and phase.get("measured_s"):
            per_token.append(float(phase["measured_s"]) / (PACE_TOKENS - 1))
    return statistics.median(per_token) if per_token else None


class PacedRunner:
    """An arm runner that measures :func:`decode_pace` before and after every run of ``runner``
    and, given ``meter``, the host's CPU during the run.

    Attributes:
        records: one ``{"arm", "before_s", "after_s", "host_cpu"}`` per run (seconds per
            token, per server; :func:`~sessionroute.experiments.live.hostcpu.busy_cores` or
            None).
    """

    def __init__(
        self,
        runner: Callable[[ResolvedArm, int, Callable[[float], None]], RunOutput],
        servers: Sequence[ServerInfo],
        meter: HostCpu | None = None,
    ) -> None:
        self.runner = runner
        self.servers = list(servers)
        self.meter = meter
        self.records: list[dict[str, Any]] = []

    def __call__(self, arm: ResolvedArm, seed: int, progress: Callable[[float], None]) -> RunOutput:
        before = self._pace()
        start = self.meter.sample() if self.meter else None
        out = self.runner(arm, seed, progress)
        cpu = self.meter.between(start, self.meter.sample()) if self.meter else None
        after = self._pace()
        record = {"arm": arm.name, "before_s": before, "after_s": after, "host_cpu": cpu}
        self.records.append(record)
        return out

    def _pace(self) -> list[float]:
        """:func:`decode_pace`, or [] when a server did not answer (a measurement only: the
        arm's own run says what failed)."""
        try:
            return decode_pace(self.servers)
        except CalibrationError:
            return []

    def describe(self, calibrated_s: float | None) -> str:
        """One line: the calibration's pace and the mean over the servers around each run."""

        def ms(values: Sequence[float]) -> str:
            known = [v for v in values if v > 0]  # 0.0: not measured (decode_pace)
            return f"{1e3 * statistics.fmean(known):.1f}" if known else "-"

        runs = "; ".join(f"{r['arm']} {ms(r['before_s'])}/{ms(r['after_s'])}" for r in self.records)
        cal = f"{1e3 * calibrated_s:.1f}" if calibrated_s is not None else "-"
        return f"decode pace, ms per token at 1 request: calibration {cal}; before/after: {runs}"
