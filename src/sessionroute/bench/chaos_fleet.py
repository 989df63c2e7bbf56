"""The processes of ``sessionroute bench chaos``: one ``redis-server``, emulated replicas
(``sessionroute emulate``, one process each) and ``sessionroute serve`` routers sharing the
Redis, all on 127.0.0.1 on free ports.

Every child is started, signalled and stopped by its PID; a child restarted after a fault
binds the same port again. :meth:`Fleet.stop_all` resumes a frozen child before stopping it,
so nothing is left behind (call it in a ``finally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

import aiohttp

from sessionroute.bench.backend import free_port

__all__ = ["Child", "Fleet", "rss_mib"]

_START_TIMEOUT_S = 120.0
"""Seconds a child gets to answer after (re)start; generous: the machine may be loaded."""


def rss_mib(pid: int) -> float | None:
    """Resident set size of ``pid`` in MiB (``VmRSS`` of ``/proc/<pid>/status``), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


@dataclass
class Child:
    """One child process on ``port``: ``kind`` is ``redis``, ``replica`` or ``router``."""

    name: str
    kind: str
    cmd: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    frozen: bool = False
    starts: int = 0
    log: IO[bytes] = field(default_factory=lambda: tempfile.TemporaryFile())  # noqa: SIM115

    @property
    def url(self) -> str:
        scheme = "redis" if self.kind == "redis" else "http"
        return f"{scheme}://127.0.0.1:{self.port}" + ("/0" if self.kind == "redis" else "")

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    async def start(self) -> None:
        """Start it and wait until it answers (PING, or ``GET /health`` 200).

        Raises:
            RuntimeError: it exited or did not answer within 120 s (with its stderr's tail).
        """
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.starts += 1
        self.frozen = False
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            if await self._answers():
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer within {_START_TIMEOUT_S:g} s")

    async def _answers(self) -> bool:
        with contextlib.suppress(OSError, asyncio.TimeoutError, aiohttp.ClientError):
            if self.kind == "redis":
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                try:
                    writer.write(b"PING\r\n")
                    return (await asyncio.wait_for(reader.readline(), 2)).startswith(b"+PONG")
                finally:
                    writer.close()
            timeout = aiohttp.ClientTimeout(total=5)
            async with (
                aiohttp.ClientSession(timeout=timeout) as s,
                s.get(self.url + "/health") as r,
            ):
                return r.status == 200
        return False

    def tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-1500:].decode(errors="replace").strip() or "(no stderr)"

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to it (by PID); SIGSTOP/SIGCONT mark it frozen/thawed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig in (signal.SIGSTOP, signal.SIGCONT):
                self.frozen = sig == signal.SIGSTOP

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.frozen = False

    def stop(self) -> None:
        """Thaw it if frozen, SIGTERM, and SIGKILL after 15 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.frozen:
            self.send(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Fleet:
    """Redis, ``replicas`` emulated replicas and ``routers`` routers (not started)."""

    redis: Child
    replicas: list[Child]
    routers: list[Child]

    @classmethod
    def build(
        cls,
        replicas: int,
        routers: int,
        time_scale: float,
        max_tokens: int,
        router_flags: Sequence[str] = (),
    ) -> Fleet:
        """The commands of every child, on free ports (``router_flags``: more ``serve`` flags
        for every router).

        Raises:
            RuntimeError: redis-server is not installed.
        """
        binary = shutil.which("redis-server") or shutil.which(
            "redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin"
        )
        if binary is None:
            raise RuntimeError("bench chaos needs redis-server (apt-get install -y redis-server)")
        rport = free_port()
        redis_cmd = [binary, "--bind", "127.0.0.1", "--port", str(rport), "--save", ""]
        redis_cmd += ["--appendonly", "no", "--protected-mode", "no"]
        redis = Child("redis", "redis", redis_cmd, rport)
        cli = [sys.executable, "-m", "sessionroute.cli"]
        reps = []
        for i in range(replicas):
            port = free_port()
            cmd = [*cli, "emulate", "--replicas", "1", "--port", str(port), "--log-level"]
            cmd += ["warning", "--time-scale", repr(time_scale)]
            cmd += ["--default-max-tokens", str(max_tokens), "--fault-routes"]
            reps.append(Child(f"replica{i}", "replica", cmd, port))
        workers = [r.url for r in reps]
        outs = []
        for i in range(routers):
            port = free_port()
            cmd = [*cli, "serve", "--host", "127.0.0.1", "--port", str(port)]
            cmd += ["--policy", "sticky_least_loaded", "--worker-urls", *workers]
            cmd += ["--state-url", redis.url, "--state-key-prefix", f"chaos-{os.getpid()}"]
            cmd += ["--expose-worker-header", "--log-level", "warning"]
            cmd += ["--health-check-interval-secs", "2", "--health-recheck-interval-secs", "1"]
            cmd += ["--health-check-timeout-secs", "5", "--health-failure-threshold", "2"]
            cmd += ["--health-success-threshold", "1", "--request-timeout-secs", "60"]
            cmd += ["--session-ttl-secs", "3600", *router_flags]
            outs.append(Child(f"router{i}", "router", cmd, port))
        return cls(redis, reps, outs)

    @property
    def children(self) -> list[Child]:
        return [self.redis, *self.replicas, *self.routers]

    async def start_all(self) -> None:
        """Redis, then the replicas, then the routers (each group concurrently)."""
        await self.redis.start()
        await asyncio.gather(*(r.start() for r in self.replicas))
        await asyncio.gather(*(r.start() for r in self.routers))

    def stop_all(self) -> None:
        """Stop every child that runs (routers first), each by its PID."""
        for child in reversed(self.children):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                child.stop()
        for child in self.children:
            child.log.close()

    def worker_index(self, url: str | None) -> int | None:
        """The replica index of a worker URL (as the router names it), or None."""
        for i, r in enumerate(self.replicas):
            if url is not None and url.rstrip("/") == r.url:
                return i
        return None
