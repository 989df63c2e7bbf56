"""The replicas of a live run: emulated (in-process or a ``sessionroute emulate`` process),
given URLs, or processes from a command template (the ``vllm-cpu`` preset).

Processes are started once for the whole experiment (real vLLM takes 30-60 s to start), one
after the other ``stagger_s`` apart, each with its own compile-cache directory
(``TRITON_CACHE_DIR``, ``VLLM_CACHE_ROOT``) under a node-local root, and the run waits until
every one answers ``GET /health``. In-process emulators are started fresh in each arm's event
loop. Arms share replica settings: a difference in ``[replicas]`` between arms is refused for
shared processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sessionroute.errors import ConfigError
from sessionroute.experiments.live.cpuslice import (
    CpuSlice,
    auto_replica_cpus,
    cgroup_cpu_root,
    host_cpus,
)
from sessionroute.experiments.live.procs import (
    LiveStartError,
    ProcessSet,
    StartedProcess,
    expand_command,
    free_port,
    free_port_block,
    wait_healthy,
)
from sessionroute.experiments.live.vllm_cpu import (
    VLLM_CPU_BLOCK_SIZE,
    VLLM_CPU_COMMAND,
    vllm_cpu_env,
)
from sessionroute.experiments.live_section import LiveSection
from sessionroute.sim import SimSpec, replica_config

__all__ = ["VLLM_DEFAULT_BLOCK_SIZE", "ReplicaFleet"]

VLLM_DEFAULT_BLOCK_SIZE = 16
"""The KV block size (tokens) a vLLM server uses when not told, assumed for replicas started
from a command or given by URL when ``[replicas]`` sets none (the vllm-cpu preset sets
:data:`~sessionroute.experiments.live.vllm_cpu.VLLM_CPU_BLOCK_SIZE`)."""


class ReplicaFleet:
    """Starts, hands out and stops the replicas of a live run.

    Args:
        live: the ``[live]`` section.
        settings: an arm's merged settings (``replicas``, ``workload``, ...).
        procs: where started processes are registered (stopped when it closes).
        kv_events: some arm routes on KV cache events (``kv_aware``): the emulated replicas
            then publish them (vLLM's ``--kv-events-config``; the router binds).

    Attributes:
        urls: replica base URLs (processes and given URLs; in-process emulators get theirs per
            arm from :meth:`arm_replicas`).
        block_size: tokens per KV block of the replicas.
        time_scale: their seconds per wall second (1 unless emulated).
        work_dir: this run's directory of logs and compile caches (a fresh one under
            ``live.cache_root`` or the temp dir; removed at the end unless ``keep_cache``).

    Raises:
        ConfigError: for a missing model, command or URL list, or bad engine settings, or
            ``kv_events`` with replicas that are not emulated.
    """

    def __init__(
        self,
        live: LiveSection,
        settings: dict[str, Any],
        procs: ProcessSet,
        *,
        kv_events: bool = False,
    ) -> None:
        self.live = live
        self.kv_events = kv_events
        self._kv_ports: tuple[int, int] | None = None  # PUB and replay port bases (process)
        self.settings = settings
        self.procs = procs
        spec = SimSpec.from_settings(settings)
        self.count, self.config = replica_config(spec)
        self.urls: list[str] = []
        self._started: list[StartedProcess] = []
        self._slices: list[CpuSlice] = []
        self.replica_cpus, self.cpu_note = self._replica_cpus()
        if live.cache_root is not None:
            Path(live.cache_root).mkdir(parents=True, exist_ok=True)
        self.work_dir = Path(tempfile.mkdtemp(prefix="sessionroute-live-", dir=live.cache_root))
        if live.replicas == "emulate":
            self.block_size = self.config.block_size
            self.time_scale = live.time_scale
        else:
            self.time_scale = 1.0
            explicit = spec.replicas.block_size
            default = VLLM_CPU_BLOCK_SIZE if live.preset == "vllm-cpu" else VLLM_DEFAULT_BLOCK_SIZE
            self.block_size = explicit or default
        if kv_events and live.replicas != "emulate":
            raise ConfigError(
                "kv_aware in compare --live needs emulated replicas (live.replicas = "
                '"emulate"); with real vLLM servers run scripts/kv_aware_vllm_tier.py'
            )
        if live.replicas == "urls" and not live.urls:
            raise ConfigError('live.replicas = "urls" needs live.urls = ["http://...", ...]')
        if live.replicas == "command":
            if live.replica_command is None and live.preset is None:
                raise ConfigError(
                    'live.replicas = "command" needs live.replica_command or live.preset'
                )
            if live.preset == "vllm-cpu" and not live.model:
                raise ConfigError(
                    "the vllm-cpu preset needs live.model (a model directory; make one with "
                    "'sessionroute tiny-model DIR')"
                )

    # -- lifetime -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start replica processes (or check the given URLs) and wait until all are healthy.

        Raises:
            LiveStartError: a process exited or missed its deadline (its log tail is shown).
        """
        live = self.live
        if live.replicas == "urls":
            self.urls = [u.rstrip("/") for u in live.urls]
            for i, url in enumerate(self.urls):
                wait_healthy(url + "/health", None, live.start_timeout_s, f"replica {i}")
        elif live.replicas == "command":
            self._start_commands()
        elif live.emulate_mode == "process":
            self._start_emulate_process()

    def close(self) -> None:
        """Stop what :meth:`start` started; remove the work directory unless kept."""
        for proc in reversed(self._started):
            self.procs.stop(proc)
        self._started.clear()
        for piece in self._slices:
            piece.remove()
        self._slices.clear()
        if not self.live.keep_cache:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    @property
    def server_pids(self) -> list[int]:
        """Process ids of the replica processes started here (each leads a session of its
        own); empty for ``urls`` and in-process emulation."""
        return [p.pid for p in self._started]

    @property
    def worker_ports(self) -> list[int] | None:
        """Ports of ``[replicas] urls`` when they name this machine's replicas (emulate mode):
        the router is then given exactly those URLs, as the simulator's router is, so
        URL-hashing policies place sessions identically. None otherwise."""
        urls = (self.settings.get("replicas") or {}).get("urls")
        if self.live.replicas != "emulate" or not urls:
            return None
        from urllib.parse import urlsplit

        ports = [urlsplit(u).port for u in urls[: self.count]]
        if len(ports) < self.count or any(p is None for p in ports):
            raise ConfigError(f"replicas.urls must give a port for each of {self.count}: {urls}")
        return [int(p) for p in ports if p is not None]

    def check_ports_free(self, host: str) -> None:
        """Bind and release each port of :attr:`worker_ports` on ``host``, as the emulators or
        recording taps of an arm are about to.

        Raises:
            ConfigError: a port is held by another process (named, with its URL), instead of
                asyncio's traceback from deep inside the arm.
        """
        import socket

        for port in self.worker_ports or []:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio does
                try:
                    sock.bind((host, port))
                except OSError as exc:
                    raise ConfigError(
                        f"cannot listen on {host}:{port} ({exc.strerror or exc}), a port of "
                        f"[replicas] urls: stop what holds it (ss -ltnp 'sport = :{port}') or "
                        "choose free ports in [replicas] urls"
                    ) from None

    def kv_streams(self, workers: list[str]) -> list[str]:
        """``serve --kv-events`` specs ``URL=ENDPOINT,REPLAY`` of this arm's emulated replicas
        (``workers[i]`` is replica ``i`` as the router knows it): the router binds
        ``ENDPOINT``, replica ``i``'s PUB socket connects to it; ``REPLAY`` is the replica's
        replay socket. Empty unless the fleet publishes KV events."""
        if self._kv_ports is None:
            return []
        pub, replay = self._kv_ports
        host = self.live.host
        return [
            f"{w}=tcp://{host}:{pub + i},tcp://{host}:{replay + i}" for i, w in enumerate(workers)
        ]

    def _kv_config(self) -> str | None:
        """The replicas' ``--kv-events-config`` JSON (fresh ports), or None."""
        if not self.kv_events:
            return None
        host = self.live.host
        self._kv_ports = (free_port_block(self.count, host), free_port_block(self.count, host))
        pub, replay = self._kv_ports
        return json.dumps(
            {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://{host}:{pub}",
                "replay_endpoint": f"tcp://{host}:{replay}",
            }
        )

    @contextlib.asynccontextmanager
    async def arm_replicas(
        self, ports: list[int] | None = None, *, kv_events: bool = False
    ) -> AsyncIterator[list[str]]:
        """The replica URLs for one arm (in-process emulators are started here, fresh, on
        ``ports`` when given, publishing KV events on fresh ports when the arm reads them;
        emulator processes, shared by the arms, publish for every arm when one reads them)."""
        if self.live.replicas == "emulate" and self.live.emulate_mode == "in-process":
            import dataclasses

            from sessionroute.emulate import start_emulator, stop_all
            from sessionroute.emulate.kvevents import KvEventsConfig

            settings = self._emulator_settings()
            kv = self._kv_config() if kv_events else None
            if kv is not None:
                settings = dataclasses.replace(settings, kv_events=KvEventsConfig.from_json(kv))
            handles = []
            try:
                for i in range(self.count):
                    port = ports[i] if ports else None
                    handles.append(await start_emulator(settings, index=i, port=port))
            except BaseException:
                await stop_all(handles)
                raise
            try:
                yield [h.url for h in handles]
            finally:
                await stop_all(handles)
        else:
            yield list(self.urls)

    # -- emulators ------------------------------------------------------------------------------
    def _emulator_settings(self) -> Any:
        from sessionroute.emulate import EmulatorSettings

        c = self.config
        return EmulatorSettings(
            profile=c.profile,
            time_scale=self.live.time_scale,
            host=self.live.host,
            port=0,
            block_size=c.block_size,
            kv_capacity_tokens=c.kv_capacity_tokens,
            max_num_batched_tokens=c.max_num_batched_tokens,
            max_num_seqs=c.max_num_seqs,
            max_model_len=c.max_model_len,
        )

    def _start_emulate_process(self) -> None:
        c = self.config
        r = self.settings.get("replicas") or {}
        argv = [
            sys.executable, "-m", "sessionroute.cli", "emulate",
            "--replicas", str(self.count), "--host", self.live.host,
            "--port", str(self.live.base_port), "--profile", c.profile.name,
            "--time-scale", repr(self.live.time_scale), "--block-size", str(c.block_size),
        ]  # fmt: skip
        if r.get("profiles_file"):
            argv += ["--profile-file", str(r["profiles_file"])]
        elif str(r.get("profile") or "").lower().endswith((".toml", ".json")):
            argv += ["--profile-file", str(r["profile"])]  # a calibrated profile's file
        kv = self._kv_config()
        if kv is not None:
            argv += ["--kv-events-config", kv]
        for flag, value in (
            ("--kv-capacity-tokens", c.kv_capacity_tokens),
            ("--max-num-batched-tokens", c.max_num_batched_tokens),
            ("--max-num-seqs", c.max_num_seqs),
            ("--max-model-len", c.max_model_len),
        ):
            if value is not None:
                argv += [flag, str(value)]
        log = self.work_dir / "emulate.log"
        proc = self.procs.start("sessionroute emulate", argv, dict(os.environ), log)
        self._started.append(proc)
        deadline = time.monotonic() + self.live.start_timeout_s
        while True:
            lines = log.read_text("utf-8", errors="replace").splitlines()
            urls = [ln.strip() for ln in lines if ln.startswith("http://")]
            if len(urls) >= self.count:
                self.urls = urls[: self.count]
                return
            if (rc := proc.exited()) is not None or time.monotonic() > deadline:
                raise LiveStartError(
                    f"sessionroute emulate did not start (status {rc}):\n{proc.log_tail()}"
                )
            time.sleep(0.1)

    # -- command replicas -----------------------------------------------------------------------
    def _replica_cpus(self) -> tuple[float | None, str]:
        """Cores per started replica (None: uncapped) and a line saying so and why."""
        live = self.live
        if live.replicas != "command":
            return None, ""
        cpus = host_cpus()
        if live.replica_cpus == "auto":
            if live.preset != "vllm-cpu":
                return None, "replica CPU: uncapped (replica_cpus = 'auto' caps vllm-cpu only)"
            want = auto_replica_cpus(self.count, cpus)
            if want is None:
                return None, f"replica CPU: uncapped ({self.count} servers on {cpus} cores)"
        elif float(live.replica_cpus) == 0:
            return None, "replica CPU: uncapped (replica_cpus = 0; 'auto' caps vllm-cpu servers)"
        else:
            want = float(live.replica_cpus)
        root, why = cgroup_cpu_root()
        if root is None:
            if live.replica_cpus != "auto":
                raise ConfigError(f"live.replica_cpus = {want}: cannot cap CPU here: {why}")
            return None, (
                f"replica CPU: uncapped, {self.count} servers share {cpus} cores ({why}): each "
                "one's pace moves with the others' load, which the simulator does not model"
            )
        return want, f"replica CPU: {want:g} cores each ({self.count} servers, {cpus} cores)"

    def _variables(self, index: int, port: int, cache_dir: Path) -> dict[str, str]:
        live = self.live
        model = live.model or ""
        served = live.served_model or (Path(model).name if model else "model")
        return {
            "PORT": str(port),
            "INDEX": str(index),
            "HOST": live.host,
            "MODEL": model,
            "SERVED_MODEL": served,
            "PYTHON": live.python or "python3",
            "CACHE_DIR": str(cache_dir),
            "BLOCK_SIZE": str(self.block_size),
            "MAX_MODEL_LEN": str(live.max_model_len),
            "KV_CACHE_BYTES": str(live.kv_cache_bytes),
            "MAX_NUM_SEQS": str(live.max_num_seqs),
        }

    def _start_commands(self) -> None:
        live = self.live
        template = live.replica_command or VLLM_CPU_COMMAND
        starts: list[tuple[StartedProcess, str, float]] = []
        for i in range(self.count):
            port = live.base_port + i if live.base_port else free_port(live.host)
            cache_dir = self.work_dir / f"replica-{i}"
            cache_dir.mkdir(parents=True, exist_ok=True)
            variables = self._variables(i, port, cache_dir)
            env = dict(os.environ)
            if live.preset == "vllm-cpu":
                env.update(vllm_cpu_env(str(cache_dir / "vllm"), live.host))
            env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
            env["VLLM_CACHE_ROOT"] = str(cache_dir / "vllm")
            env.update(live.env)
            argv = expand_command(template, variables, env, "live.replica_command")
            proc = self.procs.start(f"replica {i}", argv, env, cache_dir / "server.log")
            self._started.append(proc)
            if self.replica_cpus is not None:
                piece = CpuSlice(f"{self.work_dir.name}-replica-{i}", self.replica_cpus)
                self._slices.append(piece)
                piece.add(proc.pid)
            starts.append((proc, f"http://{live.host}:{port}", time.monotonic()))
            if live.stagger_s and i + 1 < self.count:
                time.sleep(live.stagger_s)
        for i, (proc, url, t0) in enumerate(starts):
            left = max(1.0, live.start_timeout_s - (time.monotonic() - t0))
            wait_healthy(url + "/health", proc, left, f"replica {i}")
        self.urls = [url for _, url, _ in starts]
