"""A real ``redis-server`` on a free loopback port, for the shared-state tests.

Started as a child process (no persistence), stopped by its PID. Tests that need one skip with
the reason when the ``redis-server`` binary is missing (``apt-get install -y redis-server``;
``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

__all__ = ["RedisServer", "redis_binary"]


def redis_binary() -> str | None:
    """The ``redis-server`` binary on PATH (or /usr/bin, /usr/sbin), or None."""
    return shutil.which("redis-server") or shutil.which(
        "redis-server", path="/usr/bin:/usr/sbin:/usr/local/bin"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """One ``redis-server`` child on 127.0.0.1 (``url`` is ``redis://127.0.0.1:PORT/0``)."""

    binary: str
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start it (on the same port as before after a :meth:`kill`) and wait until it
        accepts connections."""
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL it by PID and reap it (nothing saved: its data is gone)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None
