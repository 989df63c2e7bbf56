"""The simulator's recorder: :class:`sessionroute.record.Recorder`, shared with live arms.

Kept so the simulator's modules can keep importing ``sessionroute.sim.metrics``; new code
imports :mod:`sessionroute.record`.
"""

from sessionroute.record.recorder import Recorder, cov, summary

__all__ = ["Recorder", "cov", "summary"]
