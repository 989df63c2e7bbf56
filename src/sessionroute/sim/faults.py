"""Replica faults applied to a running simulation (``FaultSection`` kinds)."""

from __future__ import annotations

from sessionroute.sim.simulation import Simulation

__all__ = ["FAULT_KINDS", "apply_fault"]

FAULT_KINDS: tuple[str, ...] = ("down", "up", "slow", "drain", "add", "hang")


def apply_fault(sim: Simulation, kind: str, index: int, factor: float = 1.0) -> None:
    """Apply one fault now.

    * ``down``: the replica fails (:meth:`Simulation.fail_replica`); its sessions are re-placed
      by the policy on their next attempt.
    * ``up``: a fresh engine (empty cache) if it was down or hung (a hung one is restarted:
      its requests break); the router's health checks find it back, or it is re-added if it
      was drained.
    * ``hang``: the replica accepts requests and answers nothing (:meth:`Simulation.hang_replica`)
      until the router's health checks give it up.
    * ``slow``: every step starting from now takes ``factor`` times as long (1.0 restores).
    * ``drain``: removed from the router; its in-flight requests finish.
    * ``add``: a new replica with the next index joins (``index`` is ignored).

    Raises:
        ValueError: for an unknown kind or a replica index that does not exist.
    """
    if kind == "add":
        sim.add_replica()
        return
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
    if not 0 <= index < len(sim.replicas):
        raise ValueError(f"fault {kind!r}: no replica {index} (have {len(sim.replicas)})")
    rep = sim.replicas[index]
    core = sim.core
    if kind == "down":
        sim.fail_replica(rep)
    elif kind == "hang":
        sim.hang_replica(rep)
    elif kind == "up":
        if rep.hung:
            sim.fail_replica(rep)
        rep.restart()
        if rep.drained:
            rep.drained = False
            core.add_worker(rep.url)
    elif kind == "slow":
        sim.sync(rep)
        rep.set_slowdown(factor, sim.now())
        sim.sync(rep)
    elif not rep.drained and rep.url in core.cluster:  # drain
        rep.drained = True
        core.remove_worker(rep.url)
