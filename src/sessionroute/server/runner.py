"""Starting and stopping a router: listeners, signals, graceful shutdown, uvloop.

Shutdown (SIGTERM, SIGINT or :meth:`RunningRouter.stop`) first closes the listening sockets,
then lets in-flight requests finish for up to ``--shutdown-timeout-secs`` seconds (aiohttp's
graceful shutdown; streams still open then are cancelled, which releases their reservations),
then stops the health checker and closes the upstream session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from dataclasses import dataclass

from aiohttp import web

from sessionroute.clock import Clock
from sessionroute.server.app import build_metrics_server, build_server
from sessionroute.server.config import RouterSettings
from sessionroute.server.router import Router

__all__ = ["RunningRouter", "run", "serve", "start_router"]

log = logging.getLogger("sessionroute.server")


def _bound_port(runner: web.BaseRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("router is not listening on a TCP port")


@dataclass(slots=True)
class RunningRouter:
    """A started router.

    Attributes:
        router: its state (routing core, health, metrics).
        runner: the aiohttp runner of the main listener (a low-level ``web.Server``).
        port: the bound port (useful with ``--port 0``).
        metrics_runner: the runner of the ``--prometheus-port`` listener, if any.
        metrics_port: its bound port, if any.
    """

    router: Router
    runner: web.ServerRunner
    port: int
    metrics_runner: web.ServerRunner | None = None
    metrics_port: int | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the main listener."""
        return f"http://{self.router.settings.host}:{self.port}"

    async def stop(self) -> None:
        """Graceful shutdown (see the module docstring)."""
        try:
            if self.metrics_runner is not None:
                await self.metrics_runner.cleanup()
            await self.runner.cleanup()
        finally:
            await self.router.close()


async def start_router(
    settings: RouterSettings,
    *,
    clock: Clock | None = None,
    rng: random.Random | None = None,
) -> RunningRouter:
    """Build a :class:`Router`, start its listeners and background tasks, and return it.

    Raises:
        UnknownPolicyError, ConfigError: bad policy or options. OSError: port unavailable.
    """
    router = Router(settings, clock=clock, rng=rng)
    access_log = logging.getLogger("aiohttp.access") if settings.log_level == "debug" else None
    runner = web.ServerRunner(
        build_server(
            router,
            handler_cancellation=True,
            auto_decompress=False,  # compressed request bodies are forwarded as received
            access_log=access_log,
            read_bufsize=2**20,  # a 200 KB context arrives without pausing the socket
        ),
        shutdown_timeout=settings.shutdown_timeout_secs,
    )
    await runner.setup()
    try:
        await router.start()
        site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
        await site.start()
        running = RunningRouter(router, runner, _bound_port(runner))
        if settings.prometheus_port is not None:
            mrunner = web.ServerRunner(build_metrics_server(router, access_log=None))
            await mrunner.setup()
            running.metrics_runner = mrunner
            await web.TCPSite(mrunner, settings.prometheus_host, settings.prometheus_port).start()
            running.metrics_port = _bound_port(mrunner)
    except BaseException:
        await runner.cleanup()
        await router.close()
        raise
    return running


async def serve(settings: RouterSettings, stop: asyncio.Event | None = None) -> None:
    """Run a router until SIGTERM/SIGINT (or ``stop`` is set), then shut down gracefully."""
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    running = await start_router(settings)
    log.info(
        "sessionroute router on %s | policy %s | workers %s",
        running.url,
        settings.policy,
        list(settings.worker_urls),
    )
    try:
        await stop.wait()
        log.info("shutting down (in-flight requests get %.0f s)", settings.shutdown_timeout_secs)
    finally:
        await running.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)


def run(settings: RouterSettings) -> None:
    """Run :func:`serve` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
