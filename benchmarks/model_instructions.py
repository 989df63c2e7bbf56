"""User-space instructions per simulated request of the replica model or the simulator.

Wall-clock rates (``sessionroute bench engine`` / ``bench sim``) swing by tens of percent on a
shared machine; instruction counts do not. This runs the benchmark's workload twice under
valgrind's callgrind, with a small and a large size, and divides the difference of the total
instruction counts by the difference of the finished requests, so start-up, imports and set-up
cancel out::

    python benchmarks/model_instructions.py engine            # bench engine's workload
    python benchmarks/model_instructions.py sim               # bench sim's (swe-rl, 3 replicas)

It prints ``{"instructions_per_request": X, ...}`` as JSON. Needs ``valgrind`` (``apt install
valgrind``); under callgrind Python runs ~50x slower, so the default sizes are small (the
engine: 1,000 and 3,000 requests; the simulator: 2 and 4 RL steps) and a run takes minutes.
Run it against another checkout with ``PYTHONPATH=/path/to/checkout/src``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

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
    requests = int(proc.stdout.split()[-1])
    with open(out) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1]), requests
    raise RuntimeError(f"no instruction total in {out}")


def main() -> None:
    """Parse the command line, measure, print JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", choices=["engine", "sim"])
    p.add_argument("--small", type=int, help="requests (engine) or RL steps (sim)")
    p.add_argument("--large", type=int, help="requests (engine) or RL steps (sim)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (tokens)")
    args = p.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    template = _ENGINE if args.target == "engine" else _SIM
    small = args.small or (1000 if args.target == "engine" else 2)
    large = args.large or (3000 if args.target == "engine" else 4)
    if large <= small:
        sys.exit(f"--large ({large}) must be above --small ({small})")
    with tempfile.TemporaryDirectory() as d:
        i0, r0 = _count(template.format(size=small, block_size=args.block_size), d, "small")
        i1, r1 = _count(template.format(size=large, block_size=args.block_size), d, "large")
    print(
        json.dumps(
            {
                "target": args.target,
                "instructions_per_request": (i1 - i0) / (r1 - r0),
                "requests": [r0, r1],
                "instructions": [i0, i1],
                "block_size": args.block_size,
            }
        )
    )


if __name__ == "__main__":
    main()
