"""``sessionroute bench instructions``: user-space instructions per request, load-independent.

Wall-clock rates (``bench engine``, ``bench sim``, ``bench proxy``) swing by tens of percent
on a shared machine; instruction counts under valgrind's callgrind do not (repeated runs agree
within 1 %). Needs ``valgrind`` (``apt install valgrind``); under callgrind Python runs ~50x
slower, so the default sizes are small and a run takes minutes::

    sessionroute bench instructions engine     # bench engine's load: 1,000 vs 3,000 requests
    sessionroute bench instructions sim        # bench sim's (swe-rl, 3 replicas): 2 vs 4 steps
    sessionroute bench instructions proxy --requests 1000 --concurrency 1
    sessionroute bench instructions proxy --requests 300 --body-bytes 204800

``engine`` and ``sim`` run the workload twice, with a small and a large size, and divide the
difference of the instruction totals by the difference of the finished requests, so start-up,
imports and set-up cancel out. ``proxy`` runs ``bench proxy``'s zero-delay backend and
``sessionroute serve --policy consistent_hash`` under callgrind, sends a warm-up, zeroes the
counters (``callgrind_control -z``), sends ``--requests`` requests from a closed-loop aiohttp
client at ``--concurrency`` (keep-alive, 64 session ids), dumps the counters
(``callgrind_control -d``) and divides (``--router floor`` counts the minimal proxy of
:mod:`sessionroute.bench.floor_proxy` instead, for scale; ``--keep FILE`` keeps the dump for
``callgrind_annotate``). Each measures the code on ``sys.path``: run it against
another checkout with ``PYTHONPATH=/path/to/checkout/src``.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["add_arguments", "print_table", "run"]

_ENGINE = """
from sessionroute.bench.closed_loop import run_closed_loop
from sessionroute.replica import PROFILES, ReplicaConfig
cfg = ReplicaConfig(PROFILES["glm45air-h200-tp8"], block_size={block_size})
r = run_closed_loop(cfg, fast=True, sessions=256, max_context=60000, requests={size}, seed=0)
print(r["requests"])
"""

_SIM = """
from sessionroute.clock import ManualClock
from sessionroute.sim import SimSpec, run_simulation
spec = SimSpec.model_validate({{"workload": {{"kind": "swe-rl", "steps": {size}}},
                               "replicas": {{"count": 3, "block_size": {block_size}}}}})
res = run_simulation(spec, "sticky_least_loaded", seed=0, wall_clock=ManualClock())
print(res.metrics["requests_completed"])
"""

_SIZES = {"engine": (1000, 3000), "sim": (2, 4)}
"""Default (small, large) sizes: requests for ``engine``, RL steps for ``sim``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``sessionroute bench instructions``."""
    parser.add_argument("target", choices=["engine", "sim", "proxy"], help="what to count")
    parser.add_argument("--small", type=int, help="engine/sim: requests or RL steps, small run")
    parser.add_argument("--large", type=int, help="engine/sim: requests or RL steps, large run")
    parser.add_argument("--block-size", type=int, default=16, help="engine/sim: KV block size")
    parser.add_argument("--requests", type=int, default=1000, help="proxy: measured requests")
    parser.add_argument("--warmup", type=int, default=200, help="proxy: requests before zeroing")
    parser.add_argument("--concurrency", type=int, default=1, help="proxy: closed-loop workers")
    parser.add_argument("--body-bytes", type=int, default=0, help="proxy: 0 is a small chat body")
    parser.add_argument(
        "--router",
        choices=["sessionroute", "floor"],
        default="sessionroute",
        help="proxy: what runs under callgrind: 'sessionroute serve' or the minimal parsing "
        "proxy of 'bench proxy --targets floor' (sessionroute.bench.floor_proxy), for scale",
    )
    parser.add_argument(
        "--keep",
        metavar="FILE",
        help="proxy: copy the callgrind dump of the measured requests to FILE "
        "(for callgrind_annotate)",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="proxy: one more argument for 'sessionroute serve' (repeatable), e.g. "
        "--router-arg=--route-receipts",
    )


def _total(path: str) -> int:
    """The instruction total of a callgrind output file."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {path}")


def _count(code: str, out_dir: str, tag: str) -> tuple[int, int]:
    """Run ``code`` under callgrind; returns (total instructions, requests it printed)."""
    out = os.path.join(out_dir, f"callgrind.{tag}")
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c",
         code],
        capture_output=True,
        text=True,
        check=True,
    )  # fmt: skip
    return _total(out), int(proc.stdout.split()[-1])


