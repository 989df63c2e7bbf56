"""What an arm measured, and the one builder of its ``metrics`` (``results.json``).

Shared by both kinds of arm: the simulator (:mod:`sessionroute.sim`) and the live runner
(:mod:`sessionroute.experiments.live`) fill a :class:`Recorder` as the run goes and an
:class:`ArmRecord` at its end; :func:`arm_metrics` turns that into the metrics dict whose keys
``shared/WORKLOADS.md`` lists. Pure Python and numpy: no I/O, no clock, no imports from the
rest of sessionroute, so every driver can use it without an import cycle.
"""

from sessionroute.record.balance import HitDips, hit_dips
from sessionroute.record.build import ArmRecord, ReplicaRecord, SessionLifecycle, arm_metrics
from sessionroute.record.recorder import Recorder, cov, summary

__all__ = [
    "ArmRecord",
    "HitDips",
    "Recorder",
    "ReplicaRecord",
    "SessionLifecycle",
    "arm_metrics",
    "cov",
    "hit_dips",
    "summary",
]
