"""User-space instructions per proxied request of ``sessionroute serve``, load-independent.

Wall-clock and CPU-time profilers are noisy on a shared machine; instruction counts are not.
This runs the bench backend of ``sessionroute bench proxy`` and the router under valgrind's
callgrind, sends a warm-up, zeroes the counters (``callgrind_control -z``), sends ``--requests``
requests from a closed-loop aiohttp client at ``--concurrency``, dumps the counters
(``callgrind_control -d``) and prints ``{"instructions_per_request": X, ...}`` as JSON.

Needs ``valgrind`` (``apt install valgrind``). Under callgrind the router runs ~50x slower, so
keep ``--requests`` in the hundreds to low thousands::

    python benchmarks/proxy_instructions.py --requests 1000 --concurrency 1
    python benchmarks/proxy_instructions.py --requests 300 --body-bytes 204800
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import aiohttp

from sessionroute.bench.proxy import _body, _free_port


async def _load(url: str, body: bytes, n: int, concurrency: int) -> None:
    """Send ``n`` requests with ``concurrency`` keep-alive workers; raise on a non-200."""
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


async def _measure(args: argparse.Namespace, out_dir: str) -> dict[str, object]:
    bport, rport = _free_port(), _free_port()
    backend = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from sessionroute.bench.proxy import backend_main; backend_main({bport})",
        ]
    )
    out = os.path.join(out_dir, "callgrind.out")
    router = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
         "sessionroute.cli", "serve", "--host", "127.0.0.1", "--port", str(rport), "--policy",
         "consistent_hash", "--worker-urls", f"http://127.0.0.1:{bport}", "--log-level",
         "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{rport}/v1/chat/completions"
        body = _body(args.body_bytes)
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
    total = 0
    with open(dumps[-1]) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
                break
    return {
        "instructions_per_request": total / args.requests,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "body_bytes": len(body),
    }


def main() -> None:
    """Parse the command line, measure, print JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1000, help="measured requests")
    p.add_argument("--warmup", type=int, default=200, help="requests before zeroing counters")
    p.add_argument("--concurrency", type=int, default=1, help="closed-loop workers")
    p.add_argument("--body-bytes", type=int, default=0, help="0: a small chat body")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(asyncio.run(_measure(args, d))))


if __name__ == "__main__":
    main()