def _model(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    from sessionroute.errors import ConfigError

    template = _ENGINE if args.target == "engine" else _SIM
    small = args.small or _SIZES[args.target][0]
    large = args.large or _SIZES[args.target][1]
    if large <= small:
        raise ConfigError(f"--large ({large}) must be above --small ({small})")
    i0, r0 = _count(template.format(size=small, block_size=args.block_size), out_dir, "small")
    i1, r1 = _count(template.format(size=large, block_size=args.block_size), out_dir, "large")
    return {
        "target": args.target,
        "instructions_per_request": (i1 - i0) / (r1 - r0),
        "requests": [r0, r1],
        "instructions": [i0, i1],
        "block_size": args.block_size,
    }


async def _load(url: str, body: bytes, n: int, concurrency: int) -> None:
    """Send ``n`` requests with ``concurrency`` keep-alive workers; raise on a non-200."""
    import aiohttp

    left = [n]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as s:

        async def worker(k: int) -> None:
            headers = {"Content-Type": "application/json", "x-session-id": f"bench-{k % 64}"}
            while left[0] > 0:
                left[0] -= 1
                async with s.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"router answered {r.status}")

        await asyncio.gather(*(worker(k) for k in range(concurrency)))


async def _proxy(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    import aiohttp

    from sessionroute.bench.backend import chat_body, free_port

    bport, rport = free_port(), free_port()
    backend = subprocess.Popen(
        [sys.executable, "-c",
         f"from sessionroute.bench.backend import backend_main; backend_main({bport})"]
    )  # fmt: skip
    out = os.path.join(out_dir, "callgrind.out")
    if args.router == "floor":
        code = "from sessionroute.bench.floor_proxy import floor_main; floor_main(%d, %d)"
        served = ["-c", code % (rport, bport)]
    else:
        served = ["-m", "sessionroute.cli", "serve", "--host", "127.0.0.1", "--port", str(rport),
                  "--policy", "consistent_hash", "--worker-urls", f"http://127.0.0.1:{bport}",
                  "--log-level", "warning", *args.router_arg]  # fmt: skip
    router = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, *served],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    body = chat_body(args.body_bytes)
    try:
        url = f"http://127.0.0.1:{rport}/v1/chat/completions"
        for _ in range(600):  # the router starts slowly under valgrind
            try:
                await _load(url, body, 1, 1)
                break
            except (aiohttp.ClientError, RuntimeError):
                await asyncio.sleep(0.5)
        else:
            raise RuntimeError("the router did not come up under valgrind")
        await _load(url, body, args.warmup, args.concurrency)
        subprocess.run(["callgrind_control", "-z", str(router.pid)], check=True,
                       capture_output=True)  # fmt: skip
        await _load(url, body, args.requests, args.concurrency)
        subprocess.run(["callgrind_control", "-d", str(router.pid)], check=True,
                       capture_output=True)  # fmt: skip
    finally:
        router.terminate()
        backend.terminate()
        router.wait()
        backend.wait()
    dumps = sorted(f for f in glob.glob(out + "*") if f != out)
    if args.keep:
        shutil.copyfile(dumps[-1], args.keep)
    return {
        "target": "proxy",
        "router": args.router,
        "instructions_per_request": _total(dumps[-1]) / args.requests,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "body_bytes": len(body),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Count the instructions of ``args.target`` (see the module docstring).

    Raises:
        ConfigError: valgrind is not installed, or ``--large`` is not above ``--small``.

    Returns:
        ``target``, ``instructions_per_request`` and what was run (``requests``, and
        ``instructions`` and ``block_size``, or ``router``, ``concurrency`` and
        ``body_bytes``).
    """
    from sessionroute.errors import ConfigError

    if shutil.which("valgrind") is None:
        raise ConfigError("valgrind is not installed (apt install valgrind)")
    with tempfile.TemporaryDirectory() as d:
        if args.target == "proxy":
            return asyncio.run(_proxy(args, d))
        return _model(args, d)


def print_table(result: dict[str, Any]) -> None:
    """The count and what was run, one per line."""
    print(
        f"instructions per request ({result['target']}): {result['instructions_per_request']:,.0f}"
    )
    for key, value in result.items():
        if key not in ("target", "instructions_per_request"):
            print(f"  {key}: {value}")
