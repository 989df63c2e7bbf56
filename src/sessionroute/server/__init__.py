"""The live router: an OpenAI-compatible, session-aware reverse proxy (``sessionroute serve``).

Contract: ``shared/ROUTER.md``; user documentation: ``docs/router.md``.

Typical embedding::

    settings = RouterSettings.build(worker_urls=("http://127.0.0.1:8001",), port=0)
    running = await start_router(settings)
    ...
    await running.stop()
"""

from sessionroute.server.app import GENERATION_ROUTES, build_app, build_metrics_app
from sessionroute.server.config import RouterSettings, add_arguments, settings_from_args
from sessionroute.server.router import Router
from sessionroute.server.runner import RunningRouter, run, serve, start_router

__all__ = [
    "GENERATION_ROUTES",
    "Router",
    "RouterSettings",
    "RunningRouter",
    "add_arguments",
    "build_app",
    "build_metrics_app",
    "run",
    "serve",
    "settings_from_args",
    "start_router",
]
