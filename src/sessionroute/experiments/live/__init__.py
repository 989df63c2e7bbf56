"""Live experiments through real HTTP: ``sessionroute compare --live`` (``docs/live.md``).

The same experiment file as the simulator, run against real servers: emulated vLLM replicas
(default), given URLs, or processes started from a command template (the ``vllm-cpu`` preset
runs real vLLM on this CPU); through our router (``sessionroute serve``) or another one
(``vllm-router``); with the same workload objects paced in real time by
:class:`~sessionroute.experiments.live.host.LiveHost`. Results have the simulator's shape
(:class:`~sessionroute.experiments.results.RunOutput`, ``results.json``, ``report.html``).

The live runner is part of :mod:`sessionroute.experiments`: it imports the experiment's spec,
runner and results modules (and :mod:`sessionroute.experiments.live_section`, the ``[live]``
table of an experiment file), never the other way round, and reports through the simulator's
results builder (:mod:`sessionroute.record`).

Names are imported lazily (PEP 562): :mod:`sessionroute.experiments.live.tiny_model` and
:mod:`sessionroute.experiments.live.text` must import under vLLM's interpreter, which lacks our
dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionroute.experiments.live.host import LiveHost
    from sessionroute.experiments.live.runner import LiveArmRunner, run_live_experiment
    from sessionroute.experiments.live.tiny_model import build_tiny_model
    from sessionroute.experiments.live.vllm_cpu import VLLM_CPU_COMMAND, vllm_cpu_env
    from sessionroute.experiments.live_section import LiveSection

__all__ = [
    "VLLM_CPU_COMMAND",
    "LiveArmRunner",
    "LiveHost",
    "LiveSection",
    "build_tiny_model",
    "run_live_experiment",
    "vllm_cpu_env",
]

_WHERE = {
    "LiveHost": "sessionroute.experiments.live.host",
    "LiveArmRunner": "sessionroute.experiments.live.runner",
    "run_live_experiment": "sessionroute.experiments.live.runner",
    "LiveSection": "sessionroute.experiments.live_section",
    "build_tiny_model": "sessionroute.experiments.live.tiny_model",
    "VLLM_CPU_COMMAND": "sessionroute.experiments.live.vllm_cpu",
    "vllm_cpu_env": "sessionroute.experiments.live.vllm_cpu",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sessionroute.experiments.live' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
