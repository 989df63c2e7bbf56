"""Starting and stopping emulated replicas in-process (tests, the live experiment runner) and
from the command line (``sessionroute emulate``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TextIO

from aiohttp import web

from sessionroute.emulate.app import build_app
from sessionroute.emulate.service import EmulatedReplica
from sessionroute.emulate.settings import EmulatorSettings
from sessionroute.replica import ReplicaCounters

__all__ = [
    "EmulatorHandle",
    "emulators",
    "run",
    "serve",
    "start_emulator",
    "start_emulators",
    "stop_all",
]

MAX_HEADER_LINE_BYTES = 65536
"""The longest request line or header the emulator reads (the router's limit on a whole head,
``serve/request.py``'s ``MAX_HEAD_BYTES``, so whatever the router forwards is read)."""

log = logging.getLogger("sessionroute.emulate")


@dataclass(slots=True)
class EmulatorHandle:
    """A running emulated replica.

    Attributes:
        emulator: its state (engine ``emulator.replica``, driver, metrics, tokenizer).
        runner: the aiohttp runner.
        host: listen address.
        port: the bound port.
    """

    emulator: EmulatedReplica
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port`` (the OpenAI base URL is ``url + "/v1"``)."""
        return f"http://{self.host}:{self.port}"

    def counters(self) -> ReplicaCounters:
        """The engine's cumulative counters, brought to now."""
        self.emulator.driver.poll()
        return self.emulator.replica.counters()

    async def stop(self) -> None:
        """Stop listening, give in-flight requests ``shutdown_timeout_s``, stop the driver.

        Safe to call more than once.
        """
        await self.runner.cleanup()
        await self.emulator.driver.stop()
        if self.emulator.kv_publisher is not None:
            await self.emulator.kv_publisher.close()


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("emulator is not listening on a TCP port")


async def start_emulator(
    settings: EmulatorSettings, *, index: int = 0, port: int | None = None
) -> EmulatorHandle:
    """Start one emulated replica in the running loop.

    Args:
        settings: the replica's settings.
        index: its index among siblings (sampling nonce); also its port offset when ``port`` is
            None and ``settings.port`` is not 0.
        port: the port to bind; None: ``settings.port + index`` (or a free port when
            ``settings.port`` is 0).

    Raises:
        OSError: the port is unavailable.
    """
    if port is None:
        port = settings.port + index if settings.port else 0
    emu = EmulatedReplica(settings, index)
    runner = web.AppRunner(
        build_app(emu),
        handler_cancellation=True,
        shutdown_timeout=settings.shutdown_timeout_s,
        access_log=None,
        # the router forwards heads up to 64 KiB; aiohttp's default line limit (8,190 bytes)
        # answered a longer header with a text/plain 400
        max_line_size=MAX_HEADER_LINE_BYTES,
        max_field_size=MAX_HEADER_LINE_BYTES,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, port, backlog=1024).start()
        if emu.kv_publisher is not None:
            emu.kv_publisher.start()
        emu.driver.start()
    except BaseException:
        await runner.cleanup()
        if emu.kv_publisher is not None:
            await emu.kv_publisher.close()
        raise
    return EmulatorHandle(emu, runner, settings.host, _bound_port(runner))


async def start_emulators(n: int, settings: EmulatorSettings | None = None) -> list[EmulatorHandle]:
    """Start ``n`` emulated replicas on ``settings.port + i`` (free ports when ``port`` is 0).

    Raises:
        ValueError: ``n < 1``. OSError: a port is unavailable (the ones started are stopped).
    """
    if n < 1:
        raise ValueError(f"number of replicas must be >= 1, got {n}")
    settings = settings if settings is not None else EmulatorSettings()
    handles: list[EmulatorHandle] = []
    try:
        for i in range(n):
            handles.append(await start_emulator(settings, index=i))
    except BaseException:
        await stop_all(handles)
        raise
    return handles


async def stop_all(handles: Sequence[EmulatorHandle]) -> None:
    """Stop every handle (concurrently)."""
    await asyncio.gather(*(h.stop() for h in handles))


@asynccontextmanager
async def emulators(
    n: int, settings: EmulatorSettings | None = None
) -> AsyncIterator[list[EmulatorHandle]]:
    """``async with emulators(3, settings) as handles:`` -- started, then stopped on exit."""
    handles = await start_emulators(n, settings)
    try:
        yield handles
    finally:
        await stop_all(handles)


async def serve(
    n: int,
    settings: EmulatorSettings,
    *,
    stop: asyncio.Event | None = None,
    out: TextIO | None = None,
) -> None:
    """Run ``n`` replicas until SIGTERM/SIGINT (or ``stop``), printing one URL per line.

    Raises:
        OSError: a port is unavailable.
    """
    stop = stop if stop is not None else asyncio.Event()
    out = out if out is not None else sys.stdout
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with emulators(n, settings) as handles:
            for h in handles:
                print(h.url, file=out, flush=True)
            log.info(
                "%d emulated replicas | profile %s | model %s | time scale %g",
                n,
                settings.step_profile.name,
                settings.served_model,
                settings.time_scale,
            )
            await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run(n: int, settings: EmulatorSettings) -> None:
    """Run :func:`serve` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        asyncio.run(serve(n, settings))
    else:
        uvloop.run(serve(n, settings))
