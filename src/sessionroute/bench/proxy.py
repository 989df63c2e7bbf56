"""``sessionroute bench proxy``: router overhead against a zero-delay backend.

One run measures the same closed-loop load (an aiohttp client with keep-alive; ``C`` workers
each sending the next request as soon as the previous answer arrived) against the backend
directly, through ``sessionroute serve`` and through ``vllm-router`` when it is installed
(and, with ``--targets ... floor``, through :mod:`sessionroute.bench.floor_proxy`, the least a
parsing Python proxy does),
for each body size and concurrency. Each router runs as its own process with
``--policy consistent_hash`` (by default) and ``--log-level warning``, and requests carry an
``x-session-id`` header (64 distinct sessions). Reported per row: requests per second,
p50/p99 latency in milliseconds, and router CPU microseconds per request, from the
``utime + stime`` of the router process in ``/proc/<pid>/stat`` (all threads) over the
measured window (split into user and kernel time in ``--json`` and the Markdown table). The
backend's CPU per request is reported too: it is a minimal aiohttp server (read the body,
answer), so it shows what the HTTP machinery alone costs on the machine.
CPU columns are microseconds per request; "+p50" is the p50 latency added over "direct". The
caption gives each router's CPU per request over vllm-router's: the median of the ratios of
each cycle's pair of measurements (rows are interleaved, so a pair saw the same minutes of
machine load; ``cpu_vs_vllm_router`` and its ``_range`` over the cycles in ``--json``). The
document names the Python that runs the bench and ``sessionroute serve`` (``python``): how the
interpreter was built moves the router's user time by tens of percent (``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from sessionroute.bench.backend import chat_body, free_port
from sessionroute.bench.options import at_least, positive_float

__all__ = ["add_arguments", "print_table", "run", "to_markdown"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``sessionroute bench proxy``."""
    parser.add_argument(
        "--duration", type=positive_float, default=10.0, help="seconds per row (10)"
    )
    parser.add_argument(
        "--concurrency", type=at_least(1), nargs="+", default=[1, 64], help="closed-loop clients"
    )
    parser.add_argument(
        "--body-bytes",
        type=at_least(0),
        nargs="+",
        default=[0, 200 * 1024],
        help="prompt bytes per request (0 = a small chat body; default 0 and 204800)",
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["direct", "sessionroute", "vllm-router"],
        choices=["direct", "sessionroute", "vllm-router", "floor"],
        help="what to measure (vllm-router is skipped when not installed; 'floor': a minimal "
        "parsing proxy for scale, sessionroute.bench.floor_proxy)",
    )
    parser.add_argument("--policy", default="consistent_hash", help="policy of both routers")
    parser.add_argument(
        "--state-url",
        default=None,
        metavar="redis://HOST:PORT/DB|auto",
        help="also measure sessionroute with its session table shared on this Redis (target "
        "'sessionroute+redis', serve --state-url); 'auto' starts a redis-server child on a "
        "free loopback port. Compare it with the in-process 'sessionroute' rows",
    )
    parser.add_argument(
        "--repeat",
        type=at_least(1),
        default=1,
        help="cycles over all rows; medians are reported (1)",
    )


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of process ``pid`` (all threads), seconds, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick  # fields 14 and 15 of proc(5)


def _python() -> dict[str, Any]:
    """The Python running this bench (and the routers it starts): version, executable, and
    whether libpython is a shared library (a shared build without PGO or LTO, such as pyenv's
    default, spends noticeably more user time per request than a distribution's optimized,
    statically linked one: compare routers only on the same build)."""
    try:
        shared: bool | None = "/libpython" in Path("/proc/self/maps").read_text()
    except OSError:  # not Linux
        shared = None
    return {
        "version": platform.python_version(),
        "executable": sys.executable,
        "libpython_shared": shared,
        "config_args": sysconfig.get_config_var("CONFIG_ARGS"),
    }


