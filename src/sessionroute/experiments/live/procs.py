"""Processes a live run starts: command templates, logs, health waits, stopping by process id.

Every process is started in a session of its own (``start_new_session``), so stopping it sends
SIGTERM (then SIGKILL after a grace period) to exactly the process group it leads -- its id is
the one we started -- and never to anything else by name. A session is also a scheduler
autogroup. (Keeping the whole test-bed in our session instead stopped the client from being
starved, but then a server's decode pace moved with how many of the others were busy; a fixed
share of the cores per replica is an option, ``[live] replica_cpus``,
:mod:`sessionroute.experiments.live.cpuslice`; docs/simulator.md, "Each server its own share of
the host".) A terminal's Ctrl-C
reaches only its foreground process group, so not the children: :class:`ProcessSet` stops
everything it started when its ``with`` block ends, on success, on an exception and on Ctrl-C;
while it is open, SIGTERM to this process raises ``KeyboardInterrupt`` so the same cleanup runs.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType

import httpx

from sessionroute.errors import ConfigError, SessionRouteError
from sessionroute.experiments.envexpand import expand_env

__all__ = [
    "LiveStartError",
    "ProcessSet",
    "StartedProcess",
    "expand_command",
    "free_port",
    "wait_healthy",
]


class LiveStartError(SessionRouteError, RuntimeError):
    """A replica or router did not start (it exited, or missed its health deadline)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_port_block(n: int, host: str = "127.0.0.1", tries: int = 50) -> int:
    """The first of ``n`` consecutive TCP ports that were free a moment ago on ``host`` (for
    endpoints numbered port + index, as vLLM numbers its data-parallel ranks' KV event
    endpoints).

    Raises:
        LiveStartError: no such block found in ``tries`` attempts.
    """
    for _ in range(tries):
        base = free_port(host)
        if base + n - 1 > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise LiveStartError(f"no {n} consecutive free ports on {host}")


def expand_command(
    template: str, variables: Mapping[str, str], env: Mapping[str, str], where: str
) -> list[str]:
    """Split a command template like a shell line and expand ``${VAR}`` in each argument.

    An argument that is exactly one variable whose value holds spaces (``${WORKER_URLS}``)
    becomes several arguments.

    Args:
        template: e.g. ``"${PYTHON} -m vllm.entrypoints.openai.api_server --port ${PORT}"``.
        variables: the template's own variables (win over the environment).
        env: the environment.
        where: names the template in errors.

    Raises:
        ConfigError: for an unbalanced quote, or a variable that is neither given nor set.
    """
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise ConfigError(f"{where}: cannot split command {template!r}: {exc}") from None
    scope = {**env, **variables}
    out: list[str] = []
    for word in words:
        name = word[2:-1] if word.startswith("${") and word.endswith("}") else None
        value = expand_env(word, scope, where)
        if name is not None and name in variables and " " in variables[name]:
            out.extend(value.split())
        else:
            out.append(value)
    if not out:
        raise ConfigError(f"{where}: empty command")
    return out


class StartedProcess:
    """A process this run started (see the module docstring).

    Args:
        name: label for messages (``replica 0``, ``router``).
        argv: the command.
        env: its whole environment.
        log_path: where its stdout and stderr go.
        cwd: its working directory (None: ours).

    Raises:
        LiveStartError: the program cannot be started (missing, not executable).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise LiveStartError(f"{name}: cannot run {self.argv[0]!r}: {exc}") from None

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return int(self.proc.pid)

    def exited(self) -> int | None:
        """The exit status if it has exited, else None."""
        return self.proc.poll()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of its log."""
        try:
            text = self.log_path.read_text("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM its process group, SIGKILL after ``grace_s``; returns the exit status.

        Safe to call more than once.
        """
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(10.0)
        else:  # the leader is gone; its group may still have children
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self._log.close()
        return self.proc.returncode


def wait_healthy(
    url: str,
    proc: StartedProcess | None,
    timeout_s: float,
    name: str,
    *,
    interval_s: float = 0.25,
) -> float:
    """Poll ``GET url`` until it answers 200; returns the seconds waited.

    Raises:
        LiveStartError: ``proc`` exited first (its log tail is in the message), or no 200 came
            within ``timeout_s``.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = "no answer"
    with httpx.Client(timeout=5.0) as client:
        while True:
            if proc is not None and (rc := proc.exited()) is not None:
                raise LiveStartError(
                    f"{name} exited with status {rc} before it was healthy "
                    f"(log {proc.log_path}):\n{proc.log_tail()}"
                )
            try:
                r = client.get(url)
                if r.status_code == 200:
                    return time.monotonic() - t0
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if time.monotonic() >= deadline:
                tail = f"\n{proc.log_tail()}" if proc is not None else ""
                raise LiveStartError(
                    f"{name} was not healthy at {url} within {timeout_s:.0f} s ({last}){tail}"
                )
            time.sleep(interval_s)


class ProcessSet:
    """Starts processes and stops all of them when the ``with`` block ends (LIFO)."""

    def __init__(self) -> None:
        self._procs: list[StartedProcess] = []
        self._old: signal.Handlers | object | None = None

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        cwd: str | None = None,
    ) -> StartedProcess:
        """Start and remember a process (see :class:`StartedProcess`)."""
        proc = StartedProcess(name, argv, env, log_path, cwd)
        self._procs.append(proc)
        return proc

    def stop(self, proc: StartedProcess) -> None:
        """Stop one process now and forget it."""
        proc.stop()
        with contextlib.suppress(ValueError):
            self._procs.remove(proc)

    def stop_all(self) -> None:
        """Stop every process still running, newest first."""
        while self._procs:
            self._procs.pop().stop()

    def __enter__(self) -> ProcessSet:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop_all()
        finally:
            if self._old is not None:
                signal.signal(signal.SIGTERM, self._old)  # type: ignore[arg-type]
                self._old = None


def _sigterm_to_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
