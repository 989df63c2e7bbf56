"""Where this host's CPU went during a live run: the servers, the client, everything else.

On a GPU cluster each replica's step time is its GPU's; on a CPU test-bed (the real-vLLM CPU
tier: 2 servers on 2 cores) it is the share of the cores the server gets, and the client, the
router and the servers' HTTP frontends take their share of the same cores. ``calibrate`` probes
the servers with the host to themselves; when an arm run leaves them less, their steps are
slower than the profile says and the simulator's time metrics are off by as much, whatever
the model (docs/simulator.md, "How far to trust it"). :class:`HostCpu` measures it:

* the host: busy time of all cores (``/proc/stat``: every field but ``idle`` and ``iowait``);
* each server: CPU time of every process in the session its started process leads (vLLM's
  API server and its engine process), from ``/proc/PID/stat`` (``utime`` + ``stime``, and
  ``cutime`` + ``cstime`` of the children each has reaped, so a helper process that ends
  between two samples stays counted); a server started through a wrapper that runs it
  elsewhere (``docker run``) is measured as the wrapper, its work lands in *other*;
* the client: this process, all its threads (:func:`os.times`);
* other: the host less the two (the router, the placement taps, anything else running).

Linux only; elsewhere :meth:`HostCpu.sample` returns None and nothing is reported. Source:
proc(5), ``/proc/stat`` and ``/proc/PID/stat``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:
    from sessionroute.experiments.live.hostspeed import HostSpeed

__all__ = ["BusyCores", "CpuSample", "HostCpu", "busy_cores", "crowding_note", "describe"]

_PROC = Path("/proc")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds at one moment (see the module docstring for each part)."""

    wall_s: float
    host_s: float
    servers_s: tuple[float, ...]
    client_s: float


class BusyCores(TypedDict):
    """Mean cores busy over an interval (2 decimals), and where measured the host's speed:
    ``loop_ms``, the median CPU milliseconds of a fixed loop
    (:mod:`sessionroute.experiments.live.hostspeed`; higher: slower cores)."""

    host: float
    servers: float
    per_server: list[float]
    client: float
    other: float
    loop_ms: NotRequired[float]


def _host_busy_s() -> float:
    fields = (_PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) * _TICK_S


def _session_cpu_s(leaders: Sequence[int]) -> tuple[float, ...]:
    """CPU seconds of the live processes in each session led by ``leaders``, with what each has
    reaped of its children (a process that exits without being reaped by one of them is no
    longer counted: :func:`busy_cores` clamps a server's share at 0)."""
    want = {pid: i for i, pid in enumerate(leaders)}
    out = [0.0] * len(leaders)
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
        i = want.get(int(fields[3]))
        if i is not None:
            out[i] += sum(int(f) for f in fields[11:15]) * _TICK_S  # u, s, cu, cs time
    return tuple(out)


class HostCpu:
    """Samples of the host's, the servers' and this process's CPU time.

    Args:
        server_pids: the started servers' process ids (each leads a session of its own:
            :mod:`sessionroute.experiments.live.procs`); empty for servers not started here
            (then only the host and the client are told apart).
        speed: a running :class:`~sessionroute.experiments.live.hostspeed.HostSpeed`, whose
            median over each interval :meth:`between` adds, or None.
    """

    def __init__(self, server_pids: Sequence[int], speed: HostSpeed | None = None) -> None:
        self.server_pids = list(server_pids)
        self.speed = speed
        self.cores = os.cpu_count() or 1
        """The host's cores (all of ``/proc/stat``'s)."""

    def sample(self) -> CpuSample | None:
        """The cumulative counters now, or None where ``/proc`` cannot be read (not Linux)."""
        try:
            host = _host_busy_s()
        except (OSError, ValueError, IndexError):
            return None
        times = os.times()
        return CpuSample(
            time.monotonic(), host, _session_cpu_s(self.server_pids), times.user + times.system
        )

    def between(self, a: CpuSample | None, b: CpuSample | None) -> BusyCores | None:
        """:func:`busy_cores` from ``a`` to ``b``, with the host's speed meanwhile where
        :attr:`speed` sampled it."""
        busy = busy_cores(a, b)
        if busy is not None and a is not None and b is not None and self.speed is not None:
            ms = self.speed.median_ms(a.wall_s, b.wall_s)
            if ms is not None:
                busy["loop_ms"] = ms
        return busy


def busy_cores(a: CpuSample | None, b: CpuSample | None) -> BusyCores | None:
    """Mean cores busy between samples ``a`` and ``b`` (``servers`` is the sum of
    ``per_server``), or None without both."""
    if a is None or b is None or b.wall_s <= a.wall_s:
        return None
    wall = b.wall_s - a.wall_s
    host = (b.host_s - a.host_s) / wall
    per = [max(0.0, y - x) / wall for x, y in zip(a.servers_s, b.servers_s, strict=True)]
    client = (b.client_s - a.client_s) / wall
    return {
        "host": round(host, 2),
        "servers": round(sum(per), 2),
        "per_server": [round(c, 2) for c in per],
        "client": round(client, 2),
        "other": round(max(0.0, host - sum(per) - client), 2),
    }


def describe(cores: int, parts: Sequence[tuple[str, BusyCores | None]]) -> str:
    """One line: cores busy per labelled interval as servers/client/other; a second with the
    host's speed where measured."""
    shown = [
        f"{label} {d['servers']:.2f}/{d['client']:.2f}/{d['other']:.2f}"
        for label, d in parts
        if d is not None
    ]
    line = f"host CPU, cores busy of {cores} (servers/client/other): " + "; ".join(shown)
    speeds = [f"{label} {d['loop_ms']:.1f}" for label, d in parts if d and "loop_ms" in d]
    if speeds:
        line += "\nhost speed, CPU ms of a fixed loop (higher: slower cores): " + "; ".join(speeds)
    return line


def crowding_note(servers: int, cores: int) -> str | None:
    """A warning where more servers were started on this host than it has cores, else None.

    Servers that outnumber the cores take turns on them: a server decodes faster or slower with
    how many of the others are busy, and the client and router wait behind them. The sharing
    the path probe fits (a factor per other busy server, from requests with one other busy)
    does not hold it, so on such a test-bed the simulator's time metrics are held to the
    host's scheduler as much as to vLLM. Measured (docs/simulator.md, "Servers and
    cores"): the held-back KV-pressure workload on 1 and 2 servers of this 2-core machine met
    every per-arm bound in most runs; on 3 it missed output tok/s in most runs.
    """
    if servers <= cores:
        return None
    return (
        f"note: {servers} servers share this host's {cores} cores: each runs slower or faster "
        "with how many others are busy, beyond what the simulator's fitted sharing holds; "
        "read TTFT, ITL and output tok/s against the bounds on at most one server per core "
        '(docs/simulator.md, "Servers and cores")'
    )
