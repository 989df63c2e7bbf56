"""Starting and stopping a router: listeners, signals, graceful shutdown, uvloop.

Shutdown (SIGTERM, SIGINT or :meth:`RunningRouter.stop`) first closes the listening sockets,
closes idle keep-alive connections, then lets in-flight requests finish for up to
``--shutdown-timeout-secs`` seconds (streams still open then are cancelled, which releases
their reservations), then stops the health checker and closes the upstream session.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import signal
from dataclasses import dataclass

from sessionroute.clock import Clock
from sessionroute.serve.app import build_listener, build_metrics_listener
from sessionroute.serve.config import RouterSettings
from sessionroute.serve.listener import Listener
from sessionroute.serve.probes import StartupTimeout
from sessionroute.serve.router import Router

__all__ = ["RunningRouter", "run", "serve", "start_router"]

log = logging.getLogger("sessionroute.serve")


@dataclass(slots=True)
class RunningRouter:
    """A started router.

    Attributes:
        router: its state (routing core, health, metrics).
        listener: the main listener.
        port: the bound port (useful with ``--port 0``).
        metrics_listener: the ``--prometheus-port`` listener, if any.
        metrics_port: its bound port, if any.
    """

    router: Router
    listener: Listener
    port: int
    metrics_listener: Listener | None = None
    metrics_port: int | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the main listener."""
        return f"http://{self.router.settings.host}:{self.port}"

    async def stop(self) -> None:
        """Graceful shutdown (see the module docstring)."""
        try:
            if self.metrics_listener is not None:
                await self.metrics_listener.shutdown(0.0)
            await self.listener.shutdown(self.router.settings.shutdown_timeout_secs)
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
    listener = build_listener(router)
    running: RunningRouter | None = None
    try:
        await router.start()
        port = await listener.start(settings.host, settings.port, backlog=1024)
        running = RunningRouter(router, listener, port)
        if settings.prometheus_port is not None:
            mlistener = build_metrics_listener(router)
            running.metrics_listener = mlistener
            running.metrics_port = await mlistener.start(
                settings.prometheus_host, settings.prometheus_port
            )
    except BaseException:
        if running is not None:
            await running.stop()
        else:
            await listener.shutdown(0.0)
            await router.close()
        raise
    return running


async def serve(
    settings: RouterSettings, stop: asyncio.Event | None = None, *, freeze_gc: bool = False
) -> None:
    """Run a router until SIGTERM/SIGINT (or ``stop`` is set), then shut down gracefully.

    Raises:
        StartupTimeout: no worker passed a health check within
            ``--worker-startup-timeout-secs`` (raised after the graceful shutdown).

    Args:
        settings: the router's settings.
        stop: set it to shut down (besides SIGTERM/SIGINT).
        freeze_gc: once started, move every object then alive out of the cyclic garbage
            collector's reach (:func:`gc.freeze`), for a process that runs one router
            (:func:`run`): the ~47,000 objects of the imports and set-up then cost a full
            collection nothing, where they cost it 12-15 ms of blocked event loop (measured
            on the project's VM). Objects made later are collected as usual; on return
            everything frozen is handed back to the collector (:func:`gc.unfreeze`, which
            also unfreezes what a caller may have frozen itself).
    """
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    running = await start_router(settings)
    running.router.on_fatal = stop.set  # no worker came up in --worker-startup-timeout-secs
    if running.router.fatal_error is not None:
        stop.set()
    if freeze_gc:
        gc.collect()  # what is garbage now is not kept forever
        gc.freeze()
    log.info(
        "sessionroute router on %s | policy %s %s | workers %s",
        running.url,
        settings.policy_name(),
        settings.policy_options(),
        list(settings.worker_urls),
    )
    if settings.router_api_key is None:
        log.warning(
            "no --router-api-key: admin routes (/add_worker, /remove_worker, POST /workers, "
            "DELETE /workers/URL, /sessions/ID) answer %s",
            "every client (--allow-remote-admin)"
            if settings.allow_remote_admin
            else "loopback clients only (--allow-remote-admin opens them)",
        )
    if not settings.worker_urls:
        log.warning(
            "no workers: generation requests get 503 until one is added "
            "(POST /add_worker?url=http://HOST:PORT, or --worker-urls at start)"
        )
    try:
        await stop.wait()
        log.info("shutting down (in-flight requests get %.0f s)", settings.shutdown_timeout_secs)
    finally:
        await running.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)
        if freeze_gc:
            gc.unfreeze()
    if running.router.fatal_error is not None:
        raise StartupTimeout(running.router.fatal_error)


def run(settings: RouterSettings) -> None:
    """Run :func:`serve` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        asyncio.run(serve(settings, freeze_gc=True))
    else:
        uvloop.run(serve(settings, freeze_gc=True))
