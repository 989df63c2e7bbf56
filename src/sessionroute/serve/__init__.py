"""The live router: an OpenAI-compatible, session-aware reverse proxy (``sessionroute serve``).

Contract: ``shared/ROUTER.md``; user documentation: ``docs/router.md``.

Typical embedding::

    settings = RouterSettings.build(worker_urls=("http://127.0.0.1:8001",), port=0)
    running = await start_router(settings)
    ...
    await running.stop()

Names are imported lazily (PEP 562), so ``sessionroute --help`` and the ``serve`` flag
definitions (:mod:`sessionroute.serve.flags`) do not pay for aiohttp and pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionroute.serve.app import GENERATION_ROUTES, build_listener, build_metrics_listener
    from sessionroute.serve.config import RouterSettings, settings_from_args
    from sessionroute.serve.flags import add_arguments
    from sessionroute.serve.router import Router
    from sessionroute.serve.runner import RunningRouter, run, serve, start_router

__all__ = [
    "GENERATION_ROUTES",
    "Router",
    "RouterSettings",
    "RunningRouter",
    "add_arguments",
    "build_listener",
    "build_metrics_listener",
    "run",
    "serve",
    "settings_from_args",
    "start_router",
]

_WHERE = {
    "GENERATION_ROUTES": "app",
    "build_metrics_listener": "app",
    "build_listener": "app",
    "RouterSettings": "config",
    "settings_from_args": "config",
    "add_arguments": "flags",
    "Router": "router",
    "RunningRouter": "runner",
    "run": "runner",
    "serve": "runner",
    "start_router": "runner",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sessionroute.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sessionroute.serve.{module}"), name)
