"""Calibrating the replica model against running vLLM servers (``sessionroute calibrate``).

Reads what each server says of itself (block size, KV blocks, batch limits, ``max_model_len``),
sends a designed probe (:mod:`~sessionroute.calibrate.plan`), scrapes vLLM's own histograms
before and after each phase (:mod:`~sessionroute.calibrate.probe`) and fits the step-time
model (:mod:`~sessionroute.calibrate.fit`). The result is written as a profile file that
``[replicas] profile = "path/to/profile.toml"`` loads (:mod:`~sessionroute.calibrate.result`).

Example::

    from sessionroute.calibrate import calibrate, write_profile

    result = calibrate(["http://127.0.0.1:8001"])
    write_profile(result, "profile.toml")
"""

from __future__ import annotations

from sessionroute.calibrate.api import calibrate, calibrate_async, inspect_servers, plan_for
from sessionroute.calibrate.check import CheckResult, CheckWorkload, check_profile
from sessionroute.calibrate.fit import TERMS, FitResult, PhaseFit, TermFit
from sessionroute.calibrate.plan import Phase, ProbePlan, default_plan
from sessionroute.calibrate.probe import PhaseRun, RequestRecord
from sessionroute.calibrate.result import CalibrationResult, profile_name, write_profile
from sessionroute.calibrate.server import CalibrationError, ServerInfo

__all__ = [
    "TERMS",
    "CalibrationError",
    "CalibrationResult",
    "CheckResult",
    "CheckWorkload",
    "FitResult",
    "Phase",
    "PhaseFit",
    "PhaseRun",
    "ProbePlan",
    "RequestRecord",
    "ServerInfo",
    "TermFit",
    "calibrate",
    "calibrate_async",
    "check_profile",
    "default_plan",
    "inspect_servers",
    "plan_for",
    "profile_name",
    "write_profile",
]
