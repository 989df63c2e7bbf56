"""Digests of the full output of 16 simulations and 4 engine benchmarks, to prove a speed change
leaves results byte-identical.

Each case (every policy on 3 swe-rl steps; faults; block sizes 1, 16 and 64; a small KV cache;
the toy workload; 3,000 Mooncake requests; 600 s of the Weka replay; four `bench engine`
loads) runs with a pinned wall clock, and the JSON of its metrics, time series, RL steps and
samples (wall-clock keys removed) is hashed::

    python benchmarks/results_digest.py save before.json       # on the old code
    python benchmarks/results_digest.py check before.json      # on the new: exit 1 on a change
    python benchmarks/results_digest.py check before.json engine toy   # only matching cases

About 3.5 minutes for all cases on a 2-core machine. Trace cases need the traces (see
README); without them they record the error, which then must match too. Run the old code with
``PYTHONPATH=/path/to/old/checkout/src``.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from sessionroute.bench.closed_loop import run_closed_loop
from sessionroute.clock import ManualClock
from sessionroute.replica import PROFILES, ReplicaConfig
from sessionroute.router.policies.registry import policy_names
from sessionroute.sim import SimSpec, run_simulation

WALL = {
    "wall_seconds",
    "requests_per_wall_second",
    "cpu_seconds",
    "requests_per_cpu_second",
    "steps_per_wall_second",
}


def digest(obj: Any) -> str:
    """First 16 hex digits of the SHA-256 of ``obj``'s sorted JSON."""
    text = json.dumps(obj, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sim(spec: dict[str, Any], policy: str) -> tuple[str, Any]:
    """Digest of one simulation's whole output, and its finished requests."""
    res = run_simulation(SimSpec.model_validate(spec), policy, seed=0, wall_clock=ManualClock())
    m = {k: v for k, v in res.metrics.items() if k not in WALL}
    return digest([m, res.timeseries, res.steps, res.samples]), m.get("requests_completed")


def engine(block_size: int, sessions: int, requests: int, seed: int) -> tuple[str, Any]:
    """Digest of one ``bench engine`` run (fast path) without its wall-clock numbers."""
    cfg = ReplicaConfig(PROFILES["glm45air-h200-tp8"], block_size=block_size)
    r = run_closed_loop(
        cfg, fast=True, sessions=sessions, max_context=60000, requests=requests, seed=seed
    )
    return digest({k: v for k, v in r.items() if k not in WALL}), r["requests"]


def cases() -> dict[str, tuple[dict[str, Any], str]]:
    """The simulation cases: name -> (spec, policy)."""
    swe3: dict[str, Any] = {"kind": "swe-rl", "steps": 3}
    out: dict[str, tuple[dict[str, Any], str]] = {
        f"swe-rl-3/{p}": ({"workload": swe3}, p) for p in policy_names()
    }
    faults: list[dict[str, Any]] = [
        {"at_s": 300, "replica": 1, "kind": "down"},
        {"at_s": 600, "replica": 1, "kind": "up"},
        {"at_s": 200, "replica": 0, "kind": "slow", "factor": 2.5},
        {"at_s": 500, "kind": "add"},
        {"at_s": 700, "replica": 2, "kind": "drain"},
    ]
    sll = "sticky_least_loaded"
    out["swe-rl-4/faults"] = ({"workload": {"kind": "swe-rl", "steps": 4}, "faults": faults}, sll)
    out["swe-rl-3/bs1-noscrape"] = (
        {
            "workload": swe3,
            "replicas": {"block_size": 1, "count": 2},
            "sim": {"scrape_interval_s": None},
        },
        sll,
    )
    small_kv: dict[str, Any] = {"block_size": 64, "kv_capacity_tokens": 600000, "max_num_seqs": 64}
    out["swe-rl-3/bs64-small-kv"] = ({"workload": swe3, "replicas": small_kv}, "consistent_hash")
    toy_profile: dict[str, Any] = {"profile": "toy-8b-h100-tp1", "count": 4}
    out["swe-rl-3/toyprofile"] = ({"workload": swe3, "replicas": toy_profile}, sll)
    out["toy/sll"] = ({"workload": {"kind": "toy"}}, sll)
    out["toy/ch"] = ({"workload": {"kind": "toy"}}, "consistent_hash")
    mooncake: dict[str, Any] = {"kind": "trace:mooncake", "options": {"max_requests": 3000}}
    out["mooncake-3000"] = ({"workload": mooncake}, sll)
    weka: dict[str, Any] = {
        "workload": {"kind": "trace:weka", "options": {}},
        "sim": {"max_simulated_s": 600},
    }
    out["weka"] = (weka, sll)
    return out


ENGINE_CASES = [(16, 256, 3000, 0), (16, 64, 2000, 1), (1, 32, 500, 2), (256, 256, 3000, 3)]


def main() -> None:
    """``save FILE`` or ``check FILE`` [name fragments]."""
    if len(sys.argv) < 3 or sys.argv[1] not in ("save", "check"):
        sys.exit("usage: results_digest.py save|check FILE [NAME-FRAGMENT ...]")
    mode, path, only = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    out: dict[str, Any] = {}
    for name, (spec, pol) in cases().items():
        if only and not any(o in name for o in only):
            continue
        try:
            out[name] = sim(spec, pol)
        except Exception as exc:  # a missing trace: the error is the recorded result
            out[name] = ("error", repr(exc)[:200])
        print(name, out[name], flush=True)
    for bs, sessions, n, seed in ENGINE_CASES:
        name = f"engine/bs{bs}-s{sessions}-n{n}"
        if only and not any(o in name for o in only):
            continue
        out[name] = engine(bs, sessions, n, seed)
        print(name, out[name], flush=True)
    if mode == "save":
        path.write_text(json.dumps(out, indent=1), encoding="utf-8")
        return
    ref = json.loads(path.read_text(encoding="utf-8"))
    bad = [k for k in out if k in ref and list(ref[k]) != list(out[k])]
    print("DIFFERENT:" if bad else "ALL IDENTICAL", bad)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