def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (from /proc/net/tcp and /proc/*/fd).

    Needed because launchers (``vllm-router`` is a shell script) may run the server as a child.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":
                    inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
    return None


def _vllm_router_binary() -> str | None:
    local = Path(sys.executable).parent / "vllm-router"
    return str(local) if local.exists() else shutil.which("vllm-router")


async def _wait_listening(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up within {timeout_s} s")


async def _load(
    url: str,
    body: bytes,
    concurrency: int,
    duration_s: float,
    pid: int | None,
    backend_pid: int,
) -> dict[str, Any]:
    """Closed loop: ``concurrency`` workers for ``duration_s`` seconds after a short warm-up.

    Router CPU (of process ``pid``, if any) and backend CPU are read at the start and end of
    the measured window.
    """
    latencies: list[float] = []
    errors = 0
    cpu: list[tuple[float, float]] = []
    warmup = min(1.0, duration_s / 10)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        t_start = time.perf_counter()
        t_measure = t_start + warmup
        t_end = t_measure + duration_s

        async def worker(k: int) -> None:
            nonlocal errors
            headers = {"Content-Type": "application/json", "x-session-id": f"bench-{k % 64}"}
            while True:
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                try:
                    async with session.post(url, data=body, headers=headers) as r:
                        await r.read()
                        ok = r.status == 200
                except aiohttp.ClientError:
                    ok = False
                t1 = time.perf_counter()
                if t0 >= t_measure:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1

        async def cpu_probe() -> None:
            await asyncio.sleep(max(0.0, t_measure - time.perf_counter()))
            cpu.extend((_cpu_seconds(pid) if pid else (0.0, 0.0), _cpu_seconds(backend_pid)))
            await asyncio.sleep(max(0.0, t_end - time.perf_counter()))
            cpu.extend((_cpu_seconds(pid) if pid else (0.0, 0.0), _cpu_seconds(backend_pid)))

        await asyncio.gather(cpu_probe(), *(worker(k) for k in range(concurrency)))
    lat = np.asarray(latencies) * 1000.0
    n = len(latencies)
    measured = bool(pid and n)
    user = (cpu[2][0] - cpu[0][0]) * 1e6 / n if measured else None
    system = (cpu[2][1] - cpu[0][1]) * 1e6 / n if measured else None
    return {
        "router_cpu_us_per_req": user + system if user is not None and system is not None else None,
        "router_user_us_per_req": user,
        "router_sys_us_per_req": system,
        "backend_cpu_us_per_req": (sum(cpu[3]) - sum(cpu[1])) * 1e6 / n if n else None,
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / duration_s,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
    }


_MEDIAN_KEYS = (
    "rps",
    "p50_ms",
    "p99_ms",
    "router_cpu_us_per_req",
    "router_user_us_per_req",
    "router_sys_us_per_req",
    "backend_cpu_us_per_req",
)


def _median_rows(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (target, body, concurrency): the median of each metric over the repeats."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in raw:
        groups.setdefault((r["target"], r["body_bytes"], r["concurrency"]), []).append(r)
    rows = []
    for (target, size, c), rs in groups.items():
        row: dict[str, Any] = {"target": target, "body_bytes": size, "concurrency": c}
        for key in _MEDIAN_KEYS:
            values = [r[key] for r in rs if r.get(key) is not None]
            row[key] = float(np.median(values)) if values else None
        row["requests"] = sum(r["requests"] for r in rs)
        row["errors"] = sum(r["errors"] for r in rs)
        row["repeats"] = len(rs)
        if row["router_cpu_us_per_req"] is not None:
            row["router_cpu_us_per_req_range"] = [
                min(r["router_cpu_us_per_req"] for r in rs),
                max(r["router_cpu_us_per_req"] for r in rs),
            ]
        rows.append(row)
    order = {"direct": 0, "sessionroute": 1, "sessionroute+redis": 2, "vllm-router": 3, "floor": 4}
    rows.sort(key=lambda r: (order[r["target"]], r["body_bytes"], r["concurrency"]))
    direct = {(r["body_bytes"], r["concurrency"]): r for r in rows if r["target"] == "direct"}
    for r in rows:
        d = direct.get((r["body_bytes"], r["concurrency"]))
        if r["target"] != "direct" and d and d["p50_ms"] is not None and r["p50_ms"] is not None:
            r["added_p50_ms"] = r["p50_ms"] - d["p50_ms"]
        reference = groups.get(("vllm-router", r["body_bytes"], r["concurrency"]))
        if r["target"] not in ("direct", "vllm-router") and reference:
            ratios = _paired_ratios(
                groups[(r["target"], r["body_bytes"], r["concurrency"])], reference
            )
            if ratios:
                r["cpu_vs_vllm_router"] = float(np.median(ratios))
                r["cpu_vs_vllm_router_range"] = [min(ratios), max(ratios)]
    return rows


def _paired_ratios(runs: list[dict[str, Any]], reference: list[dict[str, Any]]) -> list[float]:
    """Router CPU per request over vllm-router's, cycle by cycle (rows are interleaved, so the
    k-th measurement of each target saw the same minutes of machine load)."""
    key = "router_cpu_us_per_req"
    return [
        a[key] / b[key]
        for a, b in zip(runs, reference, strict=False)
        if a[key] is not None and b[key]
    ]


async def _start(cmd: list[str], url: str, port: int, procs: list[subprocess.Popen[bytes]]) -> int:
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        procs.append(proc)
        try:
            await _wait_listening(url, proc, 60)
        except RuntimeError as e:
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace").strip()
            raise RuntimeError(f"{e}; its stderr ends with: {tail or '(nothing)'}") from None
    return _listener_pid(port) or proc.pid


def _start_redis(procs: list[subprocess.Popen[bytes]]) -> str:
    """Start a redis-server child (no persistence) on a free loopback port; its URL.

    Raises:
        RuntimeError: when redis-server is not installed or does not answer.
    """
    import socket

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--state-url auto needs redis-server (apt-get install -y redis-server)")
    port = free_port()
    cmd = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return f"redis://127.0.0.1:{port}/0"
        time.sleep(0.05)
    raise RuntimeError(f"redis-server did not listen on port {port}")


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    versions: dict[str, str | None] = {"vllm-router": None}
    raw: list[dict[str, Any]] = []
    try:
        bport = free_port()
        backend_url = f"http://127.0.0.1:{bport}"
        code = f"from sessionroute.bench.backend import backend_main; backend_main({bport})"
        backend_pid = await _start([sys.executable, "-c", code], backend_url, bport, procs)
        # Every target runs at once (idle ones cost nothing) and rows are interleaved, so
        # the targets see the same machine load; --repeat gives medians over several cycles.
        targets: dict[str, tuple[str, int | None]] = {}
        target_names = list(args.targets)
        state_url = args.state_url
        if state_url is not None:
            if "sessionroute" not in target_names:
                target_names.append("sessionroute")
            target_names.insert(target_names.index("sessionroute") + 1, "sessionroute+redis")
            if state_url == "auto":
                state_url = _start_redis(procs)
        for target in target_names:
            if target == "direct":
                targets[target] = (backend_url, None)
                continue
            port = free_port()
            common = ["--host", "127.0.0.1", "--port", str(port), "--policy", args.policy]
            common += ["--worker-urls", backend_url, "--log-level", "warning"]
            if target == "floor":
                code = "from sessionroute.bench.floor_proxy import floor_main; "
                cmd = [sys.executable, "-c", code + f"floor_main({port}, {bport})"]
            elif target.startswith("sessionroute"):
                cmd = [sys.executable, "-m", "sessionroute.cli", "serve", *common]
                if target == "sessionroute+redis":
                    prefix = f"bench-{os.getpid()}-{port}"
                    cmd += ["--state-url", str(state_url), "--state-key-prefix", prefix]
            else:
                binary = _vllm_router_binary()
                if binary is None:
                    continue
                # its Prometheus listener defaults to port 29000, which may be taken
                cmd = [binary, *common, "--prometheus-port", str(free_port())]
                with contextlib.suppress(Exception):
                    from importlib.metadata import version

                    versions["vllm-router"] = version("vllm-router")
            url = f"http://127.0.0.1:{port}"
            targets[target] = (url, await _start(cmd, url, port, procs))
        for _ in range(args.repeat):
            for size in args.body_bytes:
                body = chat_body(size)
                for c in args.concurrency:
                    for target, (url, pid) in targets.items():
                        stats = await _load(
                            url + "/v1/chat/completions", body, c, args.duration, pid, backend_pid
                        )
                        raw.append(
                            {"target": target, "body_bytes": len(body), "concurrency": c, **stats}
                        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(20)
    return {
        "benchmark": "proxy",
        "duration_s": args.duration,
        "repeat": args.repeat,
        "policy": args.policy,
        "cpus": os.cpu_count(),
        "versions": versions,
        "python": _python(),
        "state_url": args.state_url,
        "loadavg_1m_at_end": os.getloadavg()[0],
        "rows": _median_rows(raw),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark (see the module docstring); returns the result document."""
    return asyncio.run(_run(args))


def print_table(result: dict[str, Any]) -> None:
    """Print the rows as a table."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    # no vertical rules: nine columns then fit an 80-column terminal without cutting cells
    table = Table(
        title=f"proxy overhead, {result['duration_s']:g} s x {result['repeat']} per row, "
        f"policy {result['policy']}",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
    )
    cols = (  # two-line headers keep the columns narrow
        "target",
        "body\nbytes",
        "conc",
        "req/s",
        "p50\nms",
        "p99\nms",
        "+p50\nms",
        "router\nus/req",
        "backend\nus/req",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "target" else "right", no_wrap=True)
    for r in result["rows"]:
        table.add_row(
            r["target"],
            str(r["body_bytes"]),
            str(r["concurrency"]),
            fmt(r["rps"], ".0f"),
            fmt(r["p50_ms"], ".2f"),
            fmt(r["p99_ms"], ".2f"),
            fmt(r.get("added_p50_ms"), ".2f"),
            fmt(r["router_cpu_us_per_req"], ".0f"),
            fmt(r["backend_cpu_us_per_req"], ".0f"),
        )
    ratios = [
        f"{r['target']} {r['body_bytes']} B x {r['concurrency']}: {_ratio_cell(r)}"
        for r in result["rows"]
        if r.get("cpu_vs_vllm_router") is not None
    ]
    caption = []
    if ratios:  # a tenth column would not fit 80 columns
        caption.append(
            "router CPU per request over vllm-router's (median of the cycles' ratios, min-max): "
            + "; ".join(ratios)
        )
    py = result.get("python")
    if py:
        shared = {True: ", libpython shared", False: ", libpython static"}.get(
            py["libpython_shared"], ""
        )
        caption.append(f"Python {py['version']}{shared} ({py['executable']})")
    table.caption = "\n".join(caption) or None
    Console().print(table)


def to_markdown(result: dict[str, Any]) -> str:
    """The rows as a Markdown table (for docs/benchmarks.md)."""

    def fmt(v: Any, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    lines = [
        "| target | body bytes | concurrency | req/s | p50 ms | p99 ms | added p50 ms "
        "| router CPU us/req | user | system | x vllm-router (min-max) | backend CPU us/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['target']} | {r['body_bytes']} | {r['concurrency']} | {fmt(r['rps'], '.0f')} "
            f"| {fmt(r['p50_ms'], '.2f')} | {fmt(r['p99_ms'], '.2f')} "
            f"| {fmt(r.get('added_p50_ms'), '.2f')} | {fmt(r['router_cpu_us_per_req'], '.0f')} "
            f"| {fmt(r.get('router_user_us_per_req'), '.0f')} "
            f"| {fmt(r.get('router_sys_us_per_req'), '.0f')} | {_ratio_cell(r)} "
            f"| {fmt(r['backend_cpu_us_per_req'], '.0f')} |"
        )
    return "\n".join(lines)


def _ratio_cell(row: dict[str, Any]) -> str:
    ratio = row.get("cpu_vs_vllm_router")
    if ratio is None:
        return "-"
    lo, hi = row["cpu_vs_vllm_router_range"]
    return f"{ratio:.2f} ({lo:.2f}-{hi:.2f})"
